"""The log side of replication: a follower's append, truncation, raw reads, the epoch cache.

Functions over a partition's segments that ``PartitionLog`` calls under its lock
(``append_as_follower``, ``truncate_to``, ``read_raw``, ``become_leader``); nothing in the
server uses them yet (see docs/replication.md). Kept apart so ``partition_log`` stays
small; this module never imports ``partition_log``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from broker_core.errors import CorruptRecordError, InvalidRecordError, OffsetOutOfRangeError
from broker_core.fileutil import atomic_write, fsync_directory
from broker_core.log.leader_epoch import LeaderEpochCache
from broker_core.log.recovery import batches_from
from broker_core.log.segment import LogSegment, StoredBatch
from broker_core.record.batch import (
    HEADER_SIZE,
    INITIAL_LEADER_EPOCH,
    EncodedBatch,
    decode_header,
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
    leader epoch going back.
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
