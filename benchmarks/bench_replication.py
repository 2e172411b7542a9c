"""What replication costs a producer: replication.factor=3 against 1 on the same cluster.

Part of ``make bench-broker`` (``benchmarks/bench_broker.py`` runs it after its own part;
``--rf-producers`` and ``--mb``/``--repeat`` size it). Method:

- one cluster: a real ZooKeeper on loopback (``testkit.zookeeper``) and three broker
  processes (``benchmarks/zk_cluster.py``), every broker at its defaults but
  ``zookeeper.session.timeout.ms`` (2000, as the replication tests; see the failover part);
- two topics per round, ``replication.factor=3`` and ``replication.factor=1``, each with
  one partition per producer (3 by default: the brokers lead one each, for both factors);
- the same producers for both: ``--rf-producers`` threads, each an idempotent producer
  (its own producer id) pipelining the same 10k-row ~1 MB Arrow batches as the broker part
  to its own partition, at most 5 in flight, with ``acks=all`` (-1). With one replica
  ``acks=all`` is answered as soon as the leader appended; with three, once both followers
  fetched the batch (their long poll, ``replica.fetch.wait.max.ms``, returns as soon as
  batches arrive) and the high watermark passed it;
- ``--repeat`` rounds, the two factors alternating (rf1 first in even rounds, rf3 first in
  odd ones), after an uncounted warm-up round; medians of the rounds. Each run checks
  every answer and the partitions' log ends, then deletes its topic.

Per-batch ack latency is the time from ``send`` to the answer as seen by a thread that
waits on the batches in order: with 5 in flight it includes the wait behind earlier
batches of the same stream (latency under load, not an idle round trip); p50/p99 over
every batch of every counted round. CPU is user + system seconds per GB sent of all
three broker processes together (psutil, ``benchmarks/common.py``) and of this process (the
producers), over the produce phase only. ``elections`` counts leader-epoch changes during
a run and ``ISR shrinks`` the brokers' ``isr_shrinks``: both must be 0 for an rf=3 run to
have measured three in-sync replicas.

The summary line ``replicated_rf3_vs_rf1_ratio`` is rf=3 MB/s over rf=1 MB/s (< 1: the
share of rf=1 throughput kept with three replicas; 1 - ratio is replication's cost).
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from benchmarks.common import MB, cpu_seconds, percentile
from benchmarks.zk_cluster import LocalCluster
from broker_core.client.produce_stream import ProduceHandle, ProduceStream
from broker_core.errors import IdemlogError
from broker_core.protocol.requests import ACKS_ALL
from broker_core.protocol.wire import Action

IN_FLIGHT = 5
GB = 1e9
FACTORS = (1, 3)


@dataclass
class RfRun:
    factor: int
    mb: float
    rows: int
    seconds: float
    broker_cpu: float  # seconds, the three broker processes
    client_cpu: float  # seconds, this process
    latencies_ms: list[float] = field(repr=False)
    elections: int
    isr_shrinks: int

    @property
    def mbps(self) -> float:
        return self.mb / self.seconds

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds

    def per_gb(self, cpu: float) -> float:
        return cpu / (self.mb * MB / GB)


def produce(
    stream: ProduceStream,
    producer_id: int,
    batches: Sequence[pa.RecordBatch],
    count: int,
    latencies_ms: list[float],
    errors: list[BaseException],
) -> None:
    """Pipeline ``count`` batches (at most IN_FLIGHT unanswered); an acker thread takes
    the answers in order and times each from its send."""
    window = threading.Semaphore(IN_FLIGHT)
    sent: queue.Queue[tuple[ProduceHandle, float] | None] = queue.Queue()

    def ack() -> None:
        while (item := sent.get()) is not None:
            handle, at = item
            try:
                response = handle.result(120)
                if not response.ok:
                    raise RuntimeError(f"batch failed: {response.error()}")
                latencies_ms.append((time.perf_counter() - at) * 1000)
            except BaseException as exc:
                errors.append(exc)
            window.release()

    acker = threading.Thread(target=ack)
    acker.start()
    try:
        rows = batches[0].num_rows
        for i in range(count):
            window.acquire()
            if errors:
                break
            at = time.perf_counter()
            handle = stream.send(
                batches[i % len(batches)],
                producer_id=producer_id,
                producer_epoch=0,
                base_sequence=i * rows,
            )
            sent.put((handle, at))
    except BaseException as exc:
        errors.append(exc)
    finally:
        sent.put(None)
        acker.join()
        stream.close()


def _epochs(cluster: LocalCluster, topic: str, partitions: int) -> list[int]:
    states = [cluster.agreed_state(topic, p) for p in range(partitions)]
    return [-1 if s is None else s.leader_epoch for s in states]


def _isr_shrinks(cluster: LocalCluster) -> int:
    docs = [cluster.admin.action(n.address, Action.METRICS, {}) for n in cluster.running()]
    return sum(int(d.get("replication", {}).get("isr_shrinks", 0)) for d in docs)


def run_factor(
    cluster: LocalCluster,
    topic: str,
    factor: int,
    producers: int,
    batches: Sequence[pa.RecordBatch],
    per_producer: int,
) -> RfRun:
    """One run: ``producers`` threads to a new topic of ``factor`` replicas, checked, deleted."""
    admin = cluster.admin
    cluster.create_topic(topic, producers, factor)
    pids = [admin.init_producer_id()[0] for _ in range(producers)]
    streams = [
        admin.produce_stream(topic, p, batches[0].schema, acks=ACKS_ALL) for p in range(producers)
    ]
    latencies: list[list[float]] = [[] for _ in range(producers)]
    errors: list[BaseException] = []
    threads = [
        threading.Thread(
            target=produce, args=(streams[p], pids[p], batches, per_producer, latencies[p], errors)
        )
        for p in range(producers)
    ]
    epochs, shrinks = _epochs(cluster, topic, producers), _isr_shrinks(cluster)
    broker_pids = cluster.pids()
    broker_start = sum(cpu_seconds(pid) for pid in broker_pids)
    client_start = time.process_time()
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    client_cpu = time.process_time() - client_start
    broker_cpu = sum(cpu_seconds(pid) for pid in broker_pids) - broker_start
    if errors:
        raise SystemExit(f"rf={factor} with {producers} producers failed: {errors[0]!r}")
    rows = batches[0].num_rows
    ends = [admin.list_offsets(topic, p)["log_end_offset"] for p in range(producers)]
    assert ends == [per_producer * rows] * producers, (topic, ends)
    elections = sum(a != b for a, b in zip(epochs, _epochs(cluster, topic, producers), strict=True))
    shrinks = _isr_shrinks(cluster) - shrinks
    admin.delete_topic(topic)  # frees the disk for the next run
    return RfRun(
        factor,
        per_producer * producers * batches[0].nbytes / MB,
        per_producer * producers * rows,
        elapsed,
        broker_cpu,
        client_cpu,
        [x for lat in latencies for x in lat],
        elections,
        shrinks,
    )


def measure(
    cluster: LocalCluster,
    batches: Sequence[pa.RecordBatch],
    total_mb: float,
    producers: int,
    repeat: int,
) -> dict[int, list[RfRun]]:
    """``repeat`` interleaved rounds of rf=1 and rf=3 after a warm-up round."""
    per_producer = max(IN_FLIGHT, round(total_mb * MB / batches[0].nbytes / producers))
    for factor in FACTORS:  # warm-up: connections, the brokers' first topics; not counted
        run_factor(cluster, f"warmup-rf{factor}", factor, producers, batches, IN_FLIGHT)
    runs: dict[int, list[RfRun]] = {f: [] for f in FACTORS}
    for r in range(repeat):
        for factor in FACTORS if r % 2 == 0 else FACTORS[::-1]:
            run = run_factor(cluster, f"rf{factor}-{r}", factor, producers, batches, per_producer)
            runs[factor].append(run)
    return runs


def report(runs: dict[int, list[RfRun]], producers: int, total_mb: float) -> None:
    """The table and the ``replicated_*`` summary lines."""
    repeat = len(runs[FACTORS[0]])
    print()
    print(
        f"Replication cost: 3 brokers on one ZooKeeper (loopback), {producers} producers "
        f"(threads, one partition each, <= {IN_FLIGHT} in flight), acks=all, "
        f"{total_mb:g} MB per run, median of {repeat} interleaved runs; ack latency over "
        "every batch of every run; CPU s (user + system) per GB sent"
    )
    print(
        f"{'factor':>6}  {'MB/s':>6}  {'rows/s':>10}  {'ack p50 ms':>10}  {'ack p99 ms':>10}  "
        f"{'brokers CPU s/GB':>16}  {'client CPU s/GB':>15}  {'elections':>9}  "
        f"{'ISR shrinks':>11}  MB/s runs (worst-best)"
    )
    med: dict[int, dict[str, float]] = {}
    for factor in FACTORS:
        rs = runs[factor]
        lat = [x for r in rs for x in r.latencies_ms]
        med[factor] = m = {
            "MBps": statistics.median(r.mbps for r in rs),
            "rows_per_s": statistics.median(r.rows_per_s for r in rs),
            "ack_p50_ms": percentile(lat, 50),
            "ack_p99_ms": percentile(lat, 99),
            "broker_cpu_s_per_gb": statistics.median(r.per_gb(r.broker_cpu) for r in rs),
            "client_cpu_s_per_gb": statistics.median(r.per_gb(r.client_cpu) for r in rs),
        }
        mbps = [r.mbps for r in rs]
        print(
            f"{f'rf={factor}':>6}  {m['MBps']:>6.0f}  {m['rows_per_s']:>10.0f}  "
            f"{m['ack_p50_ms']:>10.1f}  {m['ack_p99_ms']:>10.1f}  "
            f"{m['broker_cpu_s_per_gb']:>16.3f}  {m['client_cpu_s_per_gb']:>15.3f}  "
            f"{sum(r.elections for r in rs):>9}  {sum(r.isr_shrinks for r in rs):>11}  "
            f"{min(mbps):.0f}-{max(mbps):.0f}"
        )
    ratio = med[3]["MBps"] / med[1]["MBps"]
    cpu_ratio = med[3]["broker_cpu_s_per_gb"] / med[1]["broker_cpu_s_per_gb"]
    print()
    for factor in FACTORS:
        for name, value in med[factor].items():
            digits = 3 if "cpu" in name else 1 if "ms" in name else 0
            print(f"replicated_rf{factor}_{name}={value:.{digits}f}")
    print(f"replicated_rf3_vs_rf1_broker_cpu_ratio={cpu_ratio:.2f}")
    print(f"replicated_rf3_vs_rf1_ratio={ratio:.2f}")


def check_idle(cluster: LocalCluster) -> None:
    """Fail early if a broker of the cluster is not serving."""
    for node in cluster.nodes.values():
        try:
            cluster.admin.action(node.address, Action.METADATA, {})
        except IdemlogError as exc:
            raise SystemExit(f"broker {node.broker_id} is not serving: {exc}") from exc
