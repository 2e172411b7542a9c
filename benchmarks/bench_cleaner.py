"""The log cleaner: how long a compaction pass takes and what it leaves.

    python -m benchmarks.bench_cleaner [--rows 200000] [--keys 1000,10000,100000]
                                       [--batch-rows 100] [--dir DIR]

For each key count: one partition of a compacted topic (key columns ``kind,key``, a
64-byte string value) gets ``--rows`` rows in batches of ``--batch-rows`` rows with keys
drawn uniformly (seeded), 5% tombstones, rolled every 4 MiB; then one forced pass
(``PartitionLog.clean``) cleans every closed segment. Printed per key count: the bytes
before and after, rows kept, the pass's wall time, MB of segments rewritten per second,
and the batches the kept rows were split into (one Arrow schema message each: the cost
of keeping offsets, see docs/storage.md, Compaction). A second, forced pass over the
cleaned log shows the steady cost of a pass with nothing left to remove. Figures are
printed, never asserted.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from broker_core.log.store import LogStore

SCHEMA = pa.schema([("kind", pa.string()), ("key", pa.int64()), ("value", pa.string())])
VALUE = "v" * 64


def run(directory: Path, rows: int, keys: int, batch_rows: int) -> dict[str, float]:
    store = LogStore(directory)
    config = {
        "cleanup.policy": "compact",
        "compaction.key.columns": "kind,key",
        "segment.bytes": 4 * 1024**2,
        "max.message.bytes": 4 * 1024**2,
        "delete.retention.ms": 0,
    }
    store.create_topic("bench", 1, schema=SCHEMA, config=config)
    log = store.partition("bench", 0)
    rng = random.Random(keys)
    for start in range(0, rows, batch_rows):
        n = min(batch_rows, rows - start)
        chosen = [rng.randrange(keys) for _ in range(n)]
        values = [None if rng.random() < 0.05 else VALUE for _ in range(n)]
        log.append(
            pa.record_batch(
                [pa.array(["k"] * n), pa.array(chosen, pa.int64()), pa.array(values, pa.string())],
                schema=SCHEMA,
            )
        )
    log.roll()
    log.append(pa.RecordBatch.from_pylist([{"kind": "end", "key": 0, "value": VALUE}], SCHEMA))
    before = log.size_bytes
    t0 = time.perf_counter()
    result = log.clean(force=True)
    first_s = time.perf_counter() - t0
    assert result is not None
    after = log.size_bytes
    kept = batches = 0
    for seg in log.segments:
        for stored in seg.batches():
            kept += stored.header.record_count
            batches += 1
    t0 = time.perf_counter()
    log.clean(force=True)
    second_s = time.perf_counter() - t0
    store.close()
    return {
        "keys": keys,
        "MB before": before / 1e6,
        "MB after": after / 1e6,
        "rows kept": kept,
        "batches after": batches,
        "pass s": first_s,
        "MB/s": result.bytes_before / 1e6 / first_s,
        "2nd pass s": second_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--keys", default="1000,10000,100000")
    parser.add_argument("--batch-rows", type=int, default=100)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-cleaner-", dir=args.dir))
    try:
        results = [
            run(base / f"k{keys}", args.rows, int(keys), args.batch_rows)
            for keys in args.keys.split(",")
        ]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    headers = list(results[0])
    print(f"rows={args.rows} batch_rows={args.batch_rows}")
    print("  ".join(f"{h:>13}" for h in headers))
    for r in results:
        print(
            "  ".join(
                f"{r[h]:>13.2f}" if isinstance(r[h], float) else f"{r[h]:>13}" for h in headers
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
