"""StageTasks (spark_sink/export/job_progress.py): a running job's task counts from Spark's
status tracker, reported when they change and once at the end; a tracker that fails ends
the polling with one line, never silently. A fake tracker (one class under test); the real
one is driven by tests/spark/test_delta_export.py through ``idemlog export delta``."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from spark_sink.export.job_progress import StageTasks


class FakeTracker:
    def __init__(self) -> None:
        self.active: list[int] = []
        self.stages: dict[int, tuple[int, int]] = {}
        self.fail: Exception | None = None
        self.asked = threading.Event()

    def getActiveStageIds(self) -> list[int]:
        self.asked.set()
        if self.fail is not None:
            raise self.fail
        return list(self.active)

    def getStageInfo(self, stage: int) -> Any:
        if stage not in self.stages:
            return None
        done, total = self.stages[stage]
        return SimpleNamespace(numCompletedTasks=done, numTasks=total)


def _spark(tracker: FakeTracker) -> Any:
    return SimpleNamespace(sparkContext=SimpleNamespace(statusTracker=lambda: tracker))


def test_counts_are_summed_over_stages_kept_after_they_finish_and_reported_at_the_end() -> None:
    tracker = FakeTracker()
    reports: list[tuple[int, int]] = []
    lines: list[str] = []
    with StageTasks(_spark(tracker), lambda d, t: reports.append((d, t)), lines.append, 0.01):
        tracker.active, tracker.stages = [1], {1: (1, 4)}
        tracker.asked.clear()
        assert tracker.asked.wait(5)
        tracker.active, tracker.stages = [2], {1: (4, 4), 2: (0, 2)}
        tracker.asked.clear()
        assert tracker.asked.wait(5)
        # Spark forgets stage 1: its last figures stay in the sum.
        tracker.active, tracker.stages = [], {2: (2, 2)}
    assert reports[-1] == (6, 6), reports
    assert reports == sorted(set(reports), key=reports.index)  # only changes are reported
    assert lines == []


def test_a_failing_tracker_is_said_once_and_the_block_still_ends() -> None:
    tracker = FakeTracker()
    tracker.fail = RuntimeError("py4j gone")
    lines: list[str] = []
    with StageTasks(_spark(tracker), lambda d, t: None, lines.append, 0.01):
        assert tracker.asked.wait(5)
    assert lines == ["export progress unavailable: RuntimeError: py4j gone"]
