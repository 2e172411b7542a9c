"""``flush.writeback.bytes``: appended batches are handed to the disk as they accumulate,
so a later fsync (a transaction marker's) no longer writes the whole transaction's data
while its caller waits. Seen in the kernel's own page counts (``cachestat``)."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import pytest

import broker_core.log.segment as segment_module
from broker_core.log.partition_log import PartitionLog
from broker_core.log.segment import LogSegment
from broker_core.record.batch import ControlType
from tests.harness.page_cache import page_counts
from tests.harness.waiting import wait_until
from tests.store.helpers import open_log, read_ids, rows

MIB = 1 << 20
BATCH_ROWS = 20_000  # about 0.5 MiB a batch with 16-character values
BATCHES = 8
# Well inside the kernel's own periodic writeback (dirty_expire_centisecs, 30 s): pages
# clean before it were written because the log asked.
HINTED_DEADLINE_S = 10.0


def _append_batches(log: PartitionLog, *, transactional: bool = True) -> None:
    """BATCHES batches of one producer (about 4 MiB), in one transaction by default."""
    for i in range(BATCHES):
        log.append(
            rows(BATCH_ROWS, i * BATCH_ROWS, width=16),
            producer_id=1,
            producer_epoch=0,
            base_sequence=i * BATCH_ROWS,
            transactional=transactional,
        )


def _append_transaction(path: Path, writeback_bytes: int) -> LogSegment:
    log = open_log(path, flush_writeback_bytes=writeback_bytes)
    _append_batches(log)
    return log.active


def test_appended_batches_are_written_back_without_an_fsync(tmp_path: Path) -> None:
    hinted = _append_transaction(tmp_path / "hinted", MIB)
    unhinted = _append_transaction(tmp_path / "unhinted", 0)
    assert hinted.size > 3 * MIB and unhinted.size == hinted.size
    # The twin shows the scenario: without the hint the appended pages stay dirty (no
    # fsync was made, and the kernel's own writeback waits 30 s).
    assert page_counts(unhinted.log_path).dirty > 0
    # With it, the kernel writes them now: everything up to the last full MiB at least.
    left = wait_until(
        lambda: (c := page_counts(hinted.log_path)).dirty + c.writeback <= MIB // 4096 and c,
        "the hinted log's pages written back",
        timeout=HINTED_DEADLINE_S,
    )
    assert left.cached > 0


def test_the_hint_covers_each_appended_byte_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(
        segment_module, "start_writeback", lambda _fd, off, n: calls.append((off, n)) or True
    )
    log = open_log(tmp_path, flush_writeback_bytes=MIB)
    _append_batches(log)
    log.write_marker(1, 0, ControlType.COMMIT)
    assert calls, "no writeback was started"
    # Back to back from the segment's start, each at least the threshold.
    assert calls[0][0] == 0
    for (off, n), (next_off, _) in itertools.pairwise(calls):
        assert next_off == off + n
    assert all(n >= MIB for _, n in calls)
    covered = calls[-1][0] + calls[-1][1]
    assert log.active.size - covered < MIB  # at most one threshold's worth left to the fsync
    assert read_ids(log) == list(range(BATCHES * BATCH_ROWS))


def test_a_refused_hint_stops_the_hints_and_keeps_the_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    def refuse(_fd: int, _off: int, _n: int) -> bool:
        calls.append(1)
        raise OSError(22, "sync_file_range: Invalid argument")

    monkeypatch.setattr(segment_module, "start_writeback", refuse)
    log = open_log(tmp_path, flush_writeback_bytes=MIB)
    with caplog.at_level(logging.WARNING, logger="idemlog.segment"):
        _append_batches(log, transactional=False)
    assert calls == [1]  # tried once, then off for this segment
    assert "early writeback off" in caplog.text
    assert read_ids(log) == list(range(BATCHES * BATCH_ROWS))
