"""The demos' input: a deterministic stream of payments, one parquet file per micro-batch.

``make demo`` (``jobs/streaming_demo.py``), the notebook (``notebooks/dedup_metrics.ipynb``)
and the tests write the same rows, so each ships in the package: an installed wheel runs the
notebook without a checkout. ``payment_id`` is unique and increasing, ``account_id`` the key.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TOPIC = "payments"
KEY = "account_id"
SCHEMA = "payment_id bigint, account_id int, amount_cents bigint, batch int"


def make_input(directory: Path, files: int, rows: int) -> int:
    """Write ``files`` parquet files of ``rows`` payments each into ``directory`` (ids
    ``0..files*rows-1`` in file order); return how many payments were written."""
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows, dtype=np.int64)
        table = pa.table(
            {
                "payment_id": ids,
                "account_id": ((ids * 2654435761) % 1000).astype(np.int32),
                "amount_cents": (ids * 7919) % 100_000,
                "batch": np.full(rows, f, dtype=np.int32),
            }
        )
        path = directory / f"payments-{f:05d}.parquet"
        pq.write_table(table, path)
        # The file source takes files in modification-time order: make it the id order
        # (files written within one clock tick would otherwise tie).
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))
    return files * rows
