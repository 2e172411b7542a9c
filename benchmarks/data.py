"""Synthetic rows shared by the benchmarks: (id bigint, key int, value string)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.int32()), ("value", pa.string())])


def distinct_batches(count: int, rows: int, value_bytes: int, seed: int) -> list[pa.RecordBatch]:
    """``count`` different batches of ``rows`` rows with ``value_bytes``-byte random strings
    and keys ``id % 1009``; benchmarks cycle through them so data building is not measured."""
    rng = np.random.default_rng(seed)
    offsets = pa.py_buffer(np.arange(0, (rows + 1) * value_bytes, value_bytes, dtype=np.int32))
    batches = []
    for i in range(count):
        ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
        values = pa.StringArray.from_buffers(
            rows, offsets, pa.py_buffer(rng.integers(97, 123, rows * value_bytes, dtype=np.uint8))
        )
        batches.append(
            pa.RecordBatch.from_arrays(
                [pa.array(ids), pa.array((ids % 1009).astype(np.int32)), values], schema=SCHEMA
            )
        )
    return batches


# bench-peers' rows as Spark hands them to a Python writer: its plan's columns are not
# nullable (``spark.range(N).selectExpr("id", "cast(id % 1000 as int) key",
# "concat('value-', id) value")``).
PEERS_SPARK_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("key", pa.int32(), nullable=False),
        pa.field("value", pa.string(), nullable=False),
    ]
)


def iter_peers_batches(rows: int, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """bench-peers' first ``rows`` rows in batches of ``batch_rows`` rows (the last one
    shorter), typed as Spark hands them over (:data:`PEERS_SPARK_SCHEMA`), made one at a
    time."""
    import pyarrow.compute as pc

    for start in range(0, rows, batch_rows):
        ids = pa.array(np.arange(start, min(start + batch_rows, rows), dtype=np.int64))
        keys = pa.array((ids.to_numpy() % 1000).astype(np.int32))
        values = pc.binary_join_element_wise("value-", pc.cast(ids, pa.string()), "")
        yield pa.RecordBatch.from_arrays([ids, keys, values], schema=PEERS_SPARK_SCHEMA)


def peers_batches(rows: int, batch_rows: int) -> list[pa.RecordBatch]:
    """:func:`iter_peers_batches` as a list."""
    return list(iter_peers_batches(rows, batch_rows))
