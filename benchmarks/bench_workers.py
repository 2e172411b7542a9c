"""Spark's Python workers with and without ``spark_sink.worker_daemon``.

    python -m benchmarks.bench_workers [--rows 40000] [--runs 10] [--rounds 2]

Spark runs every Python task (a data source's read or write, a UDF) in a worker forked by
a daemon, ``spark.python.daemon.module``. Spark's own, ``pyspark.daemon``, leaves
``pyspark.zip`` first on the workers' path, and before each task a worker's
``importlib.invalidate_caches()`` re-reads that archive's directory (before Python 3.13);
``spark_sink.worker_daemon`` (what ``local_session`` sets) drops the archive when the
same PySpark is installed as a package (docs/spark.md, "Spark's Python workers").

Per round, one ``local[2,1]`` session per daemon, in alternating order (the daemon is a
setting of the SparkContext, fixed at its start): ``--runs`` reads of a ``--rows``-row
topic of 4 partitions with ``spark.read.format("idemlog")`` into ``noop`` (4 tasks), and
``--runs`` batch writes of ``--rows`` rows to the discard writer (2 tasks), after two
warm-up runs of each. Per daemon: p50 wall ms, and CPU ms per run of Spark's Python
processes (the daemons and their workers: the part the daemon changes) and of the JVM.
The checks: each session's daemon process is the one asked for, and every read returns
``--rows`` rows.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil
from pyspark.sql import SparkSession

from benchmarks.common import print_table
from benchmarks.discard_sink import DiscardDataSource
from benchmarks.spark_workload import source
from benchmarks.spark_write_cpu import cpu_by_kind
from spark_sink import local_session
from spark_sink.embedded import stop_broker

DAEMONS = {"spark": "pyspark.daemon", "idemlog": "spark_sink.worker_daemon"}
TOPIC = "bench-workers"
WARMUP_RUNS = 2
DAEMON_EXIT_TIMEOUT_S = 30.0


def _daemon_modules() -> set[str]:
    """The ``-m`` module of every task workers' daemon running under this process (the
    driver-side planners' daemons are always ``pyspark.daemon``: Spark fixes it)."""
    found = set()
    for process in psutil.Process().children(recursive=True):
        try:
            command = process.cmdline()
        except psutil.NoSuchProcess:
            continue
        at = command.index("-m") if "-m" in command else -1
        if 0 <= at < len(command) - 2 and command[at + 2] == "pyspark.worker":
            found.add(command[at + 1])
    return found


def _wait_daemons_gone() -> None:
    """Until the stopped session's daemons have exited (Spark stops them as it stops), so
    the next session's check and CPU figures see only its own."""
    deadline = time.monotonic() + DAEMON_EXIT_TIMEOUT_S
    while _daemon_modules():
        if time.monotonic() > deadline:
            raise SystemExit(f"Python daemons still running: {_daemon_modules()}")
        time.sleep(0.1)  # polling: a process's exit offers no event to a non-parent


def _timed(embedded: str, action: Callable[[], None]) -> tuple[float, float, float]:
    before = cpu_by_kind(embedded)
    start = time.perf_counter()
    action()
    elapsed = time.perf_counter() - start
    after = cpu_by_kind(embedded)
    return elapsed, after["python"] - before["python"], after["jvm"] - before["jvm"]


def _session(daemon: str) -> SparkSession:
    spark = local_session(
        "bench-workers",
        cores=2,
        max_failures=1,
        conf={"spark.python.daemon.module": daemon},
        quiet=True,
    )
    spark.dataSource.register(DiscardDataSource)
    return spark


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--steps", default="read,write", help="which runs: read, write or both (read,write)"
    )
    args = parser.parse_args(argv)
    chosen = set(args.steps.split(","))
    if not chosen or not chosen <= {"read", "write"}:
        parser.error(f"--steps {args.steps!r}: a comma-separated list of read and write")
    directory = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    embedded = str(directory / "embedded")
    runs: dict[str, dict[str, list[tuple[float, float, float]]]] = {
        name: {"read": [], "write": []} for name in DAEMONS
    }
    try:
        written = False
        for round_ in range(args.rounds):
            order = list(DAEMONS) if round_ % 2 == 0 else list(reversed(DAEMONS))
            for name in order:
                spark = _session(DAEMONS[name])
                try:
                    df = source(spark, args.rows)
                    if not written:
                        df.write.format("idemlog").option("path", embedded).option(
                            "topic", TOPIC
                        ).option("key", "key").mode("append").save()
                        written = True
                    read = (
                        spark.read.format("idemlog")
                        .option("path", embedded)
                        .option("topic", TOPIC)
                        .load()
                    )
                    if read.count() != args.rows:
                        raise SystemExit(f"read {read.count()} rows, expected {args.rows}")
                    steps = {
                        "read": read.write.format("noop").mode("overwrite").save,
                        "write": df.write.format("discard")
                        .option("expected_rows", str(args.rows))
                        .mode("append")
                        .save,
                    }
                    for step, action in steps.items():
                        if step not in chosen:
                            continue
                        for _ in range(WARMUP_RUNS):
                            action()
                        running = _daemon_modules()
                        if running != {DAEMONS[name]}:
                            raise SystemExit(
                                f"{name}: the Python daemons running are {running}, "
                                f"not only {DAEMONS[name]}"
                            )
                        for _ in range(args.runs):
                            runs[name][step].append(_timed(embedded, action))
                    print(
                        f"round {round_ + 1} {name}: "
                        + ", ".join(
                            f"{step} p50 {statistics.median(r[0] for r in done) * 1000:.0f} ms"
                            for step, done in runs[name].items()
                            if done
                        ),
                        flush=True,
                    )
                finally:
                    spark.stop()
                    _wait_daemons_gone()
    finally:
        stop_broker(embedded)
        shutil.rmtree(directory, ignore_errors=True)

    def p50(name: str, step: str, index: int) -> float:
        if not runs[name][step]:
            return float("nan")
        return statistics.median(r[index] for r in runs[name][step]) * 1000

    rows = [
        [
            f"{name} ({DAEMONS[name]})",
            f"{p50(name, 'read', 0):.0f}",
            f"{p50(name, 'read', 1):.0f}",
            f"{p50(name, 'read', 2):.0f}",
            f"{p50(name, 'write', 0):.0f}",
            f"{p50(name, 'write', 1):.0f}",
        ]
        for name in DAEMONS
    ]
    print(
        f"\n{args.rows} rows, {args.runs} runs x {args.rounds} rounds per daemon; "
        "p50 per run (ms): wall, CPU of Spark's Python processes, CPU of the JVM"
    )
    print_table(
        ["daemon", "read wall", "read Python CPU", "read JVM CPU", "write wall", "write Python"],
        rows,
    )
    print()
    print(f"workers_read_wall_ratio={p50('spark', 'read', 0) / p50('idemlog', 'read', 0):.3f}")
    print(
        f"workers_read_python_cpu_ratio={p50('spark', 'read', 1) / p50('idemlog', 'read', 1):.3f}"
    )
    print(f"workers_write_wall_ratio={p50('spark', 'write', 0) / p50('idemlog', 'write', 0):.3f}")
    print(
        "workers_write_python_cpu_ratio="
        f"{p50('spark', 'write', 1) / p50('idemlog', 'write', 1):.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
