"""Small pure pieces of ``PartitionLog``: which segments retention deletes, when a segment
rolls, and the one record-batch form appends take."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from broker_core.errors import InvalidRecordError
from broker_core.log.config import LogConfig
from broker_core.log.segment import LogSegment


def past_retention(
    segments: Sequence[LogSegment], config: LogConfig, now_ms: int, high_watermark: int
) -> list[LogSegment]:
    """The oldest sealed segments past ``retention.bytes`` / ``retention.ms``, in order.

    Never the active segment, and never one holding offsets at or above the high
    watermark: a follower may still need them (Kafka deletes only below it too). Nothing
    under ``cleanup.policy=compact`` alone: there the cleaner bounds the log instead.
    """
    if not config.policy.deletes:
        return []
    deletable: list[LogSegment] = []
    size = sum(int(s.size) for s in segments)
    for seg in segments[:-1]:
        over_size = config.retention_bytes >= 0 and size - seg.size >= config.retention_bytes
        over_age = config.retention_ms >= 0 and now_ms - seg.max_timestamp > config.retention_ms
        if not (over_size or over_age) or seg.next_offset > high_watermark:
            break
        deletable.append(seg)
        size -= seg.size
    return deletable


def should_roll(active: LogSegment, config: LogConfig, batch_size: int, now_ms: int) -> bool:
    """Whether a batch of ``batch_size`` bytes goes into a new segment: the active one is
    not empty and would pass ``segment.bytes``, or is ``segment.ms`` old."""
    if active.size == 0:
        return False
    too_big = active.size + batch_size > config.segment_bytes
    too_old = now_ms - active.first_timestamp >= config.segment_ms
    return too_big or too_old


def as_record_batch(records: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """``records`` as one RecordBatch (a Table's chunks combined)."""
    if isinstance(records, pa.RecordBatch):
        return records
    if isinstance(records, pa.Table):
        combined = records.combine_chunks()
        batches = combined.to_batches()
        if len(batches) == 1:
            return batches[0]
        return pa.RecordBatch.from_pylist([], schema=records.schema)
    raise InvalidRecordError(
        f"records must be a pyarrow RecordBatch or Table, got {type(records).__name__}"
    )
