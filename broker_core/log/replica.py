"""The log side of replication: what a replica's log does that a lone log does not, and the
replication state it keeps on disk (docs/replication.md).

A follower's fetched batches checked before any is written (``parse_fetched``) and
appended byte for byte (``as_encoded``); the leader's raw reads that serve them
(``read_raw``); a diverged tail cut (``truncate_segments``); the reset of a follower whose
log ends below its leader's log start (``log_start_state``, ``reset_log``); the
leader-epoch cache made consistent with the recovered log (``open_epoch_cache``); the
high-watermark checkpoint. Functions over a partition's segments that ``PartitionLog``
calls under its lock (``append_as_follower``, ``read_raw``, ``truncate_to``,
``log_start_state``, ``reset_to``, and its constructor); below ``partition_log``, which
imports them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from broker_core.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidRequestError,
    OffsetOutOfRangeError,
)
from broker_core.fileutil import atomic_write, fsync_directory
from broker_core.log.leader_epoch import LeaderEpochCache
from broker_core.log.producer_state import ProducerStateManager
from broker_core.log.recovery import batches_from
from broker_core.log.segment import LogSegment, StoredBatch
from broker_core.log.snapshot import (
    decode_snapshot,
    encode_snapshot,
    list_snapshots,
    snapshot_path,
)
from broker_core.record.batch import (
    HEADER_SIZE,
    INITIAL_LEADER_EPOCH,
    EncodedBatch,
    decode_header,
    decode_rows,
    validate_rows,
    verify_crc,
)

log = logging.getLogger("idemlog.replica")


def parse_fetched(
    raw: bytes | memoryview,
    log_end_offset: int,
    latest_epoch: int,
    name: str,
    *,
    gaps: bool = False,
) -> list[StoredBatch]:
    """The batches in ``raw`` (as a leader's log holds them), all checked, none written.

    Each batch must be whole, pass its CRC, follow on from the previous one (the first at
    ``log_end_offset``; with ``gaps``, a compacted log's, at or after it: the leader's
    cleaner leaves gaps, see docs/storage.md, Compaction) and carry a leader epoch no older
    than the one before it (the first no older than ``latest_epoch``, the follower's).
    Raises OffsetOutOfRangeError when the first batch does not start there,
    CorruptRecordError for a torn, corrupt or misplaced batch, InvalidRecordError for a
    leader epoch going back or rows that fail Arrow's full validation.
    ``StoredBatch.position`` is the batch's position in ``raw``.
    """
    view = memoryview(raw).cast("B")
    out: list[StoredBatch] = []
    position, expected, epoch = 0, log_end_offset, latest_epoch
    while position < len(view):
        header = decode_header(view, position)
        end = position + header.size
        if end > len(view):
            raise CorruptRecordError(
                f"{name}: fetched batch at byte {position} needs {header.size} bytes, "
                f"{len(view) - position} present"
            )
        data = view[position:end]
        verify_crc(header, data)
        if not header.is_control:
            # The leader checked it when it was produced; a log written before that check,
            # or a leader that did not, must not spread bad buffers to every replica.
            what = f"{name}: fetched batch at offset {header.base_offset}"
            validate_rows(decode_rows(header, data), what)
        if header.base_offset < expected or (header.base_offset != expected and not gaps):
            if not out:
                raise OffsetOutOfRangeError(
                    f"{name}: fetched batches start at offset {header.base_offset}, "
                    f"but this log ends at {log_end_offset}"
                )
            raise CorruptRecordError(
                f"{name}: fetched batch at byte {position} has offset {header.base_offset}, "
                f"expected {expected}"
            )
        if header.leader_epoch < epoch:
            raise InvalidRecordError(
                f"{name}: fetched batch at offset {header.base_offset} has leader epoch "
                f"{header.leader_epoch}, older than {epoch} before it"
            )
        out.append(StoredBatch(position, header, data))
        position, expected, epoch = end, header.next_offset, header.leader_epoch
    return out


def as_encoded(stored: StoredBatch) -> EncodedBatch:
    """A fetched batch as the segment writer takes it: its bytes unchanged, CRC kept."""
    data = stored.data
    return EncodedBatch(bytearray(data[:HEADER_SIZE]), [data[HEADER_SIZE:]], len(data), True)


def read_raw(segments: Sequence[LogSegment], offset: int, max_bytes: int) -> bytes:
    """Whole batches as stored, from the one holding ``offset``: what a follower fetches.

    At least one batch when any holds ``offset`` or follows it, then none that would pass
    ``max_bytes``; empty at the log end.
    """
    pieces: list[memoryview] = []
    size = 0
    for _seg, stored in batches_from(segments, offset):
        if pieces and size + stored.header.size > max_bytes:
            break
        pieces.append(stored.data)
        size += stored.header.size
    return b"".join(pieces)


def truncate_segments(
    directory: Path, name: str, segments: list[LogSegment], offset: int, index_interval: int
) -> list[LogSegment]:
    """Cut the log at ``offset`` and return the segments left (at least one).

    Segments based after ``offset`` are deleted with their indexes; the last one left is
    cut before the batch holding ``offset`` (so the new log end is ``offset``, or that
    batch's base offset when ``offset`` falls inside it), its offset index rebuilt, and
    fsynced. The txn index entries past the cut are the caller's to drop (replay does).
    ``offset`` must be at or above the first segment's base offset.
    """
    keep = [s for s in segments if s.base_offset <= offset]
    for seg in segments[len(keep) :]:
        log.warning("%s: truncation to %d deletes segment %s", name, offset, seg.log_path.name)
        seg.delete()
    last = keep[-1]
    position = last.position_of(offset)
    if position is not None:
        log.warning(
            "%s: truncating %s to byte %d (offset %d)", name, last.log_path.name, position, offset
        )
        last.truncate_to(position)
        last.rebuild_index(index_interval)
        last.flush()
    fsync_directory(directory)
    return keep


def open_epoch_cache(directory: Path, segments: Sequence[LogSegment]) -> LeaderEpochCache:
    """The partition's leader-epoch cache, consistent with the recovered log.

    The checkpoint as found; without one, every batch is of INITIAL_LEADER_EPOCH (see
    ``leader_epoch``); an unreadable one is rebuilt from every batch header. Then cut to
    the log: entries from the log end on are dropped (a crash can leave an epoch recorded
    before its first batch was written), and the earliest starts at the log start.
    """
    cache = LeaderEpochCache.load(directory)
    if cache is not None and not cache.entries and segments and segments[-1].next_offset:
        cache.assign(INITIAL_LEADER_EPOCH, segments[0].base_offset)  # not written: implied
    if cache is None:
        start = segments[0].base_offset if segments else 0
        epochs = (
            (stored.header.leader_epoch, stored.header.base_offset)
            for _seg, stored in batches_from(segments, start)
        )
        cache = LeaderEpochCache.rebuild(directory, epochs)
    if segments:
        cache.truncate_from_end(segments[-1].next_offset)
        cache.truncate_from_start(segments[0].base_offset)
    return cache


def log_start_state(
    directory: Path,
    segments: Sequence[LogSegment],
    epochs: LeaderEpochCache,
    state: ProducerStateManager,
) -> tuple[int, int, bytes]:
    """Where a follower whose log ends below this log's start starts its own instead:
    (offset, the leader epoch of the batch there, the producer-state snapshot there).

    The offset is the log start: a roll snapshots the state at every segment's base and
    retention keeps the snapshot at the new start, so it is normally there. When it is
    not (lost in a crash right after a roll, or unreadable), the first readable snapshot
    above it within the log; with none, the log end, snapshotted now from ``state``
    (the follower then copies nothing older, which is still a consistent log). The
    snapshot bytes are the file's, CRC-protected (``broker_core.log.snapshot``).
    """
    start, end = segments[0].base_offset, segments[-1].next_offset
    for offset, path in list_snapshots(directory):
        if not start <= offset <= end:
            continue
        try:
            data = path.read_bytes()
            decode_snapshot(data, window=state.window, name=str(path))
        except (OSError, CorruptRecordError) as exc:
            log.warning("%s: not offered to a follower below the log start: %s", path, exc)
            continue
        return offset, epochs.epoch_at(offset), data
    data = encode_snapshot(end, state.entries())
    atomic_write(snapshot_path(directory, end), data)  # the leader's own, for its recovery
    return end, epochs.epoch_at(end), data


def reset_log(
    directory: Path,
    name: str,
    segments: Sequence[LogSegment],
    offset: int,
    epoch: int,
    snapshot: bytes,
    state: ProducerStateManager,
    high_watermark: HighWatermarkCheckpoint,
) -> tuple[list[LogSegment], LeaderEpochCache]:
    """Replace the whole log by an empty one at ``offset`` with the leader's producer state
    there (``snapshot``) and an epoch cache that starts with ``epoch`` there (none when it
    is NO_LEADER_EPOCH): a follower whose log ends below its leader's log start.

    Returns the new segments (one, empty) and epoch cache; ``state`` is loaded with the
    snapshot's entries and ``high_watermark`` saved at ``offset``.
    Crash-safe by order, so a crash anywhere leaves a log that recovery opens and the
    fetcher resumes from: (1) the old segments are deleted newest first, each unlink
    fsynced, then the old snapshots (a crash leaves a prefix of the old log, still below
    the leader's start: the fetcher resets again); (2) the snapshot at ``offset`` is
    written durably, then the epoch checkpoint (with no segment at ``offset`` yet,
    recovery ignores both: a directory without segments drops its snapshots, epoch
    entries past the log end are dropped); (3) the empty segment at ``offset`` is created
    and the directory fsynced: from then on recovery opens the reset
    log with the leader's producer state. Raises CorruptRecordError for a snapshot that is
    unreadable or not at ``offset``, and InvalidRequestError for an ``offset`` not past
    the log end (a reset never drops a batch the leader still has), both before anything
    is deleted.
    """
    end = segments[-1].next_offset if segments else 0
    if offset <= end:
        raise InvalidRequestError(f"{name}: reset to {offset}, not past the log end {end}")
    at, entries = decode_snapshot(snapshot, window=state.window, name=f"{name}: leader's snapshot")
    if at != offset:
        raise CorruptRecordError(f"{name}: leader's snapshot is at {at}, not at {offset}")
    for seg in reversed(segments):
        log.warning("%s: reset to %d deletes segment %s", name, offset, seg.log_path.name)
        seg.delete()
        fsync_directory(directory)  # one at a time: never a gap, whatever the file system
    for _at, path in list_snapshots(directory):
        path.unlink(missing_ok=True)
    atomic_write(snapshot_path(directory, offset), snapshot)
    cache = LeaderEpochCache.rebuild(directory, [(epoch, offset)] if epoch >= 0 else [])
    segment = LogSegment(directory, offset)
    fsync_directory(directory)
    state.load(entries)
    high_watermark.save(offset, sync=True)
    return [segment], cache


HIGH_WATERMARK_FILE = "high-watermark-checkpoint"


class HighWatermarkCheckpoint:
    """A replicated partition's high watermark, kept on disk (Kafka's
    replication-offset-checkpoint, one file per partition), so a restarted leader's readers
    see at once what they saw before instead of waiting for every follower to fetch.

    Safe to lag: a lower value only holds readers back until the followers fetch. Never
    left above the log end: truncation rewrites it first. An unreadable file is no file.
    """

    def __init__(self, directory: Path) -> None:
        self.path = directory / HIGH_WATERMARK_FILE
        self.saved: int | None = None

    def load(self) -> int | None:
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("%s: ignored (%s)", self.path, exc)
            return None
        if not text.isdigit():
            log.warning("%s: ignored, not an offset: %r", self.path, text[:40])
            return None
        self.saved = int(text)
        return self.saved

    def save(self, high_watermark: int, *, sync: bool = False) -> None:
        """Write ``high_watermark`` if it changed (``sync``: fsynced, at a clean close)."""
        if high_watermark != self.saved:
            atomic_write(self.path, f"{high_watermark}\n".encode(), sync=sync)
            self.saved = high_watermark
