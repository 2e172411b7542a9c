"""bench-peers, part 4: reads. The same rows read back with ``spark.read.format("idemlog")``
(read_committed), Spark's Kafka source and Delta; a streaming read of appended
micro-batches from idemlog and from Kafka.

**Batch read.** ``--rows`` rows of ``spark_workload.source`` are written once, untimed, by
each peer's own Spark sink (idemlog: ``df.write.format("idemlog")`` with ``key="key"``
into a fresh topic of the default 4 partitions; Kafka: the batch part's projection
``cast(key as string) key, cast(value as binary) value`` into a fresh 4-partition topic;
Delta: a fresh table), and their row counts checked. Each reader then reads every row
once, untimed (a warm-up: the count does not run the row path, so without it the JIT
compiled each reader's path during its first timed rounds). Then ``--repeats``
interleaved rounds of one read each, materialised the same way for all three:
``.write.format("noop")`` of every column the reader returns, so Spark can neither prune
a column nor short-circuit a count:

- ``idemlog``: ``spark.read.format("idemlog")`` (its defaults: read_committed, no
  metadata columns): ``id bigint, key int, value string``;
- ``kafka``: ``spark.read.format("kafka")`` (``startingOffsets=earliest``,
  ``endingOffsets=latest``, ``kafka.isolation.level=read_committed``), **decoded** back to
  the written columns, ``cast(cast(key as string) as int) key, cast(value as string)
  value``: decoding is part of the comparison, because a user of the Kafka source needs it
  to get the DataFrame idemlog and Delta hand out. Kafka's rows have no ``id`` (the write
  part never sends it), so it moves 8 bytes a row less than the other two;
- ``delta``: ``spark.read.format("delta").load(path)``: ``id, key, value``;
- two references, not peers (``benchmarks.arrow_probe``): the same rows as 4 Arrow IPC
  stream files on local disk, read by ``arrowpy`` (a Python data source yielding their
  batches: the floor of any Python data source's read) and by ``arrowjvm`` (a JVM
  DataSource V2 handing Spark the Arrow vectors as columnar batches): ``id, key, value``.

Each reader's **median** run counts (rows/s), CPU seconds (this process tree -- the JVM,
its Python workers, the Kafka node -- plus the embedded broker) of its median run.

**Streaming read.** A query of each source (idemlog read_committed; Kafka with
``kafka.isolation.level=read_committed``, decoded as above) runs with a noop sink and the
default trigger (the next micro-batch as soon as the last ends) while ``--stream-batches``
appends of ``--stream-rows`` rows are made, each one transaction of a transactional
producer outside Spark (``broker_core.producer.Producer``; ``confluent_kafka.Producer``),
each after the query has read the previous one (a poll of its progress), so each append is
one micro-batch -- for idemlog always (a transaction is read whole or not at all); Kafka's
source, even read_committed, can split one transaction's rows over micro-batches (seen at
smoke size: two appends of 10,000 rows read as 10,000, 5,000 and 5,000), and then the
append's time is the sum of its micro-batches' (the splits are printed). One warm-up
append first (not counted). A micro-batch's time is its
``durationMs["triggerExecution"]``: for a source the offset planning (idemlog's stable
cut, Kafka's end offsets) is part of the read. p50 and p95 of those; ``addBatch`` p50 is
printed too. The streaming read's CPU seconds include the appends' (the producers run in
this process): a like cost on both sides, not the read's alone.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer as KafkaProducer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from benchmarks.arrow_probe import PROBE_CLASS, write_arrow_files
from benchmarks.bench_spark import Cpu
from benchmarks.common import percentile
from benchmarks.kafka_node import PARTITIONS, KafkaAdmin, fresh
from benchmarks.peers_report import Row
from benchmarks.spark_workload import source
from broker_core.client.broker_client import BrokerClient
from broker_core.producer import Producer as IdemlogProducer
from broker_core.producer import ProducerConfig
from spark_sink.embedded import ensure_broker

# arrowpy and arrowjvm are references, not peers: the same rows from local Arrow files
# through a Python data source and through a JVM columnar scan (benchmarks.arrow_probe).
READERS = ("idemlog", "kafka", "delta", "arrowpy", "arrowjvm")
STREAM_READERS = ("idemlog", "kafka")
KAFKA_WRITE_COLUMNS = ("cast(key as string) key", "cast(value as binary) value")
KAFKA_READ_COLUMNS = ("cast(cast(key as string) as int) key", "cast(value as string) value")
STREAM_SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.int32()), ("value", pa.string())])
APPEND_READ_TIMEOUT_S = 300.0
POLL_S = 0.01
TRANSACTION_TIMEOUT_S = 120.0


@dataclass
class Stored:
    """Where each peer holds the rows the batch reads read."""

    idemlog_topic: str
    kafka_topic: str
    delta_path: Path
    arrow_path: Path


def _store(
    spark: SparkSession, embedded: str, kafka: KafkaAdmin, directory: Path, rows: int
) -> Stored:
    """Write ``rows`` rows once to each peer with its own Spark sink (untimed), checked."""
    stored = Stored(
        fresh("read"),
        fresh("read"),
        directory / fresh("delta-read"),
        directory / fresh("arrow-read"),
    )
    df = source(spark, rows)
    (
        df.write.format("idemlog")
        .mode("append")
        .option("path", embedded)
        .option("topic", stored.idemlog_topic)
        .option("key", "key")
        .save()
    )
    kafka.create(stored.kafka_topic)
    (
        df.selectExpr(*KAFKA_WRITE_COLUMNS)
        .write.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("topic", stored.kafka_topic)
        .save()
    )
    kafka.check("read part", stored.kafka_topic, rows)
    df.write.format("delta").mode("errorifexists").save(str(stored.delta_path))
    write_arrow_files(stored.arrow_path, rows)
    return stored


def _reader(
    spark: SparkSession,
    embedded: str,
    kafka: KafkaAdmin,
    stored: Stored,
    name: str,
    idemlog_options: Mapping[str, str],
) -> DataFrame:
    """The DataFrame each peer's reader returns, with the columns a user gets."""
    if name == "idemlog":
        return (
            spark.read.format("idemlog")
            .option("path", embedded)
            .option("topic", stored.idemlog_topic)
            .options(**idemlog_options)
            .load()
        )
    if name == "kafka":
        return (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("subscribe", stored.kafka_topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .option("kafka.isolation.level", "read_committed")
            .load()
            .selectExpr(*KAFKA_READ_COLUMNS)
        )
    if name == "delta":
        return spark.read.format("delta").load(str(stored.delta_path))
    if name == "arrowpy":
        return spark.read.format("arrowfiles").load(str(stored.arrow_path))
    if name == "arrowjvm":
        return spark.read.format(PROBE_CLASS).load(str(stored.arrow_path))
    raise ValueError(name)


def _timed(embedded: str, action: Callable[[], None]) -> tuple[float, float]:
    before = Cpu.now(embedded)
    start = time.perf_counter()
    action()
    elapsed = time.perf_counter() - start
    return elapsed, (Cpu.now(embedded) - before).total


def batch_reads(
    spark: SparkSession,
    embedded: str,
    kafka: KafkaAdmin,
    directory: Path,
    rows: int,
    repeats: int,
    nbytes: int,
    idemlog_options: Mapping[str, str],
) -> list[Row]:
    """The batch reads' rows of the table: each reader's median run."""
    stored = _store(spark, embedded, kafka, directory, rows)
    try:
        frames = {
            name: _reader(spark, embedded, kafka, stored, name, idemlog_options) for name in READERS
        }
        for name, frame in frames.items():
            counted = frame.count()
            if counted != rows:
                raise SystemExit(f"read {name}: {counted} rows, expected {rows}")
        print(
            "\nread: columns "
            + "; ".join(f"{n} {frames[n].schema.simpleString()}" for n in READERS),
            flush=True,
        )
        # One untimed read of every row by each reader before the rounds: the count above
        # does not run the row path (Delta answers it from its log's statistics, the
        # others convert no column), so the JIT would otherwise compile each reader's
        # path during its first timed rounds.
        for name, frame in frames.items():
            elapsed, _ = _timed(embedded, frame.write.format("noop").mode("overwrite").save)
            print(f"  read warm-up {name}: {elapsed:.2f}s (not counted)", flush=True)
        runs: dict[str, list[tuple[float, float]]] = {n: [] for n in READERS}
        for round_ in range(repeats):
            for name in READERS:
                elapsed, cpu = _timed(
                    embedded, frames[name].write.format("noop").mode("overwrite").save
                )
                runs[name].append((elapsed, cpu))
                print(
                    f"  read round {round_ + 1} {name}: {elapsed:.2f}s = "
                    f"{rows / elapsed:,.0f} rows/s, {cpu:.1f} CPU s",
                    flush=True,
                )
    finally:
        kafka.delete(stored.kafka_topic)
        shutil.rmtree(stored.delta_path, ignore_errors=True)
        shutil.rmtree(stored.arrow_path, ignore_errors=True)
        with BrokerClient(ensure_broker(embedded)) as client:
            client.delete_topic(stored.idemlog_topic)
    result = []
    for name in READERS:
        ordered = sorted(runs[name])
        elapsed, cpu = ordered[(len(ordered) - 1) // 2]  # the median run (lower middle)
        result.append(Row("read", name, elapsed, rows, nbytes, cpu))
    return result


# -- the streaming read -----------------------------------------------------------------------
def _append_table(index: int, rows: int) -> pa.Table:
    ids = pa.array(np.arange(index * rows, (index + 1) * rows, dtype=np.int64))
    return pa.table(
        [
            ids,
            pc.cast(pc.remainder(ids, 1000), pa.int32()),
            pc.binary_join_element_wise("value-", pc.cast(ids, pa.string()), ""),
        ],
        schema=STREAM_SCHEMA,
    )


class _IdemlogAppender:
    """One transaction of a transactional idemlog producer per append."""

    def __init__(self, address: str, topic: str) -> None:
        with BrokerClient(address) as admin:
            admin.create_topic(topic, PARTITIONS, schema=STREAM_SCHEMA)
        self.topic = topic
        self.producer = IdemlogProducer(
            address, config=ProducerConfig(transactional_id=fresh("reader-append"))
        )
        self.producer.init_transactions()

    def append(self, table: pa.Table) -> None:
        self.producer.begin_transaction()
        self.producer.send(self.topic, table, key="key")
        self.producer.commit_transaction()

    def close(self) -> None:
        self.producer.close()


class _KafkaAppender:
    """One transaction of a transactional confluent-kafka producer per append."""

    def __init__(self, kafka: KafkaAdmin, topic: str) -> None:
        kafka.create(topic)
        self.topic = topic
        self.producer = KafkaProducer(
            {
                "bootstrap.servers": kafka.bootstrap,
                "transactional.id": fresh("reader-append"),
                "enable.idempotence": True,
                "acks": "all",
            }
        )
        self.producer.init_transactions(TRANSACTION_TIMEOUT_S)

    def append(self, table: pa.Table) -> None:
        keys = [str(k).encode() for k in table.column("key").to_pylist()]
        values = [v.encode() for v in table.column("value").to_pylist()]
        self.producer.begin_transaction()
        for key, value in zip(keys, values, strict=True):
            while True:
                try:
                    self.producer.produce(self.topic, value, key)
                    break
                except BufferError:
                    self.producer.poll(0.005)
        self.producer.commit_transaction(TRANSACTION_TIMEOUT_S)

    def close(self) -> None:
        self.producer.flush(TRANSACTION_TIMEOUT_S)


def _read_rows(query: StreamingQuery) -> int:
    return sum(p.numInputRows for p in query.recentProgress)


def _non_empty(query: StreamingQuery) -> list[Any]:
    """The query's progress of the micro-batches that read rows (Spark keeps the last
    ``spark.sql.streaming.numRecentProgressUpdates``, 100 by default)."""
    return [p for p in query.recentProgress if p.numInputRows > 0]


def _wait_read(query: StreamingQuery, rows: int, name: str) -> None:
    """Until the query has read ``rows`` rows in all (its progress), or fail."""
    deadline = time.monotonic() + APPEND_READ_TIMEOUT_S
    while _read_rows(query) < rows:
        if query.exception() is not None:
            raise SystemExit(f"read stream {name} failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise SystemExit(
                f"read stream {name}: {_read_rows(query)} rows read, not {rows}, after "
                f"{APPEND_READ_TIMEOUT_S:g} s"
            )
        time.sleep(POLL_S)  # polling Spark's progress: the query offers no event to wait on


def stream_read(
    spark: SparkSession,
    embedded: str,
    kafka: KafkaAdmin,
    directory: Path,
    name: str,
    batches: int,
    rows: int,
    idemlog_options: Mapping[str, str],
) -> tuple[list[dict[str, float]], float]:
    """A streaming read of ``name`` while ``batches`` appends of ``rows`` rows are made:
    for each append after the warm-up one, the durations of the micro-batches that read it
    (summed; one micro-batch unless the source split the append), and CPU seconds."""
    topic = fresh("read-stream")
    checkpoint = directory / fresh("checkpoint-read")
    appender: _IdemlogAppender | _KafkaAppender
    if name == "idemlog":
        appender = _IdemlogAppender(ensure_broker(embedded), topic)
        stream = (
            spark.readStream.format("idemlog")
            .option("path", embedded)
            .option("topic", topic)
            .options(**idemlog_options)
        ).load()
    else:
        appender = _KafkaAppender(kafka, topic)
        stream = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("kafka.isolation.level", "read_committed")
            .load()
            .selectExpr(*KAFKA_READ_COLUMNS)
        )
    tables = [_append_table(i, rows) for i in range(batches + 1)]
    query = stream.writeStream.format("noop").option("checkpointLocation", str(checkpoint)).start()
    try:
        appender.append(tables[0])
        _wait_read(query, rows, name)
        seen = len(_non_empty(query))
        before = Cpu.now(embedded)
        per_append: list[list[Any]] = []
        for i in range(1, batches + 1):
            appender.append(tables[i])
            _wait_read(query, (i + 1) * rows, name)
            progress = _non_empty(query)
            per_append.append(progress[seen:])
            seen = len(progress)
        cpu = (Cpu.now(embedded) - before).total
    finally:
        query.stop()
        appender.close()
        shutil.rmtree(checkpoint, ignore_errors=True)
        if name == "kafka":
            kafka.delete(topic)
        else:
            with BrokerClient(ensure_broker(embedded)) as client:
                client.delete_topic(topic)
    counts = [sum(p.numInputRows for p in append) for append in per_append]
    if counts != [rows] * batches:
        raise SystemExit(f"read stream {name}: appends read as {counts} rows, not {rows} each")
    split = [len(append) for append in per_append if len(append) > 1]
    if split:
        # Kafka's source can read part of one transaction in a micro-batch (see above).
        print(
            f"  read stream {name}: {len(split)} of {batches} appends took more than one "
            f"micro-batch ({split}); an append's time is the sum of its micro-batches'",
            flush=True,
        )
    return [
        {
            key: sum(float(p.durationMs.get(key, 0)) for p in append)
            for key in ("triggerExecution", "addBatch")
        }
        for append in per_append
    ], cpu


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def read_options_argument(parser: argparse.ArgumentParser) -> None:
    """``--idemlog-read-option KEY=VALUE`` (repeatable): an option of idemlog's reader in
    the read part (e.g. ``minPartitions=8``; default: none, the reader's defaults)."""
    parser.add_argument(
        "--idemlog-read-option",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of spark.read.format('idemlog') in the read part (repeatable)",
    )


def read_part(
    args: argparse.Namespace,
    spark: SparkSession,
    embedded: str,
    kafka: KafkaAdmin,
    directory: Path,
    nbytes: Callable[[int, int], int],
) -> list[Row]:
    """Part 4's rows: the batch reads, then the streaming reads."""
    idemlog_options = dict(args.idemlog_read_option)
    if idemlog_options:
        print(f"read: idemlog's reader options {idemlog_options}", flush=True)
    rows = batch_reads(
        spark,
        embedded,
        kafka,
        directory,
        args.rows,
        args.repeats,
        nbytes(0, args.rows),
        idemlog_options,
    )
    for name in STREAM_READERS:
        durations, cpu = stream_read(
            spark,
            embedded,
            kafka,
            directory,
            name,
            args.stream_batches,
            args.stream_rows,
            idemlog_options,
        )
        trigger = [d["triggerExecution"] / 1000 for d in durations]
        add = [d["addBatch"] for d in durations]
        print(
            f"  read stream {name}: triggerExecution ms "
            + " ".join(f"{t * 1000:.0f}" for t in trigger)
            + f"; addBatch p50 {statistics.median(add):.0f} ms",
            flush=True,
        )
        rows.append(
            Row(
                "rstream",
                name,
                percentile(trigger, 50),
                args.stream_rows,
                nbytes(0, args.stream_rows),
                cpu,
                p95=percentile(trigger, 95),
            )
        )
    return rows
