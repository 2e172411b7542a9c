"""bench-peers, part 3: broker ingest without Spark, idemlog's producer against
confluent-kafka's idempotent producer (the method is in ``benchmarks.bench_peers``)."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, Message, Producer

from benchmarks.bench_spark import WARMUP_ROWS, Cpu
from benchmarks.broker_process import start_broker
from benchmarks.kafka_node import FLUSH, PARTITIONS, KafkaAdmin, fresh
from benchmarks.peers_report import Row
from broker_core.client.broker_client import BrokerClient
from broker_core.log.config import LOG_CONFIG
from broker_core.producer import Producer as IdemlogProducer

INGEST_CLIENTS = ("idemlog", "kafka")
KAFKA_PRODUCER_CONFIG = {"enable.idempotence": True, "acks": "all"}
INGEST_CHUNK_ROWS = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default
INGEST_DISTINCT_CHUNKS = 50
INGEST_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.string())])
FLUSH_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Chunk:
    """One chunk of ingest rows, as an Arrow table (idemlog) and as byte strings (Kafka)."""

    table: pa.Table
    keys: list[bytes]
    values: list[bytes]
    nbytes: int  # key + value bytes


def ingest_chunks() -> list[Chunk]:
    chunks = []
    for c in range(INGEST_DISTINCT_CHUNKS):
        ids = pa.array(np.arange(c * INGEST_CHUNK_ROWS, (c + 1) * INGEST_CHUNK_ROWS))
        keys = pc.cast(pc.remainder(ids, 1000), pa.string())
        values = pc.binary_join_element_wise("value-", pc.cast(ids, pa.string()), "")
        table = pa.table([keys, values], schema=INGEST_SCHEMA)
        nbytes = sum(int(pc.sum(pc.binary_length(a)).as_py()) for a in (keys, values))
        chunks.append(
            Chunk(
                table=table,
                keys=[k.encode() for k in keys.to_pylist()],
                values=[v.encode() for v in values.to_pylist()],
                nbytes=nbytes,
            )
        )
    return chunks


@dataclass(frozen=True)
class Ingest:
    chunks: list[Chunk]
    count: int  # chunks per run, cycling through ``chunks``

    @property
    def rows(self) -> int:
        return self.count * INGEST_CHUNK_ROWS

    @property
    def nbytes(self) -> int:
        return sum(self.chunks[i % len(self.chunks)].nbytes for i in range(self.count))

    def sequence(self) -> list[Chunk]:
        return [self.chunks[i % len(self.chunks)] for i in range(self.count)]


def ingest_idemlog(address: str, ingest: Ingest) -> float:
    topic = fresh("ingest")
    with BrokerClient(address) as admin:
        admin.create_topic(topic, PARTITIONS, schema=INGEST_SCHEMA, config=dict(FLUSH))
    try:
        chunks = ingest.sequence()
        with IdemlogProducer(address) as producer:
            start = time.perf_counter()
            futures = [producer.send(topic, chunk.table, key="key") for chunk in chunks]
            producer.flush(FLUSH_TIMEOUT_S)
            elapsed = time.perf_counter() - start
            acknowledged = sum(m.num_rows for f in futures for m in f.result(0))
            errors = producer.metrics_snapshot()["record_errors"]
        with BrokerClient(address) as admin:
            stored = sum(admin.list_offsets(topic, p)["log_end_offset"] for p in range(PARTITIONS))
        if acknowledged != ingest.rows or stored != ingest.rows or errors:
            raise SystemExit(
                f"idemlog ingest: {acknowledged} rows acknowledged, {stored} in the log, "
                f"{errors} failed; expected {ingest.rows}"
            )
    finally:
        with BrokerClient(address) as admin:
            admin.delete_topic(topic)
    return elapsed


def ingest_kafka(kafka: KafkaAdmin, ingest: Ingest, primer: str) -> float:
    topic = fresh("ingest")
    kafka.create(topic)
    failures: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failures.append(error)

    config: dict[str, Any] = {
        "bootstrap.servers": kafka.bootstrap,
        **KAFKA_PRODUCER_CONFIG,
        # Successes need no callback (that would be a Python call per record); failures do.
        "delivery.report.only.error": True,
        "on_delivery": delivered,
    }
    try:
        chunks = ingest.sequence()
        producer = Producer(config)
        try:
            # Ready before the clock starts, as idemlog's Producer() is: connected, producer
            # id acquired (one record to another topic, flushed), the topic's metadata known.
            producer.produce(primer, b"", b"")
            if producer.flush(60) or producer.list_topics(topic, timeout=60) is None:
                raise SystemExit("kafka ingest: the producer did not get ready in 60 s")
            produce, poll = producer.produce, producer.poll
            start = time.perf_counter()
            for chunk in chunks:
                for key, value in zip(chunk.keys, chunk.values, strict=True):
                    while True:
                        try:
                            produce(topic, value, key)
                            break
                        except BufferError:
                            # librdkafka's queue is full: let it drain, then the same record.
                            poll(0.005)
                poll(0)
            left = producer.flush(FLUSH_TIMEOUT_S)
            elapsed = time.perf_counter() - start
        finally:
            # Nothing is left after a complete flush; after an error, close() must not wait
            # for records to a broker that may be gone.
            producer.purge(blocking=False)
            producer.close()
        if left or failures:
            raise SystemExit(f"kafka ingest: {left} records unsent, {len(failures)} failed")
        kafka.check("kafka ingest", topic, ingest.rows)
    finally:
        kafka.delete(topic)
    return elapsed


def ingest_part(args: argparse.Namespace, directory: Path, kafka: KafkaAdmin) -> list[Row]:
    chunks = ingest_chunks()
    count = -(-args.rows // INGEST_CHUNK_ROWS)
    ingest = Ingest(chunks, count)
    warm = Ingest(chunks, max(1, WARMUP_ROWS // INGEST_CHUNK_ROWS))
    (directory / "ingest-broker").mkdir()
    server = start_broker(directory / "ingest-broker")
    try:
        with BrokerClient(server.address) as admin:
            probe = fresh("probe")
            admin.create_topic(probe, PARTITIONS, schema=INGEST_SCHEMA, config=dict(FLUSH))
            overrides = admin.describe_topics([probe])[0].config
            admin.delete_topic(probe)
        probe = fresh("probe")
        kafka.create(probe)
        kafka_flush = kafka.flush_config(probe)
        kafka.delete(probe)
        idemlog_flush = {k: LOG_CONFIG.parse(overrides)[k] for k in FLUSH}
        print(
            f"\ningest: {ingest.rows} records ({ingest.nbytes / 1e6:.1f} MB of keys and values) "
            f"per run in chunks of {INGEST_CHUNK_ROWS}, {PARTITIONS} partitions; idemlog "
            f"topic {idemlog_flush}, Kafka topic {kafka_flush}",
            flush=True,
        )
        primer = fresh("primer")
        kafka.create(primer)
        runs: dict[str, list[float]] = {c: [] for c in INGEST_CLIENTS}
        cpu: dict[str, list[float]] = {c: [] for c in INGEST_CLIENTS}

        def run(client: str, what: Ingest) -> tuple[float, float]:
            before = Cpu.now(str(directory / "embedded"))
            if client == "idemlog":
                elapsed = ingest_idemlog(server.address, what)
            else:
                elapsed = ingest_kafka(kafka, what, primer)
            return elapsed, (Cpu.now(str(directory / "embedded")) - before).total

        for client in INGEST_CLIENTS:
            run(client, warm)
        for round_ in range(args.repeats):
            for client in INGEST_CLIENTS:
                elapsed, used = run(client, ingest)
                runs[client].append(elapsed)
                cpu[client].append(used)
                print(
                    f"  ingest round {round_ + 1} {client}: {elapsed:.2f}s = "
                    f"{ingest.rows / elapsed:,.0f} records/s",
                    flush=True,
                )
    finally:
        server.stop()
    return [
        Row("ingest", c, min(runs[c]), ingest.rows, ingest.nbytes, min(cpu[c]))
        for c in INGEST_CLIENTS
    ]
