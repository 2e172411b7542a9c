"""Log compaction in the store: configuration errors, when a pass runs, what it keeps,
reads across the gaps it leaves, and a follower copying a cleaned leader."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from broker_core.errors import InvalidConfigError, OffsetOutOfRangeError
from broker_core.log import swap
from broker_core.log.cleaner import CHECKPOINT_FILE, MAX_YOUNG_PASSES, CleanerCheckpoint
from broker_core.log.config import LogConfig
from broker_core.log.inspect import StoreView
from broker_core.log.partition_log import PartitionLog
from broker_core.log.store import LogStore
from broker_core.record.batch import ControlType
from broker_core.txn.state_topic.schema import TXN_STATE_SCHEMA, append_rows, read_rows
from tests.store.helpers import ManualClock

SCHEMA = pa.schema([("kind", pa.string()), ("key", pa.int32()), ("value", pa.int64())])
COMPACT = {"cleanup.policy": "compact", "compaction.key.columns": "kind,key"}


def batch(*rows: tuple[str, int, int | None]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"kind": k, "key": key, "value": v} for k, key, v in rows], schema=SCHEMA
    )


def offsets_and_values(log: PartitionLog, start: int | None = None) -> list[tuple[int, object]]:
    out: list[tuple[int, object]] = []
    offset = log.log_start_offset if start is None else start
    while True:
        result = log.read(offset, max_bytes=1)  # one batch a read: every gap is crossed
        for b in result.batches:
            out += [(b.base_offset + i, v) for i, v in enumerate(b.records.column("value"))]
        if result.next_offset == offset:
            return [(o, v.as_py() if hasattr(v, "as_py") else v) for o, v in out]
        offset = result.next_offset


def compacted_log(tmp_path: Path, clock: ManualClock, **extra: object) -> PartitionLog:
    store = LogStore(tmp_path, clock=clock)
    store.create_topic("t", 1, schema=SCHEMA, config={**COMPACT, **extra})
    return store.partition("t", 0)


# -- configuration -------------------------------------------------------------------------
def test_a_compacted_topic_whose_schema_lacks_a_key_column_is_refused_at_creation(
    tmp_path: Path,
) -> None:
    store = LogStore(tmp_path)
    schema = pa.schema([("kind", pa.string()), ("value", pa.int64())])
    with pytest.raises(InvalidConfigError, match=r"topic 'users'.*'kind,key'.*column 'key'"):
        store.create_topic("users", 1, schema=schema, config=COMPACT)
    assert store.topics() == []  # nothing partial


def test_without_a_schema_the_first_append_lacking_the_key_is_refused(tmp_path: Path) -> None:
    store = LogStore(tmp_path)
    store.create_topic("users", 1, config={"cleanup.policy": "compact,delete"})
    log = store.partition("users", 0)
    bad = pa.RecordBatch.from_pylist([{"id": 1}])
    with pytest.raises(InvalidConfigError, match=r"topic 'users'.*'key'.*column 'key'"):
        log.append(bad)
    assert log.log_end_offset == 0 and store.topic("users").schema is None
    log.append(pa.RecordBatch.from_pylist([{"key": "a", "v": 1}]))  # a schema with the key
    assert log.log_end_offset == 1


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"cleanup.policy": "compacted"}, r"cleanup\.policy='compacted' is not one of"),
        ({"compaction.key.columns": "a,,b"}, r"compaction\.key\.columns='a,,b'.*empty"),
        ({"compaction.key.columns": "a,a"}, r"compaction\.key\.columns='a,a' names a more"),
        ({"min.cleanable.dirty.ratio": 1.5}, r"min\.cleanable\.dirty\.ratio=1\.5 is above"),
        ({"delete.retention.ms": -1}, r"delete\.retention\.ms=-1 is below"),
    ],
)
def test_bad_compaction_config_names_the_key_and_value(
    config: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidConfigError, match=message) as info:
        LogConfig.from_mapping(config)
    assert info.value.code == 40


def test_compact_alone_turns_retention_off_and_compact_delete_keeps_it(tmp_path: Path) -> None:
    clock = ManualClock()
    for policy, deleted in (("compact", 0), ("compact,delete", 1), ("delete", 1)):
        store = LogStore(tmp_path / policy, clock=clock)
        config = {**COMPACT, "cleanup.policy": policy, "retention.ms": 1000}
        store.create_topic("t", 1, schema=SCHEMA, config=config)
        log = store.partition("t", 0)
        log.append(batch(("a", 1, 1)))
        log.roll()
        log.append(batch(("a", 2, 2)))
        assert log.enforce_retention(clock.now + 10_000) == deleted, policy


# -- when a pass runs and what it keeps ---------------------------------------------------
def test_dirty_ratio_and_compaction_lag_decide_when_a_pass_runs(tmp_path: Path) -> None:
    clock = ManualClock()
    log = compacted_log(
        tmp_path, clock, **{"min.cleanable.dirty.ratio": 0.5, "min.compaction.lag.ms": 5_000}
    )
    for i in range(4):
        log.append(batch(("a", 1, i), ("a", 2, i)))
        log.roll()
    log.append(batch(("a", 3, 0)))
    assert log.clean() is None  # every segment younger than the lag
    clock.advance(5_000)
    first = log.clean()
    assert first is not None and first.removed_rows == 6  # (a,1), (a,2) kept at offsets 6, 7
    assert log.clean() is None  # nothing dirty since
    assert [o for o, _v in offsets_and_values(log)] == [6, 7, 8]
    assert log.cleaner.stats.passes == 1 and log.cleaner.stats.removed_rows == 6


def test_tombstones_and_markers_go_after_delete_retention(tmp_path: Path) -> None:
    clock = ManualClock()
    # A window of one batch: only producer 7's last batch (offset 6) is kept whole.
    config = {"delete.retention.ms": 10_000, "producer.state.batch.window": 1}
    log = compacted_log(tmp_path, clock, **config)
    log.append(batch(("a", 1, 1), ("a", 2, 2)))
    txn = {"producer_id": 7, "producer_epoch": 0, "transactional": True}
    log.append(batch(("a", 1, None)), base_sequence=0, **txn)  # a tombstone, at 2
    log.write_marker(7, 0, ControlType.COMMIT)  # 3
    log.append(batch(("b", 9, 9)), base_sequence=1, **txn)  # 4, aborted
    log.write_marker(7, 0, ControlType.ABORT)  # 5
    log.append(batch(("c", 5, 5)), base_sequence=2, **txn)  # 6
    log.write_marker(7, 0, ControlType.COMMIT)  # 7
    log.roll()
    log.append(batch(("c", 1, 1)))
    log.roll()
    log.append(batch(("c", 2, 2)))
    first = log.clean(force=True)
    # (a, 1)'s old value and the aborted row went; the tombstone and markers stay.
    assert first is not None and first.removed_rows == 2 and first.removed_markers == 0
    assert offsets_and_values(log) == [(1, 2), (2, None), (6, 5), (8, 1), (9, 2)]
    clock.advance(9_999)
    assert log.clean() is None  # not due: the horizon is a millisecond away
    clock.advance(1)
    second = log.clean()  # due: delete.retention.ms after the first pass reached them
    # The tombstone went, and so did the markers with no data left before them (the
    # committed tombstone's and the abort's); the last transaction keeps its marker.
    assert second is not None and second.removed_rows == 1 and second.removed_markers == 2
    assert offsets_and_values(log) == [(1, 2), (6, 5), (8, 1), (9, 2)]
    assert log.read_control(3) is None and log.read_control(5) is None
    assert log.read_control(7) is not None
    assert log.last_stable_offset == log.log_end_offset
    log.abandon()  # a crash: no snapshot may reopen a transaction whose marker went
    reopened = LogStore(tmp_path, clock=clock).partition("t", 0)
    assert reopened.last_stable_offset == reopened.log_end_offset
    assert offsets_and_values(reopened) == [(1, 2), (6, 5), (8, 1), (9, 2)]


def test_the_last_batch_of_a_producer_stays_whole_for_its_retry(tmp_path: Path) -> None:
    clock = ManualClock()
    log = compacted_log(tmp_path, clock)
    rows = batch(("a", 1, 1), ("a", 2, 2), ("a", 3, 3))
    result = log.append(rows, producer_id=5, producer_epoch=0, base_sequence=0)
    log.append(batch(("a", 1, 10), ("a", 2, 20)))  # supersedes two of its rows
    log.roll()
    log.append(batch(("z", 0, 0)))
    log.roll()
    log.append(batch(("z", 1, 1)))
    assert log.clean(force=True) is not None
    assert [o for o, _v in offsets_and_values(log)] == [0, 1, 2, 3, 4, 5, 6]  # all kept
    store_dir = log.directory
    log.abandon()  # a crash: the state is rebuilt from the log
    # The same clock: with the wall clock the producer (written at the ManualClock's
    # 1970 time) would be past producer.id.expiration.ms and dropped at the reopen.
    reopened = LogStore(store_dir.parent.parent, clock=clock).partition("t", 0)
    retry = reopened.append(rows, producer_id=5, producer_epoch=0, base_sequence=0)
    assert retry.duplicate and (retry.base_offset, retry.last_offset) == (
        result.base_offset,
        result.last_offset,
    )


# -- reads and replication across gaps ----------------------------------------------------
def gappy_log(tmp_path: Path, clock: ManualClock) -> PartitionLog:
    log = compacted_log(tmp_path, clock)
    for i in range(6):
        log.append(batch(("a", 1, i), ("a", 2, i), (f"k{i}", 0, i)))
        log.roll()
    log.append(batch(("end", 0, 0)))
    assert log.clean(force=True) is not None
    return log


def test_reads_cross_the_gaps_and_never_start_inside_one(tmp_path: Path) -> None:
    log = gappy_log(tmp_path, ManualClock())
    kept = [o for o, _v in offsets_and_values(log)]
    assert kept == [2, 5, 8, 11, 14, 15, 16, 17, 18]  # k0..k4, then the last batch whole
    for start in range(0, log.log_end_offset + 1):
        assert [o for o, _v in offsets_and_values(log, start)] == [o for o in kept if o >= start]
    # A read whose range is all gap still moves on (a reader never waits on a gap).
    result = log.read(0, max_offset=2)
    assert result.batches == [] and result.next_offset == 2


def test_a_follower_copies_a_cleaned_leader_gaps_and_all(tmp_path: Path) -> None:
    clock = ManualClock()
    leader = gappy_log(tmp_path / "leader", clock)
    store = LogStore(tmp_path / "follower", clock=clock)
    store.create_topic("t", 1, schema=SCHEMA, config=COMPACT)
    follower = store.partition("t", 0)
    fetches = 0
    while follower.log_end_offset < leader.log_end_offset:
        follower.append_as_follower(leader.read_raw(follower.log_end_offset, 1))
        fetches += 1
    assert fetches == 7  # one batch a fetch: 2, 5, 8, 11, 14, 15-17, 18
    assert offsets_and_values(follower) == offsets_and_values(leader)
    follower.abandon()  # crash recovery re-scans the follower's gappy segments
    reopened = LogStore(tmp_path / "follower").partition("t", 0)
    assert offsets_and_values(reopened) == offsets_and_values(leader)
    assert reopened.log_end_offset == leader.log_end_offset


def test_a_log_that_is_not_compacted_still_refuses_a_gap(tmp_path: Path) -> None:
    leader = gappy_log(tmp_path / "leader", ManualClock())
    store = LogStore(tmp_path / "follower")
    store.create_topic("t", 1, schema=SCHEMA)  # cleanup.policy=delete: never a gap
    follower = store.partition("t", 0)
    with pytest.raises(OffsetOutOfRangeError, match="start at offset 2, but this log ends at 0"):
        follower.append_as_follower(leader.read_raw(0, 1))


# -- the cleaner checkpoint ---------------------------------------------------------------
def test_the_checkpoint_is_bounded_and_only_ever_delays_a_removal(tmp_path: Path) -> None:
    checkpoint = CleanerCheckpoint(tmp_path)
    for i in range(1, 101):
        checkpoint.record(i * 10, i, retention_ms=1000)
    assert len(checkpoint.young) == MAX_YOUNG_PASSES
    # Offset 5 was reached at time 1; merging says later, never earlier.
    assert not checkpoint.removable(5, 1 + 1000, 1000)
    assert checkpoint.removable(5, 100 + 1000, 1000)
    checkpoint.record(1010, 5000, retention_ms=1000)  # every earlier pass is old now
    assert checkpoint.expired_end == 1000 and len(checkpoint.young) == 1
    assert checkpoint.removable(999, 5000, 1000) and not checkpoint.removable(1000, 5000, 1000)
    reloaded = CleanerCheckpoint(tmp_path)
    assert (reloaded.expired_end, reloaded.young) == (checkpoint.expired_end, checkpoint.young)
    # A log cut back below a pass's end: offsets from the cut on are reached anew.
    reloaded.truncate(500)
    assert reloaded.expired_end == 500 and reloaded.young == []
    assert not reloaded.removable(600, 10**9, 1000)


def test_an_unreadable_checkpoint_is_dropped_and_keeps_tombstones_longer(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT_FILE).write_text("0\n12\nthree\n")
    checkpoint = CleanerCheckpoint(tmp_path)
    assert (checkpoint.expired_end, checkpoint.young) == (0, [])
    assert not checkpoint.removable(5, 10**9, 1000)  # reached now, not long ago


def test_a_pass_failing_half_way_leaves_a_readable_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    log = gappy_log(tmp_path / "done", clock)  # what a whole pass leaves
    expected = offsets_and_values(log)
    log = compacted_log(tmp_path / "failing", clock)
    for i in range(6):
        log.append(batch(("a", 1, i), ("a", 2, i), (f"k{i}", 0, i)))
        log.roll()
    log.append(batch(("end", 0, 0)))
    before = offsets_and_values(log)
    real_install, calls = swap.install, []

    def failing_install(directory: Path, base_offset: int) -> None:
        calls.append(base_offset)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real_install(directory, base_offset)

    monkeypatch.setattr(swap, "install", failing_install)
    with pytest.raises(OSError, match="No space left"):
        log.clean(force=True)
    # Two segments swapped, the rest old: every row read is one that was written there.
    half = offsets_and_values(log)
    assert set(expected) <= set(half) <= set(before) and half != before
    monkeypatch.setattr(swap, "install", real_install)
    assert log.clean(force=True) is not None
    assert offsets_and_values(log) == expected


def test_the_read_only_view_reads_a_cleaned_log_without_reporting_its_gaps(
    tmp_path: Path,
) -> None:
    log = gappy_log(tmp_path, ManualClock())
    expected = offsets_and_values(log)
    log.close()
    with StoreView(tmp_path) as view:  # what `idemlog log describe|dump` read
        partition = view.partition("t", 0)
        assert partition.problems == []
        assert partition.log_end_offset == 19
        rows = []
        offset = 0
        while True:
            result = partition.read(offset, max_bytes=1)
            rows += [
                (b.base_offset + i, v.as_py())
                for b in result.batches
                for i, v in enumerate(b.records.column("value"))
            ]
            if result.next_offset == offset:
                break
            offset = result.next_offset
        assert rows == expected


def test_the_transaction_state_topic_schema_compacts_to_its_newest_rows(tmp_path: Path) -> None:
    """What the lead wires in: ``__transaction_state``'s schema (kind, key, nullable value)
    with ``compaction.key.columns=kind,key``, written and read by its own helpers."""
    clock = ManualClock()
    store = LogStore(tmp_path, clock=clock)
    config = {**COMPACT, "delete.retention.ms": 0}
    store.create_topic("txn-state", 1, schema=TXN_STATE_SCHEMA, config=config)
    log = store.partition("txn-state", 0)
    newest: dict[tuple[str, str], bytes | None] = {}
    for i in range(60):
        row = ("txn", f"id-{i % 6}", None if i % 13 == 12 else f"state {i}".encode())
        append_rows(log, [row], TXN_STATE_SCHEMA)
        newest[(row[0], row[1])] = row[2]
        if i % 7 == 6:
            log.roll()
    log.roll()
    append_rows(log, [("sink", "job", b"record")], TXN_STATE_SCHEMA)
    newest[("sink", "job")] = b"record"
    before = log.size_bytes
    assert log.clean(force=True) is not None
    assert log.size_bytes < before / 4
    rows = list(read_rows(log))
    live = {k: v for k, v in newest.items() if v is not None}
    assert {(kind, key): value for _o, (kind, key, value) in rows if value is not None} == live
    assert len(rows) <= len(newest) + 1  # one row per key, at most the last batch's extra
