"""The coordinator's state partition fences it (docs/design.md §5): every state change is
an acks=all append through the leader's replica (``server.coordination.state_partition``) at the
coordinator's leader epoch, refused atomically once the partition is led at another
epoch, and a change takes effect in memory only after its append was answered.

Real parts: the ``Partition`` a broker leads, its log, the coordinator. The leadership
changes as the cluster metadata delivers them (``Partition.apply``); the held write is an
acks=all append waiting for a follower that never fetches, so it is deterministically in
flight when the leadership moves.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import pytest

from broker_core.cluster.records import PartitionState
from broker_core.errors import NotCoordinatorError
from broker_core.log.store import LogStore
from broker_core.producer_ids.manager import FileProducerIdBlockSource, ProducerIdManager
from broker_core.record.batch import ControlType
from broker_core.server.coordination.state_partition import (
    LeaderStatePartition,
    embedded_state_partition,
)
from broker_core.server.replication.partition import Partition
from broker_core.txn.coordinator.coordinator import LocalMarkerWriter, TransactionCoordinator
from broker_core.txn.coordinator.lifecycle import CoordinatorStatus
from broker_core.txn.state_topic.records import TransactionState as S
from broker_core.txn.state_topic.schema import TXN_STATE_TOPIC, open_state_log
from broker_core.txn.state_topic.store import CoordinatorEpochFencedError, LogTxnStateStore
from tests.harness.waiting import wait_until
from tests.store.helpers import ManualClock
from tests.store.test_txn_coordinator import (
    P0,
    Broker,
    Producer,
    StoreStableOffsets,
    open_data,
)

EPOCH = 7
ACK_TIMEOUT_S = 30.0  # longer than the test: the held write ends by the election only


def _broker(tmp_path: Path) -> tuple[Broker, Partition]:
    """A coordinator over this broker's replica of __transaction_state-0 (replicas 1 and
    2, led by 1 at EPOCH, 1 alone in the ISR so its appends are answered at once)."""
    clock = ManualClock()
    store = open_data(tmp_path)
    partition = Partition(TXN_STATE_TOPIC, 0, open_state_log(store), broker_id=1)
    partition.apply(PartitionState((1, 2), 1, EPOCH, (1,)))
    state = LogTxnStateStore(LeaderStatePartition(partition, ACK_TIMEOUT_S), leader_epoch=EPOCH)
    coordinator = TransactionCoordinator(
        state,
        ProducerIdManager(0, FileProducerIdBlockSource(tmp_path / "producer_id_block.json")),
        LocalMarkerWriter(store),
        clock=clock,
        coordinator_epoch=EPOCH,
        marker_retry_deadline_s=1.0,
        marker_retry_backoff_s=0.001,
        stable_offsets=StoreStableOffsets(store),
    )
    coordinator.start()
    return Broker(tmp_path, clock, store, state, coordinator), partition


def test_a_decision_in_flight_across_a_leadership_change_is_never_applied(
    tmp_path: Path,
) -> None:
    b, partition = _broker(tmp_path)
    p = Producer(b, "app").init()
    p.send(P0, range(5))
    # Follower 2 joins the ISR and never fetches: the next state append waits for it.
    partition.apply(PartitionState((1, 2), 1, EPOCH, (1, 2)))
    end_before = partition.log.log_end_offset
    outcome: list[BaseException] = []

    def commit() -> None:
        try:
            p.commit()
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=commit)
    thread.start()
    wait_until(
        lambda: partition.log.log_end_offset > end_before, "the PREPARE_COMMIT row in flight"
    )
    assert thread.is_alive()  # the fault: the decision is written, not yet acknowledged
    partition.apply(PartitionState((1, 2), 2, EPOCH + 1, (1, 2)))  # broker 2 elected
    thread.join(ACK_TIMEOUT_S)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], CoordinatorEpochFencedError)
    # Stood down: no marker, the decision not in memory, nothing answered any more.
    assert b.coordinator.status is CoordinatorStatus.CLOSED
    assert not b.stable(P0) and b.committed(P0) == []
    assert b.coordinator.describe()["open_transactions"] == 1
    with pytest.raises(NotCoordinatorError):
        b.coordinator.end_txn(*p.txn, commit=True)
    with pytest.raises(NotCoordinatorError):
        b.coordinator.abort_timed_out(b.clock.now + 10**9)


def test_a_deposed_coordinator_cannot_time_a_transaction_out(tmp_path: Path) -> None:
    """Re-elected leader at a newer epoch (its broker bounced): the coordinator of the old
    epoch may not write, so its timeout sweep neither records an abort nor writes a
    marker; the appends are refused before anything reaches the log."""
    b, partition = _broker(tmp_path)
    p = Producer(b, "app").init(timeout_ms=1_000)
    p.send(P0, range(5))
    partition.apply(PartitionState((1, 2), 1, EPOCH + 1, (1,)))
    end_before = partition.log.log_end_offset
    b.clock.advance(1_001)
    assert b.coordinator.abort_timed_out() == []
    assert partition.log.log_end_offset == end_before  # refused atomically: nothing written
    assert b.coordinator.status is CoordinatorStatus.CLOSED
    assert not b.stable(P0)  # no abort marker
    assert b.stored("app").state is S.ONGOING


def test_a_deposed_coordinators_timeout_pass_stops_at_its_first_refused_abort(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two ids past their timeout when the epoch has moved on: the first abort is refused
    for the epoch and the pass ends there, saying so, instead of trying (and logging as
    aborted) every other id on a coordinator that stood down (the host-cut variant of
    issue 23's test 1, ``tests/cluster/test_coordinator_cut.py``, reads this line)."""
    b, partition = _broker(tmp_path)
    producers = [Producer(b, name).init(timeout_ms=1_000) for name in ("app-a", "app-b")]
    for p in producers:
        p.send(P0, range(5))
    partition.apply(PartitionState((1, 2), 1, EPOCH + 1, (1,)))
    end_before = partition.log.log_end_offset
    b.clock.advance(1_001)
    with caplog.at_level(logging.INFO, logger="idemlog.txn"):
        assert b.coordinator.abort_timed_out() == []
    tried = [r for r in caplog.records if "aborted by the coordinator" in r.getMessage()]
    stopped = [r for r in caplog.records if "timeout pass stopped" in r.getMessage()]
    assert len(tried) == 1 and len(stopped) == 1, caplog.text
    assert "was refused" in stopped[0].getMessage() and stopped[0].levelno == logging.WARNING
    assert partition.log.log_end_offset == end_before
    assert b.coordinator.status is CoordinatorStatus.CLOSED
    assert [b.stored(n).state for n in ("app-a", "app-b")] == [S.ONGOING, S.ONGOING]


def test_a_deposed_coordinators_expiry_pass_removes_nothing(tmp_path: Path) -> None:
    """An id idle past its expiry when the epoch has moved on: the old coordinator's DEAD
    record is refused for the epoch, so no tombstone follows, the id stays for the new
    coordinator, and the old one stands down."""
    b, partition = _broker(tmp_path)
    p = Producer(b, "app").init()
    p.send(P0, range(3))
    p.commit()
    partition.apply(PartitionState((1, 2), 1, EPOCH + 1, (1,)))
    end_before = partition.log.log_end_offset
    b.clock.advance(10**12)  # far past transactional.id.expiration.ms
    result = b.coordinator.expire_idle()
    assert result.transactional_ids == [] and result.sinks == []
    assert partition.log.log_end_offset == end_before  # neither DEAD nor tombstone
    assert b.coordinator.status is CoordinatorStatus.CLOSED
    assert b.stored("app").state is S.COMPLETE_COMMIT


def test_the_next_leaders_coordinator_loads_the_state_and_goes_on(tmp_path: Path) -> None:
    """The epoch moves on (re-elected at EPOCH + 1): a coordinator of the new epoch loads
    what the old one wrote and finishes the transaction."""
    b, partition = _broker(tmp_path)
    p = Producer(b, "app").init(timeout_ms=1_000)
    p.send(P0, range(5))
    partition.apply(PartitionState((1, 2), 1, EPOCH + 1, (1,)))
    with pytest.raises(CoordinatorEpochFencedError):
        p.commit()
    state = LogTxnStateStore(LeaderStatePartition(partition, ACK_TIMEOUT_S), leader_epoch=EPOCH + 1)
    new = TransactionCoordinator(
        state,
        ProducerIdManager(0, FileProducerIdBlockSource(tmp_path / "producer_id_block.json")),
        LocalMarkerWriter(b.store),
        clock=b.clock,
        coordinator_epoch=EPOCH + 1,
        stable_offsets=StoreStableOffsets(b.store),
    )
    new.start()
    b2 = Broker(b.path, b.clock, b.store, state, new)
    p.broker = b2
    p.commit()
    assert b2.committed(P0) == list(range(5))
    assert b2.last_marker(P0) == (p.producer_id, p.epoch, ControlType.COMMIT)
    assert b.coordinator.status is CoordinatorStatus.CLOSED


def test_the_embedded_state_partition_is_led_at_the_given_epoch(tmp_path: Path) -> None:
    store = open_data(tmp_path)
    first = embedded_state_partition(store, 0, 3)
    assert first.partition.leader_epoch == 3 and first.partition.log.leader_epoch == 3
    with pytest.raises(CoordinatorEpochFencedError):
        first.append([("transaction", "x", None)], 2)
    first.append([("transaction", "x", None)], 3)
    assert [row for _, row in first.rows()] == [("transaction", "x", None)]


def _successor(b: Broker, partition: Partition, path: Path) -> tuple[Broker, Partition]:
    """Broker 2's coordinator at EPOCH + 1 over its own replica of the state partition, a
    copy of broker 1's as fetched so far; its markers go to the same data partitions. Broker
    1 has not learned of the election: its replica still leads at EPOCH, alone in its ISR,
    so its appends are acknowledged (the followers that fetched them before they learned
    of the new epoch, in the black-box run)."""
    partition.log.flush()
    shutil.copytree(b.store.data_dir / TXN_STATE_TOPIC, path / "data" / TXN_STATE_TOPIC)
    mine = LogStore(path / "data")
    replica = Partition(TXN_STATE_TOPIC, 0, open_state_log(mine), broker_id=2)
    replica.apply(PartitionState((1, 2), 2, EPOCH + 1, (2,)))
    state = LogTxnStateStore(LeaderStatePartition(replica, ACK_TIMEOUT_S), leader_epoch=EPOCH + 1)
    coordinator = TransactionCoordinator(
        state,
        ProducerIdManager(1, FileProducerIdBlockSource(path / "producer_id_block.json")),
        LocalMarkerWriter(b.store),
        clock=b.clock,
        coordinator_epoch=EPOCH + 1,
        marker_retry_deadline_s=1.0,
        marker_retry_backoff_s=0.001,
        stable_offsets=StoreStableOffsets(b.store),
    )
    coordinator.start()
    return Broker(path, b.clock, b.store, state, coordinator), replica


@pytest.mark.parametrize("case", ["commit_after_abort", "abort_after_commit"])
def test_a_deposed_coordinators_acknowledged_decision_is_stopped_by_the_markers_epoch(
    tmp_path: Path, case: str
) -> None:
    """Issue 35 (docs/failure-model.md, "coordinator paused"): the leader epoch does not
    stop a resumed deposed coordinator whose replica has not learned of the election: its
    decision's append is acknowledged. What stops it is the data partitions' check of the
    markers' coordinator epoch: its successor ended the transaction first, the other
    way, at a higher coordinator epoch, so the deposed one's markers are refused
    (TRANSACTION_COORDINATOR_FENCED), it stands down, and the partition keeps the
    successor's outcome alone."""
    b, partition = _broker(tmp_path / "b1")
    p = Producer(b, "app").init(timeout_ms=1_000)
    p.send(P0, range(5))
    successor, _ = _successor(b, partition, tmp_path / "b2")
    deposed_txn = p.txn
    p.broker = successor
    if case == "commit_after_abort":
        # The producer aborts at the successor, then a client still routed to the deposed
        # coordinator commits there: the dangerous direction.
        p.abort()
        end_before = partition.log.log_end_offset
        with pytest.raises(CoordinatorEpochFencedError, match=f"coordinator epoch {EPOCH}"):
            b.coordinator.end_txn(*deposed_txn, commit=True)
        expected_marker, expected_ids = ControlType.ABORT, []
    else:
        # The successor commits; the deposed one's own clock times the transaction out.
        p.commit()
        end_before = partition.log.log_end_offset
        b.clock.advance(1_001)
        assert b.coordinator.abort_timed_out() == []
        expected_marker, expected_ids = ControlType.COMMIT, list(range(5))
    # The deposed decision was appended and acknowledged at EPOCH (high watermark past it).
    assert partition.log.log_end_offset > end_before
    assert partition.log.high_watermark == partition.log.log_end_offset
    assert b.stored("app").state in (S.PREPARE_COMMIT, S.PREPARE_ABORT)
    # ... and stopped at the data partition: the successor's outcome stands, alone.
    assert b.coordinator.status is CoordinatorStatus.CLOSED
    assert b.stable(P0) and b.committed(P0) == expected_ids
    pid, _, control = b.last_marker(P0)
    assert (pid, control) == (p.producer_id, expected_marker)
    entry = b.store.partition(*P0).state.get(p.producer_id)
    assert entry is not None and entry.coordinator_epoch == EPOCH + 1


def test_a_deposed_coordinators_commit_after_its_successors_timeout_is_refused_by_the_epoch(
    tmp_path: Path,
) -> None:
    """The successor timed the transaction out, which bumps the producer epoch. The
    deposed coordinator's acknowledged PREPARE_COMMIT ends the transaction at its own
    epoch (KIP-890), the same bumped one, so the producer-epoch check lets its markers by;
    the markers' coordinator epoch refuses them (TRANSACTION_COORDINATOR_FENCED) and it
    stands down, the successor's abort alone on the partition."""
    b, partition = _broker(tmp_path / "b1")
    p = Producer(b, "app").init(timeout_ms=1_000)
    p.send(P0, range(5))
    successor, _ = _successor(b, partition, tmp_path / "b2")
    b.clock.advance(1_001)
    assert successor.coordinator.abort_timed_out() == ["app"]
    assert b.last_marker(P0) == (p.producer_id, p.epoch + 1, ControlType.ABORT)
    end_before = partition.log.log_end_offset
    with pytest.raises(CoordinatorEpochFencedError, match=f"coordinator epoch {EPOCH}"):
        b.coordinator.end_txn(*p.txn, commit=True)
    assert partition.log.log_end_offset > end_before  # acknowledged at EPOCH
    assert b.stored("app").state is S.PREPARE_COMMIT
    assert b.coordinator.status is CoordinatorStatus.CLOSED
    assert b.stable(P0) and b.committed(P0) == []
    assert b.last_marker(P0) == (p.producer_id, p.epoch + 1, ControlType.ABORT)
    # Its broker learns of the election: server.coordination.state_coordinator closes it on
    # the role change.
    partition.apply(PartitionState((1, 2), 2, EPOCH + 1, (2,)))
    b.coordinator.close()
    with pytest.raises(NotCoordinatorError):
        b.coordinator.end_txn(*p.txn, commit=True)
