"""Read-only inspection (``broker_core.log.inspect``): it answers what a recovered log
answers, and leaves the directory byte for byte as it found it (issue 24)."""

from __future__ import annotations

import shutil
from pathlib import Path

from broker_core.log.config import LogConfig
from broker_core.log.inspect import PartitionView, StoreView, open_partition
from broker_core.log.partition_log import PartitionLog
from broker_core.record.batch import ControlType
from tests.harness.files import changed_files, digest_tree
from tests.store.helpers import open_store, read_ids, rows

P1, P2, P3, IDEMPOTENT = 101, 202, 303, 404
CONFIG = {"segment.bytes": 4096, "max.message.bytes": 4096}


def _txn(log: PartitionLog, pid: int, seq: int, n: int, start: int) -> None:
    log.append(
        rows(n, start), producer_id=pid, producer_epoch=0, base_sequence=seq, transactional=True
    )


def _busy_log(path: Path) -> PartitionLog:
    """Several segments (so snapshots), a committed, an aborted (across a roll) and an open
    transaction, and an idempotent producer."""
    log = PartitionLog(path, LogConfig.from_mapping(CONFIG))
    seq = 0
    for i in range(6):
        log.append(rows(20, 100 * i), producer_id=IDEMPOTENT, producer_epoch=0, base_sequence=seq)
        seq += 20
    _txn(log, P1, 0, 5, 1000)
    log.roll()
    _txn(log, P1, 5, 5, 1005)
    log.write_marker(P1, 0, ControlType.ABORT)
    _txn(log, P2, 0, 7, 2000)
    log.write_marker(P2, 0, ControlType.COMMIT)
    log.append(rows(3, 3000), producer_id=IDEMPOTENT, producer_epoch=0, base_sequence=seq)
    _txn(log, P3, 0, 4, 4000)  # left open
    assert len(log.segments) >= 3
    return log


def _view_ids(view: PartitionView, isolation: str) -> list[int]:
    offset, ids = view.log_start_offset, []
    while True:
        result = view.read(offset, isolation=isolation, max_bytes=1 << 12)
        ids += [i for b in result.batches for i in b.records.column("id").to_pylist()]
        if result.next_offset == offset:
            return ids
        offset = result.next_offset


def _states(state: object) -> dict[int, tuple[object, ...]]:
    return {
        e.producer_id: (e.epoch, list(e.batches), e.current_txn_first_offset)
        for e in state  # type: ignore[attr-defined]
    }


def _assert_same_as_recovered(view: PartitionView, directory: Path, tmp_path: Path) -> None:
    copy = tmp_path / "recovered"
    shutil.copytree(directory, copy)
    log = PartitionLog(copy, LogConfig.from_mapping(CONFIG))
    try:
        assert (view.log_start_offset, view.log_end_offset, view.last_stable_offset) == (
            log.log_start_offset,
            log.log_end_offset,
            log.last_stable_offset,
        )
        assert len(view.segments) == len(log.segments)
        assert _states(view.state) == _states(log.state)
        assert view.state.ongoing_transactions() == log.state.ongoing_transactions()
        for isolation in ("read_committed", "read_uncommitted"):
            assert _view_ids(view, isolation) == read_ids(log, isolation)
    finally:
        log.close()


def test_crashed_log_reads_as_recovery_would_and_nothing_changes(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    _busy_log(directory).abandon()  # a crash: no snapshot at the end, no clean marker
    before = digest_tree(directory)
    view = open_partition(directory, LogConfig.from_mapping(CONFIG))
    assert view.problems == []
    assert view.snapshot_offset is not None  # the state started from a roll's snapshot
    assert view.state.ongoing_transactions() == {P3: view.log_end_offset - 4}
    _assert_same_as_recovered(view, directory, tmp_path)
    view.close()
    assert changed_files(directory, before, digest_tree(directory)) == []


def test_clean_shutdown_marker_is_left_in_place(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    _busy_log(directory).close()
    assert (directory / ".clean_shutdown").exists()
    before = digest_tree(directory)
    view = open_partition(directory, LogConfig.from_mapping(CONFIG))
    _assert_same_as_recovered(view, directory, tmp_path)
    view.close()
    assert changed_files(directory, before, digest_tree(directory)) == []


def test_torn_tail_is_reported_not_repaired(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    log = _busy_log(directory)
    end = log.log_end_offset
    active = log.active.log_path
    log.abandon()
    good_size = active.stat().st_size
    with open(active, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x01\x00" * 5)  # half a header: a torn append
    before = digest_tree(directory)
    view = open_partition(directory, LogConfig.from_mapping(CONFIG))
    assert len(view.problems) == 1, view.problems
    assert active.name in view.problems[0] and f"at byte {good_size}" in view.problems[0]
    assert view.log_end_offset == end
    _assert_same_as_recovered(view, directory, tmp_path)  # recovery cuts it at the same end
    view.close()
    assert changed_files(directory, before, digest_tree(directory)) == []
    assert active.stat().st_size == good_size + 40  # still torn: not ours to fix


def test_store_view_creates_no_partition_directory_and_no_lock_file(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.create_topic("orders", 3)
    store.partition("orders", 1).append(rows(4))
    store.close()
    before = digest_tree(tmp_path)
    with StoreView(tmp_path) as view:
        assert view.topics() == ["orders"] and not view.live
        assert view.partition("orders", 0).log_end_offset == 0  # never opened: no directory
        assert view.partition("orders", 1).log_end_offset == 4
    assert not (tmp_path / "orders" / "0").exists()
    assert not (tmp_path / ".lock").exists()
    assert changed_files(tmp_path, before, digest_tree(tmp_path)) == []


def test_torn_transaction_index_is_read_without_being_rewritten(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    _busy_log(directory).abandon()
    (txn_index,) = [p for p in directory.glob("*.txnindex") if p.stat().st_size]  # the abort
    with open(txn_index, "ab") as f:
        f.write(b"\x01\x02\x03")  # a torn last entry: recovery rewrites the file without it
    before = digest_tree(directory)
    view = open_partition(directory, LogConfig.from_mapping(CONFIG))
    _assert_same_as_recovered(view, directory, tmp_path)  # the abort is still skipped
    view.close()
    assert changed_files(directory, before, digest_tree(directory)) == []
