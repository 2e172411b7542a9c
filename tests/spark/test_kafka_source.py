"""Spark's own Kafka source (``spark-sql-kafka-0-10`` from ``jars/spark-kafka``) reads an
idemlog topic through the Kafka listener: a topic created with librdkafka's AdminClient
(Kafka's CreateTopics), two partitions, written by idemlog's transactional ``Producer``
with a transaction aborted between two committed ones. ``spark.read.format("kafka")``
(earliest to latest) and ``spark.readStream.format("kafka")`` (Trigger.AvailableNow) with
``kafka.isolation.level`` read_committed give exactly the rows ``format("idemlog")`` gives:
the same partitions, offsets, keys, values and timestamps, no aborted row; a batch read
from ``startingTimestamp`` (ListOffsets by timestamp) the rows from that time on. The
driver is a process of its own (``kafka_source_child.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from broker_core.producer.producer import Producer
from broker_core.server.kafka.admin import KAFKA_TOPIC_SCHEMA
from tests.broker.test_kafka_listener import KAFKA_ON, kafka_address
from tests.harness.broker import BrokerFactory, BrokerProcess

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("kafka_source_child.py")
TOPIC = "spark-kafka"
DRIVER_TIMEOUT_S = 300.0
START_MS = 1_700_000_000_000


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("kafka-source"))
    try:
        yield factory(KAFKA_ON, name="ksource")
    finally:
        factory.close()


def rows(tag: str, first: int, count: int) -> pa.Table:
    """Kafka-shaped rows; timestamps whole milliseconds (a Kafka record carries ms)."""
    return pa.table(
        {
            "key": pa.array([f"k{(first + i) % 17}".encode() for i in range(count)], pa.binary()),
            "value": pa.array([f"{tag}-{first + i}".encode() for i in range(count)], pa.binary()),
            "timestamp": pa.array(
                [(START_MS + first + i) * 1000 for i in range(count)],
                pa.timestamp("us", tz="UTC"),
            ),
            "headers": pa.array([[] for _ in range(count)], KAFKA_TOPIC_SCHEMA.field(3).type),
        },
        schema=KAFKA_TOPIC_SCHEMA,
    )


def transaction(address: str, txn_id: str, table: pa.Table, *, commit: bool) -> None:
    with Producer(address, **{"transactional.id": txn_id}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(TOPIC, table, key="key")
        producer.flush()
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()


@pytest.mark.slow  # a Spark driver of its own and three reads: a minute or more
def test_spark_kafka_source_reads_what_idemlog_reads(
    kafka_broker: BrokerProcess, tmp_path: Path
) -> None:
    bootstrap = kafka_address(kafka_broker)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (created,) = admin.create_topics([NewTopic(TOPIC, 2, 1)]).values()
    created.result(15.0)
    transaction(kafka_broker.address, "first", rows("c", 0, 150), commit=True)
    transaction(kafka_broker.address, "aborted", rows("ab", 150, 60), commit=False)
    transaction(kafka_broker.address, "second", rows("c", 210, 150), commit=True)

    out = tmp_path / "read.json"
    spec = {
        "bootstrap": bootstrap,
        "brokers": kafka_broker.address,
        "topic": TOPIC,
        "since_ms": START_MS + 210,  # the second committed transaction's first row
        "checkpoint": str(tmp_path / "checkpoint"),
        "out": str(out),
    }
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    driver = subprocess.run(
        [sys.executable, str(CHILD), json.dumps(spec)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT_S,
        check=False,
    )
    assert driver.returncode == 0, driver.stderr[-4000:]
    print(*(line for line in driver.stderr.splitlines() if line.startswith("TIMED")), sep="\n")
    read = json.loads(out.read_text())

    own = read["idemlog"]
    assert len(own) == 300  # the committed rows, each once
    assert sorted(r[3] for r in own) == sorted(f"c-{i}" for i in [*range(150), *range(210, 360)])
    assert {r[0] for r in own} == {0, 1}
    assert read["kafka_batch"] == own
    assert read["kafka_stream"] == own
    # From a timestamp on: in each partition, from the first row at or after it.
    assert read["kafka_since"] == [r for r in own if r[4] >= START_MS + 210]
    assert len(read["kafka_since"]) == 150


def test_a_topic_created_over_kafka_has_the_schema_the_sink_writes_of_kafka_columns() -> None:
    """What Spark's Kafka source gives of a record (key, value, timestamp, headers) is
    what idemlog's sink writes to a topic made by CreateTopics: no cast, no mismatch."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    from spark_sink.schema import arrow_schema_for

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    kafka_columns = StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("timestamp", TimestampType()),
            StructField("headers", ArrayType(header)),
        ]
    )
    assert arrow_schema_for(kafka_columns).equals(KAFKA_TOPIC_SCHEMA)
