"""What one sink commit costs: ``commit_sink_batch`` latency for tasks x partitions.

    python -m benchmarks.bench_commit [--tasks 1,4,16] [--partitions 1,8,32]
                                      [--commits 20] [--warmup 3] [--mb 0]
                                      [--writeback BYTES,...] [--dir DIR]

A real broker process (``idemlog broker start``, embedded mode, default config) and, for
each (tasks T, partitions P), a topic of P partitions. Each round is one Spark batch of
the sink protocol (docs/design.md §6) as ``spark_sink`` drives it: T task attempts, each
``init_sink_producer`` for the batch, ``add_partitions_to_txn`` of all P partitions, one
small transactional batch (10 rows) to each partition -- plus ``--mb`` MiB of rows in
1 MiB batches, a task's real output --, ``prepare_sink_txn`` with its ranges; then the
driver's ``commit_sink_batch`` of the T transactions, which is what is timed (wall clock,
one client call: the coordinator's PREPARE record, every marker fsynced, the COMPLETE
records). ``--warmup`` rounds are not counted. After the last round every partition's
last stable offset must be its log end (every marker written) and its read_committed rows
every row sent, else the run exits non-zero.

``--writeback`` runs every cell once per value of the topic key ``flush.writeback.bytes``
(each its own topic, rounds interleaved): with ``--mb`` it shows what a marker's fsync
costs when the transaction's data is still unwritten (0) and when the appends started
its writeback (docs/storage.md, "Early writeback"), e.g. ``--tasks 1 --partitions 4
--mb 16 --writeback 0,1048576``.

Prints a table (p50 / p95 / max ms per grid cell) and ``commit_p50_ms_<T>x<P>`` and
``commit_p95_ms_<T>x<P>`` lines (of the first ``--writeback`` value; with several, also
``commit_p50_ms_<T>x<P>_wb<BYTES>`` for each, and ``commit_writeback_off_vs_on_<T>x<P>``,
the p50 with 0 over the p50 with the first other value). The setup of a round (the
produce calls) is not timed. The code measured is whatever ``broker_core`` the broker
process imports: run this file from another checkout (a worktree of an older commit) to
measure that code (benchmarks/README.md says how the "before" figures were taken).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks.broker_process import Server, start_broker
from benchmarks.common import percentile
from broker_core.client.broker_client import BrokerClient
from broker_core.protocol.wire import SinkAttempt

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
ROWS = 10
RUN = "bench-run"


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


MIB_ROWS = (1 << 20) // 8  # int64 rows in 1 MiB


def _batch(start: int, rows: int = ROWS) -> pa.RecordBatch:
    return pa.record_batch([pa.array(np.arange(start, start + rows), pa.int64())], schema=SCHEMA)


def _round(
    client: BrokerClient, sink: str, topic: str, tasks: int, partitions: int, batch: int, mb: int
) -> float:
    """One Spark batch of the sink protocol, each task writing ``mb`` MiB more to each
    partition; returns the commit's seconds."""
    txns = []
    parts = [(topic, p) for p in range(partitions)]
    for task in range(tasks):
        tid = f"{sink}/{task}"
        pid, epoch, _ = client.init_sink_producer(tid, None, SinkAttempt(sink, RUN, batch))
        client.add_partitions_to_txn(tid, pid, epoch, parts)
        ranges = []
        for p in range(partitions):
            batches = [_batch(0)] + [_batch(0, MIB_ROWS) for _ in range(mb)]
            with client.produce_stream(topic, p, SCHEMA, transactional_id=tid) as stream:
                sent, sequence = [], 0
                for rows in batches:
                    sent.append(
                        stream.send(
                            rows,
                            producer_id=pid,
                            producer_epoch=epoch,
                            base_sequence=sequence,
                            transactional=True,
                        )
                    )
                    sequence += rows.num_rows
                base, last = sent[0].offsets(60)[0], sent[-1].offsets(60)[1]
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
    client: BrokerClient,
    tasks: int,
    partitions: int,
    args: argparse.Namespace,
    writebacks: list[int | None],
) -> dict[int | None, list[float]]:
    """Each round once per ``flush.writeback.bytes`` value (None: the broker's default),
    on a topic of its own, interleaved; the timed commits' seconds by value."""
    cell = f"{tasks}x{partitions}"
    topics = {}
    for wb in writebacks:
        topic = f"commit-{cell}" if wb is None else f"commit-{cell}-wb{wb}"
        config = None if wb is None else {"flush.writeback.bytes": wb}
        client.create_topic(topic, partitions, schema=SCHEMA, config=config)
        topics[wb] = topic
    seconds: dict[int | None, list[float]] = {wb: [] for wb in writebacks}
    for batch in range(args.warmup + args.commits):
        for wb in writebacks if batch % 2 == 0 else writebacks[::-1]:
            sink = f"sink-{topics[wb]}"
            took = _round(client, sink, topics[wb], tasks, partitions, batch, args.mb)
            if batch >= args.warmup:
                seconds[wb].append(took)
    rows = (args.warmup + args.commits) * tasks * (ROWS + args.mb * MIB_ROWS)
    for topic in topics.values():
        _check(client, topic, partitions, rows)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default="1,4,16", help="task counts (default 1,4,16)")
    parser.add_argument("--partitions", default="1,8,32", help="partition counts (1,8,32)")
    parser.add_argument("--commits", type=int, default=20, help="timed commits per cell")
    parser.add_argument("--warmup", type=int, default=3, help="untimed commits first")
    parser.add_argument(
        "--mb", type=int, default=0, help="MiB each task writes to each partition (default 0)"
    )
    parser.add_argument(
        "--writeback",
        default="",
        help="flush.writeback.bytes values to compare, e.g. 0,1048576 (default: the broker's)",
    )
    parser.add_argument("--dir", help="scratch directory (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.commits < 1 or args.warmup < 0 or args.mb < 0:
        parser.error("--commits must be >= 1, --warmup and --mb >= 0")
    writebacks: list[int | None] = list(_ints(args.writeback)) or [None]
    if any(wb is not None and wb < 0 for wb in writebacks):
        parser.error(f"--writeback {args.writeback}: values are bytes, 0 or more")
    grid = [(t, p) for t in _ints(args.tasks) for p in _ints(args.partitions)]
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="bench-commit-"))
    scratch.mkdir(parents=True, exist_ok=True)
    server: Server | None = None
    results: dict[tuple[int, int], dict[int | None, list[float]]] = {}
    try:
        server = start_broker(scratch)
        with BrokerClient(server.address) as client:
            for tasks, partitions in grid:
                results[(tasks, partitions)] = _measure(client, tasks, partitions, args, writebacks)
    finally:
        if server is not None:
            server.stop()
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"sink commit latency, {args.commits} commits per cell ({args.warmup} warm-up), "
        f"{args.mb} MiB per task and partition"
    )
    heads = ("tasks", "partitions", "markers", "writeback", "p50 ms", "p95 ms", "max ms")
    print(" ".join(f"{h:>{max(6, len(h))}}" for h in heads))
    for (tasks, partitions), by_wb in results.items():
        for wb, seconds in by_wb.items():
            print(
                f"{tasks:>6} {partitions:>10} {tasks * partitions:>7} "
                f"{'default' if wb is None else wb:>9} "
                f"{statistics.median(seconds) * 1e3:>6.1f} "
                f"{percentile(seconds, 95) * 1e3:>6.1f} {max(seconds) * 1e3:>6.1f}"
            )
    for (tasks, partitions), by_wb in results.items():
        cell = f"{tasks}x{partitions}"
        first = by_wb[writebacks[0]]
        print(f"commit_p50_ms_{cell}={statistics.median(first) * 1e3:.2f}")
        print(f"commit_p95_ms_{cell}={percentile(first, 95) * 1e3:.2f}")
        if len(writebacks) > 1:
            for wb, seconds in by_wb.items():
                print(f"commit_p50_ms_{cell}_wb{wb}={statistics.median(seconds) * 1e3:.2f}")
        on = [wb for wb in writebacks if wb != 0]
        if 0 in by_wb and on:
            ratio = statistics.median(by_wb[0]) / statistics.median(by_wb[on[0]])
            print(f"commit_writeback_off_vs_on_{cell}={ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
