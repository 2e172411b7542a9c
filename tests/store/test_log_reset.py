"""A follower whose log ends below its leader's log start (a wiped disk, or away longer than
retention) resets its log to start where the leader's does, with the leader's producer
state and leader epoch there (docs/replication.md, "A follower below the leader's log
start"): after it the follower copies the leader byte for byte from the log start, and
as a leader it answers retries of producers whose batches retention deleted, and knows
the transaction left open across the reset. A crash anywhere in a reset leaves a log that
opens (the old one or a prefix of it, or the reset one) and from which copying resumes."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_core.errors import CorruptRecordError, InvalidRequestError
from broker_core.log import replica
from broker_core.log.leader_epoch import EpochEntry
from broker_core.log.partition_log import PartitionLog
from broker_core.log.snapshot import SUFFIX as SNAPSHOT_SUFFIX
from broker_core.log.snapshot import list_snapshots
from broker_core.record.batch import ControlType
from tests.store.helpers import ManualClock, open_log, producer_states, read_ids, rows
from tests.store.test_replica_log import CONFIG, files, replicate

RETAINED = {**CONFIG, "retention_bytes": 3 * 4096}
OLD, LATE, OPEN, FILLER = 61, 62, 63, 64


def leader_past_retention(path: Path, clock: ManualClock) -> tuple[PartitionLog, dict[str, int]]:
    """A leader at epoch 1 whose retention deleted every batch of producer OLD and the first
    of LATE, and the start of OPEN's transaction (still open); returns it and the offsets
    that matter."""
    leader = open_log(path, clock, **RETAINED)
    leader.become_leader(1)
    old = leader.append(rows(3, 0), producer_id=OLD, producer_epoch=0, base_sequence=0)
    leader.append(rows(3, 3), producer_id=LATE, producer_epoch=0, base_sequence=0)
    opened = leader.append(
        rows(2, 6), producer_id=OPEN, producer_epoch=0, base_sequence=0, transactional=True
    )
    for i in range(60):
        leader.append(
            rows(10, 100 + 10 * i), producer_id=FILLER, producer_epoch=0, base_sequence=10 * i
        )
    late = leader.append(rows(3, 900), producer_id=LATE, producer_epoch=0, base_sequence=3)
    assert leader.enforce_retention() > 0
    assert leader.log_start_offset > opened.base_offset
    return leader, {
        "old_first": old.base_offset,
        "old_last": old.last_offset,
        "open_first": opened.base_offset,
        "late_first": late.base_offset,
        "late_last": late.last_offset,
    }


def reset_from(leader: PartitionLog, follower: PartitionLog) -> int:
    """What the fetcher does below the leader's start: ask, reset, copy. Returns where the
    follower's log starts."""
    start, at, epoch, snapshot = leader.log_start_state()
    assert at == start  # the roll's snapshot at the log start is there
    follower.reset_to(at, epoch, snapshot)
    assert follower.high_watermark == at  # until the leader's answers raise it
    replicate(leader, follower)
    follower.update_high_watermark(leader.high_watermark)
    return at


def test_a_wiped_follower_resets_to_the_leaders_log_start_and_copies_it_byte_for_byte(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    leader, at = leader_past_retention(tmp_path / "a", clock)
    follower = open_log(tmp_path / "b", clock, **RETAINED)  # a new, empty disk
    start = reset_from(leader, follower)
    assert follower.log_start_offset == start == leader.log_start_offset
    suffixes = (".log", ".index", ".txnindex")
    assert files(follower, suffixes) == files(leader, suffixes)  # with the epoch checkpoint
    assert follower.epochs.entries == leader.epochs.entries == [EpochEntry(1, start)]
    assert producer_states(follower) == producer_states(leader)
    assert follower.last_stable_offset == leader.last_stable_offset == at["open_first"]
    follower.close()  # and the reset state survives a restart
    reopened = open_log(tmp_path / "b", clock, **RETAINED)
    assert producer_states(reopened) == producer_states(leader)
    assert reopened.log_start_offset == start


def test_after_a_reset_the_follower_leads_with_the_old_producers_and_the_open_transaction(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    leader, at = leader_past_retention(tmp_path / "a", clock)
    follower = open_log(tmp_path / "b", clock, **RETAINED)
    reset_from(leader, follower)
    expected_committed = read_ids(leader, "read_committed")
    leader.abandon()  # the leader's machine is lost; the reset follower is elected
    follower.become_leader(2)
    end = follower.log_end_offset
    # OLD's batches are all below the log start: known only through the leader's snapshot.
    old = follower.append(rows(3, 0), producer_id=OLD, producer_epoch=0, base_sequence=0)
    assert old.duplicate and (old.base_offset, old.last_offset) == (
        at["old_first"],
        at["old_last"],
    )
    late = follower.append(rows(3, 900), producer_id=LATE, producer_epoch=0, base_sequence=3)
    assert late.duplicate and (late.base_offset, late.last_offset) == (
        at["late_first"],
        at["late_last"],
    )
    assert follower.log_end_offset == end  # nothing written twice
    assert read_ids(follower, "read_committed") == expected_committed == []  # below the LSO
    marker = follower.write_marker(OPEN, 0, ControlType.COMMIT, coordinator_epoch=0)
    follower.update_high_watermark(follower.log_end_offset)  # the followers caught up
    assert follower.last_stable_offset == follower.log_end_offset == marker.offset + 1
    committed = read_ids(follower, "read_committed")
    assert committed == read_ids(follower, "read_uncommitted")
    assert committed[-1] == 900 + 2


def test_a_replica_away_longer_than_retention_resets_past_its_old_log(tmp_path: Path) -> None:
    clock = ManualClock()
    leader = open_log(tmp_path / "a", clock, **RETAINED)
    follower = open_log(tmp_path / "b", clock, **RETAINED)
    leader.become_leader(1)
    for i in range(10):
        leader.append(rows(10, 10 * i), producer_id=FILLER, producer_epoch=0, base_sequence=10 * i)
    replicate(leader, follower)
    old_end = follower.log_end_offset
    for i in range(10, 80):  # the follower is away
        leader.append(rows(10, 10 * i), producer_id=FILLER, producer_epoch=0, base_sequence=10 * i)
    leader.enforce_retention()
    assert leader.log_start_offset > old_end
    with pytest.raises(InvalidRequestError):  # never drops what the leader still has
        _start, _at, epoch, snapshot = leader.log_start_state()
        follower.reset_to(old_end, epoch, snapshot)
    start = reset_from(leader, follower)
    assert min(p.name for p in follower.directory.glob("*.log")) == f"{start:020d}.log"
    assert producer_states(follower) == producer_states(leader)
    assert read_ids(follower) == read_ids(leader)


def test_a_bad_snapshot_is_refused_before_anything_is_deleted(tmp_path: Path) -> None:
    clock = ManualClock()
    leader, _at = leader_past_retention(tmp_path / "a", clock)
    follower = open_log(tmp_path / "b", clock, **RETAINED)
    follower.append(rows(3, 0))
    before = files(follower, (".log",))
    _start, at, epoch, snapshot = leader.log_start_state()
    for bad, offset in ((snapshot[:-1] + b"x", at), (snapshot, at + 1)):
        with pytest.raises(CorruptRecordError):
            follower.reset_to(offset, epoch, bad)
    assert files(follower, (".log",)) == before


class Crash(Exception):
    """The process dies here (nothing after this step runs)."""


CRASH_POINTS = ["old_segments_deleted", "snapshot_written", "epochs_written", "segment_created"]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_anywhere_in_a_reset_leaves_a_log_that_opens_and_copying_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    clock = ManualClock()
    leader, _at = leader_past_retention(tmp_path / "a", clock)
    follower = open_log(tmp_path / "b", clock, **RETAINED)
    follower.become_leader(0)
    for i in range(6):  # an old log of its own, below the leader's start
        follower.append(rows(10, 5000 + 10 * i))
    old = read_ids(follower)
    assert follower.log_end_offset < leader.log_start_offset

    def crash(*_args: object, **_kwargs: object) -> None:
        raise Crash(point)

    steps = {  # the first call of each step after the named one
        "old_segments_deleted": "atomic_write",
        "epochs_written": "LogSegment",
    }
    if point in steps:
        monkeypatch.setattr(replica, steps[point], crash)
    elif point == "snapshot_written":
        monkeypatch.setattr(replica.LeaderEpochCache, "rebuild", crash)
    else:  # the segment exists and the directory is fsynced: only memory is left to do
        monkeypatch.setattr(follower.state, "load", crash)
    _start, at, epoch, snapshot = leader.log_start_state()
    with pytest.raises(Crash):
        follower.reset_to(at, epoch, snapshot)
    monkeypatch.undo()

    recovered = open_log(tmp_path / "b", clock, **RETAINED)  # the restart after the crash
    if point == "segment_created":
        assert recovered.log_start_offset == at  # the reset log, with the leader's state
        assert recovered.state.get(OLD) is not None  # known only through the snapshot
    else:
        assert recovered.log_end_offset < leader.log_start_offset  # old, or empty
        assert read_ids(recovered) == old[: len(read_ids(recovered))]
        assert all(o <= recovered.log_end_offset for o, _p in list_snapshots(recovered.directory))
        reset_from(leader, recovered)  # the fetcher finds it below the start again
    replicate(leader, recovered)
    assert producer_states(recovered) == producer_states(leader)
    assert read_ids(recovered, "read_uncommitted") == read_ids(leader, "read_uncommitted")
    assert any(recovered.directory.glob(f"*{SNAPSHOT_SUFFIX}"))


def test_without_a_snapshot_at_its_start_the_leader_offers_a_later_one(tmp_path: Path) -> None:
    """The snapshot at the log start lost (a crash right after a roll): the leader offers
    the next one within its log, and with none the log end, snapshotted then; either way
    the follower ends with the leader's producer state."""
    clock = ManualClock()
    leader, _at = leader_past_retention(tmp_path / "a", clock)
    start = leader.log_start_offset
    snapshots = dict(list_snapshots(leader.directory))
    snapshots[start].unlink()
    later = min(o for o in snapshots if o > start)
    _start, offered, _epoch, _snapshot = leader.log_start_state()
    assert (_start, offered) == (start, later)
    follower = open_log(tmp_path / "b", clock, **RETAINED)
    follower.reset_to(*leader.log_start_state()[1:])
    replicate(leader, follower)
    assert follower.log_start_offset == later
    assert producer_states(follower) == producer_states(leader)

    for _o, path in list_snapshots(leader.directory):
        path.unlink()
    _start, offered, _epoch, _snapshot = leader.log_start_state()
    assert offered == leader.log_end_offset  # snapshotted now, for the follower and itself
    assert [o for o, _p in list_snapshots(leader.directory)] == [offered]
    wiped = open_log(tmp_path / "c", clock, **RETAINED)
    wiped.reset_to(*leader.log_start_state()[1:])
    assert wiped.log_end_offset == leader.log_end_offset
    assert producer_states(wiped) == producer_states(leader)
