"""Whose CPU a Spark batch write uses: the discard writer, idemlog keyed and idemlog without
a key, CPU seconds by process kind.

    python -m benchmarks.spark_write_cpu [--rows 5000000] [--repeats 3]

One ``local[2,1]`` session (as ``bench_spark``'s), bench-peers' rows
(``spark_workload.source``), the three writes in interleaved rounds after a warm-up write of
each; for each write the user + system CPU seconds (psutil, reaped children included) of
each kind of process: ``jvm`` (Spark's JVM), ``python`` (the Python daemon and the workers
it forks: the tasks, the data source's planning and commit), ``driver`` (this process) and
``broker`` (the embedded broker: a descendant of the worker that started it, counted
here only). Prints the medians per write and kind, per 10M rows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import psutil
from pyspark.sql import DataFrame

from benchmarks.bench_spark import WARMUP_ROWS
from benchmarks.common import print_table
from benchmarks.discard_sink import DiscardDataSource
from benchmarks.spark_workload import source
from spark_sink import local_session
from spark_sink.embedded import broker_pid, stop_broker

WRITES = ("discard", "idemlog_key", "idemlog_no_key")
KINDS = ("jvm", "python", "driver", "broker")
PER = 10_000_000


def _kind(process: psutil.Process, broker: int | None) -> str:
    if process.pid == broker:
        return "broker"
    if process.pid == os.getpid():
        return "driver"
    command = " ".join(process.cmdline())
    return "jvm" if "java" in command else "python"


def cpu_by_kind(embedded: str) -> dict[str, float]:
    """CPU seconds so far of every process of this tree, summed by kind."""
    broker = broker_pid(embedded)
    root = psutil.Process()
    out = dict.fromkeys(KINDS, 0.0)
    for process in [root, *root.children(recursive=True)]:
        try:
            t = process.cpu_times()
            kind = _kind(process, broker)
        except psutil.NoSuchProcess:
            continue
        out[kind] += t.user + t.system + t.children_user + t.children_system
    return out


def write(name: str, df: DataFrame, embedded: str) -> None:
    writer = df.write.mode("append")
    if name == "discard":
        writer.format("discard").save()
        return
    writer = writer.format("idemlog").option("path", embedded)
    writer = writer.option("topic", f"spark-write-cpu-{uuid.uuid4().hex[:8]}")
    if name == "idemlog_key":
        writer = writer.option("key", "key")
    writer.save()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    args = parser.parse_args(argv)
    if args.rows <= 0 or args.repeats <= 0:
        parser.error("--rows and --repeats must be positive")
    directory = Path(tempfile.mkdtemp(prefix="spark-write-cpu-"))
    embedded = str(directory / "embedded")
    spark = local_session("spark-write-cpu", cores=2, max_failures=1, quiet=True)
    cpu: dict[str, list[dict[str, float]]] = {name: [] for name in WRITES}
    seconds: dict[str, list[float]] = {name: [] for name in WRITES}
    try:
        spark.dataSource.register(DiscardDataSource)
        for name in WRITES:
            write(name, source(spark, WARMUP_ROWS), embedded)
        df = source(spark, args.rows)
        for _ in range(args.repeats):
            for name in WRITES:
                before, started = cpu_by_kind(embedded), time.perf_counter()
                write(name, df, embedded)
                seconds[name].append(time.perf_counter() - started)
                after = cpu_by_kind(embedded)
                cpu[name].append({k: after[k] - before[k] for k in KINDS})
    finally:
        spark.stop()
        stop_broker(embedded)
        shutil.rmtree(directory, ignore_errors=True)
    scale = PER / args.rows
    rows = []
    for name in WRITES:
        medians = {k: statistics.median(c[k] for c in cpu[name]) * scale for k in KINDS}
        rows.append(
            [
                name,
                f"{statistics.median(seconds[name]):.2f}",
                *(f"{medians[k]:.2f}" for k in KINDS),
                f"{sum(medians.values()):.2f}",
            ]
        )
    print(f"{args.rows} rows, {args.repeats} interleaved rounds, medians; CPU s per 10M rows")
    print_table(["write", "seconds", *KINDS, "total"], rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
