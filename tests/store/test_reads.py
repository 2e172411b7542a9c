"""PartitionLog.read: isolation levels, slicing, bounds, segment crossing and zero-copy."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from broker_core.errors import OffsetOutOfRangeError
from broker_core.log.partition_log import FetchResult, PartitionLog
from broker_core.log.store import LogStore
from broker_core.record.batch import HEADER_SIZE, ControlType, ipc_stream_size
from tests.store.helpers import SCHEMA, ManualClock, open_log, read_ids, rows

P1, P2 = 101, 202


def ids_of(result: FetchResult) -> list[int]:
    return [i for b in result.batches for i in b.records.column("id").to_pylist()]


def txn(log: PartitionLog, pid: int, seq: int, n: int, start: int) -> None:
    log.append(
        rows(n, start), producer_id=pid, producer_epoch=0, base_sequence=seq, transactional=True
    )


@pytest.fixture
def log(tmp_path: Path) -> PartitionLog:
    return open_log(tmp_path / "p")


def test_read_committed_stops_at_first_offset_of_open_transaction(log: PartitionLog) -> None:
    log.append(rows(5, 0))  # offsets 0-4
    txn(log, P1, 0, 3, 5)  # offsets 5-7, open
    log.append(rows(2, 8))  # offsets 8-9, after the open transaction

    committed = log.read(0)
    assert ids_of(committed) == [0, 1, 2, 3, 4]
    assert committed.next_offset == 5
    assert (committed.last_stable_offset, committed.high_watermark) == (5, 10)
    # A committed reader at the LSO gets nothing and stays there.
    at_lso = log.read(5)
    assert at_lso.batches == [] and at_lso.next_offset == 5

    uncommitted = log.read(0, isolation="read_uncommitted")
    assert ids_of(uncommitted) == list(range(10))
    assert uncommitted.next_offset == 10

    marker = log.write_marker(P1, 0, ControlType.COMMIT)
    assert (marker.offset, marker.last_stable_offset) == (10, 11)
    after = log.read(0)
    assert ids_of(after) == list(range(10))
    assert after.next_offset == 11 and after.last_stable_offset == 11
    assert [b.is_transactional for b in after.batches] == [False, True, False]


def test_lso_read_in_the_middle_of_an_append_never_counts_its_rows_stable(
    log: PartitionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append moves the high watermark before it records its transaction as open. A
    reader (another thread) asking for the LSO between the two steps must not get an
    end that counts the open transaction's rows as stable: it waits for the append."""
    log.append(rows(4, 0))  # offsets 0-3, no transaction open
    state = log.state
    unpatched = state.on_data_batch
    seen: list[int] = []
    reader: list[threading.Thread] = []

    def between_the_two_steps(*args: Any, **kwargs: Any) -> None:
        # The rows are written (high watermark 7), their transaction not yet open.
        assert log.high_watermark == 7
        reader.append(threading.Thread(target=lambda: seen.append(log.last_stable_offset)))
        reader[0].start()
        # Bounded: with the lock held by this append, the reader cannot answer yet.
        reader[0].join(timeout=1.0)
        unpatched(*args, **kwargs)

    monkeypatch.setattr(state, "on_data_batch", between_the_two_steps)
    txn(log, P1, 0, 3, 4)  # offsets 4-6, open
    reader[0].join()
    assert seen == [4], f"LSO {seen} counts the open transaction's rows 4-6 as stable"


def test_aborted_transaction_is_skipped_by_read_committed_only(log: PartitionLog) -> None:
    txn(log, P1, 0, 3, 0)
    txn(log, P1, 3, 2, 3)
    log.append(rows(1, 5))
    log.write_marker(P1, 0, ControlType.ABORT)
    log.append(rows(1, 6))

    assert read_ids(log) == [5, 6]
    assert read_ids(log, "read_uncommitted") == list(range(7))
    # Starting inside the aborted range changes nothing.
    assert read_ids(log, start=4) == [5, 6]
    assert log.read(0).next_offset == 8


def test_control_batches_are_never_returned(log: PartitionLog) -> None:
    txn(log, P1, 0, 2, 0)
    commit = log.write_marker(P1, 0, ControlType.COMMIT).offset
    txn(log, P1, 2, 2, 2)
    abort = log.write_marker(P1, 0, ControlType.ABORT).offset
    log.append(rows(1, 4))
    assert (commit, abort) == (2, 5)

    # After the COMMIT marker: the aborted rows at 3-4 for read_uncommitted only.
    for isolation, after_commit in (("read_committed", 6), ("read_uncommitted", 3)):
        result = log.read(0, isolation=isolation)
        offsets = [o for b in result.batches for o in range(b.base_offset, b.last_offset + 1)]
        assert commit not in offsets and abort not in offsets
        assert all(b.records.schema.equals(SCHEMA) for b in result.batches)
        # Reading at a marker skips it without returning anything in its place.
        at_marker = log.read(commit, isolation=isolation)
        assert at_marker.batches[0].base_offset == after_commit
    assert ids_of(log.read(abort)) == [4]
    assert ids_of(log.read(abort, max_offset=abort + 1)) == []
    assert log.read(abort, max_offset=abort + 1).next_offset == abort + 1


def test_interleaved_transactions_one_aborts_one_commits(log: PartitionLog) -> None:
    txn(log, P2, 0, 3, 0)  # P2: 0-2
    txn(log, P1, 0, 3, 100)  # P1: 3-5
    txn(log, P2, 3, 3, 3)  # P2: 6-8
    txn(log, P1, 3, 3, 103)  # P1: 9-11
    assert read_ids(log) == []
    assert log.last_stable_offset == 0

    log.write_marker(P2, 0, ControlType.COMMIT)  # 12
    # P1 is still open from offset 3: only P2's rows before it are stable.
    assert log.last_stable_offset == 3
    assert read_ids(log) == [0, 1, 2]
    assert read_ids(log, "read_uncommitted") == [0, 1, 2, 100, 101, 102, 3, 4, 5, 103, 104, 105]

    log.write_marker(P1, 0, ControlType.ABORT)  # 13
    assert log.last_stable_offset == 14
    assert read_ids(log) == [0, 1, 2, 3, 4, 5]
    assert read_ids(log, start=4) == [3, 4, 5]
    assert len(read_ids(log, "read_uncommitted")) == 12


def test_read_from_mid_batch_offset_slices_rows(log: PartitionLog) -> None:
    log.append(rows(10, 0))
    log.append(rows(10, 10))
    result = log.read(4)
    assert [b.base_offset for b in result.batches] == [4, 10]
    assert result.batches[0].records.column("id").to_pylist() == list(range(4, 10))
    assert result.batches[0].last_offset == 9
    assert ids_of(result) == list(range(4, 20))
    last_row = log.read(19)
    assert ids_of(last_row) == [19] and last_row.batches[0].base_offset == 19


def test_max_bytes_returns_at_least_one_batch_then_stops_before_the_limit(
    log: PartitionLog,
) -> None:
    size = HEADER_SIZE + ipc_stream_size(rows(10))
    for i in range(3):
        log.append(rows(10, 10 * i))

    tiny = log.read(0, max_bytes=1)
    assert [b.base_offset for b in tiny.batches] == [0]
    assert tiny.next_offset == 10
    assert [b.base_offset for b in log.read(0, max_bytes=2 * size - 1).batches] == [0]
    assert [b.base_offset for b in log.read(0, max_bytes=2 * size).batches] == [0, 10]
    assert ids_of(log.read(0, max_bytes=3 * size)) == list(range(30))
    # A batch over the limit is still returned when it is the first one.
    assert ids_of(log.read(15, max_bytes=1)) == list(range(15, 20))


def test_max_offset_bounds_the_read_and_slices_the_last_batch(log: PartitionLog) -> None:
    log.append(rows(10, 0))
    log.append(rows(10, 10))
    result = log.read(0, max_offset=15)
    assert ids_of(result) == list(range(15))
    assert result.next_offset == 15
    assert result.batches[-1].last_offset == 14
    assert ids_of(log.read(0, max_offset=10)) == list(range(10))
    assert log.read(0, max_offset=10).next_offset == 10
    assert ids_of(log.read(3, max_offset=5)) == [3, 4]


def test_reads_cross_segment_boundaries(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    for seg in range(4):
        log.append(rows(5, 10 * seg))
        log.append(rows(5, 10 * seg + 5))
        log.roll()
    assert [s.base_offset for s in log.segments] == [0, 10, 20, 30, 40]

    assert read_ids(log) == list(range(40))
    assert ids_of(log.read(0)) == list(range(40))
    spanning = log.read(17, max_offset=33)
    assert ids_of(spanning) == list(range(17, 33))
    assert [b.base_offset for b in spanning.batches] == [17, 20, 25, 30]
    # Small fetches following next_offset see each row once.
    offset, seen = 7, []
    while True:
        result = log.read(offset, max_bytes=1)
        seen += ids_of(result)
        if result.next_offset == offset:
            break
        offset = result.next_offset
    assert seen == list(range(7, 40))


def test_aborted_transaction_spanning_a_roll_is_skipped(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    txn(log, P1, 0, 3, 0)
    log.append(rows(2, 3))
    log.roll()
    txn(log, P1, 3, 2, 5)
    log.write_marker(P1, 0, ControlType.ABORT)
    log.append(rows(1, 7))
    assert len(log.segments) == 2
    assert read_ids(log) == [3, 4, 7]
    assert read_ids(log, start=5) == [7]
    assert read_ids(log, "read_uncommitted") == list(range(8))


def test_offset_out_of_range(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path / "p", clock, retention_ms=1_000)
    log.append(rows(5, 0))
    log.roll()
    clock.advance(2_000)
    log.append(rows(5, 5))

    with pytest.raises(OffsetOutOfRangeError) as past:
        log.read(11)
    assert past.value.code == 1 and "11" in past.value.message
    at_end = log.read(10)
    assert at_end.batches == [] and at_end.next_offset == 10

    assert log.enforce_retention() == 1
    with pytest.raises(OffsetOutOfRangeError) as below:
        log.read(4)
    assert below.value.code == 1 and "[5, 10]" in below.value.message
    assert ids_of(log.read(5)) == list(range(5, 10))


def test_read_is_zero_copy_from_the_segment_map(log: PartitionLog) -> None:
    log.append(rows(100, 0))
    log.append(rows(100, 100))
    result = log.read(0)
    segment = log.active
    # The address of the segment's memory map; the map is reused while the file has not grown.
    base = pa.py_buffer(segment.view()).address
    stored = list(segment.batches())
    assert len(stored) == len(result.batches) == 2
    for fetched, batch in zip(result.batches, stored, strict=True):
        start = base + batch.position + HEADER_SIZE
        end = base + batch.position + batch.header.size
        for column in fetched.records.columns:
            for buffer in column.buffers():
                if buffer is None:
                    continue  # no validity bitmap
                assert start <= buffer.address and buffer.address + buffer.size <= end

    # Readers keep the mapped memory alive while the log grows, rolls and closes.
    log.append(rows(1000, 200))
    log.roll()
    log.close()
    assert ids_of(result) == list(range(200))
    assert result.batches[1].records.column("value").to_pylist()[-1] == f"{199:08d}"


@pytest.mark.parametrize("rolled", [False, True])
def test_abort_cut_off_by_a_crash_does_not_hide_later_data(tmp_path: Path, rolled: bool) -> None:
    directory = tmp_path / "p"
    log = open_log(directory)
    if rolled:
        log.append(rows(2, 100))
        log.roll()  # snapshot at offset 2: recovery replays from the segment's start
    start = log.log_end_offset
    txn(log, P1, 0, 1, 0)
    log.write_marker(P1, 1, ControlType.ABORT)
    segment = log.active.log_path
    log.abandon()
    # The crash lost everything written to the active segment (never fsynced).
    segment.write_bytes(b"")

    log = open_log(directory)
    assert log.log_end_offset == start
    assert log.active.txn_index.entries == []
    # New data at the offsets the lost abort covered is not mistaken for aborted data.
    log.append(rows(1, 1), producer_id=P1, producer_epoch=1, base_sequence=0, transactional=True)
    log.write_marker(P1, 1, ControlType.COMMIT)
    expected = ([100, 101] if rolled else []) + [1]
    assert read_ids(log) == expected


def test_flush_ms_applies_to_an_idle_log(tmp_path: Path) -> None:
    clock = ManualClock()
    store = LogStore(tmp_path, {"flush.ms": 1000}, clock=clock)
    store.create_topic("t", 1)
    log = store.partition("t", 0)
    log.append(rows(3))
    assert not log.flush_if_due()  # not due yet
    clock.advance(999)
    assert not log.flush_if_due()
    clock.advance(1)
    assert log.flush_if_due()
    assert not log.flush_if_due()  # nothing left unflushed
