"""The tasks of a running Spark job, for a progress display: what Spark's status tracker
says of every stage seen since the poller started (done and total tasks, summed).

A daemon thread asks ``SparkContext.statusTracker()`` every ``interval_s`` while the job
runs and calls ``report(done, total)`` when the figures change, and once more when the
block ends. Progress is advice: a tracker call that fails ends the polling with one line
on ``log`` (never silently), and the job goes on. State: one (done, total) pair per stage
seen, bounded by the job's stages.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

Report = Callable[[int, int], None]
POLL_S = 0.5  # how often the tracker is asked: a few JVM calls, cheap beside a write


class StageTasks:
    """``with StageTasks(spark, report): job()`` reports the job's task counts."""

    def __init__(
        self,
        spark: Any,
        report: Report,
        log: Callable[[str], None],
        interval_s: float = POLL_S,
    ) -> None:
        self._tracker = spark.sparkContext.statusTracker()
        self._report = report
        self._log = log
        self._interval_s = interval_s
        self._stages: dict[int, tuple[int, int]] = {}
        self._shown: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="export-progress", daemon=True)
        self._failed = False

    def __enter__(self) -> StageTasks:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        if kind is None and not self._failed:
            self._poll()  # the finished stages' last figures

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            if not self._poll():
                return

    def _poll(self) -> bool:
        try:
            for stage in self._tracker.getActiveStageIds():
                self._stages.setdefault(int(stage), (0, 0))
            for stage in list(self._stages):
                info = self._tracker.getStageInfo(stage)
                if info is not None:  # None once Spark forgot it: keep its last figures
                    self._stages[stage] = (int(info.numCompletedTasks), int(info.numTasks))
        except Exception as exc:
            self._failed = True
            self._log(f"export progress unavailable: {type(exc).__name__}: {exc}")
            return False
        figures = (
            sum(done for done, _ in self._stages.values()),
            sum(total for _, total in self._stages.values()),
        )
        if figures != self._shown and figures[1] > 0:
            self._shown = figures
            self._report(*figures)
        return True
