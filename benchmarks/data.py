"""Synthetic rows shared by the benchmarks: (id bigint, key int, value string)."""

from __future__ import annotations

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
