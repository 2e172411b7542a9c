"""Producer throughput against a bare Flight client writing the same batches, one process.

    python -m benchmarks.bench_producer [--rows 20000000] [--partitions 1] [--repeat 1]
                                        [--dir DIR]

A real broker process (``idemlog broker start``, embedded mode, default config) on
loopback. Rows: ``id`` bigint, ``key`` int, ``value`` a 64-byte string, pre-built as
``ROWS_PER_BATCH``-row Arrow batches (a few distinct ones, cycled), so both sides send the
very same batches:

- producer: ``broker_core.producer.Producer`` (idempotent, default config except
  ``batch.size`` = one batch's bytes so each ``send`` is one produced batch, and
  ``linger.ms=0``): ``send()`` of every batch (round-robin over the partitions, as without
  a key), then ``flush()``; every future checked. Time from the first send to the flush.
- bare_flight: the same batches written with ``broker_core.client.produce_stream.ProduceStream``
  (one raw Flight DoPut per partition, the same idempotent producer fields, at most 5
  batches in flight per partition like the producer), no accumulator, sender thread or
  retry state machine; every answer checked.

Each run goes to a fresh topic, deleted afterwards (frees the disk). The broker does the
same work for both (idempotent appends of the same bytes), so the ratio is the cost of
the producer machinery in this one Python process. Output::

    producer_rows_per_s=<x>
    bare_flight_rows_per_s=<y>
    producer_vs_bare_ratio=<x/y>
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from benchmarks.broker_process import Server, start_broker
from benchmarks.data import SCHEMA, distinct_batches
from broker_core.client.broker_client import BrokerClient
from broker_core.client.produce_stream import ProduceHandle
from broker_core.producer import Producer, ProducerConfig

ROWS_PER_BATCH = 16_384
VALUE_BYTES = 64
DISTINCT_BATCHES = 8
IN_FLIGHT = 5
TARGET_RATIO = 0.9


def build_batches() -> list[pa.RecordBatch]:
    return distinct_batches(DISTINCT_BATCHES, ROWS_PER_BATCH, VALUE_BYTES, seed=7)


def run_producer(
    address: str, topic: str, partitions: int, batches: Sequence[pa.RecordBatch], count: int
) -> float:
    config = ProducerConfig(
        batch_size=batches[0].nbytes,
        linger_ms=0,
        buffer_memory=256 << 20,
        partitioner="round_robin",
    )
    with Producer(address, config=config) as producer:
        start = time.perf_counter()
        futures = [producer.send(topic, batches[i % len(batches)]) for i in range(count)]
        producer.flush()
        elapsed = time.perf_counter() - start
        rows = sum(m.num_rows for f in futures for m in f.result(0))
        errors = producer.metrics_snapshot()["record_errors"]
    if rows != count * ROWS_PER_BATCH or errors:
        raise SystemExit(f"producer: {rows} rows acknowledged, {errors} failed")
    return elapsed


def run_bare(
    address: str, topic: str, partitions: int, batches: Sequence[pa.RecordBatch], count: int
) -> float:
    with BrokerClient(address) as client:
        producer_id, epoch = client.init_producer_id()
        streams = [client.produce_stream(topic, p, SCHEMA) for p in range(partitions)]
        windows: list[deque[ProduceHandle]] = [deque() for _ in range(partitions)]
        sequences = [0] * partitions
        start = time.perf_counter()
        for i in range(count):
            p = i % partitions
            if len(windows[p]) == IN_FLIGHT:
                windows[p].popleft().offsets(120)  # raises the batch's error, if any
            batch = batches[i % len(batches)]
            windows[p].append(
                streams[p].send(
                    batch,
                    producer_id=producer_id,
                    producer_epoch=epoch,
                    base_sequence=sequences[p],
                )
            )
            sequences[p] += batch.num_rows
        for window in windows:
            while window:
                window.popleft().offsets(120)
        elapsed = time.perf_counter() - start
        for stream in streams:
            stream.close()
    return elapsed


def measure(
    server: Server, name: str, partitions: int, batches: Sequence[pa.RecordBatch], count: int
) -> float:
    topic = f"bench-{name}"
    with BrokerClient(server.address) as admin:
        admin.create_topic(topic, partitions, schema=SCHEMA)
    run = run_producer if name == "producer" else run_bare
    elapsed = run(server.address, topic, partitions, batches, count)
    with BrokerClient(server.address) as admin:
        ends = [admin.list_offsets(topic, p)["log_end_offset"] for p in range(partitions)]
        if sum(ends) != count * ROWS_PER_BATCH:
            raise SystemExit(
                f"{name}: the log holds {sum(ends)} rows, not {count * ROWS_PER_BATCH}"
            )
        admin.delete_topic(topic)
    rate = count * ROWS_PER_BATCH / elapsed
    print(f"  {name}: {count * ROWS_PER_BATCH} rows in {elapsed:.2f}s = {rate:,.0f} rows/s")
    return rate


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each (median counts)")
    parser.add_argument("--dir", type=Path, default=None, help="broker data directory")
    args = parser.parse_args(argv)
    count = max(IN_FLIGHT, round(args.rows / ROWS_PER_BATCH))
    batches = build_batches()
    directory = Path(args.dir or tempfile.mkdtemp(prefix="bench-producer-"))
    directory.mkdir(parents=True, exist_ok=True)
    print(
        f"bench-producer: {count * ROWS_PER_BATCH} rows per run in {count} batches of "
        f"{ROWS_PER_BATCH} rows ({batches[0].nbytes / 1e6:.2f} MB), "
        f"{args.partitions} partition(s), broker data in {directory}"
    )
    server = start_broker(directory)
    try:
        rates: dict[str, list[float]] = {"bare_flight": [], "producer": []}
        for _ in range(args.repeat):
            for name in ("bare_flight", "producer"):
                rates[name].append(measure(server, name, args.partitions, batches, count))
    finally:
        server.stop()
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    producer = statistics.median(rates["producer"])
    bare = statistics.median(rates["bare_flight"])
    ratio = producer / bare
    print(f"producer_rows_per_s={producer:.0f}")
    print(f"bare_flight_rows_per_s={bare:.0f}")
    print(f"producer_vs_bare_ratio={ratio:.3f}")
    verdict = "meets" if ratio >= TARGET_RATIO else "misses"
    print(f"# {verdict} the target ratio >= {TARGET_RATIO}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
