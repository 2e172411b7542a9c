"""What one sink commit costs: ``commit_sink_batch`` latency for tasks x partitions.

    python -m benchmarks.bench_commit [--tasks 1,4,16] [--partitions 1,8,32]
                                      [--commits 20] [--warmup 3] [--dir DIR]

A real broker process (``idemlog broker start``, embedded mode, default config) and, for
each (tasks T, partitions P), a topic of P partitions. Each round is one Spark batch of
the sink protocol (docs/design.md §6) as ``spark_sink`` drives it: T task attempts, each
``init_sink_producer`` for the batch, ``add_partitions_to_txn`` of all P partitions, one
small transactional batch (10 rows) to each partition, ``prepare_sink_txn`` with its
ranges; then the driver's ``commit_sink_batch`` of the T transactions, which is what is
timed (wall clock, one client call: the coordinator's PREPARE record, every marker
fsynced, the COMPLETE records). ``--warmup`` rounds are not counted. After the last round
every partition's last stable offset must be its log end (every marker written) and its
read_committed rows every row sent, else the run exits non-zero.

Prints a table (p50 / p95 / max ms per grid cell) and ``commit_p50_ms_<T>x<P>`` and
``commit_p95_ms_<T>x<P>`` lines. The setup of a round (T x P produce calls) is not timed.
The code measured is whatever ``broker_core`` the broker process imports: run this file
from another checkout (a worktree of an older commit) to measure that code
(benchmarks/README.md says how the "before" figures were taken).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from benchmarks.bench_broker import Server, start_broker
from benchmarks.common import percentile
from broker_core.client.broker_client import BrokerClient
from broker_core.protocol.wire import SinkAttempt

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
ROWS = 10
RUN = "bench-run"


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def _batch(start: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(start, start + ROWS), pa.int64())], schema=SCHEMA)


def _round(
    client: BrokerClient, sink: str, topic: str, tasks: int, partitions: int, batch: int
) -> float:
    """One Spark batch of the sink protocol; returns the commit's seconds."""
    txns = []
    parts = [(topic, p) for p in range(partitions)]
    for task in range(tasks):
        tid = f"{sink}/{task}"
        pid, epoch, _ = client.init_sink_producer(tid, None, SinkAttempt(sink, RUN, batch))
        client.add_partitions_to_txn(tid, pid, epoch, parts)
        ranges = []
        for p in range(partitions):
            with client.produce_stream(topic, p, SCHEMA) as stream:
                base, last = stream.send(
                    _batch(batch * 1_000_000 + task * 1000),
                    producer_id=pid,
                    producer_epoch=epoch,
                    base_sequence=0,
                    transactional=True,
                ).offsets(60)
            ranges.append((topic, p, base, last))
        client.prepare_sink_txn(tid, pid, epoch, batch, ranges)
        txns.append((tid, pid, epoch))
    start = time.perf_counter()
    if not client.commit_sink_batch(sink, batch, txns, RUN):
        raise SystemExit(f"{sink} batch {batch}: the commit answered 'committed before'")
    return time.perf_counter() - start


def _check(client: BrokerClient, topic: str, partitions: int, expected_rows: int) -> None:
    for p in range(partitions):
        offsets = client.list_offsets(topic, p)
        if offsets["last_stable_offset"] != offsets["log_end_offset"]:
            raise SystemExit(f"{topic}-{p}: LSO {offsets} short of the log end after the commits")
        table = client.read_table(topic, p, isolation="read_committed")
        rows = 0 if table is None else table.num_rows
        if rows != expected_rows:
            raise SystemExit(f"{topic}-{p}: {rows} committed rows read back, {expected_rows} sent")


def _measure(
    client: BrokerClient, tasks: int, partitions: int, commits: int, warmup: int
) -> list[float]:
    topic = f"commit-{tasks}x{partitions}"
    sink = f"sink-{tasks}x{partitions}"
    client.create_topic(topic, partitions, schema=SCHEMA)
    seconds = []
    for batch in range(warmup + commits):
        took = _round(client, sink, topic, tasks, partitions, batch)
        if batch >= warmup:
            seconds.append(took)
    _check(client, topic, partitions, (warmup + commits) * tasks * ROWS)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default="1,4,16", help="task counts (default 1,4,16)")
    parser.add_argument("--partitions", default="1,8,32", help="partition counts (1,8,32)")
    parser.add_argument("--commits", type=int, default=20, help="timed commits per cell")
    parser.add_argument("--warmup", type=int, default=3, help="untimed commits first")
    parser.add_argument("--dir", help="scratch directory (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.commits < 1 or args.warmup < 0:
        parser.error("--commits must be >= 1 and --warmup >= 0")
    grid = [(t, p) for t in _ints(args.tasks) for p in _ints(args.partitions)]
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="bench-commit-"))
    scratch.mkdir(parents=True, exist_ok=True)
    server: Server | None = None
    results: dict[tuple[int, int], list[float]] = {}
    try:
        server = start_broker(scratch)
        with BrokerClient(server.address) as client:
            for tasks, partitions in grid:
                results[(tasks, partitions)] = _measure(
                    client, tasks, partitions, args.commits, args.warmup
                )
    finally:
        if server is not None:
            server.stop()
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"sink commit latency, {args.commits} commits per cell ({args.warmup} warm-up)")
    heads = ("tasks", "partitions", "markers", "p50 ms", "p95 ms", "max ms")
    print(" ".join(f"{h:>{max(6, len(h))}}" for h in heads))
    for (tasks, partitions), seconds in results.items():
        print(
            f"{tasks:>6} {partitions:>10} {tasks * partitions:>7} "
            f"{statistics.median(seconds) * 1e3:>6.1f} {percentile(seconds, 95) * 1e3:>6.1f} "
            f"{max(seconds) * 1e3:>6.1f}"
        )
    for (tasks, partitions), seconds in results.items():
        print(f"commit_p50_ms_{tasks}x{partitions}={statistics.median(seconds) * 1e3:.2f}")
        print(f"commit_p95_ms_{tasks}x{partitions}={percentile(seconds, 95) * 1e3:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
