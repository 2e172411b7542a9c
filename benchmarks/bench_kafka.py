"""``make bench-kafka``: Kafka's own client against idemlog's Kafka listener and against a
real Kafka broker, in the same run.

Per round, for each system in turn (the order alternates between rounds, so neither
always runs on a warmer machine): a fresh topic of ``--partitions`` partitions, then

1. **produce**: ``--rows`` records (a 16-byte key, a ``--value-bytes`` value) sent by
   one idempotent ``confluent-kafka`` producer (``enable.idempotence=true``, acks=all,
   librdkafka's defaults otherwise, no compression), spread over the partitions, until
   every delivery report is in; checked: no delivery failed and the topic's end offsets
   add up to the rows;
2. **consume**: the same records read from offset 0 of every partition by one
   ``confluent-kafka`` consumer (assigned, no group; read_committed, the default of
   idemlog's own readers); checked: exactly ``--rows`` records, the value bytes equal to
   what was sent;

then the topic is deleted. Each system's broker is one process on loopback: idemlog's
broker (``idemlog broker start``, embedded, ``kafka.listener`` set) and a KRaft Kafka
node from Kafka's jars (``benchmarks/kafka_node.py``, as ``make bench-peers`` runs it).
Both keep Kafka's default durability (the page cache, no fsync per write). Reported:
records/s of each phase (median over the rounds), the brokers' CPU seconds per million
records, and the ratios idemlog/Kafka; the issue's goal is at least 0.5.

    make bench-kafka BENCH_ARGS="--rows 1000000 --rounds 3"
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from benchmarks.broker_process import Server, start_broker
from benchmarks.common import cpu_seconds, print_table, verdict
from benchmarks.kafka_node import KafkaAdmin, free_port, kafka_node
from broker_core.client.broker_client import BrokerClient
from broker_core.kafka.record_batch import DECODED_SCHEMA

GOAL = 0.5
CONSUME_BATCH = 10_000


@dataclass
class Phase:
    records_per_s: float
    broker_cpu_s: float


@dataclass
class System:
    """One broker under test: its Kafka bootstrap, its process, and how it makes and
    drops a topic."""

    name: str
    bootstrap: str
    pid: int
    create: Callable[[str, int], None]
    delete: Callable[[str], None]


Payload = tuple[list[bytes], list[bytes]]


def payload(rows: int, value_bytes: int) -> Payload:
    """``rows`` keys and values; 4,096 distinct of each, reused (making 10 M Python
    objects would cost more than sending them)."""
    rng = np.random.default_rng(39)
    distinct = min(rows, 4096)
    keys = [rng.bytes(16) for _ in range(distinct)]
    values = [rng.bytes(value_bytes) for _ in range(distinct)]
    return keys, values


def produce(system: System, topic: str, rows: int, partitions: int, data: Payload) -> Phase:
    keys, values = data
    distinct = len(keys)
    producer = Producer(
        {
            "bootstrap.servers": system.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    failed: list[KafkaError] = []

    def report(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failed.append(error)

    cpu0, started = cpu_seconds(system.pid), time.monotonic()
    for i in range(rows):
        while True:
            try:
                producer.produce(
                    topic,
                    values[i % distinct],
                    keys[i % distinct],
                    partition=i % partitions,
                    on_delivery=report,
                )
                break
            except BufferError:
                producer.poll(0.05)  # the local queue is full: let deliveries drain it
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(600)
    elapsed, cpu = time.monotonic() - started, cpu_seconds(system.pid) - cpu0
    if left or failed:
        raise SystemExit(f"{system.name}: {left} records undelivered, failures {failed[:3]}")
    return Phase(rows / elapsed, cpu)


def end_offsets(bootstrap: str, topic: str, partitions: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-kafka-ends"})
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=60)[1]
            for p in range(partitions)
        )
    finally:
        consumer.close()


def consume(system: System, topic: str, rows: int, partitions: int, value_bytes: int) -> Phase:
    consumer = Consumer(
        {
            "bootstrap.servers": system.bootstrap,
            "group.id": "bench-kafka",  # librdkafka wants one; assigned, nothing committed
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    count, value_total = 0, 0
    cpu0, started = cpu_seconds(system.pid), time.monotonic()
    deadline = started + 600
    try:
        while count < rows and time.monotonic() < deadline:
            for message in consumer.consume(CONSUME_BATCH, timeout=1.0):
                if message.error() is not None:
                    raise SystemExit(f"{system.name}: consume failed: {message.error()}")
                value = message.value()
                count += 1
                value_total += 0 if value is None else len(value)
    finally:
        consumer.close()
    elapsed, cpu = time.monotonic() - started, cpu_seconds(system.pid) - cpu0
    if count != rows or value_total != rows * value_bytes:
        raise SystemExit(
            f"{system.name}: read {count} records of {value_total} value bytes, "
            f"not {rows} of {rows * value_bytes}"
        )
    return Phase(rows / elapsed, cpu)


def idemlog_system(directory: Path) -> tuple[System, Server, BrokerClient]:
    port = free_port()
    server = start_broker(directory, "idemlog", f"kafka.listener=PLAINTEXT://127.0.0.1:{port}\n")
    client = BrokerClient(server.address)

    def create(topic: str, partitions: int) -> None:
        client.create_topic(topic, partitions, schema=DECODED_SCHEMA)

    system = System("idemlog", f"127.0.0.1:{port}", server.process.pid, create, client.delete_topic)
    return system, server, client


def run(args: argparse.Namespace) -> int:
    data = payload(args.rows, args.value_bytes)
    results: dict[tuple[str, str], list[Phase]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp, kafka_node() as node:
        idemlog, server, client = idemlog_system(Path(tmp) / "idemlog")
        admin = KafkaAdmin(node.bootstrap)
        kafka = System(
            "kafka",
            node.bootstrap,
            node.pid,
            lambda topic, partitions: _kafka_create(admin, topic, partitions),
            admin.delete,
        )
        try:
            for round_ in range(args.rounds):
                order: Sequence[System] = (idemlog, kafka) if round_ % 2 == 0 else (kafka, idemlog)
                for system in order:
                    topic = f"bench-kafka-{uuid.uuid4().hex[:12]}"
                    system.create(topic, args.partitions)
                    made = produce(system, topic, args.rows, args.partitions, data)
                    held = end_offsets(system.bootstrap, topic, args.partitions)
                    if held != args.rows:
                        raise SystemExit(f"{system.name}: {topic} holds {held}, not {args.rows}")
                    read = consume(system, topic, args.rows, args.partitions, args.value_bytes)
                    system.delete(topic)
                    results.setdefault((system.name, "produce"), []).append(made)
                    results.setdefault((system.name, "consume"), []).append(read)
                    print(
                        f"round {round_ + 1} {system.name}: produce {made.records_per_s:,.0f}/s, "
                        f"consume {read.records_per_s:,.0f}/s",
                        flush=True,
                    )
        finally:
            admin.close()
            client.close()
            server.stop()
    return report(results, args.rows)


def _kafka_create(admin: KafkaAdmin, topic: str, partitions: int) -> None:
    new = NewTopic(topic, num_partitions=partitions, replication_factor=1)
    for future in admin.client.create_topics([new], operation_timeout=60).values():
        future.result()


def report(results: dict[tuple[str, str], list[Phase]], rows: int) -> int:
    def median(system: str, phase: str) -> float:
        return statistics.median(p.records_per_s for p in results[(system, phase)])

    def cpu_per_m(system: str, phase: str) -> float:
        runs = results[(system, phase)]
        return statistics.median(p.broker_cpu_s for p in runs) / (rows / 1e6)

    table = []
    ratios = {}
    for phase in ("produce", "consume"):
        ratio = median("idemlog", phase) / median("kafka", phase)
        ratios[phase] = ratio
        table.append(
            [
                phase,
                f"{median('idemlog', phase):,.0f}",
                f"{median('kafka', phase):,.0f}",
                f"{ratio:.2f}",
                f"{cpu_per_m('idemlog', phase):.2f}",
                f"{cpu_per_m('kafka', phase):.2f}",
                verdict(ratio >= GOAL),
            ]
        )
    print_table(
        [
            "phase",
            "idemlog rec/s",
            "kafka rec/s",
            "idemlog/kafka",
            "idemlog cpu s/M",
            "kafka cpu s/M",
            f"goal >= {GOAL}",
        ],
        table,
    )
    print(f"kafka_produce_vs_kafka_broker={ratios['produce']:.3f}")
    print(f"kafka_consume_vs_kafka_broker={ratios['consume']:.3f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="records per phase")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--partitions", type=int, default=6, help="partitions per topic")
    parser.add_argument("--value-bytes", type=int, default=100, help="bytes per value")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.rounds < 1 or args.partitions < 1 or args.value_bytes < 0:
        parser.error("--rows, --rounds, --partitions must be >= 1 and --value-bytes >= 0")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
