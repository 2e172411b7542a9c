"""Coordinator epochs at the partitions: a marker from a replaced coordinator is refused.

Kafka's rule: a partition keeps, per producer, the coordinator epoch of the last marker;
a marker from a lower coordinator epoch is TRANSACTION_COORDINATOR_FENCED (52, not
retriable) and writes nothing. Replay of the log in recovery does not check it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.cluster.embedded import EmbeddedCluster
from broker_core.cluster.records import BrokerInfo
from broker_core.errors import (
    ErrorCode,
    InvalidProducerEpochError,
    InvalidRecordError,
    TransactionCoordinatorFencedError,
    error_for_code,
)
from broker_core.log.partition_log import PartitionLog
from broker_core.log.producer_state import NO_COORDINATOR_EPOCH
from broker_core.log.validator import MAX_COORDINATOR_EPOCH, check_marker
from broker_core.protocol.wire import Action, error_message, parse_error_message
from broker_core.record.batch import ControlType
from tests.harness.broker import BrokerFactory
from tests.store.helpers import ManualClock, open_log, producer_states, read_ids, rows

PID = 77


def open_txn(log: PartitionLog, epoch: int, start: int) -> None:
    log.append(
        rows(2, start), producer_id=PID, producer_epoch=epoch, base_sequence=0, transactional=True
    )


def coordinator_epoch(log: PartitionLog, pid: int = PID) -> int:
    entry = log.state.get(pid)
    assert entry is not None
    return entry.coordinator_epoch


def test_error_code_52_is_kafkas_and_not_retriable() -> None:
    error = TransactionCoordinatorFencedError("coordinator epoch 1 < 2")
    assert (error.code, error.retriable) == (52, False)
    assert ErrorCode.from_code(52) is ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert type(error_for_code(52, "x")) is TransactionCoordinatorFencedError
    # What the broker's WRITE_TXN_MARKERS handler sends back, and what a peer reads.
    parsed = parse_error_message(error_message(error))
    assert type(parsed) is TransactionCoordinatorFencedError
    assert parsed.message == error.message


def test_marker_from_an_older_coordinator_epoch_is_refused_and_writes_nothing(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path / "p", ManualClock())
    open_txn(log, 0, 0)
    assert coordinator_epoch(log) == NO_COORDINATOR_EPOCH  # no marker yet: any epoch passes
    log.write_marker(PID, 0, ControlType.COMMIT, coordinator_epoch=5)
    assert coordinator_epoch(log) == 5
    open_txn(log, 1, 10)  # the next transaction, at a bumped producer epoch

    end, lso = log.log_end_offset, log.last_stable_offset
    before = producer_states(log)
    with pytest.raises(TransactionCoordinatorFencedError) as info:
        log.write_marker(PID, 1, ControlType.ABORT, coordinator_epoch=4)
    assert info.value.code == 52 and not info.value.retriable
    assert "coordinator_epoch=4" in info.value.message and "5" in info.value.message
    assert (log.log_end_offset, log.last_stable_offset) == (end, lso)
    assert producer_states(log) == before  # the transaction is still open
    assert read_ids(log) == [0, 1]

    # A stale producer epoch is still reported as such first (Kafka's order of checks).
    with pytest.raises(InvalidProducerEpochError):
        log.write_marker(PID, 0, ControlType.ABORT, coordinator_epoch=4)

    # The same coordinator epoch and higher ones are accepted.
    log.write_marker(PID, 1, ControlType.COMMIT, coordinator_epoch=5)
    assert read_ids(log) == [0, 1, 10, 11]
    open_txn(log, 2, 20)
    log.write_marker(PID, 2, ControlType.ABORT, coordinator_epoch=9)
    assert coordinator_epoch(log) == 9
    assert read_ids(log) == [0, 1, 10, 11]
    assert log.last_stable_offset == log.log_end_offset
    log.close()


@pytest.mark.parametrize("restart", ["close", "snapshot_then_crash", "crash_replay"])
def test_coordinator_epoch_survives_restart(tmp_path: Path, restart: str) -> None:
    directory = tmp_path / "p"
    clock = ManualClock()
    log = open_log(directory, clock)
    open_txn(log, 0, 0)
    log.write_marker(PID, 0, ControlType.COMMIT, coordinator_epoch=3)
    other = PID + 1
    log.append(
        rows(1, 50), producer_id=other, producer_epoch=0, base_sequence=0, transactional=True
    )
    log.write_marker(other, 0, ControlType.ABORT, coordinator_epoch=8)
    open_txn(log, 1, 10)
    expected = producer_states(log)
    if restart == "close":
        log.close()  # writes a snapshot
    elif restart == "snapshot_then_crash":
        log.take_snapshot()
        log.abandon()
    else:
        log.abandon()  # no snapshot at all: the markers are replayed from the log

    log = open_log(directory, clock)
    assert producer_states(log) == expected
    assert (coordinator_epoch(log), coordinator_epoch(log, other)) == (3, 8)
    end = log.log_end_offset
    with pytest.raises(TransactionCoordinatorFencedError):
        log.write_marker(PID, 1, ControlType.COMMIT, coordinator_epoch=2)
    assert log.log_end_offset == end
    log.write_marker(PID, 1, ControlType.COMMIT, coordinator_epoch=3)
    assert read_ids(log) == [0, 1, 10, 11]
    log.close()


def test_recovery_replays_markers_without_the_coordinator_check(tmp_path: Path) -> None:
    """A producer forgotten by expiry accepts any coordinator epoch (as in Kafka), so the
    log can hold a lower epoch after a higher one; replaying it must not refuse that."""
    directory = tmp_path / "p"
    clock = ManualClock()
    log = open_log(directory, clock, producer_id_expiration_ms=1000)
    open_txn(log, 0, 0)
    log.write_marker(PID, 0, ControlType.COMMIT, coordinator_epoch=6)
    clock.advance(5000)
    assert log.expire_producers() == [PID]
    open_txn(log, 0, 10)
    log.write_marker(PID, 0, ControlType.ABORT, coordinator_epoch=2)
    log.abandon()  # crash: no snapshot, the whole log is replayed

    log = open_log(directory, clock, producer_id_expiration_ms=1000)
    assert coordinator_epoch(log) == 2  # the last marker's, although lower than before
    assert log.last_stable_offset == log.log_end_offset
    assert read_ids(log) == [0, 1]
    log.close()


def test_check_marker_refuses_coordinator_epochs_outside_int32() -> None:
    for bad in (-1, MAX_COORDINATOR_EPOCH + 1):
        with pytest.raises(InvalidRecordError, match=f"coordinator_epoch={bad}"):
            check_marker(None, PID, 0, bad)
    check_marker(None, PID, 0, MAX_COORDINATOR_EPOCH)


def test_embedded_cluster_counts_an_epoch_per_registration(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    info = BrokerInfo(0, "127.0.0.1", 9092)
    first = EmbeddedCluster(info, path)
    assert first.controller_epoch() == 0
    first.register(info)
    assert first.controller_epoch() == 1
    first.register(BrokerInfo(0, "127.0.0.1", 9093))  # a new address, the same run
    assert first.controller_epoch() == 1
    first.create_topic("t", 1, None, {})
    first.close()
    assert json.loads(path.read_bytes())["controller_epoch"] == 1

    second = EmbeddedCluster(info, path)
    assert second.controller_epoch() == 1  # the previous run's, until it registers
    second.register(info)
    assert second.controller_epoch() == 2
    assert json.loads(path.read_bytes())["controller_epoch"] == 2  # durable at once
    assert set(second.topics()) == {"t"}
    second.close()
    third = EmbeddedCluster(info, path)
    assert third.controller_epoch() == 2
    third.close()


def commit_one(client: BrokerClient, start: int) -> tuple[int, int]:
    """One committed transaction of two rows on fence-0; the producer id and the epoch its
    markers carry (the next transaction's: KIP-890)."""
    pid, epoch = client.init_producer_id("fence-app")
    client.add_partitions_to_txn("fence-app", pid, epoch, [("fence", 0)])
    with client.produce_stream("fence", 0, transactional_id="fence-app") as stream:
        stream.send(
            rows(2, start), producer_id=pid, producer_epoch=epoch, base_sequence=0,
            transactional=True,
        ).offsets(10)  # fmt: skip
    return client.end_txn("fence-app", pid, epoch, commit=True)


def test_broker_refuses_a_stale_coordinators_markers_over_the_wire(tmp_path: Path) -> None:
    """A real embedded broker: each start is a new coordinator epoch, and WRITE_TXN_MARKERS
    from an older one is answered TRANSACTION_COORDINATOR_FENCED."""
    factory = BrokerFactory(tmp_path)
    try:
        broker = factory({}, name="epochs")
        with BrokerClient(broker.address, timeout_s=20.0) as client:
            client.create_topic("fence", 1)
            first_epoch = client.metrics()["transactions"]["coordinator_epoch"]
            assert first_epoch >= 1

            commit_one(client, 0)
        broker.kill()
        broker.restart()
        with BrokerClient(broker.address, timeout_s=20.0) as client:
            second_epoch = client.metrics()["transactions"]["coordinator_epoch"]
            assert second_epoch == first_epoch + 1
            pid, epoch = commit_one(client, 10)  # the new coordinator's markers pass
            end = client.list_offsets("fence", 0)["log_end_offset"]
            stale = {
                "producer_id": pid,
                "producer_epoch": epoch,
                "commit": False,
                "coordinator_epoch": first_epoch,
                "partitions": [["fence", 0]],
            }
            with pytest.raises(TransactionCoordinatorFencedError) as info:
                client.action(broker.address, Action.WRITE_TXN_MARKERS, stale)
            assert info.value.code == 52 and not info.value.retriable
            assert client.list_offsets("fence", 0)["log_end_offset"] == end
            table = client.read_table("fence", 0)
            assert table is not None and table.column("id").to_pylist() == [0, 1, 10, 11]
    finally:
        factory.close()
