"""Small pure pieces of ``PartitionLog``: which segments retention deletes, and the one
record-batch form appends take."""

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
    watermark: a follower may still need them (Kafka deletes only below it too).
    """
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
