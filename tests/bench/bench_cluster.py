"""``make bench-cluster``: the same ``df.write`` on the cluster with 1 and with 2 workers.

The stack of the cluster tests (``tests/cluster/stack.py``: ZooKeeper and three brokers, a
Spark standalone master and two one-core workers and the driver, each on a host of its
own) runs one batch write of ``--rows`` rows per application, ``spark.cores.max`` 1 (one
executor, on one worker) or 2 (one executor on each worker), interleaved ``--repeats``
times. The figure is the ``save()``'s wall time (the driver's session start is not in
it); every write is read back and checked exactly once.

All hosts share this machine's cores: with 2 cores, the second worker competes with the
brokers, ZooKeeper, the master and the driver, so 2 workers cannot be twice as fast here.
The ratio says what the sink adds to Spark's scaling on real hosts only as far as the
brokers keep up; the table prints the host's core count beside it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from jobs.verify import verify_exactly_once
from tests.cluster.stack import Stack, running_stack
from tests.harness.cluster import read_back
from tests.spark.helpers import DriverLauncher, batch_spec, make_input


def _write(
    stack: Stack, drivers: DriverLauncher, src: Path, work: Path, workers: int, n: int
) -> float:
    topic = f"scale_{workers}w_{n}"
    spec = stack.spec(
        work / f"events-{topic}", cores=workers, **batch_spec(src, "", topic, spark_partitions=8)
    )
    run = stack.start(drivers, spec)
    code = run.wait()
    timed = [line for line in run.lines if line.startswith("TIMED")]
    if code != 0 or not timed:
        raise SystemExit(f"write with {workers} worker(s) failed:\n{run.describe()}")
    return float(timed[0].split("=")[1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="idemlog-bench-cluster-"))
    try:
        src = work / "src"
        ids = make_input(src, args.files, args.rows // args.files)
        seconds: dict[int, list[float]] = {1: [], 2: []}
        with running_stack(work) as stack:
            drivers = DriverLauncher(work)
            try:
                for n in range(args.repeats):
                    for workers in (1, 2):
                        seconds[workers].append(_write(stack, drivers, src, work, workers, n))
                        print(
                            f"  {workers} worker(s), run {n}: {seconds[workers][-1]:.2f} s",
                            flush=True,
                        )
            finally:
                drivers.close()
            with stack.brokers.client() as client:
                for workers in (1, 2):
                    for n in range(args.repeats):
                        table = read_back(client, f"scale_{workers}w_{n}")
                        verdict = verify_exactly_once(
                            table, id_column="id", key_column="account", expected_ids=ids
                        )
                        if not verdict.ok:
                            print(f"{workers} worker(s), run {n}: {verdict.line()}")
                            return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = len(ids)
    rate = {w: rows / statistics.median(s) for w, s in seconds.items()}
    print(f"\nmachine cores: {os.cpu_count()}; rows per write: {rows}; repeats: {args.repeats}")
    print(f"{'workers':>7}  {'write s (median)':>16}  {'rows/s':>10}")
    for workers in (1, 2):
        print(f"{workers:>7}  {statistics.median(seconds[workers]):>16.2f}  {rate[workers]:>10.0f}")
    print("exactly_once=OK")
    print(f"cluster_1_worker_rows_per_s={rate[1]:.0f}")
    print(f"cluster_2_workers_rows_per_s={rate[2]:.0f}")
    print(f"cluster_2_vs_1_workers_ratio={rate[2] / rate[1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
