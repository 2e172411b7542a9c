"""Broker epochs on the replication path, one class at a time with fakes for its
collaborators: a leader refuses a replaced process's request (STALE_BROKER_EPOCH), a
broker named leader by a state for its predecessor stands by, and a follower refuses to
truncate below its high watermark to a leader at an epoch its log already holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from broker_core.cluster.records import BrokerInfo, PartitionState
from broker_core.errors import NotLeaderOrFollowerError, StaleBrokerEpochError
from broker_core.protocol.replica import ReplicaFetchRequest
from broker_core.server.replication.partition import Partition, Role
from broker_core.server.replication.replica_fetcher import (
    FetcherConfig,
    ReplicaFetcher,
    TruncationRefusedError,
)
from broker_core.server.replication.replica_manager import ReplicaManager, ReplicationConfig
from tests.store.helpers import ManualClock, open_log, rows


class Brokers:
    """The cluster metadata as the replica manager reads it: the registrations."""

    def __init__(self, *brokers: BrokerInfo) -> None:
        self._brokers = list(brokers)

    def brokers(self) -> list[BrokerInfo]:
        return self._brokers

    def broker_epoch(self) -> int:
        return 500

    def unclean_leader_elections(self) -> int:
        return 0


def test_a_fetch_from_a_replaced_process_is_refused_with_stale_broker_epoch(
    tmp_path: Path,
) -> None:
    cluster: Any = Brokers(BrokerInfo(2, "h", 1, epoch=700))
    config = ReplicationConfig(1000, FetcherConfig(1024, 10, 0.01))
    manager = ReplicaManager(1, None, cluster, config)  # type: ignore[arg-type]
    try:
        stale = ReplicaFetchRequest("t", 0, 2, 0, 0, 1024, 0, broker_epoch=600)
        with pytest.raises(StaleBrokerEpochError, match=r"broker 2 at broker epoch 600.*700"):
            manager.replica_fetch(stale)
        # The current process (or a newer one the cache has not seen) passes the check.
        for epoch in (700, 800, -1):
            current = ReplicaFetchRequest("t", 0, 2, 0, 0, 1024, 0, broker_epoch=epoch)
            with pytest.raises(NotLeaderOrFollowerError):  # no replica here: past the check
                manager.replica_fetch(current)
    finally:
        manager.close()


def test_a_broker_named_leader_for_its_predecessor_stands_by(tmp_path: Path) -> None:
    partition = Partition("t", 0, open_log(tmp_path / "t-0", ManualClock()), 1)
    state = PartitionState((1, 2), 1, 3, (1, 2), ((1, 100), (2, 200)))
    assert partition.apply(state, broker_epoch=900) is Role.NONE
    with pytest.raises(NotLeaderOrFollowerError):
        partition.check_leader()
    # The controller's new state: broker 2 leads at epoch 4, this one follows.
    moved = PartitionState((1, 2), 2, 4, (2,), ((2, 200),))
    assert partition.apply(moved, broker_epoch=900) is Role.FOLLOWER
    # Admitted at its own epoch, it leads.
    back = PartitionState((1, 2), 1, 5, (2, 1), ((1, 900), (2, 200)))
    assert partition.apply(back, broker_epoch=900) is Role.LEADER


class Leader:
    """A leader's answer to offsets_for_leader_epoch: ``end`` for any epoch."""

    def __init__(self, epoch: int, end: int) -> None:
        self.answer = {"epoch": epoch, "end_offset": end}

    def action(self, address: str, action: str, body: bytes, timeout: float, what: str) -> bytes:
        return json.dumps(self.answer).encode()


def _follower(tmp_path: Path, leader: Leader, leader_epoch: int) -> ReplicaFetcher:
    log_ = open_log(tmp_path / "t-0", ManualClock())
    log_.become_leader(2)
    log_.append(rows(10))
    log_.update_high_watermark(10)  # every in-sync replica had it
    partition = Partition("t", 0, log_, 1)
    return ReplicaFetcher(
        partition,
        broker_id=1,
        leader_id=2,
        leader_epoch=leader_epoch,
        address=lambda: "leader:1",
        connections=leader,  # type: ignore[arg-type]
        config=FetcherConfig(1024, 10, 0.01),
    )


def test_no_truncation_below_the_high_watermark_to_a_leader_at_a_known_epoch(
    tmp_path: Path,
) -> None:
    # An empty leader at the epoch this log holds: it lost what was acknowledged.
    fetcher = _follower(tmp_path, Leader(2, 0), leader_epoch=2)
    with pytest.raises(TruncationRefusedError, match="refused to truncate from 10 to 0"):
        fetcher._truncate()
    assert fetcher.truncations_refused == 1
    assert fetcher.partition.log.log_end_offset == 10  # nothing cut


def test_an_unclean_leader_at_a_higher_epoch_may_still_cut_below_it(tmp_path: Path) -> None:
    fetcher = _follower(tmp_path, Leader(2, 4), leader_epoch=3)
    fetcher._truncate()
    assert fetcher.truncations_refused == 0
    assert fetcher.partition.log.log_end_offset == 0  # the one batch holding offset 4 goes
