"""The sink commit path (docs/design.md §6, §7, §10; issue 23): one marker append per
partition whatever the number of tasks, O(1) state writes, and commit records that stay
O(one batch) while another writer holds a partition's last stable offset back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from broker_core.errors import TransactionCoordinatorFencedError
from broker_core.log.store import LogStore
from broker_core.record.batch import ControlType
from broker_core.txn.coordinator.coordinator import LocalMarkerWriter
from broker_core.txn.coordinator.markers import ProducerMarkers, StableOffsets
from broker_core.txn.coordinator.visibility import consistent_cut
from broker_core.txn.state_topic.records import (
    SinkBatchRecord,
    SinkCommitRecord,
    SinkCommitState,
    TransactionMetadata,
    TransactionState,
)
from broker_core.txn.state_topic.store import TXN_STATE_TOPIC, LogTxnStateStore
from tests.store.test_txn_coordinator import ALL, P0, P1, Broker, Producer, start_broker

S = TransactionState


class CountingMarkers:
    """LocalMarkerWriter, counting its calls and the markers each partition got."""

    def __init__(self, store: LogStore) -> None:
        self.inner = LocalMarkerWriter(store)
        self.calls = 0
        self.markers: dict[tuple[str, int], int] = {}

    def write_markers(
        self, producers: Sequence[ProducerMarkers], commit: bool, coordinator_epoch: int
    ) -> StableOffsets:
        self.calls += 1
        for m in producers:
            for tp in m.partitions:
                self.markers[tp] = self.markers.get(tp, 0) + 1
        return self.inner.write_markers(producers, commit, coordinator_epoch)


class CountingState:
    """The log state store, counting its writes (each one append and one fsync)."""

    def __init__(self, inner: LogTxnStateStore) -> None:
        self.inner = inner
        self.writes = 0

    def load(self) -> tuple[dict[str, TransactionMetadata], dict[str, SinkCommitRecord]]:
        return self.inner.load()

    def put_transaction(self, meta: TransactionMetadata, *, coordinator_epoch: int = 0) -> None:
        self.writes += 1
        self.inner.put_transaction(meta, coordinator_epoch=coordinator_epoch)

    def put_sink(self, record: SinkCommitRecord, *, coordinator_epoch: int = 0) -> None:
        self.writes += 1
        self.inner.put_sink(record, coordinator_epoch=coordinator_epoch)

    def put_transactions(
        self, metas: Sequence[TransactionMetadata], *, coordinator_epoch: int = 0
    ) -> None:
        self.writes += 1
        self.inner.put_transactions(metas, coordinator_epoch=coordinator_epoch)

    def put_sink_batch(self, record: SinkBatchRecord, *, coordinator_epoch: int = 0) -> None:
        self.writes += 1
        self.inner.put_sink_batch(record, coordinator_epoch=coordinator_epoch)

    def delete_sink_batch(self, sink_id: str, batch_id: int, *, coordinator_epoch: int = 0) -> None:
        self.writes += 1
        self.inner.delete_sink_batch(sink_id, batch_id, coordinator_epoch=coordinator_epoch)

    def load_sink_batches(self) -> list[SinkBatchRecord]:
        return self.inner.load_sink_batches()


def sink_batch(broker: Broker, sink: str, tasks: int, batch: int, base: int) -> list[Producer]:
    """``tasks`` prepared attempts of ``batch``, each writing 3 rows to every partition."""
    plan = []
    for task in range(tasks):
        producer = Producer(broker, f"{sink}/{task}").init_sink(batch)
        for i, tp in enumerate(ALL):
            start = base + task * 100 + i * 10
            producer.send(tp, range(start, start + 3))
        producer.prepare()
        plan.append(producer)
    return plan


def test_a_sink_commit_writes_one_marker_append_per_partition(tmp_path: Path) -> None:
    counting: list[CountingMarkers] = []
    states: list[CountingState] = []

    def markers(store: LogStore) -> CountingMarkers:
        counting.append(CountingMarkers(store))
        return counting[0]

    def state(inner: LogTxnStateStore) -> CountingState:
        states.append(CountingState(inner))
        return states[0]

    b = start_broker(tmp_path, markers, wrap_state=state)
    tasks = 6
    plan = sink_batch(b, "q", tasks, 1, 0)
    appends_before = {tp: b.store.partition(*tp).marker_appends for tp in ALL}
    ends_before = {tp: b.store.partition(*tp).log_end_offset for tp in ALL}
    writes_before = states[0].writes

    assert b.coordinator.commit_sink_batch("q", 1, [p.txn for p in plan]) is True

    assert counting[0].calls == 1  # one call for the whole batch
    assert counting[0].markers == dict.fromkeys(ALL, tasks)  # every task's marker...
    for tp in ALL:
        log = b.store.partition(*tp)
        # ...in one append (one write, one fsync) per partition, T markers in it.
        assert log.marker_appends - appends_before[tp] == 1
        assert log.log_end_offset - ends_before[tp] == tasks
        assert log.last_stable_offset == log.log_end_offset  # past the batch
        assert sorted(b.committed(tp)) == sorted(b.uncommitted(tp))
    # PREPARE sink record, every COMPLETE_COMMIT in one write, COMPLETE sink record.
    assert states[0].writes - writes_before == 3
    assert {b.stored(p.transactional_id).state for p in plan} == {S.COMPLETE_COMMIT}
    record = b.state.load()[1]["q"]
    assert record.state == SinkCommitState.COMPLETE
    assert [(t, p) for t, p, _, _ in record.ranges] == sorted(ALL)  # one range per partition


def test_a_partition_refuses_the_whole_append_from_an_older_coordinator(
    tmp_path: Path,
) -> None:
    b = start_broker(tmp_path)
    first = Producer(b, "a").init()
    first.send(P0, range(3))
    second = Producer(b, "b").init()
    second.send(P0, range(3, 6))
    log = b.store.partition(*P0)
    log.write_markers([(second.producer_id, second.epoch)], ControlType.ABORT, 5)
    end = log.log_end_offset
    # b's marker is from coordinator epoch 4 < 5: the append of both is refused whole.
    with pytest.raises(TransactionCoordinatorFencedError):
        log.write_markers(
            [(first.producer_id, first.epoch), (second.producer_id, second.epoch)],
            ControlType.COMMIT,
            4,
        )
    assert log.log_end_offset == end
    assert b.committed(P0) == []


@pytest.mark.slow  # ~20 s: 1,000 sink commits
def test_a_held_back_partition_keeps_commit_records_flat(tmp_path: Path) -> None:
    """Issue test 5, at the store: a foreign transaction holds P0's LSO for 1,000 sink
    commits. Each commit writes the same few bytes, nothing fails, readers' cut keeps
    every batch whole, a restart rebuilds the tracking, and the end of the foreign
    transaction settles (and deletes the records of) every batch."""
    b = start_broker(tmp_path)
    foreign = Producer(b, "foreign").init()
    foreign.send(P0, range(10_000, 10_003))  # held open: P0's LSO stays here
    state_log = b.store.partition(TXN_STATE_TOPIC, 0)
    written: list[int] = []
    commits = 1000
    restart_at = 600
    for batch in range(commits):
        if batch == restart_at:
            ends_before = {t: b.coordinator.stable_ends(t) for t in ("payments", "audit")}
            tracked = b.coordinator.describe()["sink_batches_tracked"]
            b.crash()
            b = start_broker(tmp_path, coordinator_epoch=1)
            foreign.broker = b  # its transaction stays open across the restart
            state_log = b.store.partition(TXN_STATE_TOPIC, 0)
            assert b.coordinator.describe()["sink_batches_tracked"] == tracked
            for topic, ends in ends_before.items():
                assert b.coordinator.stable_ends(topic) == ends
        plan = sink_batch(b, "q", 2, batch, batch * 1000)
        before = state_log.size_bytes
        assert b.coordinator.commit_sink_batch("q", batch, [p.txn for p in plan]) is True
        written.append(state_log.size_bytes - before)
        record = b.state.load()[1]["q"] if batch % 250 == 0 else None
        if record is not None:
            assert record.unsettled == [] and len(record.to_json()) < 1000

    # Flat: the last commits write no more than the first ones (a few bytes of ids and
    # offsets grow with the numbers, never with the batches held back).
    assert max(written[-100:]) <= max(written[5:100]) + 64, (written[:10], written[-10:])
    assert b.coordinator.describe()["sink_batches_tracked"] == commits  # all held back
    held = {(r.sink_id, r.batch_id) for r in b.state.load_sink_batches()}
    assert len(held) == commits - 1  # every batch but the last, which its record holds

    # Readers: every batch whole on either side of the cut.
    ends = b.coordinator.stable_ends("payments")
    assert ends[0] == b.store.partition(*P0).last_stable_offset
    ranges = {
        r.batch_id: [(p, first, last) for t, p, first, last in r.ranges if t == "payments"]
        for r in b.state.load_sink_batches()
    }
    assert consistent_cut(ends, ranges.values()) == ends
    for rs in ranges.values():
        below = all(last < ends[p] for p, _, last in rs)
        above = all(first >= ends[p] for p, first, _ in rs)
        assert below or above

    foreign.abort()  # its ABORT marker moves P0's LSO past every batch
    plan = sink_batch(b, "q", 2, commits, commits * 1000)
    assert b.coordinator.commit_sink_batch("q", commits, [p.txn for p in plan]) is True
    assert b.coordinator.describe()["sink_batches_tracked"] == 0
    assert b.state.load_sink_batches() == []  # every batch record deleted
    assert b.coordinator.stable_ends("payments") == {
        p: b.store.partition("payments", p).log_end_offset for p in (0, 1)
    }
    assert len(b.committed(P0)) == len(b.committed(P1)) == (commits + 1) * 2 * 3


def test_an_old_record_with_unsettled_batches_still_loads(tmp_path: Path) -> None:
    """A record written before batches had records of their own (``unsettled``): its
    batches are tracked on load, get records of their own at the next commit, and the
    field is never written again."""
    b = start_broker(tmp_path)
    foreign = Producer(b, "foreign").init()
    foreign.send(P0, range(10_000, 10_003))
    plan = sink_batch(b, "q", 1, 1, 0)
    assert b.coordinator.commit_sink_batch("q", 1, [p.txn for p in plan]) is True
    record = b.state.load()[1]["q"]
    # Rewrite it as an old coordinator would have: its batch listed under "unsettled".
    old = SinkCommitRecord(
        "q", 1, SinkCommitState.COMPLETE, record.transactions, [], [(1, record.ranges)]
    )
    doc = old.to_json().replace(b'"ranges":[]', b'"unsettled":[[1,' + _ranges(old) + b"]]")
    b.state._append("sink", "q", doc)
    b.crash()

    b = start_broker(tmp_path, coordinator_epoch=1)
    foreign.broker = b
    loaded = b.state.load()[1]["q"]
    assert loaded.unsettled == [(1, record.ranges)] and loaded.ranges == []
    assert b.coordinator.describe()["sink_batches_tracked"] == 1
    plan = sink_batch(b, "q", 1, 2, 1000)
    assert b.coordinator.commit_sink_batch("q", 2, [p.txn for p in plan]) is True
    assert [(r.batch_id, r.ranges) for r in b.state.load_sink_batches()] == [(1, record.ranges)]
    assert b"unsettled" not in b.state.load()[1]["q"].to_json()
    foreign.abort()
    plan = sink_batch(b, "q", 1, 3, 2000)
    assert b.coordinator.commit_sink_batch("q", 3, [p.txn for p in plan]) is True
    assert b.state.load_sink_batches() == []


def _ranges(record: SinkCommitRecord) -> bytes:
    return json.dumps([list(r) for r in record.unsettled[0][1]], separators=(",", ":")).encode()
