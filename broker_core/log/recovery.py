"""Opening a partition directory: find the valid log end and rebuild the producer state.

After a clean close (``.clean_shutdown`` present) everything is trusted and the producer
state is loaded from the snapshot at the log end: no batch is read.

After a crash:
1. the segments from the one holding the newest snapshot's offset onwards are re-scanned
   with CRC checks; the first torn, corrupt or misplaced batch and everything after it
   is truncated (the tail that was never acknowledged durably);
2. the newest readable snapshot at or below the recovered log end is loaded (unreadable
   ones and ones beyond the end are deleted);
3. the batches from that snapshot's offset to the end are replayed into the producer
   state, without sequence checks, re-creating the aborted-transaction index entries.

So the work after a crash is proportional to the tail since the last snapshot (taken at
every segment roll), not to the size of the log.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker_core.errors import CorruptRecordError
from broker_core.fileutil import fsync_directory
from broker_core.log.segment import INDEX_SUFFIX, LOG_SUFFIX, TXN_INDEX_SUFFIX, LogSegment
from broker_core.log.snapshot import delete_snapshots_below, list_snapshots, load_newest_valid
from broker_core.record.batch import decode_control

if TYPE_CHECKING:
    from broker_core.log.partition_log import PartitionLog

log = logging.getLogger("idemlog.recovery")


def _segment_offsets(log_: PartitionLog) -> list[int]:
    offsets = []
    for path in log_.directory.iterdir():
        if path.name.endswith(".tmp"):
            path.unlink()  # an interrupted atomic write; the old file is still in place
            continue
        stem, _, suffix = path.name.partition(".")
        if f".{suffix}" == LOG_SUFFIX:
            if len(stem) != 20 or not stem.isdigit():
                raise CorruptRecordError(f"{path}: not a segment name (<20-digit offset>.log)")
            offsets.append(int(stem))
    for path in log_.directory.iterdir():
        stem, _, suffix = path.name.partition(".")
        if f".{suffix}" in (INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            if len(stem) != 20 or not stem.isdigit():
                raise CorruptRecordError(f"{path}: not an index name (<20-digit offset>.{suffix})")
            if int(stem) not in offsets:
                path.unlink()  # index of a segment deleted before a crash
    return sorted(offsets)


def recover(log_: PartitionLog) -> None:
    from broker_core.log.partition_log import CLEAN_SHUTDOWN_FILE

    directory = log_.directory
    marker = directory / CLEAN_SHUTDOWN_FILE
    clean = marker.exists()
    offsets = _segment_offsets(log_)
    if not offsets:
        marker.unlink(missing_ok=True)
        return
    segments = [LogSegment(directory, base) for base in offsets]
    log_.segments = segments
    snapshots = list_snapshots(directory)
    if clean:
        for seg in segments:
            seg.load_summary(log_.config.index_interval_bytes)
    else:
        newest = snapshots[-1][0] if snapshots else offsets[0]
        first_scanned = max(i for i, base in enumerate(offsets) if base <= newest or i == 0)
        for seg in segments[:first_scanned]:
            seg.load_summary(log_.config.index_interval_bytes)
        _scan_tail(log_, first_scanned)

    end = log_.log_end_offset
    loaded = load_newest_valid(directory, window=log_.state.window, at_most=end)
    if loaded is not None and loaded[0] < log_.log_start_offset:
        loaded = None  # older than the log: its producers' later writes are gone
    replay_from = log_.log_start_offset
    if loaded is not None:
        replay_from, entries = loaded
        log_.state.load(entries)
    if not clean or replay_from != end:
        _replay(log_, replay_from)
    delete_snapshots_below(directory, log_.log_start_offset)
    if clean:
        marker.unlink()
        fsync_directory(directory)
    log.info(
        "%s: opened %s (%d segments, offsets %d..%d, %d producers, replayed from %d)",
        log_.name,
        "after a clean shutdown" if clean else "after a crash",
        len(segments),
        log_.log_start_offset,
        end,
        len(log_.state),
        replay_from,
    )


def _scan_tail(log_: PartitionLog, first: int) -> None:
    """CRC-check segments[first:], truncating at the first bad batch."""
    segments = log_.segments
    interval = log_.config.index_interval_bytes
    expected = segments[first].base_offset
    for i in range(first, len(segments)):
        seg = segments[i]
        if seg.base_offset != expected:
            _truncate_after(log_, i - 1, f"segment {seg.log_path.name} does not follow on")
            return
        seg.index.truncate_from_position(0)
        seg.first_timestamp = seg.max_timestamp = -1
        file_size = seg.size
        batches = seg.scan(0, expected)  # bound to the file size before re-accounting
        seg.restore_position_state(0)
        valid = 0
        for stored in batches:
            seg.account_recovered(stored, interval)
            valid = stored.position + stored.header.size
        if seg.scan_error is not None or valid != file_size:
            log.warning(
                "%s: truncating %s at byte %d of %d: %s",
                log_.name,
                seg.log_path.name,
                valid,
                file_size,
                seg.scan_error or "trailing bytes",
            )
            seg.truncate_to(valid)
            _truncate_after(log_, i, "after a truncated segment")
            return
        expected = seg.next_offset


def _truncate_after(log_: PartitionLog, index: int, why: str) -> None:
    for seg in log_.segments[index + 1 :]:
        log.warning("%s: deleting segment %s (%s)", log_.name, seg.log_path.name, why)
        seg.delete()
    del log_.segments[index + 1 :]
    fsync_directory(log_.directory)


def _replay(log_: PartitionLog, offset: int) -> None:
    from broker_core.log.producer_state import producer_batch

    for seg in log_.segments:
        # Every segment, even one cut back to or below ``offset`` by the tail scan: it may
        # still list aborts whose markers are gone, which would hide later data.
        seg.txn_index.truncate_from(offset)
    for seg, stored in log_.batches_from(offset):
        h = stored.header
        if h.base_offset < offset:
            continue
        if h.is_control:
            record = decode_control(h, stored.data)
            log_.apply_marker(h, record.control_type, record.coordinator_epoch, seg)
        else:
            log_.state.on_data_batch(
                producer_batch(h), h.base_offset, h.last_offset, h.max_timestamp
            )
