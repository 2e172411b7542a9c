"""Routing rows to log partitions, vectorised (no per-row Python on the hot path).

The hash (documented here once; every client that wants the same routing must use it):

1. The key column is turned into one NumPy array ``v``:
   integers, booleans, dates, times, timestamps and durations → ``int64`` (their integer
   storage; unsigned 64-bit values wrap); floating point → ``float64`` (``-0.0`` becomes
   ``0.0``, every NaN the one NaN ``0x7ff8000000000000``); strings → ``object`` array of
   ``str``; binary → ``object`` array of ``bytes``. Any other key type is rejected with
   the column named.
2. ``h = pandas.util.hash_array(v, encoding="utf8", hash_key="0123456789123456",
   categorize=False)`` — numbers: their 64-bit pattern through the splitmix64 finaliser
   (``x ^= x >> 30; x *= 0xbf58476d1ce4e5b9; x ^= x >> 27; x *= 0x94d049bb133111eb;
   x ^= x >> 31``, modulo 2**64); strings/bytes: SipHash-2-4 of the UTF-8 bytes with that
   key, then the same finaliser. Numbers are hashed here with NumPy (the same values,
   checked against pandas by the tests), so numeric keys never import pandas; strings
   import it on first use. The string path hashes each *distinct* value once (Arrow
   dictionary encoding).
3. ``partition = h % num_partitions`` (unsigned 64-bit; for a power of two computed as
   ``h & (num_partitions - 1)``, the same value). A null key hashes to
   ``2**64 - 1``, so it goes to partition ``(2**64 - 1) % num_partitions``.

Same key → same partition, whatever batch or process it comes from. Without a key every
send goes whole to the next partition in turn (round-robin per send).

Rows are grouped by partition (a stable ``argsort``: a radix sort of the partition numbers
up to 65,536 partitions) and one ``take``, so the rows of one key keep their order inside their
partition.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from broker_core.errors import InvalidRequestError

HASH_KEY = "0123456789123456"
NULL_HASH = np.uint64(2**64 - 1)
CANONICAL_NAN = np.uint64(0x7FF8000000000000)  # np.nan's bit pattern: every NaN hashes as it
# Up to this many partitions a send's rows are grouped by a radix sort of the partition
# numbers (16 bits), above by NumPy's stable merge sort of the 64-bit ones.
_RADIX_MAX_PARTITIONS = 1 << 16
# splitmix64's finaliser, as pandas.util.hash_array applies it.
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_SHIFT_1, _SHIFT_2, _SHIFT_3 = np.uint64(30), np.uint64(27), np.uint64(31)


def _finalise(bits: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """The finaliser of step 2, in place on a fresh array (uint64 arithmetic wraps).

    The shifts go to one scratch array: every new array of a send's size is fresh memory
    the allocator may have to map again (page faults were most of the hash's cost)."""
    scratch = np.empty_like(bits)
    for shift, mix in ((_SHIFT_1, _MIX_1), (_SHIFT_2, _MIX_2)):
        np.right_shift(bits, shift, out=scratch)
        bits ^= scratch
        bits *= mix
    np.right_shift(bits, _SHIFT_3, out=scratch)
    bits ^= scratch
    return bits


def _hash_numbers(
    values: npt.NDArray[np.generic], *, fresh: bool = False
) -> npt.NDArray[np.uint64]:
    """Step 2 for int64 or float64 values, without pandas; ``fresh``: ``values`` is this
    call's to overwrite (no copy)."""
    bits = values.view(np.uint64) if fresh else values.view(np.uint64).copy()
    if values.dtype == np.float64:
        bits[np.isnan(values)] = CANONICAL_NAN
    return _finalise(bits)


def _key_values(keys: pa.Array) -> npt.NDArray[np.generic]:
    t = keys.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_temporal(t):
        if pa.types.is_temporal(t):
            width = pa.int32() if t.bit_width == 32 else pa.int64()
            keys = keys.view(width)
        filled = pc.fill_null(keys, False if pa.types.is_boolean(t) else 0)
        ints = pc.cast(filled, pa.int64(), safe=False)
        return np.asarray(ints.to_numpy(zero_copy_only=False), dtype=np.int64)
    if pa.types.is_floating(t):
        floats = pc.cast(pc.fill_null(keys, 0.0), pa.float64())
        values = np.asarray(floats.to_numpy(zero_copy_only=False), dtype=np.float64)
        return np.where(values == 0.0, 0.0, values)  # -0.0 == 0.0: one hash for both zeros
    raise InvalidRequestError(
        f"key column of type {t} cannot be hashed (use an integer, float, boolean, "
        "temporal, string or binary column)"
    )


def hash_keys(keys: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.uint64]:
    """The 64-bit hash of every key (module docstring), nulls as ``2**64 - 1``."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    t = keys.type
    if pa.types.is_dictionary(t):
        keys = keys.dictionary_decode()
        t = keys.type
    if (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_string_view(t)
        or (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t))
    ):
        # Hash each distinct value once, then spread by the dictionary indices.
        encoded = keys.dictionary_encode()
        distinct = np.asarray(encoded.dictionary.to_numpy(zero_copy_only=False), dtype=object)
        # SipHash of Python strings/bytes: pandas' C implementation, imported only here.
        try:
            import pandas as pd
        except ImportError as exc:
            raise InvalidRequestError(
                f"key column of type {t} is hashed with pandas, which is not installed "
                f"(pip install pandas, or use a numeric key): {exc}"
            ) from exc

        distinct_hash = pd.util.hash_array(
            distinct, encoding="utf8", hash_key=HASH_KEY, categorize=False
        )
        indices = pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False)
        table = np.append(np.asarray(distinct_hash, dtype=np.uint64), NULL_HASH)
        hashes = table[indices] if len(distinct) else table[np.zeros(len(keys), dtype=np.int64)]
    elif pa.types.is_signed_integer(t) and not keys.null_count:
        # Spark's usual key: its int64 values are a fresh copy (never a view of the
        # batch), which the hash may overwrite; the same values as _key_values'.
        ints = np.asarray(keys.to_numpy(zero_copy_only=True)).astype(np.int64)
        hashes = _hash_numbers(ints, fresh=True)
    else:
        hashes = _hash_numbers(_key_values(keys))
    if keys.null_count:
        nulls = np.asarray(keys.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        hashes = np.where(nulls, NULL_HASH, hashes)
    return hashes


def partitions_for_keys(
    keys: pa.Array | pa.ChunkedArray, num_partitions: int
) -> npt.NDArray[np.int64]:
    """The partition of every row: ``hash_keys(keys) % num_partitions``."""
    if num_partitions < 1:
        raise InvalidRequestError(f"a topic needs at least one partition, not {num_partitions}")
    hashes = hash_keys(keys)  # a fresh array: the remainder is computed in place
    if num_partitions & (num_partitions - 1) == 0:
        # A power of two: the remainder is the low bits, the same partitions without a
        # 64-bit division per row (the division was the costliest step of the hash).
        hashes &= np.uint64(num_partitions - 1)
    else:
        hashes %= np.uint64(num_partitions)
    return hashes.view(np.int64)  # every value < num_partitions: the same as a cast


@dataclass(frozen=True)
class PartitionSlice:
    partition: int
    batch: pa.RecordBatch


def group_by_partition(
    table: pa.Table, partitions: npt.NDArray[np.int64], num_partitions: int
) -> list[PartitionSlice]:
    """The table's rows split by partition: one stable argsort, one take, then slices.

    Rows of one partition keep their relative order (so per-key order is kept).
    """
    counts = np.bincount(partitions, minlength=num_partitions)
    if num_partitions <= _RADIX_MAX_PARTITIONS:
        # NumPy's stable sort of 8/16-bit integers is a radix sort: two linear passes,
        # rows of a partition in their order, one array allocated.
        narrow = np.uint8 if num_partitions <= 256 else np.uint16
        order = np.argsort(partitions.astype(narrow), kind="stable")
    else:
        order = np.argsort(partitions, kind="stable")
    ordered = table.take(pa.array(order)).combine_chunks()
    batches = ordered.to_batches()
    batch = batches[0] if len(batches) == 1 else _single_batch(ordered)
    result: list[PartitionSlice] = []
    start = 0
    for partition, count in enumerate(counts.tolist()):  # one step per partition, not per row
        if count:
            result.append(PartitionSlice(partition, batch.slice(start, count)))
        start += count
    return result


def _single_batch(table: pa.Table) -> pa.RecordBatch:
    if table.num_rows == 0:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return pa.concat_batches(table.to_batches())


class Partitioner:
    """Chooses partitions for a send: by key hash, or round-robin per send."""

    def __init__(self, strategy: str = "hash") -> None:
        if strategy not in ("hash", "round_robin"):
            raise InvalidRequestError(f"partitioner={strategy!r} is not hash or round_robin")
        self.strategy = strategy
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def next_round_robin(self, num_partitions: int) -> int:
        with self._lock:
            return next(self._counter) % num_partitions

    def split(self, table: pa.Table, key: str | None, num_partitions: int) -> list[PartitionSlice]:
        """The send's rows per partition (only partitions that get rows)."""
        if key is not None and key not in table.column_names:
            raise InvalidRequestError(
                f"key column {key!r} is not in the data (columns: {', '.join(table.column_names)})"
            )
        if key is None or self.strategy == "round_robin" or num_partitions == 1:
            partition = self.next_round_robin(num_partitions)
            batches = table.combine_chunks().to_batches()
            whole = batches[0] if len(batches) == 1 else _single_batch(table)
            return [PartitionSlice(partition, whole)] if table.num_rows else []
        parts = partitions_for_keys(table.column(key), num_partitions)
        return group_by_partition(table, parts, num_partitions)
