"""The batch write with the brokers' early writeback on and off, in one Spark session.

    python -m benchmarks.bench_writeback [--rows 20000000] [--repeats 3] [--dir DIR]
    python -m benchmarks.bench_writeback --files-only [--repeats 10] [--dir DIR]

(``make bench-writeback``.) Two broker processes (``idemlog broker start``, embedded
mode), alike but for the topic key ``flush.writeback.bytes``: the default (1 MiB) on one,
``0`` on the other (``log.flush.writeback.bytes=0``). One ``local[2,1]`` session writes the
same DataFrame (``spark_workload.source``: ``id``, ``key``, ``value``; 20M rows by default)
with ``format("idemlog")`` (``key="key"``) to each, and with the discard writer (the floor
of any Python sink), ``--repeats`` interleaved rounds, the order turned every round. Each
idemlog write is checked (every row in the log, every transaction decided) and its topic
deleted. The job's commit is where the two differ: its markers' fsync writes whatever of
the job's output is still unwritten (docs/storage.md, "Early writeback").

Prints each run, a table (best and median seconds, rows/s, and the driver's commit
``commit_request`` p50 from the sink's spans) and the lines::

    writeback_on_vs_off_batch=<off's best seconds / on's>      (> 1: the writeback helps)
    writeback_on_vs_discard_batch=<discard's best / idemlog's, writeback on>
    writeback_off_vs_discard_batch=<discard's best / idemlog's, writeback off>
    writeback_commit_ms_on=<p50>, writeback_commit_ms_off=<p50>

``--files-only``: the hint's own cost, without Spark or a broker: 1 GiB written to a file in
1 MiB ``pwrite``s then fsynced, ``--repeats`` times with ``start_writeback`` after each MiB
and as many without, alternating; the write's and the fsync's seconds, and the whole
machine's busy CPU seconds from ``/proc/stat`` (the kernel's writeback threads included).
Last lines ``writeback_file_busy_s_on``/``_off`` and ``writeback_file_fsync_ms_on``/``_off``
(medians).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from benchmarks import trace_hooks
from benchmarks.bench_spark import check_topic
from benchmarks.broker_process import Server, start_broker
from benchmarks.discard_sink import DiscardDataSource
from benchmarks.spark_workload import source
from broker_core.client.broker_client import BrokerClient
from broker_core.fileutil import start_writeback
from spark_sink import local_session

VARIANTS = {"on": "", "off": "log.flush.writeback.bytes=0\n"}
WARMUP_ROWS = 100_000


def _check(address: str, topic: str, rows: int, transactions: int) -> None:
    """Every row in the log and every transaction decided; then the topic is deleted."""
    with BrokerClient(address) as client:
        check_topic(client, topic, rows, transactions)
        client.delete_topic(topic)


def _commit_ms(trace_file: Path, since: float) -> list[float]:
    """The ``commit_request`` spans (ms) that started after ``since`` (epoch seconds)."""
    spans = []
    if trace_file.exists():
        for line in trace_file.read_text().splitlines():
            span = json.loads(line)
            if span["name"] == "commit_request" and span["start"] >= since:
                spans.append((span["end"] - span["start"]) * 1000)
    return spans


def _busy_cpu_s() -> float:
    """Busy CPU seconds of the whole machine so far (every core, kernel threads too)."""
    with open("/proc/stat") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def files_only(directory: Path, repeats: int) -> None:
    """The early writeback's cost in CPU and what it saves the fsync, on a plain file."""
    chunk = os.urandom(1 << 20)
    figures: dict[str, list[tuple[float, float, float]]] = {"on": [], "off": []}
    for r in range(repeats):
        for way in ("off", "on") if r % 2 == 0 else ("on", "off"):
            os.sync()
            path = directory / f"writeback-{way}.bin"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                busy, start = _busy_cpu_s(), time.perf_counter()
                for i in range(1024):
                    os.pwrite(fd, chunk, i << 20)
                    if way == "on":
                        start_writeback(fd, i << 20, 1 << 20)
                written = time.perf_counter()
                os.fsync(fd)
                done = time.perf_counter()
                figures[way].append((written - start, done - written, _busy_cpu_s() - busy))
            finally:
                os.close(fd)
                path.unlink()
    print(f"{'1 GiB':<6} {'write s':>8} {'fsync ms':>9} {'busy CPU s':>11}  (medians of {repeats})")
    for way, runs in figures.items():
        write_s, fsync_s, busy_s = (statistics.median(column) for column in zip(*runs, strict=True))
        print(f"{way:<6} {write_s:>8.2f} {fsync_s * 1000:>9.1f} {busy_s:>11.2f}")
    for way, runs in figures.items():
        print(f"writeback_file_busy_s_{way}={statistics.median(r[2] for r in runs):.3f}")
        print(f"writeback_file_fsync_ms_{way}={statistics.median(r[1] for r in runs) * 1000:.2f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--dir", help="scratch directory (default: a temporary one)")
    parser.add_argument(
        "--files-only", action="store_true", help="the hint's cost on a plain file, no Spark"
    )
    args = parser.parse_args(argv)
    if args.rows < 1 or args.repeats < 1:
        parser.error("--rows and --repeats must be at least 1")
    directory = Path(args.dir or tempfile.mkdtemp(prefix="bench-writeback-"))
    directory.mkdir(parents=True, exist_ok=True)
    if args.files_only:
        try:
            files_only(directory, args.repeats)
        finally:
            if args.dir is None:
                shutil.rmtree(directory, ignore_errors=True)
        return 0
    trace_file = directory / "trace.jsonl"
    os.environ[trace_hooks.ENV] = str(trace_file)  # inherited by Spark's Python workers
    servers: dict[str, Server] = {}
    runs: dict[str, list[float]] = {"discard": [], "on": [], "off": []}
    commits: dict[str, list[float]] = {"on": [], "off": []}
    try:
        for name, extra in VARIANTS.items():
            servers[name] = start_broker(directory / name, name, extra)
        spark = local_session("bench-writeback", cores=2, max_failures=1, quiet=True)
        spark.dataSource.register(DiscardDataSource)
        partitions = source(spark, 1).rdd.getNumPartitions()
        print(
            f"bench-writeback: {args.rows} rows x {args.repeats} round(s), "
            f"{spark.sparkContext.master}, {partitions} source partitions; brokers "
            + ", ".join(f"{n} {s.address}" for n, s in servers.items()),
            flush=True,
        )

        def write(sink: str, rows: int) -> float:
            df = source(spark, rows)
            started, start = time.time(), time.perf_counter()
            if sink == "discard":
                df.write.format("discard").mode("append").option("expected_rows", rows).save()
                return time.perf_counter() - start
            topic = f"bench-writeback-{uuid.uuid4().hex[:12]}"
            writer = df.write.format("idemlog").mode("append").option("topic", topic)
            writer = writer.option("hooks", trace_hooks.HOOKS)  # its commit_request spans
            writer.option("brokers", servers[sink].address).option("key", "key").save()
            elapsed = time.perf_counter() - start
            if rows == args.rows:
                commits[sink] += _commit_ms(trace_file, started)
            _check(servers[sink].address, topic, rows, partitions)
            return elapsed

        order = list(runs)
        for sink in order:
            write(sink, WARMUP_ROWS)
        for r in range(args.repeats):
            for sink in order if r % 2 == 0 else order[::-1]:
                os.sync()  # the last run's output written back: each starts alike
                runs[sink].append(write(sink, args.rows))
                print(f"  round {r + 1} {sink}: {runs[sink][-1]:.2f}s", flush=True)
        spark.stop()
    finally:
        for server in servers.values():
            server.stop()
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)

    print(f"\n{'run':<8} {'best s':>7} {'median s':>9} {'rows/s':>12} {'commit ms p50':>14}")
    for sink, times in runs.items():
        commit = f"{statistics.median(commits[sink]):.1f}" if commits.get(sink) else "-"
        print(
            f"{sink:<8} {min(times):>7.2f} {statistics.median(times):>9.2f} "
            f"{args.rows / min(times):>12,.0f} {commit:>14}"
        )
    best = {sink: min(times) for sink, times in runs.items()}
    print(f"writeback_on_vs_off_batch={best['off'] / best['on']:.3f}")
    print(f"writeback_on_vs_discard_batch={best['discard'] / best['on']:.3f}")
    print(f"writeback_off_vs_discard_batch={best['discard'] / best['off']:.3f}")
    for sink in ("on", "off"):
        print(f"writeback_commit_ms_{sink}={statistics.median(commits[sink]):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
