"""The read path of a partition log: batches in an offset range, aborted data skipped.

Functions over the log's segments (``PartitionLog.read`` holds the lock and checks the
range); kept apart so that ``partition_log`` stays small.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker_core.errors import CorruptRecordError
from broker_core.log.recovery import batches_from
from broker_core.log.results import FetchedBatch, IsolationLevel
from broker_core.log.segment import LogSegment
from broker_core.record.batch import (
    BatchHeader,
    ControlType,
    decode_control,
    decode_rows,
    verify_crc,
)


def collect(
    segments: Sequence[LogSegment],
    offset: int,
    upper: int,
    max_bytes: int,
    level: IsolationLevel,
    out: list[FetchedBatch],
) -> int:
    """Append to ``out`` the readable batches in [offset, upper), whole or sliced, at
    least one when any is readable and then none past ``max_bytes``; aborted data is
    skipped for read_committed. Offsets may have gaps (a compacted log): a batch starts
    at its first row's offset, and the next read never starts inside a gap. Returns
    where the next read continues. Raises
    CorruptRecordError for a batch that fails its CRC or does not decode."""
    aborted: dict[int, list[tuple[int, int]]] = {}
    if level is IsolationLevel.READ_COMMITTED:
        for seg in segments:
            if seg.next_offset > offset:
                for t in seg.txn_index.overlapping(offset, upper):
                    aborted.setdefault(t.producer_id, []).append((t.first_offset, t.last_offset))
    next_offset, size = offset, 0
    for seg, stored in batches_from(segments, offset):
        h = stored.header
        if h.base_offset >= upper:
            # Nothing is left below ``upper``: offsets up to it are read or absent (a gap
            # the cleaner left), so the next read starts there, not inside the gap.
            return upper
        if out and size + h.size > max_bytes:
            return next_offset
        next_offset = min(h.next_offset, upper)
        if h.is_control or _is_aborted(aborted, h):
            continue
        try:
            # Sealed segments are trusted on open (not re-scanned), so the CRC is
            # checked here: a damaged batch must fail, never yield garbage rows.
            verify_crc(h, stored.data)
            rows = decode_rows(h, stored.data)
        except CorruptRecordError as exc:
            raise CorruptRecordError(
                f"{seg.log_path} at byte {stored.position}: {exc.message}"
            ) from exc
        first = max(offset, h.base_offset)
        if first > h.base_offset or h.last_offset >= upper:
            rows = rows.slice(first - h.base_offset, min(h.next_offset, upper) - first)
        out.append(
            FetchedBatch(
                first,
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.is_transactional,
                h.max_timestamp,
                rows,
            )
        )
        size += h.size
    return upper  # every batch below ``upper`` was read (the log may end in a gap)


def _is_aborted(aborted: dict[int, list[tuple[int, int]]], h: BatchHeader) -> bool:
    if not h.is_transactional or h.producer_id not in aborted:
        return False
    return any(first <= h.base_offset <= last for first, last in aborted[h.producer_id])


def read_control(
    segments: Sequence[LogSegment], offset: int
) -> tuple[BatchHeader, ControlType] | None:
    """The marker at ``offset``, if there is one. Raises CorruptRecordError for an
    unreadable control record."""
    for seg in segments:
        if seg.base_offset <= offset < seg.next_offset:
            position = seg.position_of(offset)
            if position is None:
                return None
            stored = next(seg.batches(position))
            if stored.header.is_control and stored.header.base_offset == offset:
                record = decode_control(stored.header, stored.data)
                return stored.header, record.control_type
    return None
