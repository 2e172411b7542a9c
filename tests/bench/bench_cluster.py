"""``make bench-cluster``: the same ``df.write`` on the cluster with 1 and with 2 workers.

The stack of the cluster tests (``tests/cluster/stack.py``: ZooKeeper and three brokers, a
Spark standalone master and two one-core workers and the driver, each on a host of its
own) runs one batch write of ``--rows`` rows per application, ``spark.cores.max`` 1 (one
executor, on one worker) or 2 (one executor on each worker), interleaved ``--repeats``
times. The figure is the ``save()``'s wall time (the driver's session start is not in
it); every write is read back and checked exactly once.

All hosts share this machine's cores: with 2 cores, the second worker competes with the
brokers, ZooKeeper, the master and the driver, so 2 workers cannot be twice as fast here.
The table prints, beside the rate, how busy the machine's cores were during the write and
the brokers' CPU seconds: that is what limits the figure here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from spark_sink.verify import verify_exactly_once
from tests.cluster.stack import Stack, running_stack
from tests.harness.cluster import read_back
from tests.spark.helpers import DriverLauncher, batch_spec, make_input


class _Sampler:
    """The machine's CPU times and the brokers' CPU seconds, every 0.2 s, on a thread."""

    def __init__(self, brokers: list[psutil.Process]) -> None:
        self.brokers = brokers
        self.samples: list[tuple[float, Any, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            cpu = sum(sum(b.cpu_times()[:2]) for b in self.brokers)
            self.samples.append((time.monotonic(), psutil.cpu_times(), cpu))

    def window(self, start: float, end: float) -> tuple[float, float]:
        """Machine busy fraction and the brokers' CPU seconds between two times."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return float("nan"), float("nan")
        (_, first, b0), (_, last, b1) = inside[0], inside[-1]
        total = sum(last) - sum(first)
        idle = (last.idle + last.iowait) - (first.idle + first.iowait)
        return 1 - idle / total, b1 - b0

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _write(
    stack: Stack,
    drivers: DriverLauncher,
    src: Path,
    work: Path,
    workers: int,
    n: int,
    sampler: _Sampler,
) -> tuple[float, float, float]:
    """One write; its seconds, the machine's busy fraction and the brokers' CPU seconds."""
    topic = f"scale_{workers}w_{n}"
    spec = stack.spec(
        work / f"events-{topic}", cores=workers, **batch_spec(src, "", topic, spark_partitions=8)
    )
    run = stack.start(drivers, spec)
    code = run.wait()
    timed = [
        (t, line) for t, line in zip(run.times, run.lines, strict=True) if line.startswith("TIMED")
    ]
    if code != 0 or not timed:
        raise SystemExit(f"write with {workers} worker(s) failed:\n{run.describe()}")
    at, line = timed[0]
    seconds = float(line.split("=")[1])
    end = run.started + at
    busy, broker_cpu = sampler.window(end - seconds, end)
    return seconds, busy, broker_cpu


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
        busy: dict[int, list[float]] = {1: [], 2: []}
        broker_cpu: dict[int, list[float]] = {1: [], 2: []}
        with running_stack(work) as stack:
            drivers = DriverLauncher(work)
            sampler = _Sampler([psutil.Process(b.pid) for b in stack.brokers.brokers])
            try:
                for n in range(args.repeats):
                    for workers in (1, 2):
                        s, b, c = _write(stack, drivers, src, work, workers, n, sampler)
                        seconds[workers].append(s)
                        busy[workers].append(b)
                        broker_cpu[workers].append(c)
                        print(
                            f"  {workers} worker(s), run {n}: {s:.2f} s, machine {b:.0%} busy, "
                            f"brokers {c:.1f} CPU s",
                            flush=True,
                        )
            finally:
                sampler.close()
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
    print(
        f"{'workers':>7}  {'write s (median)':>16}  {'rows/s':>10}  "
        f"{'machine busy':>12}  {'brokers CPU s':>13}"
    )
    for w in (1, 2):
        print(
            f"{w:>7}  {statistics.median(seconds[w]):>16.2f}  {rate[w]:>10.0f}  "
            f"{statistics.median(busy[w]):>12.0%}  {statistics.median(broker_cpu[w]):>13.1f}"
        )
    print("exactly_once=OK")
    print(f"cluster_1_worker_rows_per_s={rate[1]:.0f}")
    print(f"cluster_2_workers_rows_per_s={rate[2]:.0f}")
    print(f"cluster_2_vs_1_workers_ratio={rate[2] / rate[1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
