"""Transaction markers are durable before the coordinator records a transaction COMPLETE.

The power loss is simulated faithfully enough for the log: every ``os.fsync`` of a regular
file notes the file's size just before it (what the fsync is sure to cover); the "power
loss" then closes the logs without flushing and cuts every file back to that size (0 for a
file never fsynced), which is what a lost page cache leaves at best. Fsyncs after the power
is cut are not noted. Directory entries are not modelled (every file keeps its name).
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path

import pytest

from broker_core.errors import StorageError
from broker_core.log.partition_log import PartitionLog
from broker_core.log.segment import LogSegment
from broker_core.record.batch import ControlType
from tests.store.helpers import ManualClock, open_log, read_ids, rows
from tests.store.test_txn_coordinator import AUDIT, P0, Producer, S, start_broker

PID = 41


class PowerLoss:
    """Notes, per file (device, inode), its size at its last fsync; ``cut`` applies them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.synced: dict[tuple[int, int], int] = {}
        self.power_on = True
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            st = os.fstat(fd)  # before: bytes appended during the fsync may not be covered
            real_fsync(fd)
            if self.power_on and stat.S_ISREG(st.st_mode):
                self.synced[(st.st_dev, st.st_ino)] = st.st_size

        monkeypatch.setattr(os, "fsync", fsync)

    def fail(self) -> None:
        """The power goes out now: later fsyncs (a background flush) make nothing durable."""
        self.power_on = False

    def cut(self, root: Path) -> list[str]:
        """Cut every file under ``root`` to its last fsynced size; the names of those cut."""
        self.fail()
        cut = []
        for path in sorted(root.rglob("*")):
            st = path.stat()
            if not stat.S_ISREG(st.st_mode):
                continue
            durable = self.synced.get((st.st_dev, st.st_ino), 0)
            if st.st_size > durable:
                os.truncate(path, durable)
                cut.append(str(path.relative_to(root)))
        return cut


# -- through the real coordinator ----------------------------------------------------------


@pytest.mark.parametrize("data_durable", [False, True], ids=["data-in-cache", "data-fsynced"])
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_a_complete_transaction_is_ended_in_its_partitions_after_power_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, commit: bool, data_durable: bool
) -> None:
    power = PowerLoss(monkeypatch)
    b = start_broker(tmp_path)  # default flush policy: appends are never fsynced
    p = Producer(b, "etl").init()
    p.send(P0, range(0, 3))
    p.send(AUDIT, range(10, 12))
    if data_durable:
        # As flush.ms or a roll may have done before the transaction ended: then a lost
        # marker leaves the transaction open for good and the LSO stuck at its start.
        for tp in (P0, AUDIT):
            b.store.partition(*tp).flush()
    p.commit() if commit else p.abort()
    complete = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
    assert b.stored("etl").state is complete

    b.crash()  # no flush, no snapshot, no clean-shutdown file
    cut = power.cut(tmp_path)
    assert cut, "the simulation must have dropped something (else it shows nothing)"

    b = start_broker(tmp_path)
    assert b.stored("etl").state is complete  # the coordinator will never send them again
    for tp, ids in ((P0, [0, 1, 2]), (AUDIT, [10, 11])):
        assert b.stable(tp), f"{tp}: the transaction is still open after the power loss"
        producer_id, _epoch, control = b.last_marker(tp)
        assert producer_id == p.producer_id
        assert control is (ControlType.COMMIT if commit else ControlType.ABORT)
        assert b.committed(tp) == (ids if commit else [])
        assert b.uncommitted(tp) == ids
        log = b.store.partition(*tp)
        aborts = [t for seg in log.segments for t in seg.txn_index.entries]
        assert [(t.producer_id, t.first_offset, t.last_offset) for t in aborts] == (
            [] if commit else [(p.producer_id, 0, len(ids))]  # up to the marker, as Kafka
        ), "the aborted-transaction index after recovery"
        # Later data is readable (an aborted range must not hide it, nor an open one).
        log.append(rows(1, 99))
        assert b.committed(tp) == (ids if commit else []) + [99]


# -- the partition log itself ----------------------------------------------------------------


def open_txn(log: PartitionLog, start: int, n: int = 3) -> None:
    log.append(
        rows(n, start), producer_id=PID, producer_epoch=0, base_sequence=0, transactional=True
    )


def test_a_marker_that_rolls_the_log_returns_after_the_rolled_segment_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    power = PowerLoss(monkeypatch)
    clock = ManualClock()
    directory = tmp_path / "p"
    log = open_log(directory, clock, segment_ms=1000)
    open_txn(log, 0)
    clock.advance(1000)  # the marker's append rolls the segment
    # The rolled segment (the data) is flushed in the background: slowly here, so that a
    # marker returning before that flush is caught.
    real = PartitionLog._flush_rolled

    def slow_flush(self: PartitionLog, old: LogSegment, snapshot: Path) -> None:
        time.sleep(0.3)
        real(self, old, snapshot)

    monkeypatch.setattr(PartitionLog, "_flush_rolled", slow_flush)
    written = log.write_marker(PID, 0, ControlType.COMMIT)
    power.fail()  # right when the coordinator would store COMPLETE
    assert [s.base_offset for s in log.segments] == [0, 3]
    assert (written.offset, written.last_stable_offset) == (3, 4)
    log.abandon()
    power.cut(tmp_path)

    log = open_log(directory, clock, segment_ms=1000)
    assert read_ids(log) == [0, 1, 2]
    assert log.last_stable_offset == log.log_end_offset == 4
    found = log.read_control(3)
    assert found is not None and found[1] is ControlType.COMMIT


def test_a_marker_is_fsynced_whatever_the_flush_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    power = PowerLoss(monkeypatch)
    directory = tmp_path / "p"
    log = open_log(directory)  # flush.messages and flush.ms: never
    open_txn(log, 0)
    log.append(rows(2, 3))  # non-transactional, after the open transaction
    assert power.synced == {}
    written = log.write_marker(PID, 0, ControlType.ABORT)
    assert (written.offset, written.last_stable_offset) == (5, 6)
    segment = log.active.log_path.stat()
    assert power.synced[(segment.st_dev, segment.st_ino)] == segment.st_size
    txn_index = log.active.txn_index.path.stat()
    assert power.synced[(txn_index.st_dev, txn_index.st_ino)] == txn_index.st_size > 0
    log.abandon()
    power.cut(tmp_path)

    log = open_log(directory)
    assert read_ids(log) == [3, 4]
    assert log.last_stable_offset == log.log_end_offset == 6


def test_a_failed_fsync_is_never_followed_by_an_acknowledged_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "p"
    log = open_log(directory)
    open_txn(log, 0)
    real_fsync = os.fsync
    failures = [OSError(errno.EIO, "Input/output error")]

    def flaky_fsync(fd: int) -> None:
        if failures:
            raise failures.pop()
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", flaky_fsync)
    with pytest.raises(StorageError, match="fsync failed") as info:
        log.write_marker(PID, 0, ControlType.COMMIT)
    assert info.value.retriable  # the coordinator keeps PREPARE_COMMIT and retries
    # The next fsync succeeds, but the pages the failed one lost may be gone: refused.
    with pytest.raises(StorageError, match="an fsync of this log failed earlier"):
        log.write_marker(PID, 0, ControlType.COMMIT)
    log.abandon()

    log = open_log(directory)  # a restart recovers from what is on disk
    written = log.write_marker(PID, 0, ControlType.COMMIT)
    assert written.last_stable_offset == log.log_end_offset
    assert read_ids(log) == [0, 1, 2]


def test_a_failed_background_flush_of_a_rolled_segment_refuses_markers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    log = open_log(tmp_path / "p", clock, segment_ms=1000)
    open_txn(log, 0)
    clock.advance(1000)

    def failing_flush(self: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(LogSegment, "flush", failing_flush)
    with pytest.raises(StorageError, match="an fsync of this log failed earlier"):
        log.write_marker(PID, 0, ControlType.COMMIT)  # rolls; the rolled flush fails
    log.abandon()
