"""A Spark task's side of a batch write, without Spark: CPU per row of idemlog's task
against the discard writer's, and of the broker.

    python -m benchmarks.bench_task_write [--rows 5000000] [--repeats 3] [--partitions 4]
                                          [--profile FILE]

The rows are bench-peers' (``benchmarks.data.peers_batches``: ``id`` bigint, ``key`` int
= ``id % 1000``, ``value`` = ``'value-' || id``) in Spark-shaped Arrow batches of 10,000
rows whose fields are not nullable (as Spark hands them over; the sink relabels them to
the topic's nullable schema), built before the timing. Each round runs two peers in the
same process, one after the other (interleaved rounds; medians count):

- ``discard``: iterates the batches and counts their rows (the discard writer's work);
- ``idemlog``: exactly what a Spark task of ``df.write.format("idemlog")`` with
  ``key="key"`` runs (``spark_sink.writer._write_task``: the producer, the sink's
  ``InitProducerId``, the heartbeat, ``_write_rows``: ``conform``, the merging up to
  ``batch.size``, ``Producer.send`` with the key, flush, prepare), then the driver's
  commit (``spark_sink.commit.commit_batch``), to a real broker process (``idemlog broker
  start``, default configuration and durability) on loopback, into a fresh topic of
  ``--partitions`` partitions (deleted after the round); the log is checked to hold every
  row.

CPU seconds are user + system (psutil) of this process (the task's threads: the main one,
the producer's sender, the Flight streams' readers, the heartbeat) and of the broker
process, per 10M rows. ``--profile FILE`` samples the idemlog runs with cProfile (the main
thread only: the sender's thread is not in it) and prints the heaviest functions.
Output: a table, then::

    task_idemlog_cpu_s_per_10m=<client CPU s>   task_broker_cpu_s_per_10m=<broker CPU s>
    task_discard_cpu_s_per_10m=<discard CPU s>  task_idemlog_rows_per_s=<rows/s>
    task_added_cpu_s_per_10m=<idemlog client + broker - discard>
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pyarrow as pa

from benchmarks.broker_process import Server, start_broker
from benchmarks.common import cpu_seconds, print_table
from benchmarks.data import PEERS_SPARK_SCHEMA, peers_batches
from broker_core.client.broker_client import BrokerClient
from broker_core.protocol.txn_inputs import batch_job_sink_id
from broker_core.protocol.wire import SinkAttempt
from spark_sink.commit import commit_batch
from spark_sink.options import Scope, parse_options
from spark_sink.schema import normalise
from spark_sink.writer import BATCH_JOB_BATCH_ID, _write_task

SPARK_BATCH_ROWS = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default
PER = 10_000_000  # CPU is quoted per this many rows
TOP_FUNCTIONS = 25


@dataclass
class Run:
    seconds: float
    cpu_s: float
    broker_cpu_s: float


def _self_cpu() -> float:
    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


def run_discard(batches: Sequence[pa.RecordBatch]) -> Run:
    cpu, started = _self_cpu(), time.perf_counter()
    rows = sum(batch.num_rows for batch in iter(batches))
    run = Run(time.perf_counter() - started, _self_cpu() - cpu, 0.0)
    if rows != sum(b.num_rows for b in batches):
        raise SystemExit("discard: rows lost")
    return run


def run_idemlog(
    server: Server,
    batches: Sequence[pa.RecordBatch],
    partitions: int,
    profiler: cProfile.Profile | None,
) -> Run:
    rows = sum(b.num_rows for b in batches)
    topic = f"task-write-{uuid.uuid4().hex[:8]}"
    schema = normalise(PEERS_SPARK_SCHEMA)
    with BrokerClient(server.address) as admin:
        admin.create_topic(topic, partitions, schema=schema)
    options = parse_options({"topic": topic, "brokers": server.address, "key": "key"}, Scope.WRITE)
    run_id = uuid.uuid4().hex
    attempt = SinkAttempt(batch_job_sink_id(run_id), run_id, BATCH_JOB_BATCH_ID)
    broker_cpu, cpu, started = cpu_seconds(server.process.pid), _self_cpu(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    message = _write_task(options, schema, attempt, iter(batches), 0, 0, topic_id="")
    commit_batch(options, attempt.sink_id, run_id, BATCH_JOB_BATCH_ID, [message])
    if profiler is not None:
        profiler.disable()
    run = Run(
        time.perf_counter() - started,
        _self_cpu() - cpu,
        cpu_seconds(server.process.pid) - broker_cpu,
    )
    with BrokerClient(server.address) as admin:
        stored = sum(admin.list_offsets(topic, p)["last_stable_offset"] for p in range(partitions))
        admin.delete_topic(topic)
    # Each partition's log ends with the commit marker (one offset): the rest are rows.
    if message.rows != rows or stored - partitions != rows:
        raise SystemExit(f"idemlog: {message.rows} rows written, {stored} offsets, not {rows}")
    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--partitions", type=int, default=4, help="the topic's partitions")
    parser.add_argument("--profile", type=Path, default=None, help="cProfile stats file")
    parser.add_argument("--dir", type=Path, default=None, help="broker data directory")
    args = parser.parse_args(argv)
    if args.rows <= 0 or args.repeats <= 0 or args.partitions <= 0:
        parser.error("--rows, --repeats and --partitions must be positive")
    batches = peers_batches(args.rows, SPARK_BATCH_ROWS)
    directory = Path(args.dir or tempfile.mkdtemp(prefix="bench-task-write-"))
    print(
        f"bench-task-write: {args.rows} rows in {len(batches)} batches of {SPARK_BATCH_ROWS} "
        f"rows ({batches[0].nbytes / 1e6:.2f} MB each), key=key, {args.partitions} "
        f"partitions, {args.repeats} rounds; broker data in {directory}"
    )
    profiler = cProfile.Profile() if args.profile is not None else None
    server = start_broker(directory)
    runs: dict[str, list[Run]] = {"discard": [], "idemlog": []}
    try:
        run_idemlog(server, batches[:20], args.partitions, None)  # warm-up: imports, channel
        for _ in range(args.repeats):
            runs["discard"].append(run_discard(batches))
            runs["idemlog"].append(run_idemlog(server, batches, args.partitions, profiler))
    finally:
        server.stop()
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    scale = PER / args.rows

    def med(name: str, field: str) -> float:
        return float(statistics.median(getattr(r, field) for r in runs[name]))

    print_table(
        ["peer", "seconds", "rows/s", "CPU s/10M", "broker CPU s/10M", "runs (s)"],
        [
            [
                name,
                f"{med(name, 'seconds'):.3f}",
                f"{args.rows / med(name, 'seconds'):,.0f}",
                f"{med(name, 'cpu_s') * scale:.2f}",
                f"{med(name, 'broker_cpu_s') * scale:.2f}",
                " ".join(f"{r.seconds:.2f}" for r in runs[name]),
            ]
            for name in runs
        ],
    )
    print("(medians of the rounds; CPU s: this process's, and the broker process's)")
    if profiler is not None:
        profiler.dump_stats(args.profile)
        pstats.Stats(str(args.profile)).sort_stats("tottime").print_stats(TOP_FUNCTIONS)
    idemlog, broker = med("idemlog", "cpu_s") * scale, med("idemlog", "broker_cpu_s") * scale
    discard = med("discard", "cpu_s") * scale
    print(f"task_idemlog_cpu_s_per_10m={idemlog:.2f}")
    print(f"task_broker_cpu_s_per_10m={broker:.2f}")
    print(f"task_discard_cpu_s_per_10m={discard:.2f}")
    print(f"task_idemlog_rows_per_s={args.rows / med('idemlog', 'seconds'):.0f}")
    print(f"task_added_cpu_s_per_10m={idemlog + broker - discard:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
