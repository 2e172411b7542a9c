"""``spark_sink.read_split.split_ranges``: Spark's Kafka source's split of offset ranges
(``minPartitions``, ``maxRecordsPerPartition``), and that the pieces tile each range.

The rows read from the pieces are checked against a real broker and real Spark in
tests/spark/test_read_split.py; here, the arithmetic alone."""

from __future__ import annotations

import itertools
import random

import pytest

from spark_sink.read_split import NO_SPLIT, OffsetRangePartition, split_ranges


def R(partition: int, start: int, end: int) -> OffsetRangePartition:
    return OffsetRangePartition(partition, start, end)


def test_unset_options_keep_one_range_per_partition_and_drop_empty_ones() -> None:
    ranges = [R(0, 0, 10), R(1, 5, 5), R(2, 3, 9)]
    assert split_ranges(ranges, NO_SPLIT, NO_SPLIT) == [R(0, 0, 10), R(2, 3, 9)]


def test_min_partitions_at_most_the_ranges_changes_nothing() -> None:
    ranges = [R(0, 0, 100), R(1, 0, 1)]
    assert split_ranges(ranges, 2, NO_SPLIT) == ranges
    assert split_ranges(ranges, 1, NO_SPLIT) == ranges


def test_min_partitions_splits_one_range_evenly_the_remainder_last() -> None:
    assert split_ranges([R(0, 1, 4)], 3, NO_SPLIT) == [R(0, 1, 2), R(0, 2, 3), R(0, 3, 4)]
    assert split_ranges([R(0, 0, 10)], 3, NO_SPLIT) == [R(0, 0, 3), R(0, 3, 6), R(0, 6, 10)]
    # Never more pieces than offsets.
    assert split_ranges([R(0, 7, 9)], 5, NO_SPLIT) == [R(0, 7, 8), R(0, 8, 9)]


def test_min_partitions_leaves_small_ranges_whole_and_splits_the_large_ones() -> None:
    # As Spark's KafkaOffsetRangeCalculator: 2 small ranges stay whole (their share rounds
    # to one), the large one takes what is left of the 4 wanted.
    ranges = [R(0, 0, 1), R(1, 0, 1), R(2, 0, 100)]
    assert split_ranges(ranges, 4, NO_SPLIT) == [
        R(0, 0, 1),
        R(1, 0, 1),
        R(2, 0, 50),
        R(2, 50, 100),
    ]
    # Shares in proportion to size: 3 of 4 to the range three times larger.
    assert split_ranges([R(0, 0, 300), R(1, 0, 100)], 8, NO_SPLIT) == [
        R(0, 0, 50),
        R(0, 50, 100),
        R(0, 100, 150),
        R(0, 150, 200),
        R(0, 200, 250),
        R(0, 250, 300),
        R(1, 0, 50),
        R(1, 50, 100),
    ]


def test_max_records_caps_every_piece_and_min_partitions_splits_further() -> None:
    assert split_ranges([R(0, 0, 10), R(1, 0, 3)], NO_SPLIT, 4) == [
        R(0, 0, 3),
        R(0, 3, 6),
        R(0, 6, 10),
        R(1, 0, 3),
    ]
    # Enough pieces already: minPartitions adds nothing.
    assert len(split_ranges([R(0, 0, 10)], 2, 4)) == 3
    # Too few: the capped pieces are split again.
    assert split_ranges([R(0, 0, 10)], 6, 5) == [
        R(0, 0, 1),
        R(0, 1, 3),
        R(0, 3, 5),
        R(0, 5, 6),
        R(0, 6, 8),
        R(0, 8, 10),
    ]


@pytest.mark.parametrize("seed", range(20))
def test_pieces_tile_every_range_in_order(seed: int) -> None:
    rng = random.Random(seed)
    ranges = []
    for p in range(rng.randint(1, 6)):
        start = rng.randint(0, 1000)
        ranges.append(R(p, start, start + rng.choice([0, 1, 2, rng.randint(0, 10**6)])))
    min_parts = rng.choice([NO_SPLIT, 1, 3, 8, 64])
    max_records = rng.choice([NO_SPLIT, 1, 7, 1000, 10**5])
    if max_records == 1:
        ranges = [R(r.partition, r.start, min(r.end, r.start + 50)) for r in ranges]
    pieces = split_ranges(ranges, min_parts, max_records)
    for r in ranges:
        mine = [x for x in pieces if x.partition == r.partition]
        if r.size == 0:
            assert mine == []
            continue
        # Consecutive, non-empty, from the range's start to its end: each offset once.
        assert mine[0].start == r.start and mine[-1].end == r.end
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
        assert all(x.size > 0 for x in mine)
        if max_records:
            assert all(x.size <= max_records for x in mine)
    non_empty = sum(1 for r in ranges if r.size)
    assert len(pieces) >= non_empty
