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

``recover_partition`` is a function of the directory, the log config and the producer
state it fills; it returns the segments it recovered and ``PartitionLog`` builds itself
from them. This module never imports ``partition_log`` (which imports it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from broker_core.errors import CorruptRecordError
from broker_core.fileutil import fsync_directory
from broker_core.log.config import LogConfig
from broker_core.log.indexes import AbortedTxn
from broker_core.log.producer_state import ProducerStateManager, producer_fields
from broker_core.log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TXN_INDEX_SUFFIX,
    LogSegment,
    StoredBatch,
)
from broker_core.log.snapshot import delete_snapshots_below, list_snapshots, load_newest_valid
from broker_core.log.swap import finish_swaps
from broker_core.record.batch import BatchHeader, ControlType, decode_control

log = logging.getLogger("idemlog.recovery")

# Written by a clean close, consumed (deleted) by the next open: its presence means every
# segment and the snapshot at the log end are durable and need no re-scan.
CLEAN_SHUTDOWN_FILE = ".clean_shutdown"


@dataclass(frozen=True, slots=True)
class RecoveredLog:
    """What opening a partition directory found.

    ``segments`` is in offset order and empty only for a directory with no segment file
    (a new partition); the producer state passed to ``recover_partition`` holds the
    producers as of ``log_end_offset``.
    """

    segments: list[LogSegment]
    clean: bool  # the directory held a clean-shutdown marker (nothing was re-scanned)
    log_start_offset: int
    log_end_offset: int
    snapshot_offset: int | None  # the offset of the producer snapshot loaded, if any
    replayed_from: int  # batches from here to the end were replayed into the state
    producers: int  # producers in the state after recovery


def batches_from(
    segments: Sequence[LogSegment], offset: int
) -> Iterator[tuple[LogSegment, StoredBatch]]:
    """Every stored batch holding ``offset`` or after it, with its segment."""
    for seg in segments:
        if seg.next_offset <= offset:
            continue
        position = seg.position_of(offset)
        if position is not None:
            for stored in seg.batches(position):
                yield seg, stored


def apply_marker(
    state: ProducerStateManager,
    header: BatchHeader,
    control_type: ControlType,
    coordinator_epoch: int,
    segment: LogSegment,
) -> None:
    """Producer-state and txn-index effects of a marker (append and recovery share it)."""
    completed = state.on_marker(
        header.producer_id,
        header.producer_epoch,
        control_type,
        coordinator_epoch,
        header.base_offset,
        header.max_timestamp,
    )
    if completed is not None and completed.aborted:
        # The LSO just after this marker, not the log's current LSO: during recovery the
        # log end is already the recovered end, which would record a later LSO.
        first_unstable = state.first_unstable_offset()
        lso = header.next_offset if first_unstable is None else first_unstable
        segment.txn_index.append(
            AbortedTxn(
                completed.producer_id,
                completed.first_offset,
                completed.last_offset,
                lso,
            )
        )


def _segment_offsets(directory: Path) -> list[int]:
    offsets = []
    for path in directory.iterdir():
        if path.name.endswith(".tmp"):
            path.unlink()  # an interrupted atomic write; the old file is still in place
            continue
        stem, _, suffix = path.name.partition(".")
        if f".{suffix}" == LOG_SUFFIX:
            if len(stem) != 20 or not stem.isdigit():
                raise CorruptRecordError(f"{path}: not a segment name (<20-digit offset>.log)")
            offsets.append(int(stem))
    for path in directory.iterdir():
        stem, _, suffix = path.name.partition(".")
        if f".{suffix}" in (INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            if len(stem) != 20 or not stem.isdigit():
                raise CorruptRecordError(f"{path}: not an index name (<20-digit offset>.{suffix})")
            if int(stem) not in offsets:
                path.unlink()  # index of a segment deleted before a crash
    return sorted(offsets)


def recover_partition(
    directory: Path,
    config: LogConfig,
    state: ProducerStateManager,
    *,
    name: str = "",
    now_ms: int | None = None,
) -> RecoveredLog:
    """Open the segments of ``directory``, cut a torn tail, and rebuild ``state``.

    ``state`` must be empty; on return it holds the producers as of the recovered log end,
    less those idle past ``producer.id.expiration.ms`` at ``now_ms`` (when given) without
    an open transaction: as Kafka drops expired producers when it loads a snapshot, so
    that restarts more frequent than ``producer.id.expiration.check.interval.ms`` cannot
    keep a finished producer's state for ever (docs/storage.md, producer state).
    Files are changed only to repair the directory: a torn tail is truncated, segments
    after it and orphan indexes are deleted, snapshots below the log start (all of them
    when there is no segment) are deleted,
    and the clean-shutdown marker is consumed. Raises CorruptRecordError for a file name
    that is not a segment or index name, and OSError when the directory cannot be read.
    """
    name = name or directory.name
    finish_swaps(directory)  # a cleaner's swap cut short: the old segment or the new one
    marker = directory / CLEAN_SHUTDOWN_FILE
    clean = marker.exists()
    offsets = _segment_offsets(directory)
    if not offsets:
        marker.unlink(missing_ok=True)
        for _at, path in list_snapshots(directory):
            path.unlink()  # no log, no state: a reset interrupted before its segment
        return RecoveredLog([], clean, 0, 0, None, 0, len(state))
    segments = [LogSegment(directory, base) for base in offsets]
    snapshots = list_snapshots(directory)
    if clean:
        for seg in segments:
            seg.load_summary(config.index_interval_bytes)
    else:
        newest = snapshots[-1][0] if snapshots else offsets[0]
        first_scanned = max(i for i, base in enumerate(offsets) if base <= newest or i == 0)
        for seg in segments[:first_scanned]:
            seg.load_summary(config.index_interval_bytes)
        gaps = config.policy.compacts  # only a compacted log may have offset gaps
        _scan_tail(directory, name, segments, first_scanned, config.index_interval_bytes, gaps)

    start, end = segments[0].base_offset, segments[-1].next_offset
    snapshot_offset = load_state(directory, segments, state)
    replay_from = start if snapshot_offset is None else snapshot_offset
    if not clean or replay_from != end:
        replay(segments, state, replay_from)
    expired = [] if now_ms is None else state.remove_expired(now_ms)
    delete_snapshots_below(directory, start)
    if clean:
        marker.unlink()
        fsync_directory(directory)
    log.info(
        "%s: opened %s (%d segments, offsets %d..%d, %d producers, replayed from %d)%s",
        name,
        "after a clean shutdown" if clean else "after a crash",
        len(segments),
        start,
        end,
        len(state),
        replay_from,
        f"; dropped {len(expired)} producers idle past producer.id.expiration.ms"
        if expired
        else "",
    )
    return RecoveredLog(segments, clean, start, end, snapshot_offset, replay_from, len(state))


def _scan_tail(
    directory: Path, name: str, segments: list[LogSegment], first: int, interval: int, gaps: bool
) -> None:
    """CRC-check segments[first:], truncating at the first bad batch (in place)."""
    expected = segments[first].base_offset
    for i in range(first, len(segments)):
        seg = segments[i]
        if seg.base_offset < expected or (seg.base_offset != expected and not gaps):
            why = f"segment {seg.log_path.name} does not follow on"
            _truncate_after(directory, name, segments, i - 1, why)
            return
        seg.index.truncate_from_position(0)
        seg.first_timestamp = seg.max_timestamp = -1
        file_size = seg.size
        batches = seg.scan(0, expected, gaps=gaps)  # bound to the file size before re-accounting
        seg.restore_position_state(0)
        valid = 0
        for stored in batches:
            seg.account_recovered(stored, interval)
            valid = stored.position + stored.header.size
        if seg.scan_error is not None or valid != file_size:
            log.warning(
                "%s: truncating %s at byte %d of %d: %s",
                name,
                seg.log_path.name,
                valid,
                file_size,
                seg.scan_error or "trailing bytes",
            )
            seg.truncate_to(valid)
            _truncate_after(directory, name, segments, i, "after a truncated segment")
            return
        expected = seg.next_offset


def _truncate_after(
    directory: Path, name: str, segments: list[LogSegment], index: int, why: str
) -> None:
    for seg in segments[index + 1 :]:
        log.warning("%s: deleting segment %s (%s)", name, seg.log_path.name, why)
        seg.delete()
    del segments[index + 1 :]
    fsync_directory(directory)


def load_state(
    directory: Path, segments: list[LogSegment], state: ProducerStateManager
) -> int | None:
    """Replace ``state`` with the newest readable snapshot within the log's offsets.

    Returns the snapshot's offset (the state holds the producers as of it), or None when
    there is none (the state is left empty): the caller replays from there. Snapshots
    beyond the log end and unreadable ones are deleted.
    """
    start, end = segments[0].base_offset, segments[-1].next_offset
    loaded = load_newest_valid(directory, window=state.window, at_most=end)
    if loaded is None or loaded[0] < start:
        state.clear()  # none, or older than the log: its producers' later writes are gone
        return None
    offset, entries = loaded
    state.load(entries)
    return offset


def rebuild_state(directory: Path, segments: list[LogSegment], state: ProducerStateManager) -> int:
    """Rebuild ``state`` for the log as ``segments`` now hold it, as a crash recovery does:
    the newest snapshot at or below the log end, then the batches after it replayed (the
    txn index re-created from there). Returns the offset the replay started from."""
    snapshot_offset = load_state(directory, segments, state)
    replay_from = segments[0].base_offset if snapshot_offset is None else snapshot_offset
    replay(segments, state, replay_from)
    return replay_from


def apply_batch(state: ProducerStateManager, segment: LogSegment, stored: StoredBatch) -> None:
    """The producer-state and txn-index effects of one batch already in ``segment``.

    No sequence or epoch checks: the batch is in the log, so its effects are taken as
    they are (recovery's replay, and a follower appending its leader's batches).
    Raises CorruptRecordError for an unreadable control record.
    """
    h = stored.header
    if h.is_control:
        record = decode_control(h, stored.data)
        apply_marker(state, h, record.control_type, record.coordinator_epoch, segment)
    else:
        state.on_data_batch(producer_fields(h), h.base_offset, h.last_offset, h.max_timestamp)


def replay(segments: list[LogSegment], state: ProducerStateManager, offset: int) -> None:
    """Apply every batch from ``offset`` on to ``state``, re-creating the txn index entries
    of aborts whose marker is at or after ``offset``."""
    for seg in segments:
        # Every segment, even one cut back to or below ``offset`` by the tail scan: it may
        # still list aborts whose markers are gone, which would hide later data.
        seg.txn_index.truncate_from(offset)
    for seg, stored in batches_from(segments, offset):
        if stored.header.base_offset >= offset:
            apply_batch(state, seg, stored)
