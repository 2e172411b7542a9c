"""The partitioner: same key -> same partition, spread, vectorised grouping."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from broker_core.errors import InvalidRequestError
from broker_core.producer.partitioner import (
    HASH_KEY,
    Partitioner,
    group_by_partition,
    hash_keys,
    partitions_for_keys,
)


def test_same_key_same_partition_across_batches_and_widths() -> None:
    a = partitions_for_keys(pa.array([5, 7, 9, 5], pa.int64()), 8)
    b = partitions_for_keys(pa.array([9, 5], pa.int32()), 8)
    c = partitions_for_keys(pa.chunked_array([[7], [5, None]], pa.int16()), 8)
    assert a[0] == a[3] == b[1] == c[1] and a[2] == b[0] and a[1] == c[0]
    s1 = partitions_for_keys(pa.array(["x", "y", "x"]), 5)
    s2 = partitions_for_keys(pa.array(["y", "x"], pa.large_string()), 5)
    s3 = partitions_for_keys(pa.array(["x", "y"]).dictionary_encode(), 5)
    assert s1[0] == s1[2] == s2[1] == s3[0] and s1[1] == s2[0] == s3[1]


def test_the_documented_hash() -> None:
    keys = ["alice", "bob", "carol"]
    expected = pd.util.hash_array(
        np.array(keys, dtype=object), encoding="utf8", hash_key=HASH_KEY, categorize=False
    )
    assert list(hash_keys(pa.array(keys))) == list(expected)
    ints = np.array([0, -1, 2**40], dtype=np.int64)
    assert list(hash_keys(pa.array(ints))) == list(pd.util.hash_array(ints, categorize=False))
    nulls = partitions_for_keys(pa.array([None, "a", None]), 7)
    assert nulls[0] == nulls[2] == (2**64 - 1) % 7
    zeros = partitions_for_keys(pa.array([0.0, -0.0]), 7)
    assert zeros[0] == zeros[1]


def test_numeric_hash_is_pandas_hash_array_without_pandas() -> None:
    """Numbers are hashed with NumPy: bit for bit what the documented
    pandas.util.hash_array gives, over edge values and a random sample of every width."""
    rng = np.random.default_rng(13)
    edges = [0, 1, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 2**40, -(2**40)]
    ints = np.concatenate(
        [np.array(edges, dtype=np.int64), rng.integers(-(2**63), 2**63 - 1, 5000)]
    )
    assert hash_keys(pa.array(ints)).tolist() == pd.util.hash_array(ints, categorize=False).tolist()
    for width in (pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint32()):
        small = pa.array(rng.integers(0, 100, 1000)).cast(width)
        as_int64 = small.cast(pa.int64()).to_numpy()
        assert hash_keys(small).tolist() == pd.util.hash_array(as_int64, categorize=False).tolist()
    floats = np.concatenate(
        [
            np.array([0.0, 1.5, -2.25, np.inf, -np.inf, 1e308, 5e-324, np.nan, -np.nan]),
            np.array([0x7FF0000000000001, 0xFFF8000000000123], dtype=np.uint64).view(np.float64),
            rng.standard_normal(5000) * 1e6,
        ]
    )
    expected = pd.util.hash_array(floats, categorize=False).tolist()
    assert hash_keys(pa.array(floats, from_pandas=False)).tolist() == expected
    # Every NaN hashes as np.nan, and -0.0 as 0.0.
    assert len(set(hash_keys(pa.array(floats[7:11], from_pandas=False)).tolist())) == 1
    assert hash_keys(pa.array([-0.0])).tolist() == hash_keys(pa.array([0.0])).tolist()
    bools = np.array([True, False, True])
    assert (
        hash_keys(pa.array(bools)).tolist() == pd.util.hash_array(bools, categorize=False).tolist()
    )


def test_partition_is_the_hash_modulo_the_count_for_every_count() -> None:
    """The mapping is part of the on-disk contract: ``hash % count`` for every count, the
    power-of-two shortcut included, with fixed values pinned (computed by the division)."""
    rng = np.random.default_rng(5)
    ints = pa.array(rng.integers(-(2**62), 2**62, 5_000))
    texts = pa.array([f"k{i}" for i in rng.integers(0, 10**9, 2_000)] + [None])
    for keys in (ints, texts):
        hashes = hash_keys(keys)
        for count in [*range(1, 70), 128, 1024, 1000]:
            expected = (hashes % np.uint64(count)).astype(np.int64)
            assert partitions_for_keys(keys, count).tolist() == expected.tolist(), count
    pinned = partitions_for_keys(pa.array(range(12), pa.int32()), 4).tolist()
    assert pinned == [0, 1, 2, 0, 0, 0, 0, 0, 0, 3, 1, 1]
    letters = partitions_for_keys(pa.array(["a", "b", "c", "d", "e", "f", None]), 8)
    assert letters.tolist() == [0, 7, 0, 2, 7, 4, 7]


def test_keys_spread_over_partitions() -> None:
    parts = partitions_for_keys(pa.array(np.arange(100_000)), 4)
    counts = np.bincount(parts, minlength=4)
    assert counts.min() > 0.9 * 25_000, counts
    text = partitions_for_keys(pa.array([f"user-{i}" for i in range(20_000)]), 4)
    assert np.bincount(text, minlength=4).min() > 0.9 * 5_000


@pytest.mark.parametrize("partitions", [1, 4, 32, 33, 200])
def test_grouping_is_stable(partitions: int) -> None:
    """Both ways of grouping (a scan per partition up to 32, a stable sort above) keep
    every row once, in order within its partition, in the partition its key hashes to."""
    n = 200_000
    ids = np.arange(n, dtype=np.int64)
    data = pa.table({"id": ids, "key": ids % 1000})
    slices = Partitioner().split(data, "key", partitions)
    assert sum(s.batch.num_rows for s in slices) == n
    assert len({s.partition for s in slices}) == len(slices)
    for s in slices:
        got = s.batch.column("id").to_numpy()
        assert np.all(np.diff(got) > 0), "rows of a partition keep their order"
        parts = partitions_for_keys(s.batch.column("key"), partitions)
        assert set(parts.tolist()) == {s.partition}


def test_round_robin_per_send_without_key() -> None:
    p = Partitioner()
    data = pa.table({"id": [1, 2, 3]})
    assert [p.split(data, None, 3)[0].partition for _ in range(4)] == [0, 1, 2, 0]
    rr = Partitioner("round_robin")
    assert rr.split(pa.table({"k": [1, 2]}), "k", 2)[0].batch.num_rows == 2


def test_bad_key_column() -> None:
    with pytest.raises(InvalidRequestError, match="'nope' is not in the data"):
        Partitioner().split(pa.table({"id": [1]}), "nope", 2)
    with pytest.raises(InvalidRequestError, match="cannot be hashed"):
        partitions_for_keys(pa.array([[1], [2]]), 2)


def test_group_by_partition_empty_partitions() -> None:
    data = pa.table({"id": [1, 2, 3]})
    slices = group_by_partition(data, np.array([2, 2, 0]), 4)
    assert [(s.partition, s.batch.column("id").to_pylist()) for s in slices] == [
        (0, [3]),
        (2, [1, 2]),
    ]
