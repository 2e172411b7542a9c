"""docs/design.md §9 scenarios 1-10 (Kafka's own producer-state tests) against the log store."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from broker_core.errors import (
    DuplicateSequenceError,
    IdemlogError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
)
from broker_core.log.partition_log import PartitionLog
from broker_core.log.producer_state import BatchMetadata, ProducerStateEntry
from broker_core.log.segment import INDEX_SUFFIX, LOG_SUFFIX, TXN_INDEX_SUFFIX
from broker_core.log.snapshot import (
    decode_snapshot,
    encode_snapshot,
    read_snapshot,
    snapshot_path,
    write_snapshot,
)
from broker_core.log.store import LogStore
from broker_core.log.validator import ProducerFields, check_append
from broker_core.record.batch import HEADER_SIZE, MAX_SEQUENCE, ControlType, ipc_stream_size
from tests.store.helpers import (
    ManualClock,
    open_log,
    producer_states,
    read_ids,
    rows,
)

PID = 4242


E = TypeVar("E", bound=IdemlogError)


def assert_rejected(
    log: PartitionLog, error: type[E], code: int, append: Callable[[], object]
) -> E:
    """The append raises exactly ``error`` with ``code`` and leaves the log untouched."""
    end = log.log_end_offset
    ids = read_ids(log, "read_uncommitted")
    with pytest.raises(error) as info:
        append()
    assert type(info.value) is error
    assert info.value.code == code
    assert log.log_end_offset == end
    assert read_ids(log, "read_uncommitted") == ids
    return info.value


def test_scenario_01_sequence_and_epoch_rules(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    first = log.append(rows(1, 0), producer_id=PID, producer_epoch=0, base_sequence=0)
    second = log.append(rows(1, 1), producer_id=PID, producer_epoch=0, base_sequence=1)
    assert (first.base_offset, second.base_offset) == (0, 1)

    # Kafka's ProducerAppendInfo rejects a re-sent seq 1 with OUT_OF_ORDER because its
    # duplicate check lives elsewhere. Here the store answers the retry from its cache
    # (docs/design.md §4 rule 1), and the validator alone calls it a certain duplicate (46): in
    # neither case is it written twice, which is what Kafka's OOS protects.
    resent = log.append(rows(1, 1), producer_id=PID, producer_epoch=0, base_sequence=1)
    assert resent.duplicate
    assert (resent.base_offset, resent.last_offset) == (1, 1)
    assert log.log_end_offset == 2
    entry = log.state.get(PID)
    assert entry is not None
    with pytest.raises(DuplicateSequenceError) as dup:
        check_append(
            entry, ProducerFields(PID, 0, 1, 1, 1, False), producer_id_known=lambda _pid: True
        )
    assert dup.value.code == 46

    gap = assert_rejected(
        log,
        OutOfOrderSequenceError,
        45,
        lambda: log.append(rows(1, 5), producer_id=PID, producer_epoch=0, base_sequence=5),
    )
    assert "expected sequence 2" in gap.message

    # A new epoch must start at sequence 0.
    assert_rejected(
        log,
        OutOfOrderSequenceError,
        45,
        lambda: log.append(rows(1, 2), producer_id=PID, producer_epoch=1, base_sequence=2),
    )
    bumped = log.append(rows(1, 2), producer_id=PID, producer_epoch=1, base_sequence=0)
    assert (bumped.base_offset, bumped.duplicate) == (2, False)

    zombie = assert_rejected(
        log,
        InvalidProducerEpochError,
        47,
        lambda: log.append(rows(1, 3), producer_id=PID, producer_epoch=0, base_sequence=2),
    )
    assert "epoch 0" in zombie.message and "current epoch 1" in zombie.message
    assert read_ids(log) == [0, 1, 2]


def test_scenario_02_sequence_wraps_from_max_to_zero(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    # An unknown producer is accepted at any sequence (docs/design.md §4).
    top = log.append(rows(1, 0), producer_id=PID, producer_epoch=0, base_sequence=MAX_SEQUENCE)
    assert top.base_offset == 0 and not top.duplicate

    assert_rejected(
        log,
        OutOfOrderSequenceError,
        45,
        lambda: log.append(rows(1, 1), producer_id=PID, producer_epoch=0, base_sequence=1),
    )
    wrapped = log.append(rows(1, 1), producer_id=PID, producer_epoch=0, base_sequence=0)
    assert wrapped.base_offset == 1 and not wrapped.duplicate
    after = log.append(rows(1, 2), producer_id=PID, producer_epoch=0, base_sequence=1)
    assert after.base_offset == 2 and not after.duplicate
    # The batch before the wrap is still recognised as a duplicate.
    retry = log.append(rows(1, 0), producer_id=PID, producer_epoch=0, base_sequence=MAX_SEQUENCE)
    assert retry.duplicate and retry.base_offset == 0
    assert read_ids(log) == [0, 1, 2]


def test_scenario_03_batch_spanning_the_wrap_keeps_both_sequences(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    first_seq = 2**31 - 11
    # 21 rows: sequences 2^31-11 .. 2^31-1 (11 of them), then 0 .. 9 (10 more).
    result = log.append(rows(21, 0), producer_id=PID, producer_epoch=0, base_sequence=first_seq)
    assert (result.base_offset, result.last_offset) == (0, 20)

    stored = list(log.active.batches())
    assert len(stored) == 1
    header = stored[0].header
    assert header.base_sequence == first_seq
    assert header.last_sequence == 9
    assert header.record_count == 21
    fetched = log.read(0).batches
    assert [b.base_sequence for b in fetched] == [first_seq]
    assert fetched[0].records.column("id").to_pylist() == list(range(21))

    entry = log.state.get(PID)
    assert entry is not None
    assert [(b.first_seq, b.last_seq) for b in entry.batches] == [(first_seq, 9)]
    # The state after a restart agrees: the header alone carries both ends.
    log.abandon()
    log = open_log(tmp_path / "p")
    entry = log.state.get(PID)
    assert entry is not None and entry.last_seq == 9
    assert log.append(
        rows(21, 0), producer_id=PID, producer_epoch=0, base_sequence=first_seq
    ).duplicate
    nxt = log.append(rows(1, 21), producer_id=PID, producer_epoch=0, base_sequence=10)
    assert nxt.base_offset == 21 and not nxt.duplicate


def test_scenario_04_abort_marker_at_bumped_epoch_resets_sequence(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    log.append(rows(1, 0), producer_id=PID, producer_epoch=0, base_sequence=0)
    log.append(rows(1, 1), producer_id=PID, producer_epoch=0, base_sequence=1)
    marker = log.write_marker(PID, 1, ControlType.ABORT).offset
    assert marker == 2
    control = log.read_control(marker)
    assert control is not None and control[1] is ControlType.ABORT
    entry = log.state.get(PID)
    assert entry is not None and entry.epoch == 1 and not entry.batches

    oos = assert_rejected(
        log,
        OutOfOrderSequenceError,
        45,
        lambda: log.append(rows(1, 2), producer_id=PID, producer_epoch=1, base_sequence=2),
    )
    assert "expected sequence 0" in oos.message
    ok = log.append(rows(1, 2), producer_id=PID, producer_epoch=1, base_sequence=0)
    assert ok.base_offset == 3 and not ok.duplicate
    assert read_ids(log) == [0, 1, 2]


def test_scenario_05_plain_append_during_open_transaction_is_invalid_txn_state(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path / "p")
    log.append(rows(2, 0), producer_id=PID, producer_epoch=0, base_sequence=0, transactional=True)
    error = assert_rejected(
        log,
        InvalidTxnStateError,
        48,
        lambda: log.append(rows(1, 2), producer_id=PID, producer_epoch=0, base_sequence=2),
    )
    # Named without the producer's state: the sender may not own the producer id.
    assert f"producer_id={PID}" in error.message and "transaction open" in error.message
    assert "epoch" not in error.message and "sequence" not in error.message
    # The transaction itself goes on and commits normally.
    more = log.append(
        rows(1, 2), producer_id=PID, producer_epoch=0, base_sequence=2, transactional=True
    )
    assert more.base_offset == 2
    log.write_marker(PID, 0, ControlType.COMMIT)
    assert read_ids(log) == [0, 1, 2]
    # With the transaction closed, a plain append is fine again.
    assert (
        log.append(rows(1, 3), producer_id=PID, producer_epoch=0, base_sequence=3).base_offset == 4
    )


def test_scenario_06_duplicates_in_and_beyond_the_cached_window(tmp_path: Path) -> None:
    window = 3
    log = open_log(tmp_path / "p", producer_state_batch_window=window)
    originals = [
        log.append(rows(2, 2 * i), producer_id=PID, producer_epoch=0, base_sequence=2 * i)
        for i in range(5)
    ]  # sequences (0,1) (2,3) (4,5) (6,7) (8,9) at offsets 0-1 .. 8-9
    entry = log.state.get(PID)
    assert entry is not None
    assert [(b.first_seq, b.last_seq) for b in entry.batches] == [(4, 5), (6, 7), (8, 9)]
    end = log.log_end_offset
    all_ids = list(range(10))

    tail = log.append(rows(2, 8), producer_id=PID, producer_epoch=0, base_sequence=8)
    assert tail.duplicate
    assert (tail.base_offset, tail.last_offset) == (originals[4].base_offset, 9)
    assert tail.log_append_time == originals[4].log_append_time

    overlap = assert_rejected(
        log,
        OutOfOrderSequenceError,
        45,
        lambda: log.append(rows(2, 9), producer_id=PID, producer_epoch=0, base_sequence=9),
    )
    assert "expected sequence 10" in overlap.message and "9..10" in overlap.message

    oldest = log.append(rows(2, 4), producer_id=PID, producer_epoch=0, base_sequence=4)
    assert oldest.duplicate
    assert (oldest.base_offset, oldest.last_offset) == (4, 5)

    evicted = assert_rejected(
        log,
        DuplicateSequenceError,
        46,
        lambda: log.append(rows(2, 0), producer_id=PID, producer_epoch=0, base_sequence=0),
    )
    assert "0..1" in evicted.message
    assert log.log_end_offset == end
    assert read_ids(log) == all_ids
    # None of the retries disturbed the sequence: the next batch follows on.
    assert (
        log.append(rows(1, 10), producer_id=PID, producer_epoch=0, base_sequence=10).base_offset
        == 10
    )


def _full_entry(producer_id: int, window: int) -> ProducerStateEntry:
    """An entry with every field away from its default."""
    return ProducerStateEntry(
        producer_id=producer_id,
        window=window,
        epoch=32_767,
        batches=deque(
            [
                BatchMetadata(2**31 - 11, 9, 2**40, 2**40 + 20, 1_700_000_000_001),
                BatchMetadata(10, 19, 2**40 + 21, 2**40 + 30, 1_700_000_000_002),
            ]
        ),
        current_txn_first_offset=2**40 + 21,
        last_timestamp=1_700_000_000_002,
        coordinator_epoch=77,
        epoch_start_sequence=2**31 - 11,
        epoch_record_count=2**33,
    )


def test_scenario_07_snapshot_round_trip_keeps_every_field(tmp_path: Path) -> None:
    window = 5
    entries = [
        _full_entry(2**62, window),
        ProducerStateEntry(producer_id=0, window=window, batches=deque()),  # all defaults
        ProducerStateEntry(
            producer_id=3, window=window, epoch=0, batches=deque(), last_timestamp=5
        ),
    ]

    def as_fields(es: list[ProducerStateEntry]) -> list[tuple[object, ...]]:
        return [
            (
                e.producer_id,
                e.window,
                e.epoch,
                list(e.batches),
                e.current_txn_first_offset,
                e.last_timestamp,
                e.coordinator_epoch,
                e.epoch_start_sequence,
                e.epoch_record_count,
            )
            for e in es
        ]

    # Guard: the comparison above must list every field of the dataclass.
    assert len(as_fields(entries)[0]) == len(ProducerStateEntry.__dataclass_fields__)

    data = encode_snapshot(123, entries)
    offset, decoded = decode_snapshot(data, window=window)
    assert offset == 123
    assert as_fields(decoded) == as_fields(entries)
    assert encode_snapshot(offset, decoded) == data

    path = write_snapshot(tmp_path, 456, entries)
    assert path == snapshot_path(tmp_path, 456)
    offset, read_back = read_snapshot(path, window=window)
    assert offset == 456
    assert as_fields(read_back) == as_fields(entries)


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "corrupt":
        position = len(data) // 2
        path.write_bytes(data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :])
    elif how == "truncated":
        path.write_bytes(data[: len(data) - 7])
    else:
        path.write_bytes(b"")


@pytest.mark.parametrize("how", ["corrupt", "truncated", "empty"])
def test_scenario_07_damaged_newest_snapshot_is_deleted_and_older_used(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    directory = tmp_path / "p"
    log = open_log(directory, clock)
    pid2 = PID + 1
    for seq in range(3):
        clock.advance(10)
        log.append(rows(2, 2 * seq), producer_id=PID, producer_epoch=0, base_sequence=2 * seq)
    older = log.take_snapshot()
    older_offset = log.log_end_offset
    clock.advance(10)
    log.append(rows(2, 6), producer_id=PID, producer_epoch=0, base_sequence=6)
    log.append(rows(3, 8), producer_id=pid2, producer_epoch=2, base_sequence=0, transactional=True)
    newest = log.take_snapshot()
    clock.advance(10)
    last = log.append(rows(2, 11), producer_id=PID, producer_epoch=0, base_sequence=8)
    assert newest != older
    expected = producer_states(log)
    expected_lso = log.last_stable_offset
    _damage(newest, how)
    log.abandon()

    with caplog.at_level(logging.INFO):
        log = open_log(directory, clock)
    assert not newest.exists()
    assert older.exists()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any(newest.name in r.getMessage() for r in warnings)
    assert f"replayed from {older_offset}" in caplog.text
    assert producer_states(log) == expected
    assert log.last_stable_offset == expected_lso == 8
    retry = log.append(rows(2, 11), producer_id=PID, producer_epoch=0, base_sequence=8)
    assert retry.duplicate and (retry.base_offset, retry.last_offset) == (
        last.base_offset,
        last.last_offset,
    )
    assert read_ids(log, "read_uncommitted") == list(range(13))


# -- scenario 8 ---------------------------------------------------------------------------
P1, P2, P3 = 11, 12, 13


Op = Callable[[PartitionLog], object]


def _scenario_8_ops() -> list[Op]:
    """Several producers, epochs, committed/aborted/open transactions, with rolls between."""

    def data(pid: int, epoch: int, seq: int, n: int, start: int, txn: bool = False) -> Op:
        return lambda log: log.append(
            rows(n, start),
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            transactional=txn,
        )

    def marker(pid: int, epoch: int, kind: ControlType) -> Op:
        return lambda log: log.write_marker(pid, epoch, kind, coordinator_epoch=epoch + 3)

    def plain(n: int, start: int) -> Op:
        return lambda log: log.append(rows(n, start))

    def roll(log: PartitionLog) -> None:
        log.roll()

    return [
        data(P1, 0, 0, 3, 0),
        data(P2, 0, 0, 2, 3, txn=True),
        data(P1, 0, 3, 2, 5),
        roll,
        data(P2, 0, 2, 2, 7, txn=True),
        marker(P2, 0, ControlType.COMMIT),
        plain(2, 9),
        data(P3, 5, 0, 4, 11, txn=True),
        data(P2, 0, 4, 1, 15, txn=True),
        roll,
        marker(P2, 0, ControlType.ABORT),
        data(P1, 1, 0, 2, 16),  # P1 bumps its epoch
        data(P1, 1, 2, 1, 18),
        data(P3, 5, 4, 2, 19, txn=True),  # P3's transaction spans the roll
        roll,
        marker(P3, 6, ControlType.ABORT),  # coordinator fences P3 with an abort at epoch+1
        data(P2, 0, 5, 2, 21, txn=True),
        data(P1, 1, 3, 1, 23),
        data(P3, 6, 0, 1, 24, txn=True),  # P3 left open at the end
    ]


def _observe(log: PartitionLog) -> tuple[object, ...]:
    aborted = [t for seg in log.segments for t in seg.txn_index.entries]
    return (
        producer_states(log),
        log.state.ongoing_transactions(),
        log.last_stable_offset,
        log.log_end_offset,
        aborted,
        read_ids(log),
        read_ids(log, "read_uncommitted"),
    )


@pytest.mark.parametrize("restart", ["close", "abandon"])
def test_scenario_08_snapshot_plus_replay_equals_never_restarting(
    tmp_path: Path, restart: str
) -> None:
    ops = _scenario_8_ops()
    steady_clock, restarted_clock = ManualClock(), ManualClock()
    steady = open_log(tmp_path / "steady", steady_clock)
    restarted = open_log(tmp_path / "restarted", restarted_clock)
    for i, op in enumerate(ops):
        steady_clock.now = restarted_clock.now = 1_000_000 + 10 * i
        op(steady)
        op(restarted)
        expected = _observe(steady)
        assert _observe(restarted) == expected
        # Restart after every step, so that each replay starts at a different point.
        if restart == "close":
            restarted.close()
        else:
            restarted.abandon()
        restarted = open_log(tmp_path / "restarted", restarted_clock)
        assert _observe(restarted) == expected, f"after step {i} and a {restart}"
    assert len(restarted.segments) == 4
    assert len(producer_states(restarted)) == 3
    assert restarted.state.ongoing_transactions() == {P2: 24, P3: 27}


def test_scenario_09_idle_producer_expires_open_transaction_is_kept(tmp_path: Path) -> None:
    clock = ManualClock()
    expiration = 60_000
    store = LogStore(tmp_path, {"producer.id.expiration.ms": expiration}, clock=clock)
    store.create_topic("t")
    log = store.partition("t", 0)
    idle, in_txn = PID, PID + 1
    log.append(rows(2, 0), producer_id=idle, producer_epoch=3, base_sequence=0)
    log.append(
        rows(2, 2), producer_id=in_txn, producer_epoch=0, base_sequence=0, transactional=True
    )

    clock.advance(expiration - 1)
    assert store.expire_producers() == 0
    assert {e.producer_id for e in log.state} == {idle, in_txn}

    clock.advance(1)
    assert store.expire_producers() == 1
    assert log.state.get(idle) is None
    kept = log.state.get(in_txn)
    assert kept is not None and kept.current_txn_first_offset == 2
    assert log.last_stable_offset == 2

    # Forgotten: any sequence, and even an older epoch, is accepted as a new producer.
    again = log.append(rows(1, 4), producer_id=idle, producer_epoch=1, base_sequence=777)
    assert not again.duplicate and again.base_offset == 4
    # Kept: its retry is still a duplicate and its transaction still commits.
    retry = log.append(
        rows(2, 2), producer_id=in_txn, producer_epoch=0, base_sequence=0, transactional=True
    )
    assert retry.duplicate and retry.base_offset == 2
    log.write_marker(in_txn, 0, ControlType.COMMIT)
    assert read_ids(log) == [0, 1, 2, 3, 4]

    # Once committed, the same producer expires like any other.
    clock.advance(expiration)
    assert store.expire_producers() == 2
    assert len(log.state) == 0
    store.close()


def _segment_files(directory: Path, base: int) -> list[Path]:
    return [
        directory / f"{base:020d}{suffix}"
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TXN_INDEX_SUFFIX)
    ]


@pytest.mark.parametrize("by", ["size", "time"])
@pytest.mark.parametrize("restart", ["close", "abandon"])
def test_scenario_10_retention_keeps_producer_state(tmp_path: Path, by: str, restart: str) -> None:
    clock = ManualClock()
    batch_size = HEADER_SIZE + ipc_stream_size(rows(10))  # every rows(10) batch is this big
    config: dict[str, object] = (
        # Segments 2 and 3 (two batches each) are exactly the retained size.
        {"retention_bytes": 4 * batch_size, "retention_ms": -1}
        if by == "size"
        else {"retention_ms": 1_000}
    )
    directory = tmp_path / "p"
    log = open_log(directory, clock, **config)
    # Segments 0 and 1: only the idempotent producer; segments 2 and 3: plain appends.
    results = []
    for seg in range(2):
        for i in range(2):
            seq = 10 * (2 * seg + i)
            results.append(
                log.append(rows(10, seq), producer_id=PID, producer_epoch=0, base_sequence=seq)
            )
        log.roll()
    clock.advance(5_000)
    for start in (40, 50, 60, 70):
        log.append(rows(10, start))
        if start == 50:
            log.roll()
    assert [s.base_offset for s in log.segments] == [0, 20, 40, 60]
    assert all(s.size == 2 * batch_size for s in log.segments)
    state_before = producer_states(log)
    last = results[-1]

    clock.advance(500)  # segments 0-1 are 5.5 s old, 2-3 are 0.5 s old
    assert log.enforce_retention() == 2
    for base in (0, 20):
        assert not any(p.exists() for p in _segment_files(directory, base))
    assert all(p.exists() for p in _segment_files(directory, 40)[:2])
    assert log.log_start_offset == 40
    assert producer_states(log) == state_before
    with pytest.raises(OffsetOutOfRangeError) as gone:
        log.read(0)
    assert gone.value.code == 1

    def retry_last() -> None:
        retry = log.append(rows(10, 30), producer_id=PID, producer_epoch=0, base_sequence=30)
        assert retry.duplicate
        assert (retry.base_offset, retry.last_offset) == (last.base_offset, last.last_offset)

    retry_last()
    if restart == "close":
        log.close()
    else:
        log.abandon()
    log = open_log(directory, clock, **config)
    assert log.log_start_offset == 40 and log.log_end_offset == 80
    assert producer_states(log) == state_before
    retry_last()
    assert read_ids(log) == list(range(40, 80))
    nxt = log.append(rows(1, 80), producer_id=PID, producer_epoch=0, base_sequence=40)
    assert nxt.base_offset == 80 and not nxt.duplicate
