"""How late ``idemlog consume`` prints a committed record: commit-to-line latency.

    python -m benchmarks.bench_consume [--partitions 1,8] [--records 50] [--gap-ms 50]

A real broker process (``idemlog broker start``, embedded mode) and, per partition count
P, a topic of P partitions and ``idemlog consume --json`` in a subprocess following it
(read_committed, at the end). One transaction of one row is committed every
``--gap-ms``; what is timed is from ``commit_transaction()`` returning to the consumer's
line for that row being read from its stdout (wall clock). The consumer polls (the
broker's fetch does not long-poll): after an empty round it waits 10 ms doubling to
200 ms, so the latency grows with the gap between records, up to ~200 ms plus one round
of P fetches. Prints a table (p50 / p95 / max ms) and ``consume_latency_p50_ms_<P>``
lines; no assertion.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa

from benchmarks.broker_process import start_broker
from broker_core.client.broker_client import BrokerClient
from broker_core.producer.config import ProducerConfig
from broker_core.producer.producer import Producer

SCHEMA = pa.schema([pa.field("id", pa.int64())])


def measure(address: str, partitions: int, records: int, gap_s: float) -> list[float]:
    topic = f"consume{partitions}"
    with BrokerClient(address) as client:
        client.create_topic(topic, partitions, schema=SCHEMA)
    command = [sys.executable, "-m", "broker_core.cli.main", "consume", "--bootstrap"]
    command += [address, "--topic", topic, "--json", "--max-messages", str(records)]
    consumer = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert consumer.stdout is not None and consumer.stderr is not None
    positioned = consumer.stderr.readline()  # "Consuming ...": it prints what comes now
    if not positioned.startswith("Consuming "):
        raise SystemExit(f"consume did not start: {positioned}")
    seen: dict[int, float] = {}
    done = threading.Event()

    def read() -> None:
        for line in consumer.stdout:  # type: ignore[union-attr]
            seen[json.loads(line)["value"]["id"]] = time.monotonic()
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    committed: dict[int, float] = {}
    config = ProducerConfig(transactional_id=f"bench-{topic}")
    with Producer(address, config=config) as producer:
        producer.init_transactions()
        for i in range(records):
            producer.begin_transaction()
            producer.send(topic, pa.table({"id": pa.array([i], pa.int64())}))
            producer.commit_transaction()
            committed[i] = time.monotonic()
            time.sleep(gap_s)  # the pace of the writer being measured, not a wait for it
    done.wait(60)
    consumer.wait(60)
    missing = set(committed) - set(seen)
    if missing:
        raise SystemExit(f"consume missed {len(missing)} records")
    return [(seen[i] - committed[i]) * 1000 for i in committed]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="1,8", help="partition counts, comma-separated")
    parser.add_argument("--records", type=int, default=50, help="records per partition count")
    parser.add_argument("--gap-ms", type=float, default=50.0, help="pause between commits")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-consume-"))
    server = start_broker(workdir)
    try:
        rows = []
        for partitions in (int(p) for p in args.partitions.split(",")):
            ms = sorted(measure(server.address, partitions, args.records, args.gap_ms / 1000))
            p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
            rows.append((partitions, statistics.median(ms), p95, ms[-1]))
        print(f"{'partitions':>10} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
        for partitions, p50, p95, worst in rows:
            print(f"{partitions:>10} {p50:>8.1f} {p95:>8.1f} {worst:>8.1f}")
        for partitions, p50, _p95, _max in rows:
            print(f"consume_latency_p50_ms_{partitions}={p50:.1f}")
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
