"""A sink commit's cost with many idle transactional ids in the coordinator.

    python -m benchmarks.bench_coordinator_scan [--idle 0,100000] [--commits 200] [--dir DIR]

For each count of idle ids it builds an embedded coordinator (``LogTxnStateStore`` in a
fresh LogStore, ``LocalMarkerWriter``) whose ``__transaction_state`` already holds that
many ids of finished df.write jobs (``batch-<n>/0`` and ``/1``, COMPLETE_COMMIT, one
COMPLETE sink record per job: what every job left behind before ids expired), written as
rows straight into the topic and loaded on start. Then one streaming sink commits
``--commits`` micro-batches of two tasks each (InitProducerId per task, two rows into one
partition, prepare, then ``commit_sink_batch``), and the table shows the p50 and p90 of
``commit_sink_batch`` alone and of ``init_sink_producer`` (ms, this machine). The ids
never expire during the run (the default 7 days).

It uses only calls the coordinator had before expiry existed, so the same script measures
an older checkout: ``PYTHONPATH=<checkout> python -m benchmarks.bench_coordinator_scan``
(run from this checkout's directory with the other's path first).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from benchmarks.common import percentile
from broker_core.log.store import LogStore
from broker_core.producer_ids.manager import FileProducerIdBlockSource, ProducerIdManager
from broker_core.protocol.wire import SinkAttempt
from broker_core.txn.coordinator.coordinator import LocalMarkerWriter, TransactionCoordinator
from broker_core.txn.state_topic.records import (
    SinkCommitRecord,
    SinkCommitState,
    TransactionMetadata,
    TransactionState,
)
from broker_core.txn.state_topic.store import TXN_STATE_SCHEMA, TXN_STATE_TOPIC
from testkit.state_store import local_state_store

TOPIC = "bench"
SCHEMA = pa.schema([pa.field("id", pa.int64())])
CHUNK = 10_000


def write_idle_ids(store: LogStore, count: int) -> None:
    """``count`` ids of finished jobs (two per job) and their sink records, as rows."""
    local_state_store(store)  # creates the topic
    partition = store.partition(TXN_STATE_TOPIC, 0)
    rows: list[tuple[str, str, bytes]] = []
    for n in range(count):
        job = f"batch-{n // 2:032x}"
        tid = f"{job}/{n % 2}"
        meta = TransactionMetadata(
            tid, 10_000 + n, 0, 60_000, TransactionState.COMPLETE_COMMIT, set(), 1, 1
        )
        rows.append(("transaction", tid, meta.to_json()))
        if n % 2:
            record = SinkCommitRecord(job, 0, SinkCommitState.COMPLETE, [])
            rows.append(("sink", job, record.to_json()))
        if len(rows) >= CHUNK or n == count - 1:
            kinds, keys, values = zip(*rows, strict=True)
            partition.append(
                pa.record_batch(
                    [pa.array(kinds), pa.array(keys), pa.array(values, pa.binary())],
                    schema=TXN_STATE_SCHEMA,
                )
            )
            rows = []
    partition.flush()


def run(
    directory: Path, idle: int, commits: int
) -> tuple[list[float], list[float], list[float], float]:
    """(commit ms, commit CPU ms, init ms per task, load s) with ``idle`` idle ids."""
    store = LogStore(directory / "data")
    store.create_topic(TOPIC, 1, schema=SCHEMA)
    if idle:
        write_idle_ids(store, idle)
    started = time.perf_counter()
    coordinator = TransactionCoordinator(
        local_state_store(store),
        ProducerIdManager(0, FileProducerIdBlockSource(directory / "pid.json")),
        LocalMarkerWriter(store),
    )
    coordinator.start()
    load_s = time.perf_counter() - started
    log = store.partition(TOPIC, 0)
    commit_ms: list[float] = []
    commit_cpu_ms: list[float] = []
    init_ms: list[float] = []
    query = "0f0e0d0c-0000-4000-8000-000000000001"
    for batch in range(commits):
        txns = []
        for task in range(2):
            tid = f"{query}/{task}"
            t0 = time.perf_counter()
            pid, epoch, _ = coordinator.init_sink_producer(
                tid, None, SinkAttempt(query, "run-1", batch)
            )
            init_ms.append((time.perf_counter() - t0) * 1000)
            coordinator.add_partitions(tid, pid, epoch, [(TOPIC, 0)])
            appended = log.append(
                pa.record_batch([pa.array([batch, task], pa.int64())], schema=SCHEMA),
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=0,
                transactional=True,
            )
            ranges = [(TOPIC, 0, appended.base_offset, appended.last_offset)]
            coordinator.prepare_sink_txn(tid, pid, epoch, batch, ranges)
            txns.append((tid, pid, epoch))
        t0, cpu0 = time.perf_counter(), time.process_time()
        assert coordinator.commit_sink_batch(query, batch, txns, "run-1")
        commit_ms.append((time.perf_counter() - t0) * 1000)
        commit_cpu_ms.append((time.process_time() - cpu0) * 1000)
    coordinator.close()
    store.close()
    return commit_ms, commit_cpu_ms, init_ms, load_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", default="0,100000", help="idle id counts, comma-separated")
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--dir", default=None, help="where the data goes (default: a temp dir)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-scan-", dir=args.dir))
    try:
        print(
            f"{'idle ids':>9} {'load s':>7} {'commit p50':>11} {'commit p90':>11} "
            f"{'CPU p50':>8} {'init p50':>9} {'init p90':>9}   "
            f"(ms; {args.commits} commits of 2 tasks; CPU: the process's, fsync waits excluded)"
        )
        for i, idle in enumerate(int(v) for v in args.idle.split(",")):
            commit_ms, cpu_ms, init_ms, load_s = run(base / f"{i}-{idle}", idle, args.commits)
            print(
                f"{idle:>9} {load_s:>7.2f} {statistics.median(commit_ms):>11.2f} "
                f"{percentile(commit_ms, 90):>11.2f} {statistics.median(cpu_ms):>8.2f} "
                f"{statistics.median(init_ms):>9.2f} {percentile(init_ms, 90):>9.2f}"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
