"""A broker whose partitions take long to open (recover) at start logs its progress at
most every ``RECOVERY_REPORT_S`` and its end; a quick start logs neither. A real store
and embedded cluster; the clock is driven, so "long" costs no time."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker_core.cluster.embedded import EmbeddedCluster
from broker_core.cluster.records import BrokerInfo, TopicAssignment
from broker_core.log.store import LogStore
from broker_core.server.replication import local_topics
from broker_core.server.replication.local_topics import LocalTopics


class _Roles:
    """Takes the roles handed out (the replica manager's one call in a sync)."""

    def __init__(self) -> None:
        self.applied: list[dict[str, TopicAssignment]] = []

    def apply(self, assignments: dict[str, TopicAssignment]) -> None:
        self.applied.append(assignments)


def _sync(tmp_path: Path, step_s: float, caplog: pytest.LogCaptureFixture) -> list[str]:
    cluster = EmbeddedCluster(BrokerInfo(0, "127.0.0.1", 1), tmp_path / "cluster.json")
    cluster.register(BrokerInfo(0, "127.0.0.1", 1))
    cluster.create_topic("orders", 12, None, {})
    store = LogStore(tmp_path / "data")
    roles = _Roles()
    topics = LocalTopics(
        0,
        store,
        cluster,
        roles,  # type: ignore[arg-type]
        embedded=True,
        serving=lambda: True,
        forget_topic=lambda _name: None,
    )
    now = [0.0]

    def clock() -> float:
        now[0] += step_s  # every look at the clock: one more partition opened
        return now[0]

    with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.INFO, "idemlog.broker"):
        patch.setattr(local_topics.time, "monotonic", clock)
        topics.sync()
    opened = len(store.topic("orders").logs)
    store.close()
    cluster.close()
    assert roles.applied and opened == 12  # every partition was opened
    return [m for r in caplog.records if "partitions:" in (m := r.getMessage()) or " opened " in m]


def test_a_slow_start_logs_progress_throttled_and_its_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = _sync(tmp_path, 2.0, caplog)  # 2 s per partition: 24 s in all
    progress = [line for line in lines if "opening its partitions" in line]
    assert 3 <= len(progress) <= 5  # every 5 s at most, not once per partition
    assert progress[0].startswith("broker 0 opening its partitions: 3/12 (orders-2)")
    assert lines[-1].startswith("broker 0 opened its 12 partitions in")


def test_a_quick_start_logs_neither(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert _sync(tmp_path, 0.001, caplog) == []
