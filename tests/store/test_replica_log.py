"""The log side of replication (dormant in the server): a follower copies its leader's
batches byte for byte and rebuilds the same producer state; after a failover the new
leader answers a retried batch as a duplicate; a diverged tail is truncated by leader
epoch (KIP-101/279) and the logs converge; truncation and reopening agree with a log
rebuilt from scratch."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from broker_core.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidRequestError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
)
from broker_core.log.leader_epoch import CHECKPOINT_FILE, EpochEndOffset, EpochEntry
from broker_core.log.partition_log import PartitionLog
from broker_core.log.recovery import CLEAN_SHUTDOWN_FILE
from broker_core.log.snapshot import SUFFIX as SNAPSHOT_SUFFIX
from broker_core.record.batch import ControlType
from tests.store.helpers import (
    ManualClock,
    open_log,
    producer_states,
    read_ids,
    rows,
    rows_with_bad_offsets,
)

CONFIG = {"segment_bytes": 4096, "max_message_bytes": 4096, "index_interval_bytes": 512}
IDEMPOTENT, COMMITTED, ABORTED, OPEN = 11, 22, 33, 44


def new_log(path: Path, clock: ManualClock) -> PartitionLog:
    return open_log(path, clock, **CONFIG)


def replicate(leader: PartitionLog, follower: PartitionLog, max_bytes: int = 1500) -> int:
    """Fetch from the leader at the follower's end until caught up; returns the fetches."""
    fetches = 0
    while follower.log_end_offset < leader.log_end_offset:
        raw = leader.read_raw(follower.log_end_offset, max_bytes)
        follower.append_as_follower(raw)
        fetches += 1
    return fetches


def state_of(log: PartitionLog) -> dict[str, object]:
    """Everything a leader answers producers and readers from, comparable across logs."""
    return {
        "producers": producer_states(log),
        "ongoing": log.state.ongoing_transactions(),
        "first_unstable": log.state.first_unstable_offset(),
        "lso": log.last_stable_offset,
        "end": log.log_end_offset,
        "epochs": log.epochs.entries,
        "aborted": [t for seg in log.segments for t in seg.txn_index.entries],
    }


def files(log: PartitionLog, suffixes: tuple[str, ...] = (".log", ".txnindex")) -> dict:
    """Name -> bytes of the log's files with these suffixes, and its epoch checkpoint."""
    found = {
        p.name: p.read_bytes()
        for p in sorted(log.directory.iterdir())
        if p.suffix in suffixes or p.name == CHECKPOINT_FILE
    }
    return found


def workload(log: PartitionLog, start: int = 0) -> int:
    """Idempotent, transactional (committed, aborted, left open) and plain batches; a
    retry answered as a duplicate. Returns the next row id."""
    rid = start
    for seq in range(0, 12, 3):
        log.append(rows(3, rid), producer_id=IDEMPOTENT, producer_epoch=0, base_sequence=seq)
        rid += 3
    retry = log.append(rows(3, rid - 3), producer_id=IDEMPOTENT, producer_epoch=0, base_sequence=9)
    assert retry.duplicate
    for pid, outcome in ((COMMITTED, ControlType.COMMIT), (ABORTED, ControlType.ABORT)):
        for seq in (0, 2):
            log.append(
                rows(2, rid),
                producer_id=pid,
                producer_epoch=1,
                base_sequence=seq,
                transactional=True,
            )
            rid += 2
        log.append(rows(4, rid))
        rid += 4
        log.write_marker(pid, 1, outcome, coordinator_epoch=3)
    log.append(
        rows(2, rid), producer_id=OPEN, producer_epoch=0, base_sequence=0, transactional=True
    )
    return rid + 2


def test_a_follower_copies_the_leader_byte_for_byte_with_the_same_producer_state(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    leader, follower = new_log(tmp_path / "a", clock), new_log(tmp_path / "b", clock)
    leader.become_leader(1)
    workload(leader)
    assert len(leader.segments) > 1  # rolls happened on both sides
    assert replicate(leader, follower) > 1
    assert files(follower, (".log", ".txnindex", ".index", SNAPSHOT_SUFFIX)) == files(
        leader, (".log", ".txnindex", ".index", SNAPSHOT_SUFFIX)
    )
    assert state_of(follower) == state_of(leader)
    assert follower.epochs.entries == [EpochEntry(1, 0)]
    assert follower.state.first_unstable_offset() is not None  # OPEN's transaction
    for isolation in ("read_committed", "read_uncommitted"):
        assert read_ids(follower, isolation) == read_ids(leader, isolation)
    assert follower.read_raw(follower.log_end_offset) == b""


def test_the_new_leader_answers_a_retried_batch_as_a_duplicate_with_the_original_offsets(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    leader, follower = new_log(tmp_path / "a", clock), new_log(tmp_path / "b", clock)
    leader.become_leader(1)
    workload(leader)
    first = leader.append(rows(3, 900), producer_id=IDEMPOTENT, producer_epoch=0, base_sequence=12)
    replicate(leader, follower)
    leader.abandon()  # the leader's machine is lost; the follower is elected

    follower.become_leader(2)
    retried = follower.append(
        rows(3, 900), producer_id=IDEMPOTENT, producer_epoch=0, base_sequence=12
    )
    assert retried.duplicate
    assert (retried.base_offset, retried.last_offset) == (first.base_offset, first.last_offset)
    assert follower.log_end_offset == first.last_offset + 1  # nothing written
    with pytest.raises(OutOfOrderSequenceError):
        follower.append(rows(1, 950), producer_id=IDEMPOTENT, producer_epoch=0, base_sequence=17)
    nxt = follower.append(rows(1, 950), producer_id=IDEMPOTENT, producer_epoch=0, base_sequence=15)
    assert not nxt.duplicate and nxt.base_offset == first.last_offset + 1
    # The open transaction came along: the new leader's marker completes it.
    marker = follower.write_marker(OPEN, 0, ControlType.COMMIT, coordinator_epoch=0)
    assert marker.last_stable_offset == follower.log_end_offset
    assert follower.epochs.entries == [EpochEntry(1, 0), EpochEntry(2, first.last_offset + 1)]
    (_, stored) = next(follower.batches_from(nxt.base_offset))
    assert stored.header.leader_epoch == 2


def diverge(tmp_path: Path) -> tuple[PartitionLog, PartitionLog, int]:
    """A (epoch 1) wrote a tail B never fetched; B led at epoch 2 and wrote its own tail.

    Returns (A, B, the offset where epoch 2 starts on B)."""
    clock = ManualClock()
    a, b = new_log(tmp_path / "a", clock), new_log(tmp_path / "b", clock)
    a.become_leader(1)
    rid = workload(a)
    replicate(a, b)
    # A's tail, never replicated: idempotent data, a new transaction and its commit.
    for seq in (12, 15, 18, 21):
        a.append(rows(3, rid), producer_id=IDEMPOTENT, producer_epoch=0, base_sequence=seq)
        rid += 3
    a.append(
        rows(2, rid), producer_id=ABORTED, producer_epoch=1, base_sequence=4, transactional=True
    )
    a.write_marker(OPEN, 0, ControlType.ABORT, coordinator_epoch=0)
    a.take_snapshot()  # a snapshot inside the diverged range: truncation must drop it
    clock.advance(5)
    b.become_leader(2)
    diverged_at = b.log_end_offset
    # B's tail: the producer retries what it never had acknowledged, then more.
    b.append(rows(3, 5000), producer_id=IDEMPOTENT, producer_epoch=0, base_sequence=12)
    b.write_marker(OPEN, 0, ControlType.COMMIT, coordinator_epoch=0)
    b.append(rows(5, 6000))
    return a, b, diverged_at


def test_a_diverged_tail_is_truncated_by_leader_epoch_and_the_logs_converge(
    tmp_path: Path,
) -> None:
    a, b, diverged_at = diverge(tmp_path)
    assert a.log_end_offset > diverged_at
    # OffsetsForLeaderEpoch: A asks B where A's latest epoch ended.
    answer = b.end_offset_for(a.epochs.latest_epoch)
    assert answer == EpochEndOffset(1, diverged_at)
    end = a.truncate_to(min(answer.end_offset, a.log_end_offset))
    assert end == diverged_at == a.log_end_offset
    assert a.epochs.entries == [EpochEntry(1, 0)]
    assert all(int(p.stem) <= end for p in a.directory.glob(f"*{SNAPSHOT_SUFFIX}"))

    replicate(b, a)
    assert files(a) == files(b)  # segments, txn indexes and epoch checkpoint
    assert state_of(a) == state_of(b)
    assert read_ids(a, "read_uncommitted") == read_ids(b, "read_uncommitted")
    a.close()
    reopened = new_log(a.directory, ManualClock())
    assert state_of(reopened) == state_of(b)


def test_producer_state_after_truncation_equals_a_log_rebuilt_from_scratch(
    tmp_path: Path,
) -> None:
    a, _b, diverged_at = diverge(tmp_path)
    a.truncate_to(diverged_at)
    truncated = state_of(a)
    # From scratch: the same segments, no snapshot, no clean-shutdown marker: a full replay.
    scratch = tmp_path / "scratch"
    shutil.copytree(a.directory, scratch)
    for path in scratch.iterdir():
        if path.suffix == SNAPSHOT_SUFFIX or path.name == CLEAN_SHUTDOWN_FILE:
            path.unlink()
    rebuilt = new_log(scratch, ManualClock())
    assert rebuilt.log_end_offset == diverged_at
    assert state_of(rebuilt) == truncated
    # Reopening the truncated log, after a crash and after a clean close, agrees too.
    a.abandon()
    crashed = new_log(a.directory, ManualClock())
    assert state_of(crashed) == truncated
    crashed.close()
    clean = new_log(a.directory, ManualClock())
    assert state_of(clean) == truncated


def test_truncation_inside_a_batch_cuts_before_it_and_out_of_range_is_refused(
    tmp_path: Path,
) -> None:
    log = new_log(tmp_path / "a", ManualClock())
    log.append(rows(3, 0))
    log.append(rows(3, 3))
    assert log.truncate_to(10) == 6  # at or past the end: nothing to cut
    assert log.truncate_to(4) == 3  # offset 4 is inside the batch [3, 5]
    assert read_ids(log) == [0, 1, 2]
    log.append(rows(1, 9))
    assert read_ids(log) == [0, 1, 2, 9]
    assert log.truncate_to(0) == 0 and read_ids(log) == []


def test_follower_appends_are_checked_before_anything_is_written(tmp_path: Path) -> None:
    clock = ManualClock()
    leader, follower = new_log(tmp_path / "a", clock), new_log(tmp_path / "b", clock)
    leader.append(rows(3, 0))
    leader.become_leader(3)
    leader.append(rows(3, 3))
    raw = leader.read_raw(0)
    with pytest.raises(OffsetOutOfRangeError, match="start at offset 3, but this log ends at 0"):
        follower.append_as_follower(leader.read_raw(3))
    corrupt = bytearray(raw)
    corrupt[-1] ^= 1  # in the second batch: the first must not be written either
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        follower.append_as_follower(bytes(corrupt))
    with pytest.raises(CorruptRecordError, match="needs"):
        follower.append_as_follower(raw[:-8])
    assert follower.log_end_offset == 0 and follower.epochs.entries == []
    assert follower.append_as_follower(b"") == 0
    assert follower.append_as_follower(raw) == 6
    assert follower.epochs.entries == [EpochEntry(0, 0), EpochEntry(3, 3)]
    # A batch of an older epoch than the follower's latest: refused.
    older = new_log(tmp_path / "c", clock)
    older.append(rows(1, 0))
    stale = bytearray(older.read_raw(0))
    struct.pack_into(">q", stale, 0, 6)
    with pytest.raises(InvalidRecordError, match="leader epoch 0, older than 3"):
        follower.append_as_follower(bytes(stale))
    # Having followed epoch 3, it may not append as the leader of epoch 0.
    with pytest.raises(InvalidRequestError, match="older than this log's latest epoch 3"):
        follower.append(rows(1, 7))
    with pytest.raises(InvalidRequestError):
        follower.become_leader(2)
    follower.become_leader(4)
    assert follower.append(rows(1, 7)).base_offset == 6


def test_a_follower_refuses_rows_that_fail_arrows_full_validation(tmp_path: Path) -> None:
    # A leader's log from before produce validated (or a leader that skipped it): the bad
    # buffers stop at the follower, which writes nothing of the fetch.
    clock = ManualClock()
    leader, follower = new_log(tmp_path / "a", clock), new_log(tmp_path / "b", clock)
    leader.append(rows(2, 0))
    leader.append(rows_with_bad_offsets())
    with pytest.raises(InvalidRecordError, match=r"fetched batch at offset 2: invalid Arrow"):
        follower.append_as_follower(leader.read_raw(0))
    assert follower.log_end_offset == 0


def test_the_high_watermark_is_the_log_end_until_set_and_bounds_the_lso(tmp_path: Path) -> None:
    log = new_log(tmp_path / "a", ManualClock())
    log.append(rows(3, 0))
    assert log.high_watermark == log.log_end_offset == log.last_stable_offset == 3
    assert log.update_high_watermark(1) == 1
    assert log.update_high_watermark(0) == 1  # never moves back
    log.append(rows(2, 3))
    assert (log.high_watermark, log.last_stable_offset, log.log_end_offset) == (1, 1, 5)
    assert read_ids(log, "read_uncommitted") == [0]  # readers stop at the HW, mid-batch
    with pytest.raises(OffsetOutOfRangeError):
        log.update_high_watermark(6)
    log.update_high_watermark(5)
    log.append(rows(1, 9), producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)
    assert log.last_stable_offset == 5  # the open transaction, below the HW
    log.truncate_to(3)
    assert log.high_watermark == 3
    log.append(rows(1, 10))
    assert log.high_watermark == 3  # not the log end again: a replica must advance it


def test_a_log_written_before_leader_epochs_opens_at_epoch_zero(tmp_path: Path) -> None:
    log = new_log(tmp_path / "a", ManualClock())
    log.append(rows(3, 0))
    log.write_marker(7, 0, ControlType.COMMIT)
    log.close()
    assert not (tmp_path / "a" / CHECKPOINT_FILE).exists()  # no fsync for epoch 0 alone
    log = new_log(tmp_path / "a", ManualClock())
    assert log.leader_epoch == 0 and log.epochs.entries == [EpochEntry(0, 0)]
    assert log.end_offset_for(0) == EpochEndOffset(0, 4)
    (tmp_path / "a" / CHECKPOINT_FILE).write_bytes(b"garbage")
    log.close()
    rebuilt = new_log(tmp_path / "a", ManualClock())  # unreadable: rebuilt from the batches
    assert rebuilt.epochs.entries == [EpochEntry(0, 0)]
    assert (tmp_path / "a" / CHECKPOINT_FILE).read_bytes() == b"0\n1\n0 0\n"


def test_retention_moves_the_earliest_epoch_to_the_log_start(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path / "a", clock, retention_bytes=4096, **CONFIG)
    log.become_leader(1)
    for i in range(10):
        log.append(rows(20, 20 * i))
    log.become_leader(2)
    for i in range(10, 20):
        log.append(rows(20, 20 * i))
    assert log.enforce_retention() > 0
    start = log.log_start_offset
    assert start > 200  # every batch of epoch 1 (offsets 0-199) is gone
    assert log.epochs.entries == [EpochEntry(2, start)]
    log.close()
    reopened = open_log(tmp_path / "a", clock, retention_bytes=4096, **CONFIG)
    assert reopened.epochs.entries == log.epochs.entries
