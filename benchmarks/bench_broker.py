"""Broker produce throughput over loopback against the Flight transport ceiling.

    python -m benchmarks.bench_broker [--mb 1500] [--producers 1,4,16] [--repeat 3]
                                      [--init-seconds 2] [--rf-producers 3] [--failovers 5]
                                      [--parts broker,tls,replication,failover] [--dir DIR]
                                      [--suites aes128,aes256,chacha20]

What it measures (MB = 10^6 bytes of Arrow buffers, as ``RecordBatch.nbytes``):

- broker: a real broker process (``idemlog broker start``, embedded mode, default
  config: idempotence on, fsync left to the OS) and N producers, each an idempotent
  producer (its own producer id) pipelining 10k-row Arrow batches (~1 MB: id int64, key
  int32, an 84-byte string) to its own partition of one topic, at most 5 batches in flight
  (the broker's window), every answer checked. Time from the first send to the last
  answer.
- flight_discard: the same producers and batches against a bare Flight DoPut server
  (another process, ``python -m benchmarks.broker_process``) that reads each batch and
  answers it with a ``ProduceResponse`` without storing anything: the transport's ceiling
  on this machine.
- validate: the CPU seconds per GB of the full Arrow validation every produced batch
  passes before it is appended (in this process, on the same batches): the part of the
  broker's CPU that check costs.
- init_producer_id: InitProducerId round trips per second on one connection, without a
  transactional id (a leased block, no disk) and with a new transactional id each time
  (a durable, fsynced coordinator record).

Producers are threads of this process, not processes: with 2 cores, 16 producer
processes would measure the scheduler. N producers share min(N, 4) Flight connections
(gRPC multiplexes their streams); the Arrow serialisation and the socket I/O happen in
C++ without the GIL. Each configuration runs ``--repeat`` times, alternating broker and
discard runs. Loopback runs on a small VM vary by +-30% from run to run (page-cache
writeback, scheduling), so the median of the runs counts; best and worst are printed.
The summary lines take, for each server, its best producer count. Both servers run
with the broker's allocator setting (``cli_broker.keep_large_buffers``): the same
transport underneath, tuned the same way.

The ``tls`` part (``bench_tls.py``) runs the same producers against a TLS broker and a
plaintext one side by side and prints ``tls_vs_plaintext_ratio`` (docs/security.md), the
CPU-cost ratios ``tls_cpu_ratio`` and ``tls_broker_cpu_ratio`` and the negotiated
``tls_suite``; ``--suites`` adds brokers limited to one TLS 1.3 suite each.

Two more parts run on a 3-broker cluster on a real ZooKeeper (``zk_cluster.py``), after
this one: the cost of replication (``bench_replication.py``: ``replication.factor=3``
against 1, ``acks=all``, the same producers, ``--mb`` per run, ``--repeat`` interleaved
rounds) and the time a partition is unwritable after its leader's SIGKILL, with every
acknowledged row checked (``bench_failover.py``, ``--failovers`` rounds). ``--parts``
picks the parts to run.

CPU seconds (user + system) per GB sent (GB = 10^9 bytes, the same measure as MB/s) are
printed beside the throughput, for each side separately, over the produce phase only
(from the first send to the last answer; no topic creation or deletion): the server
process (psutil, ``benchmarks/common.py``, of the broker or discard server child, in
clock ticks of 10 ms: coarse at smoke sizes, ~0.01 s/GB at 1 GB a run) and the client
process (``time.process_time()``: every thread of this process, so all producers and the
Flight client's own threads). With the producers on the same 2 cores as the server,
broker and client CPU together are what bounds the ratio once the machine is CPU-bound.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from benchmarks.bench_tls import tls_part
from benchmarks.broker_process import (
    REPO,
    ROWS_PER_BATCH,
    Run,
    Server,
    build_batches,
    init_rate,
    run_producers,
    start_broker,
    start_discard,
)
from benchmarks.common import MB
from broker_core.record.batch import validate_rows

TARGET_RATIO = 0.7


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=1500.0, help="MB per run (all producers)")
    parser.add_argument("--producers", default="1,4,16", help="producer counts to run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration")
    parser.add_argument("--init-seconds", type=float, default=2.0)
    parser.add_argument("--rf-producers", type=int, default=3, help="replication part")
    parser.add_argument("--failovers", type=int, default=5, help="failover rounds")
    parser.add_argument("--parts", default="broker,tls,replication,failover", help="parts to run")
    parser.add_argument("--dir", type=Path, default=REPO, help="parent of the temporary dir")
    parser.add_argument(
        "--suites",
        default="",
        help="tls part: more TLS brokers, each limited to one TLS 1.3 suite "
        "(aes128, aes256, chacha20; comma-separated), beside the default one",
    )
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    batches = build_batches()
    if "broker" in parts:
        broker_part(args, batches)
    if "tls" in parts:
        tls_part(args, batches)
    if parts & {"replication", "failover"}:
        replicated_parts(args, batches, parts)
    return 0


def replicated_parts(
    args: argparse.Namespace, batches: Sequence[pa.RecordBatch], parts: set[str]
) -> None:
    """The replication-cost and failover parts, on one 3-broker cluster."""
    from benchmarks import bench_failover, bench_replication
    from benchmarks.zk_cluster import SESSION_MS, LocalCluster

    workdir = Path(tempfile.mkdtemp(prefix=".bench-replicated-", dir=args.dir))
    try:
        cluster = LocalCluster(workdir)
        try:
            if "replication" in parts:
                runs = bench_replication.measure(
                    cluster, batches, args.mb, args.rf_producers, args.repeat
                )
                bench_replication.report(runs, args.rf_producers, args.mb)
            if "failover" in parts and args.failovers > 0:
                rounds = bench_failover.measure(cluster, args.failovers)
                bench_failover.report(rounds, SESSION_MS)
        finally:
            cluster.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def broker_part(args: argparse.Namespace, batches: Sequence[pa.RecordBatch]) -> None:
    """The broker against the transport ceiling, and InitProducerId rates."""
    counts = [int(c) for c in args.producers.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix=".bench-broker-", dir=args.dir))
    servers: list[Server] = []
    try:
        broker = start_broker(workdir)
        servers.append(broker)
        discard = start_discard(workdir)
        servers.append(discard)
        print(
            f"batch: {ROWS_PER_BATCH} rows, {batches[0].nbytes / MB:.2f} MB; {args.mb:g} MB per "
            f"run; {args.repeat} runs each; cores: {os.cpu_count()}"
        )
        runs: dict[tuple[str, int], list[Run]] = {}
        for producers in counts:
            for _ in range(args.repeat):
                for server in (discard, broker):
                    run = run_producers(server, producers, batches, args.mb)
                    runs.setdefault((server.name, producers), []).append(run)
        rate = init_rate(broker, args.init_seconds, transactional=False)
        txn_rate = init_rate(broker, args.init_seconds, transactional=True)
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    def median_mbps(name: str, producers: int) -> float:
        return statistics.median(r.mbps for r in runs[(name, producers)])

    def median_cpu(name: str, producers: int, side: str) -> float:
        """Median CPU s/GB of ``side`` ("server" or "client") over the runs."""
        return statistics.median(
            r.per_gb(r.server_cpu if side == "server" else r.client_cpu)
            for r in runs[(name, producers)]
        )

    print()
    print("CPU: seconds (user + system) per GB sent, median of the runs")
    print(
        f"{'producers':>9}  {'broker MB/s':>11}  {'discard MB/s':>12}  {'ratio':>5}  "
        f"{'server CPU s/GB (broker / discard)':>34}  "
        f"{'client CPU s/GB (to broker / to discard)':>40}  runs (worst-best)"
    )
    for producers in counts:
        b = [r.mbps for r in runs[("broker", producers)]]
        d = [r.mbps for r in runs[("flight_discard", producers)]]
        on_server = [median_cpu(n, producers, "server") for n in ("broker", "flight_discard")]
        on_client = [median_cpu(n, producers, "client") for n in ("broker", "flight_discard")]
        print(
            f"{producers:>9}  {statistics.median(b):>11.0f}  {statistics.median(d):>12.0f}  "
            f"{statistics.median(b) / statistics.median(d):>5.2f}  "
            f"{f'{on_server[0]:.3f} / {on_server[1]:.3f}':>34}  "
            f"{f'{on_client[0]:.3f} / {on_client[1]:.3f}':>40}  "
            f"broker {min(b):.0f}-{max(b):.0f}, discard {min(d):.0f}-{max(d):.0f}"
        )
    broker_n = max(counts, key=lambda n: median_mbps("broker", n))
    discard_n = max(counts, key=lambda n: median_mbps("flight_discard", n))
    broker_mbps = median_mbps("broker", broker_n)
    discard_mbps = median_mbps("flight_discard", discard_n)
    ratio = broker_mbps / discard_mbps
    # CPU at the producer count each summary throughput comes from.
    broker_server_cpu = median_cpu("broker", broker_n, "server")
    broker_client_cpu = median_cpu("broker", broker_n, "client")
    discard_server_cpu = median_cpu("flight_discard", discard_n, "server")
    discard_client_cpu = median_cpu("flight_discard", discard_n, "client")
    total_cpu_ratio = (broker_server_cpu + broker_client_cpu) / (
        discard_server_cpu + discard_client_cpu
    )
    verdict = "OK" if ratio >= TARGET_RATIO else "MISSED"
    print()
    print(f"init_producer_id: {rate:.0f}/s without a transactional id, {txn_rate:.0f}/s with one")
    print(f"target broker_vs_transport_ratio >= {TARGET_RATIO}: {verdict}")
    print(f"broker_MBps={broker_mbps:.0f}")
    print(f"flight_discard_MBps={discard_mbps:.0f}")
    print(f"broker_vs_transport_ratio={ratio:.2f}")
    print(f"init_producer_id_per_s={rate:.0f}")
    print(f"init_producer_id_txn_per_s={txn_rate:.0f}")
    print(f"broker_server_cpu_s_per_gb={broker_server_cpu:.3f}")
    print(f"discard_server_cpu_s_per_gb={discard_server_cpu:.3f}")
    print(f"broker_client_cpu_s_per_gb={broker_client_cpu:.3f}")
    print(f"discard_client_cpu_s_per_gb={discard_client_cpu:.3f}")
    print(f"broker_vs_transport_cpu_ratio={total_cpu_ratio:.2f}")
    validate_cpu = validation_cpu_s_per_gb(batches)
    print(f"validate_cpu_s_per_gb={validate_cpu:.3f}")
    print(f"validate_share_of_broker_cpu={validate_cpu / broker_server_cpu:.2f}")


VALIDATE_ROUNDS = 7


def validation_cpu_s_per_gb(batches: Sequence[pa.RecordBatch]) -> float:
    """CPU seconds per GB of the check every produced (and replicated) batch passes before
    it is appended (``record.batch.validate_rows``: Arrow's full validation), on the same
    batches, in this process; median of rounds of at least 0.1 GB each. It is part of
    ``broker_server_cpu_s_per_gb`` above, which a smoke size measures too coarsely to show."""
    nbytes = sum(b.nbytes for b in batches)
    passes = max(1, int(1e8 // nbytes))
    per_gb = []
    for _ in range(VALIDATE_ROUNDS):
        started = time.process_time()
        for _ in range(passes):
            for batch in batches:
                validate_rows(batch, "bench")
        per_gb.append((time.process_time() - started) / (passes * nbytes / 1e9))
    return float(statistics.median(per_gb))


if __name__ == "__main__":
    sys.exit(main())
