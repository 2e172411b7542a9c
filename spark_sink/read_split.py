"""Input partitions of the readers: log offset ranges, and their split into Spark tasks.

By default one Spark task reads one log partition's planned range. The options
``minPartitions`` and ``maxRecordsPerPartition`` (Spark's Kafka source's names and
semantics, docs/spark.md "Reading") cut a large range into consecutive sub-ranges below
the same planned end, each read by its own task, so the reading of one partition is
spread over cores. Splitting changes who reads an offset, never which rows are read: a
sub-range is read as any range is (``reader.read_range``: ``[start, end)`` with the end
as the fetch's ``max_offset``, batches sliced at both edges, aborted rows and control
batches skipped by the broker whatever offset a fetch starts at), and sub-ranges tile
the range, so every offset belongs to exactly one task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from .options import NO_SPLIT

__all__ = ["NO_SPLIT", "OffsetRangePartition", "split_ranges"]


@dataclass(frozen=True)
class OffsetRangePartition(InputPartition):
    """Offsets ``[start, end)`` of one log partition: one Spark task. ``topic_id``: the id
    of the topic the offsets were planned in, sent with every fetch and list_offsets of
    the range, so a topic recreated since refuses them (None: a topic stored before ids)."""

    partition: int
    start: int
    end: int
    topic_id: str | None = None

    @property
    def size(self) -> int:
        """Offsets in the range (rows, markers and compacted-away offsets alike)."""
        return self.end - self.start


def _divide(part: OffsetRangePartition, parts: int) -> list[OffsetRangePartition]:
    """``part`` in ``parts`` consecutive pieces as even as integers allow (the later ones
    take the remainder), empty pieces dropped."""
    out, remaining, start = [], part.size, part.start
    for i in range(parts):
        this = remaining // (parts - i)
        remaining -= this
        end = min(start + this, part.end)
        if end > start:
            out.append(OffsetRangePartition(part.partition, start, end, part.topic_id))
        start = end
    return out


def _share(size: int, total: int, parts: int) -> int:
    """``round(size / total * parts)``, halves up (as Scala's ``math.round``), at least 1;
    in integers, so it is exact for any log size."""
    return max((2 * size * parts + total) // (2 * total), 1)


def split_ranges(
    ranges: Sequence[OffsetRangePartition], min_partitions: int, max_records: int
) -> list[OffsetRangePartition]:
    """The ranges Spark's tasks read: ``ranges`` (empty ones dropped), split as Spark's
    Kafka source splits its offset ranges (its ``KafkaOffsetRangeCalculator``).

    * ``max_records`` > 0: each range in ``ceil(size / max_records)`` even pieces.
    * ``min_partitions`` > 0 and more than the ranges so far: the ranges whose share of
      ``min_partitions`` (in proportion to their size) rounds to one stay whole; the
      others share what is left of ``min_partitions`` in proportion to their size. So
      the count is about ``min_partitions`` (rounding may miss by a few), never fewer
      ranges than without the option.

    Sizes count offsets, not rows (a marker or a compacted-away offset counts as one), as
    Kafka's do. The pieces of a range are consecutive and in offset order; a range is
    never split into more pieces than it has offsets. ``NO_SPLIT`` (0) turns an option
    off; both off: one range per log partition, unchanged.
    """
    out = [r for r in ranges if r.size > 0]
    if max_records > 0:
        out = [piece for r in out for piece in _divide(r, -(-r.size // max_records))]
    if min_partitions <= len(out):
        return out
    total = sum(r.size for r in out)
    whole = [_share(r.size, total, min_partitions) == 1 for r in out]
    split_total = total - sum(r.size for r, w in zip(out, whole, strict=True) if w)
    split_parts = max(min_partitions - sum(whole), 1)
    return [
        piece
        for r, w in zip(out, whole, strict=True)
        for piece in ([r] if w else _divide(r, _share(r.size, split_total, split_parts)))
    ]
