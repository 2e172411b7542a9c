"""The transaction coordinator against a real LogStore (docs/design.md §5, §6, §9 scenario 12).

Every test reads the partitions back with ``read_committed`` (the proof of docs/design.md §8): a
committed transaction's rows are all there once, an aborted one's are nowhere, and no
transaction is left hanging (the last stable offset reaches the log end).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker_core.errors import (
    ConcurrentTransactionsError,
    CoordinatorNotAvailableError,
    IdemlogError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTopicError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    NotCoordinatorError,
    ProducerFencedError,
    StorageError,
    UnknownServerError,
)
from broker_core.log.store import LogStore
from broker_core.producer_ids.manager import FileProducerIdBlockSource, ProducerIdManager
from broker_core.protocol.wire import SinkAttempt, SinkTxnStatus
from broker_core.record.batch import MAX_PRODUCER_EPOCH, ControlType
from broker_core.txn.coordinator.coordinator import (
    LocalMarkerWriter,
    MarkerWriter,
    TransactionCoordinator,
)
from broker_core.txn.coordinator.expiry import ExpiryPolicy
from broker_core.txn.coordinator.markers import (
    ProducerMarkers,
    StableOffsets,
    by_partition,
    restricted,
)
from broker_core.txn.state_topic.records import (
    MAX_CLIENT_EPOCH,
    SinkBatchRecord,
    SinkCommitRecord,
    SinkCommitState,
    TransactionMetadata,
    TransactionState,
)
from broker_core.txn.state_topic.store import TXN_STATE_TOPIC, LogTxnStateStore, TxnStateStore
from testkit.state_store import local_state_store
from tests.store.helpers import SCHEMA, ManualClock, read_ids, rows

S = TransactionState
P0, P1, AUDIT = ("payments", 0), ("payments", 1), ("audit", 0)
ALL = [P0, P1, AUDIT]


# -- set-up --------------------------------------------------------------------------------


def open_data(path: Path) -> LogStore:
    store = LogStore(path / "data")
    if not store.topics():
        store.create_topic("payments", 2, schema=SCHEMA)
        store.create_topic("audit", 1, schema=SCHEMA)
    return store


@dataclass
class Broker:
    """One embedded broker's parts: the store, the state store, the coordinator."""

    path: Path
    clock: ManualClock
    store: LogStore
    state: LogTxnStateStore
    coordinator: TransactionCoordinator

    def committed(self, tp: tuple[str, int]) -> list[int]:
        return read_ids(self.store.partition(*tp))

    def uncommitted(self, tp: tuple[str, int]) -> list[int]:
        return read_ids(self.store.partition(*tp), "read_uncommitted")

    def stable(self, tp: tuple[str, int]) -> bool:
        """No transaction left open on the partition."""
        log = self.store.partition(*tp)
        return log.last_stable_offset == log.log_end_offset

    def stored(self, transactional_id: str) -> TransactionMetadata:
        return self.state.load()[0][transactional_id]

    def last_marker(self, tp: tuple[str, int]) -> tuple[int, int, ControlType]:
        log = self.store.partition(*tp)
        found = log.read_control(log.log_end_offset - 1)
        assert found is not None, f"{tp}: the last batch is not a marker"
        header, control = found
        return header.producer_id, header.producer_epoch, control

    def crash(self) -> None:
        """Drop the process's state without flushing or snapshotting anything."""
        for log in self.store.open_logs():
            log.abandon()


class StoreStableOffsets:
    """The coordinator's view of the partitions' LSOs, read from the local store."""

    def __init__(self, store: LogStore) -> None:
        self.store = store

    def last_stable_offsets(self, topic: str) -> dict[int, int]:
        partitions = self.store.topic(topic).partitions
        return {p: self.store.partition(topic, p).last_stable_offset for p in range(partitions)}


def start_broker(
    path: Path,
    markers: Callable[[LogStore], MarkerWriter] = LocalMarkerWriter,
    *,
    clock: ManualClock | None = None,
    coordinator_epoch: int = 0,
    wrap_state: Callable[[LogTxnStateStore], TxnStateStore] | None = None,
    marker_retry_deadline_s: float = 30.0,
    expiry: ExpiryPolicy | None = None,
    state_segment_bytes: int | None = None,
) -> Broker:
    clock = clock or ManualClock()
    store = open_data(path)
    state = local_state_store(store, segment_bytes=state_segment_bytes)
    pids = ProducerIdManager(0, FileProducerIdBlockSource(path / "producer_id_block.json"))
    coordinator = TransactionCoordinator(
        state if wrap_state is None else wrap_state(state),
        pids,
        markers(store),
        clock=clock,
        coordinator_epoch=coordinator_epoch,
        marker_retry_deadline_s=marker_retry_deadline_s,
        marker_retry_backoff_s=0.001,
        stable_offsets=StoreStableOffsets(store),
        expiry=expiry,
    )
    coordinator.start()
    return Broker(path, clock, store, state, coordinator)


@pytest.fixture
def broker(tmp_path: Path) -> Broker:
    return start_broker(tmp_path)


@dataclass
class Producer:
    """A transactional producer writing straight into the store's partitions."""

    broker: Broker
    transactional_id: str
    producer_id: int = -1
    epoch: int = -1
    sequences: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    # A sink task attempt's batch, and where its rows went (first, last offset).
    batch: int = -1
    status: SinkTxnStatus = SinkTxnStatus.NEW
    offsets: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    ended: tuple[str, int, int] = ("", -1, -1)  # the EndTxn that ended the last transaction

    def init(self, timeout_ms: int | None = None) -> Producer:
        self.producer_id, self.epoch = self.broker.coordinator.init_producer_id(
            self.transactional_id, timeout_ms
        )
        self.sequences.clear()
        return self

    def init_sink(self, batch: int, run: str = "run-1", timeout_ms: int | None = None) -> Producer:
        """InitProducerId as an attempt of Spark task ``<sink>/<partition>`` of ``batch``."""
        sink = self.transactional_id.rsplit("/", 1)[0]
        self.producer_id, self.epoch, self.status = self.broker.coordinator.init_sink_producer(
            self.transactional_id, timeout_ms, SinkAttempt(sink, run, batch)
        )
        self.batch = batch
        self.sequences.clear()
        self.offsets.clear()
        return self

    def prepare(self) -> None:
        ranges = [(t, p, first, last) for (t, p), (first, last) in sorted(self.offsets.items())]
        self.broker.coordinator.prepare_sink_txn(*self.txn, self.batch, ranges)

    @property
    def txn(self) -> tuple[str, int, int]:
        return self.transactional_id, self.producer_id, self.epoch

    def send(self, tp: tuple[str, int], ids: range) -> None:
        """add_partitions, then append ``ids`` as one transactional batch."""
        self.broker.coordinator.add_partitions(
            self.transactional_id, self.producer_id, self.epoch, [tp]
        )
        self.append(tp, ids)

    def append(self, tp: tuple[str, int], ids: range) -> None:
        result = self.broker.store.partition(*tp).append(
            rows(len(ids), ids.start),
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            base_sequence=self.sequences[tp],
            transactional=True,
        )
        self.sequences[tp] += len(ids)
        first, _ = self.offsets.get(tp, (result.base_offset, result.last_offset))
        self.offsets[tp] = (first, result.last_offset)

    def commit(self) -> None:
        self.end(commit=True)

    def abort(self) -> None:
        self.end(commit=False)

    def end(self, commit: bool) -> None:
        """EndTxn; once it succeeds the producer goes on at the epoch it was answered (each
        transaction ends at its own: KIP-890), every partition's sequences from 0. A call
        that raised leaves it where it was, so calling again is the client's retry."""
        self.ended = self.txn
        self.producer_id, self.epoch = self.broker.coordinator.end_txn(*self.ended, commit=commit)
        self.sequences.clear()

    def retry_end(self, commit: bool) -> tuple[int, int]:
        """The EndTxn that ended the last transaction, sent again (a client's retry of a
        call whose answer was lost): answered as that call was."""
        return self.broker.coordinator.end_txn(*self.ended, commit=commit)


class CrashingMarkers:
    """Markers that fail like a dying coordinator on call ``crash_on_call`` (1-based),
    after the first ``partitions_before_crash`` partitions of that call were written."""

    def __init__(
        self, store: LogStore, *, crash_on_call: int = 1, partitions_before_crash: int = 1
    ) -> None:
        self.inner = LocalMarkerWriter(store)
        self.crash_on_call = crash_on_call
        self.partitions_before_crash = partitions_before_crash
        self.calls = 0

    def write_markers(
        self, producers: Sequence[ProducerMarkers], commit: bool, coordinator_epoch: int
    ) -> StableOffsets:
        self.calls += 1
        if self.calls != self.crash_on_call:
            return self.inner.write_markers(producers, commit, coordinator_epoch)
        done = sorted(by_partition(producers))[: self.partitions_before_crash]
        self.inner.write_markers(restricted(producers, done), commit, coordinator_epoch)
        raise UnknownServerError("simulated coordinator crash while writing markers")


class FlakyMarkers:
    """Markers failing with a retriable error while ``failures_left`` > 0."""

    def __init__(self, store: LogStore, failures: int) -> None:
        self.inner = LocalMarkerWriter(store)
        self.failures_left = failures

    def write_markers(
        self, producers: Sequence[ProducerMarkers], commit: bool, coordinator_epoch: int
    ) -> StableOffsets:
        if self.failures_left > 0:
            self.failures_left -= 1
            raise StorageError("simulated disk hiccup")
        return self.inner.write_markers(producers, commit, coordinator_epoch)


# -- docs/design.md §9 scenario 12 ----------------------------------------------------------


def test_scenario_12_init_on_a_known_id_fences_the_old_holder(broker: Broker) -> None:
    c = broker.coordinator
    old = Producer(broker, "app-1").init()
    assert old.epoch == 0
    old.send(P0, range(0, 10))
    old.send(P1, range(10, 20))
    assert broker.uncommitted(P0) == list(range(10))
    assert broker.committed(P0) == []

    new = Producer(broker, "app-1").init()
    assert (new.producer_id, new.epoch) == (old.producer_id, 1)  # same PID, bumped epoch

    # The open transaction was aborted with markers at the new epoch ...
    for tp in (P0, P1):
        assert broker.last_marker(tp) == (old.producer_id, 1, ControlType.ABORT)
        assert broker.committed(tp) == []
        assert broker.stable(tp)
    # ... so the partitions reject the old holder's appends ...
    with pytest.raises(InvalidProducerEpochError) as info:
        old.append(P0, range(20, 25))
    assert info.value.code == 47
    # ... and the coordinator its requests.
    with pytest.raises(ProducerFencedError) as fenced:
        old.commit()
    assert fenced.value.code == 90
    assert "epoch 0 is older than the current epoch 1" in fenced.value.message
    with pytest.raises(ProducerFencedError):
        c.add_partitions("app-1", old.producer_id, 0, [AUDIT])
    assert broker.stored("app-1").state is S.EMPTY

    # The new holder starts at sequence 0 of its epoch and commits normally.
    new.send(P0, range(100, 105))
    new.commit()
    assert broker.committed(P0) == list(range(100, 105))
    assert broker.committed(P1) == []
    assert c.describe()["transactions_fenced"] == 1


def test_init_without_transactional_id_is_idempotent_only(broker: Broker) -> None:
    c = broker.coordinator
    a, b = c.init_producer_id(None), c.init_producer_id(None)
    assert a[1] == b[1] == 0 and a[0] != b[0]
    assert broker.state.load() == ({}, {})  # nothing to remember for them


# -- commit / abort -----------------------------------------------------------------------


def test_commit_and_abort_across_three_partitions_of_two_topics(broker: Broker) -> None:
    p = Producer(broker, "etl").init()
    for i, tp in enumerate(ALL):
        p.send(tp, range(i * 10, i * 10 + 5))
    assert broker.stored("etl").partitions == set(ALL)
    assert all(broker.committed(tp) == [] for tp in ALL)
    p.commit()
    assert [broker.committed(tp) for tp in ALL] == [
        list(range(0, 5)),
        list(range(10, 15)),
        list(range(20, 25)),
    ]
    assert broker.stored("etl").state is S.COMPLETE_COMMIT
    # The markers carry the next transaction's epoch (each ends at its own: KIP-890).
    first_epoch = p.ended[2]
    assert p.epoch == first_epoch + 1
    assert all(broker.last_marker(tp) == (p.producer_id, p.epoch, ControlType.COMMIT) for tp in ALL)
    assert p.retry_end(commit=True) == (p.producer_id, p.epoch)  # a retried request: idempotent
    with pytest.raises(
        InvalidTxnStateError,
        match=r"cannot abort the transaction of producer id \d+ epoch 0, it ended COMPLETE_COMMIT",
    ):
        p.retry_end(commit=False)  # not the way it ended

    for i, tp in enumerate(ALL):  # a second transaction, at the next epoch
        p.send(tp, range(100 + i * 10, 100 + i * 10 + 5))
    assert broker.stored("etl").state is S.ONGOING
    with pytest.raises(InvalidTxnStateError, match=r"a late commit .* epoch 1 \(ONGOING\)"):
        p.retry_end(commit=True)  # the first transaction's EndTxn, late: ends nothing
    assert broker.stored("etl").state is S.ONGOING
    p.abort()
    assert p.epoch == first_epoch + 2
    assert [broker.committed(tp) for tp in ALL] == [
        list(range(0, 5)),
        list(range(10, 15)),
        list(range(20, 25)),
    ]
    assert all(broker.stable(tp) for tp in ALL)
    assert p.retry_end(commit=False) == (p.producer_id, p.epoch)  # retried
    with pytest.raises(
        InvalidTxnStateError, match="cannot commit, the transaction is COMPLETE_ABORT"
    ):
        p.commit()  # at the next epoch: nothing begun
    with pytest.raises(InvalidTxnStateError, match="no transaction is open"):
        Producer(broker, "etl").init().commit()
    described = broker.coordinator.describe()
    assert (described["transactions_committed"], described["transactions_aborted"]) == (1, 1)


def test_add_partitions_is_durable_and_idempotent(broker: Broker) -> None:
    p = Producer(broker, "adder").init()
    broker.clock.advance(10)
    broker.coordinator.add_partitions(*p.txn, [P0])
    start = broker.stored("adder").txn_start_ms
    assert start == broker.clock.now
    broker.clock.advance(10)
    broker.coordinator.add_partitions(*p.txn, [P0, P1])
    stored = broker.stored("adder")
    assert (stored.state, stored.partitions, stored.txn_start_ms) == (S.ONGOING, {P0, P1}, start)
    records = broker.store.partition(TXN_STATE_TOPIC, 0).log_end_offset
    broker.coordinator.add_partitions(*p.txn, [P1])  # nothing new: nothing written
    assert broker.store.partition(TXN_STATE_TOPIC, 0).log_end_offset == records


def test_a_late_add_partitions_of_an_ended_transaction_begins_nothing(broker: Broker) -> None:
    """An add_partitions of a transaction that has ended (a request delayed past the
    EndTxn) is refused at its epoch: it never begins a transaction holding only the late
    partition, which its producer did not begin."""
    p = Producer(broker, "latecomer").init()
    p.send(P0, range(0, 3))
    p.commit()
    ended_pid, ended_epoch = p.ended[1:]
    assert (p.producer_id, p.epoch) != (ended_pid, ended_epoch)
    with pytest.raises(ProducerFencedError):
        broker.coordinator.add_partitions("latecomer", ended_pid, ended_epoch, [P1])
    stored = broker.stored("latecomer")
    assert (stored.state, stored.partitions) == (S.COMPLETE_COMMIT, set())
    # The producer's own next transaction begins at the epoch the commit answered.
    p.send(P1, range(3, 5))
    assert (broker.stored("latecomer").state, broker.stored("latecomer").partitions) == (
        S.ONGOING,
        {P1},
    )


# -- sink commits (docs/design.md §6) ----------------------------------------------------------


def attempt(
    broker: Broker, sink: str, first_id: int, batch: int, run: str | None = None
) -> list[tuple[str, int, int]]:
    """One run of a Spark batch: each of 2 tasks fences older attempts, writes 5 rows and
    prepares. Each call is a new run of the sink unless ``run`` names one."""
    run = run or f"run-{first_id}"
    txns = []
    for task, tp in enumerate((P0, P1)):
        producer = Producer(broker, f"{sink}/{task}").init_sink(batch, run)
        producer.send(tp, range(first_id + task * 5, first_id + task * 5 + 5))
        producer.prepare()
        txns.append(producer.txn)
    return txns


def test_sink_commit_is_idempotent_per_batch(broker: Broker) -> None:
    c = broker.coordinator
    assert c.last_committed_batch("q1") is None
    assert c.commit_sink_batch("q1", 5, attempt(broker, "q1", 0, 5)) is True
    assert c.last_committed_batch("q1") == 5
    assert broker.committed(P0) + broker.committed(P1) == list(range(10))

    # The batch re-run after a driver crash: same batch id, new attempts -> aborted.
    assert c.commit_sink_batch("q1", 5, attempt(broker, "q1", 100, 5)) is False
    assert c.commit_sink_batch("q1", 4, attempt(broker, "q1", 200, 4)) is False  # older batch
    assert broker.committed(P0) + broker.committed(P1) == list(range(10))
    assert broker.stable(P0) and broker.stable(P1)
    assert broker.uncommitted(P0) == [*range(5), *range(100, 105), *range(200, 205)]
    assert c.last_committed_batch("q1") == 5

    assert c.commit_sink_batch("q1", 6, attempt(broker, "q1", 300, 6)) is True
    assert broker.committed(P0) == [0, 1, 2, 3, 4, 300, 301, 302, 303, 304]
    sink = broker.state.load()[1]["q1"]
    assert (sink.batch_id, sink.state) == (6, SinkCommitState.COMPLETE)
    d = c.describe()
    assert (d["sink_batches_committed"], d["sink_batches_repeated"]) == (2, 2)
    assert d["by_state"]["ONGOING"] == 0


def test_abort_sink_batch_then_commit_of_it_records_nothing(broker: Broker) -> None:
    c = broker.coordinator
    c.commit_sink_batch("q2", 1, attempt(broker, "q2", 0, 1))
    txns = attempt(broker, "q2", 50, 2)
    c.abort_sink_batch("q2", 2, txns)
    assert broker.committed(P0) == [0, 1, 2, 3, 4] and broker.stable(P0)
    with pytest.raises(InvalidTxnStateError, match="'q2/0' is COMPLETE_ABORT and cannot be"):
        c.commit_sink_batch("q2", 2, txns)
    assert c.last_committed_batch("q2") == 1
    c.abort_sink_batch("q2", 1, attempt(broker, "q2", 0, 1)[:0])  # nothing to abort: fine


def test_sink_commit_with_a_fenced_transaction_records_nothing(broker: Broker) -> None:
    c = broker.coordinator
    first = Producer(broker, "q3/0").init_sink(1, "r")
    first.send(P0, range(0, 5))  # task 0 fails before it prepared
    other = Producer(broker, "q3/1").init_sink(1, "r")
    other.send(P1, range(5, 10))
    other.prepare()
    txns = [first.txn, other.txn]
    # Spark retried task 0: the first attempt is fenced.
    retry = Producer(broker, "q3/0").init_sink(1, "r")
    with pytest.raises(ProducerFencedError, match="'q3/0'"):
        c.commit_sink_batch("q3", 1, txns)
    assert c.last_committed_batch("q3") is None
    assert "q3" not in broker.state.load()[1]
    assert broker.stored("q3/1").state is S.ONGOING  # the other task's work is untouched
    assert broker.committed(P1) == []
    # The retried attempt's commit goes through.
    retry.send(P0, range(60, 65))
    retry.prepare()
    assert c.commit_sink_batch("q3", 1, [retry.txn, txns[1]]) is True
    assert broker.committed(P0) == list(range(60, 65))
    assert broker.committed(P1) == list(range(5, 10))


def test_a_prepared_sink_attempt_is_reused_not_fenced(broker: Broker) -> None:
    """Speculation: a later attempt of a finished task of the same run keeps its work."""
    c = broker.coordinator
    first = Producer(broker, "q4/0").init_sink(7, "r1")
    assert first.status is SinkTxnStatus.NEW
    first.send(P0, range(0, 5))
    # Not prepared yet: a twin fences it (its transaction aborted, its appends refused).
    twin = Producer(broker, "q4/0").init_sink(7, "r1")
    assert twin.status is SinkTxnStatus.NEW and twin.epoch == first.epoch + 1
    with pytest.raises(ProducerFencedError):
        first.prepare()
    twin.send(P0, range(10, 15))
    twin.prepare()
    twin.prepare()  # a retried request
    # Prepared: a later attempt of the same batch reuses it and writes nothing.
    pid, epoch, status = c.init_sink_producer("q4/0", None, SinkAttempt("q4", "r1", 7))
    assert (pid, epoch, status) == (twin.producer_id, twin.epoch, SinkTxnStatus.PREPARED)
    assert c.describe()["sink_attempts_reused"] == 1
    assert c.commit_sink_batch("q4", 7, [twin.txn], "r1") is True
    pid, epoch, status = c.init_sink_producer("q4/0", None, SinkAttempt("q4", "r1", 7))
    assert status is SinkTxnStatus.COMMITTED and (pid, epoch) == twin.txn[1:]
    assert broker.committed(P0) == list(range(10, 15)) and broker.stable(P0)
    # The next batch starts afresh under a new epoch.
    nxt = Producer(broker, "q4/0").init_sink(8, "r1")
    assert nxt.status is SinkTxnStatus.NEW and nxt.epoch == twin.epoch + 1
    stored = broker.stored("q4/0")
    assert (stored.sink_batch, stored.sink_prepared, stored.sink_ranges) == (8, False, [])


def test_an_aborted_prepared_attempt_is_written_again(broker: Broker) -> None:
    c = broker.coordinator
    p = Producer(broker, "q5/0").init_sink(1)
    p.send(P0, range(0, 5))
    p.prepare()
    c.abort_sink_batch("q5", 1, [p.txn])
    again = Producer(broker, "q5/0").init_sink(1)
    assert again.status is SinkTxnStatus.NEW and again.epoch == p.epoch + 1
    assert broker.committed(P0) == [] and broker.stable(P0)


# -- a coordinator dying half-way -------------------------------------------------------------


def test_crash_while_writing_markers_is_finished_by_a_new_coordinator(tmp_path: Path) -> None:
    a = start_broker(tmp_path, lambda s: CrashingMarkers(s, partitions_before_crash=1))
    p = Producer(a, "etl").init()
    for i, tp in enumerate(ALL):
        p.send(tp, range(i * 10, i * 10 + 3))
    with pytest.raises(UnknownServerError, match="simulated coordinator crash"):
        p.commit()
    assert a.stored("etl").state is S.PREPARE_COMMIT  # the decision is durable
    partitions = sorted(ALL)  # markers go out in sorted order
    assert a.committed(partitions[0]) != [] and a.committed(partitions[1]) == []
    a.crash()

    b = start_broker(tmp_path, coordinator_epoch=1)
    assert b.stored("etl").state is S.COMPLETE_COMMIT
    assert [b.committed(tp) for tp in ALL] == [[0, 1, 2], [10, 11, 12], [20, 21, 22]]
    assert all(b.stable(tp) for tp in ALL)
    p.broker = b
    p.commit()  # the client's retry of end_txn now succeeds


def test_failed_markers_stay_prepared_until_a_later_call_finishes(tmp_path: Path) -> None:
    b = start_broker(tmp_path, lambda s: CrashingMarkers(s, partitions_before_crash=0))
    p = Producer(b, "etl").init()
    p.send(P0, range(3))
    with pytest.raises(UnknownServerError):
        p.abort()
    assert b.stored("etl").state is S.PREPARE_ABORT
    assert not b.stable(P0)
    b.coordinator.abort_timed_out()  # the periodic sweep re-drives leftovers too
    assert b.stored("etl").state is S.COMPLETE_ABORT
    assert b.stable(P0) and b.committed(P0) == []
    with pytest.raises(
        InvalidTxnStateError, match=r"cannot commit the .* epoch 0, it ended COMPLETE_ABORT"
    ):
        p.commit()  # the other way, at the epoch the abort was asked at
    p.abort()  # the client's retry: told the outcome, at the epoch the markers carry
    assert p.epoch == 1 and b.last_marker(P0) == (p.producer_id, 1, ControlType.ABORT)


def test_a_retried_end_txn_finishes_the_markers_it_left(tmp_path: Path) -> None:
    b = start_broker(tmp_path, lambda s: CrashingMarkers(s, partitions_before_crash=1))
    p = Producer(b, "etl").init()
    p.send(P0, range(3))
    p.send(P1, range(10, 13))
    with pytest.raises(UnknownServerError):
        p.abort()
    assert b.stored("etl").state is S.PREPARE_ABORT
    with pytest.raises(
        InvalidTxnStateError, match=r"cannot commit the .* epoch 0, it ended COMPLETE_ABORT"
    ):
        p.commit()  # the other way: the abort's markers finished first, then refused
    assert b.stored("etl").state is S.COMPLETE_ABORT
    assert all(b.stable(tp) and b.committed(tp) == [] for tp in (P0, P1))


def test_crash_midway_through_a_sink_commit_is_finished_on_start(tmp_path: Path) -> None:
    # One marker call for the whole batch (docs/design.md §6): it dies after the first
    # partition's markers, of every task, were appended.
    a = start_broker(tmp_path, lambda s: CrashingMarkers(s, crash_on_call=1))
    txns = []
    for task, tp in enumerate(ALL):
        producer = Producer(a, f"q/{task}").init_sink(3)
        producer.send(tp, range(task * 10, task * 10 + 4))
        producer.send(P0, range(100 + task * 10, 100 + task * 10 + 2))
        producer.prepare()
        txns.append(producer.txn)
    with pytest.raises(UnknownServerError):
        a.coordinator.commit_sink_batch("q", 3, txns)
    states = {tid: a.stored(tid).state for tid, _, _ in txns}
    # The sink record's PREPARE is the decision: no PREPARE_COMMIT of their own.
    assert states == dict.fromkeys(states, S.ONGOING)
    assert a.stable(sorted(ALL)[0]) and not a.stable(sorted(ALL)[-1])
    assert a.state.load()[1]["q"].state == SinkCommitState.PREPARE
    assert a.coordinator.last_committed_batch("q") == 3  # decided, if not yet visible
    a.crash()

    b = start_broker(tmp_path, coordinator_epoch=1)
    assert {tid: b.stored(tid).state for tid, _, _ in txns} == dict.fromkeys(
        states, S.COMPLETE_COMMIT
    )
    record = b.state.load()[1]["q"]
    assert (record.batch_id, record.state, record.transactions) == (
        3,
        SinkCommitState.COMPLETE,
        txns,
    )
    expected = {P0: [0, 1, 2, 3], P1: [10, 11, 12, 13], AUDIT: [20, 21, 22, 23]}
    expected[P0] += [100, 101, 110, 111, 120, 121]
    for tp, ids in expected.items():
        assert sorted(b.committed(tp)) == ids and b.stable(tp)
    # Spark re-runs the batch after the crash: no second copy.
    assert b.coordinator.commit_sink_batch("q", 3, attempt(b, "q", 500, 3)) is False
    for tp, ids in expected.items():
        assert sorted(b.committed(tp)) == ids


class FailingPuts:
    """A state store that, once armed, lets ``succeed`` puts through and then fails one,
    as if the process died just before that write."""

    def __init__(self, inner: LogTxnStateStore) -> None:
        self.inner = inner
        self.puts_left: int | None = None

    def arm(self, succeed: int) -> None:
        self.puts_left = succeed

    def load(self) -> tuple[dict[str, TransactionMetadata], dict[str, SinkCommitRecord]]:
        return self.inner.load()

    def _maybe_fail(self) -> None:
        if self.puts_left is None:
            return
        if self.puts_left == 0:
            self.puts_left = None
            raise StorageError("simulated crash before the write")
        self.puts_left -= 1

    def put_transaction(self, meta: TransactionMetadata, *, coordinator_epoch: int = 0) -> None:
        self._maybe_fail()
        self.inner.put_transaction(meta, coordinator_epoch=coordinator_epoch)

    def put_sink(self, record: SinkCommitRecord, *, coordinator_epoch: int = 0) -> None:
        self._maybe_fail()
        self.inner.put_sink(record, coordinator_epoch=coordinator_epoch)

    def put_transactions(
        self, metas: Sequence[TransactionMetadata], *, coordinator_epoch: int = 0
    ) -> None:
        self._maybe_fail()  # one write for all of them
        self.inner.put_transactions(metas, coordinator_epoch=coordinator_epoch)

    def put_sink_batch(self, record: SinkBatchRecord, *, coordinator_epoch: int = 0) -> None:
        self._maybe_fail()
        self.inner.put_sink_batch(record, coordinator_epoch=coordinator_epoch)

    def delete_sink_batch(self, sink_id: str, batch_id: int, *, coordinator_epoch: int = 0) -> None:
        self._maybe_fail()
        self.inner.delete_sink_batch(sink_id, batch_id, coordinator_epoch=coordinator_epoch)

    def load_sink_batches(self) -> list[SinkBatchRecord]:
        return self.inner.load_sink_batches()

    def delete_transaction(self, transactional_id: str, *, coordinator_epoch: int = 0) -> None:
        self._maybe_fail()
        self.inner.delete_transaction(transactional_id, coordinator_epoch=coordinator_epoch)

    def delete_sink(self, sink_id: str, *, coordinator_epoch: int = 0) -> None:
        self._maybe_fail()
        self.inner.delete_sink(sink_id, coordinator_epoch=coordinator_epoch)


def test_a_pending_sink_commit_is_never_aborted(tmp_path: Path) -> None:
    """Crash right after the sink's PREPARE record: its transactions are all still ONGOING.
    Neither the timeout sweep nor a new InitProducerId may abort them: they commit."""
    failing: list[FailingPuts] = []

    def wrap(state: LogTxnStateStore) -> FailingPuts:
        failing.append(FailingPuts(state))
        return failing[0]

    a = start_broker(tmp_path, wrap_state=wrap)
    txns = attempt(a, "s", 0, 1)
    failing[0].arm(succeed=1)  # the sink PREPARE record lands, the next put fails
    with pytest.raises(StorageError):
        a.coordinator.commit_sink_batch("s", 1, txns)
    assert a.state.load()[1]["s"].state == SinkCommitState.PREPARE
    assert a.stored("s/0").state is a.stored("s/1").state is S.ONGOING
    # Still in the same coordinator: a task retry (InitProducerId) finishes the commit first.
    retry = Producer(a, "s/0").init()
    assert retry.epoch == txns[0][2] + 1
    assert a.committed(P0) == list(range(5)) and a.committed(P1) == list(range(5, 10))
    assert a.state.load()[1]["s"].state == SinkCommitState.COMPLETE

    # Again, now across a restart, with the transactions long past their timeout.
    txns = attempt(a, "s", 20, 2)
    failing[0].arm(succeed=1)
    with pytest.raises(StorageError):
        a.coordinator.commit_sink_batch("s", 2, txns)
    a.crash()
    clock = ManualClock(a.clock.now + 3_600_000)
    b = start_broker(tmp_path, clock=clock)
    assert b.coordinator.abort_timed_out() == []
    assert b.committed(P0) == [0, 1, 2, 3, 4, 20, 21, 22, 23, 24]
    assert b.coordinator.last_committed_batch("s") == 2


def test_a_stale_view_of_a_finished_sink_commit_changes_nothing(tmp_path: Path) -> None:
    """A sweep that saw batch 1 pending must not, once it runs, undo batch 2's record."""
    b = start_broker(tmp_path, lambda s: CrashingMarkers(s, partitions_before_crash=0))
    with pytest.raises(UnknownServerError):
        b.coordinator.commit_sink_batch("s", 1, attempt(b, "s", 0, 1))
    stale = b.state.load()[1]["s"]
    assert stale.is_pending
    # Batch 1 is finished on the way (its transactions are re-initialised by attempt()).
    assert b.coordinator.commit_sink_batch("s", 2, attempt(b, "s", 10, 2)) is True
    b.coordinator._steps.recover_sink(stale)  # what the sweep does with its earlier scan
    record = b.state.load()[1]["s"]
    assert (record.batch_id, record.state) == (2, SinkCommitState.COMPLETE)
    assert b.coordinator.last_committed_batch("s") == 2
    assert b.committed(P0) == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14]


def test_default_timeout_follows_a_lower_maximum(tmp_path: Path) -> None:
    b = start_broker(tmp_path)
    c = TransactionCoordinator(
        b.state,
        ProducerIdManager(0, FileProducerIdBlockSource(tmp_path / "pids")),
        LocalMarkerWriter(b.store),
        max_timeout_ms=30_000,
    )
    c.start()
    c.init_producer_id("t")
    assert b.stored("t").timeout_ms == 30_000
    with pytest.raises(InvalidTransactionTimeoutError):
        c.init_producer_id("t", 30_001)


# -- retries and concurrency ----------------------------------------------------------------


def test_retriable_marker_errors_are_retried_until_the_deadline(tmp_path: Path) -> None:
    flaky: list[FlakyMarkers] = []

    def markers(store: LogStore) -> FlakyMarkers:
        flaky.append(FlakyMarkers(store, failures=3))
        return flaky[0]

    b = start_broker(tmp_path, markers, marker_retry_deadline_s=0.3)
    p = Producer(b, "t").init()
    p.send(P0, range(5))
    p.commit()
    assert b.committed(P0) == list(range(5))
    assert b.coordinator.describe()["marker_retries"] == 3

    flaky[0].failures_left = 10**9  # now past the deadline
    p.send(P0, range(5, 10))
    with pytest.raises(StorageError):
        p.commit()
    assert b.stored("t").state is S.PREPARE_COMMIT
    flaky[0].failures_left = 0
    p.commit()  # the client's retry finishes it
    assert b.committed(P0) == list(range(10))


class BlockingMarkers:
    def __init__(self, store: LogStore) -> None:
        self.inner = LocalMarkerWriter(store)
        self.entered = threading.Event()
        self.release = threading.Event()

    def write_markers(
        self, producers: Sequence[ProducerMarkers], commit: bool, coordinator_epoch: int
    ) -> StableOffsets:
        self.entered.set()
        assert self.release.wait(10), "test never released the marker write"
        return self.inner.write_markers(producers, commit, coordinator_epoch)


def test_requests_during_a_marker_write_get_concurrent_transactions(tmp_path: Path) -> None:
    blocking: list[BlockingMarkers] = []

    def markers(store: LogStore) -> BlockingMarkers:
        blocking.append(BlockingMarkers(store))
        return blocking[0]

    b = start_broker(tmp_path, markers)
    p = Producer(b, "slow").init()
    p.send(P0, range(3))
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            p.commit()
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    worker = threading.Thread(target=commit)
    worker.start()
    assert blocking[0].entered.wait(10)
    for request in (
        p.commit,
        lambda: b.coordinator.add_partitions(*p.txn, [P1]),
        lambda: b.coordinator.init_producer_id("slow"),
    ):
        with pytest.raises(ConcurrentTransactionsError) as info:
            request()
        assert info.value.retriable and info.value.code == 51
    assert b.coordinator.abort_timed_out(b.clock.now + 10**9) == []  # busy: left alone
    blocking[0].release.set()
    worker.join(10)
    assert not worker.is_alive() and errors == []
    assert b.committed(P0) == [0, 1, 2]


def test_concurrent_producers_each_commit_once(broker: Broker) -> None:
    errors: list[BaseException] = []

    def run(task: int) -> None:
        try:
            p = Producer(broker, f"worker/{task}").init()
            for round_ in range(4):
                base = task * 1000 + round_ * 10
                p.send((P0, P1)[task % 2], range(base, base + 5))
                (p.commit if round_ % 2 == 0 else p.abort)()
        except BaseException as exc:
            errors.append(exc)

    # One partition log takes appends from several threads: each holds its own sequences.
    threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    committed = sorted(broker.committed(P0) + broker.committed(P1))
    expected = sorted(t * 1000 + r * 10 + i for t in range(8) for r in (0, 2) for i in range(5))
    assert committed == expected
    assert broker.stable(P0) and broker.stable(P1)


# -- timeouts and epochs ------------------------------------------------------------------------


def test_transaction_timeout_aborts_with_an_epoch_bump(broker: Broker) -> None:
    c, clock = broker.coordinator, broker.clock
    slow = Producer(broker, "slow").init(timeout_ms=1_000)
    patient = Producer(broker, "patient").init(timeout_ms=5_000)
    Producer(broker, "idle").init(timeout_ms=1)
    slow.send(P0, range(5))
    patient.send(P1, range(10, 15))
    clock.advance(1_000)
    assert c.abort_timed_out() == []  # exactly at the timeout: not over it
    clock.advance(1)
    assert c.abort_timed_out() == ["slow"]
    assert c.abort_timed_out() == []
    assert broker.last_marker(P0) == (slow.producer_id, 1, ControlType.ABORT)
    assert broker.committed(P0) == [] and broker.stable(P0)
    assert not broker.stable(P1)  # the patient transaction is still open
    assert broker.stored("idle").state is S.EMPTY  # nothing open: nothing to time out
    with pytest.raises(ProducerFencedError):
        slow.commit()
    with pytest.raises(InvalidProducerEpochError):
        slow.append(P0, range(5, 6))
    assert slow.init().epoch == 2
    patient.commit()
    assert broker.committed(P1) == list(range(10, 15))
    assert c.describe()["transactions_timed_out"] == 1


def test_epoch_exhaustion_gives_a_new_producer_id(tmp_path: Path) -> None:
    b = start_broker(tmp_path)
    pid = b.coordinator.init_producer_id(None)[0]
    now = b.clock.now
    b.state.put_transaction(
        TransactionMetadata(
            "z", pid, MAX_CLIENT_EPOCH - 1, 60_000, S.COMPLETE_COMMIT, set(), now, now
        )
    )
    # An ONGOING transaction at the last epoch a client may hold, with data in P0.
    y_pid = b.coordinator.init_producer_id(None)[0]
    b.state.put_transaction(
        TransactionMetadata("y", y_pid, MAX_CLIENT_EPOCH, 60_000, S.ONGOING, {P0}, now, now)
    )
    y = Producer(b, "y", y_pid, MAX_CLIENT_EPOCH)
    y.append(P0, range(5))
    b.crash()
    b = start_broker(tmp_path)

    assert b.coordinator.init_producer_id("z") == (pid, MAX_CLIENT_EPOCH)
    new_pid, epoch = b.coordinator.init_producer_id("z")
    assert epoch == 0 and new_pid not in (pid, y_pid)
    assert b.stored("z").previous_producer_id == pid
    with pytest.raises(ProducerFencedError, match="was replaced by"):
        b.coordinator.end_txn("z", pid, MAX_CLIENT_EPOCH, True)

    y_new, y_epoch = b.coordinator.init_producer_id("y")
    assert y_epoch == 0 and y_new != y_pid
    # The fence used the one epoch kept in reserve for it.
    assert b.last_marker(P0) == (y_pid, MAX_PRODUCER_EPOCH, ControlType.ABORT)
    assert b.committed(P0) == [] and b.stable(P0)
    y.broker = b
    with pytest.raises(InvalidProducerEpochError):
        y.append(P0, range(5, 6))
    assert b.coordinator.describe()["producer_id_rotations"] == 2


def test_an_end_at_the_last_epoch_gives_the_next_transaction_a_new_producer_id(
    tmp_path: Path,
) -> None:
    """Each transaction ends at its own epoch (KIP-890): the one ending at the last epoch a
    client may hold has its markers at the reserved epoch, and the next transaction gets a
    new producer id, even when the first EndTxn failed on its markers and a retry ended it."""
    b = start_broker(tmp_path, lambda s: CrashingMarkers(s, partitions_before_crash=0))
    pid = b.coordinator.init_producer_id(None)[0]
    now = b.clock.now
    b.state.put_transaction(
        TransactionMetadata("x", pid, MAX_CLIENT_EPOCH, 60_000, S.EMPTY, set(), now, now)
    )
    b.crash()
    b = start_broker(tmp_path, lambda s: CrashingMarkers(s, partitions_before_crash=0))
    x = Producer(b, "x", pid, MAX_CLIENT_EPOCH)
    x.send(P0, range(5))
    with pytest.raises(UnknownServerError):
        x.commit()  # the decision stored, its markers not written
    assert (x.producer_id, x.epoch) == (pid, MAX_CLIENT_EPOCH)
    x.commit()  # the retry finishes it
    assert x.producer_id not in (pid, -1) and x.epoch == 0
    assert b.last_marker(P0) == (pid, MAX_PRODUCER_EPOCH, ControlType.COMMIT)
    assert b.stored("x").previous_producer_id == pid
    assert x.retry_end(commit=True) == (x.producer_id, 0)  # answered as it was
    x.send(P0, range(5, 8))  # the next transaction, under the new producer id
    with pytest.raises(InvalidTxnStateError, match="a late commit"):
        x.retry_end(commit=True)
    x.commit()
    assert b.committed(P0) == list(range(8)) and b.stable(P0)
    assert b.coordinator.describe()["producer_id_rotations"] == 1


# -- the state store -----------------------------------------------------------------------------


def test_log_state_store_survives_close_crash_and_a_torn_tail(tmp_path: Path) -> None:
    store = open_data(tmp_path)
    state = local_state_store(store)
    m = TransactionMetadata("a/0", 7, 0, 1000, S.EMPTY, set(), -1, 1)
    state.put_transaction(m)
    m2 = m.copy()
    m2.transition(S.ONGOING, 2)
    m2.partitions = {P0, AUDIT}
    state.put_transaction(m2)  # the later record of a key wins
    state.put_transaction(TransactionMetadata("b", 8, 3, 1000, S.EMPTY, set(), -1, 1))
    sink = SinkCommitRecord("a", 4, SinkCommitState.COMPLETE, [("a/0", 7, 0)])
    state.put_sink(sink)
    expected = ({"a/0": m2, "b": state.load()[0]["b"]}, {"a": sink})
    assert state.load() == expected
    store.close()

    store = open_data(tmp_path)
    assert local_state_store(store).load() == expected
    for log in store.open_logs():
        log.abandon()  # a crash: no flush, no snapshot, no clean-shutdown marker
    store = open_data(tmp_path)
    state = local_state_store(store)
    assert state.load() == expected
    segment = store.partition(TXN_STATE_TOPIC, 0).segment_files()[-1]
    for log in store.open_logs():
        log.abandon()
    with segment.open("ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x09torn-batch")  # a half-written put
    store = open_data(tmp_path)
    assert local_state_store(store).load() == expected
    assert store.topic(TXN_STATE_TOPIC).config.retention_ms == -1  # never deleted by age


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda c: c.init_producer_id(""), InvalidRequestError, "transactional_id='' must be"),
        (lambda c: c.init_producer_id("x" * 513), InvalidRequestError, "over the limit of 512"),
        (lambda c: c.init_producer_id("a\nb"), InvalidRequestError, "unprintable"),
        (
            lambda c: c.init_producer_id("t", 900_001),
            InvalidTransactionTimeoutError,
            "transaction_timeout_ms=900001 must be an integer between 1 and 900000",
        ),
        (lambda c: c.init_producer_id("t", 0), InvalidTransactionTimeoutError, "=0 must"),
        (lambda c: c.commit_sink_batch("q", -1, []), InvalidRequestError, "batch_id=-1"),
        (lambda c: c.commit_sink_batch("q/1", 1, []), InvalidRequestError, "must not contain '/'"),
        (lambda c: c.last_committed_batch(""), InvalidRequestError, "sink_id='' must be"),
        (
            lambda c: c.commit_sink_batch("q", 1, [("q/0", 1, 0), ("q/0", 1, 0)]),
            InvalidRequestError,
            "'q/0' more than once",
        ),
        (
            lambda c: c.abort_sink_batch("q", 1, [("q/0", 1)]),
            InvalidRequestError,
            "is not (transactional_id, producer_id, producer_epoch)",
        ),
        (lambda c: c.end_txn("t", 1, -3, True), InvalidRequestError, "producer_epoch=-3"),
        (lambda c: c.add_partitions("t", 1, 0, []), InvalidRequestError, "at least one"),
        (lambda c: c.add_partitions("t", 1, 0, [("a b", 0)]), InvalidTopicError, "'a b'"),
        (lambda c: c.add_partitions("t", 1, 0, [("a", -1)]), InvalidRequestError, "-1"),
        (lambda c: c.end_txn("nobody", 1, 0, True), InvalidProducerIdMappingError, "unknown"),
    ],
)
def test_bad_input_is_refused_by_name(
    broker: Broker, call: Callable[[TransactionCoordinator], object], error: type, message: str
) -> None:
    before = broker.state.load()
    with pytest.raises(error) as info:
        call(broker.coordinator)
    assert message in str(info.value)
    assert broker.state.load() == before


def test_wrong_producer_id_and_lifecycle(tmp_path: Path) -> None:
    b = start_broker(tmp_path)
    p = Producer(b, "t").init()
    with pytest.raises(
        InvalidProducerIdMappingError, match=f"belongs to producer id {p.producer_id}"
    ):
        b.coordinator.end_txn("t", p.producer_id + 1, 0, True)

    fresh = TransactionCoordinator(
        b.state,
        ProducerIdManager(0, FileProducerIdBlockSource(tmp_path / "p")),
        LocalMarkerWriter(b.store),
    )
    with pytest.raises(CoordinatorNotAvailableError) as loading:
        fresh.init_producer_id("t")
    assert loading.value.retriable
    b.coordinator.close()
    b.coordinator.close()  # idempotent
    with pytest.raises(NotCoordinatorError):
        b.coordinator.init_producer_id("t")
    with pytest.raises(IdemlogError, match="start\\(\\) on a coordinator that is CLOSED"):
        b.coordinator.start()
