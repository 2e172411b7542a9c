"""The driver side of the sink protocol and the schema rules, without Spark."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from broker_core.client import BrokerClient
from broker_core.errors import SchemaMismatchError
from broker_core.protocol import SinkAttempt
from spark_sink.options import Scope, parse_options
from spark_sink.producer import Producer
from spark_sink.schema import check_compatible, conform, normalise
from spark_sink.writer import IdemlogCommitMessage, commit_batch
from tests.harness.broker import BrokerProcess
from tests.harness.broker import broker as broker  # fixtures
from tests.harness.broker import broker_factory as broker_factory
from tests.harness.broker import client as client

SCHEMA = pa.schema([("id", pa.int64())])


def test_commit_waits_out_a_broker_restart_and_commits_once(
    broker: BrokerProcess, client: BrokerClient
) -> None:
    client.create_topic("w", 1, schema=SCHEMA)
    options = parse_options({"topic": "w", "brokers": broker.address}, Scope.WRITE)
    with Producer(broker.address, **{"transactional.id": "s/0"}) as producer:
        assert producer.init_sink_transaction(SinkAttempt("s", "r", 3)) == "new"
        producer.begin_transaction()
        sent = producer.send("w", pa.table({"id": list(range(10))}))
        producer.flush()
        (meta,) = sent.result()
        producer.prepare_sink_transaction(3, [("w", 0, meta.base_offset, meta.last_offset)])
        pid, epoch = producer.producer_id_and_epoch
    message = IdemlogCommitMessage("s", "r", 3, 0, 0, "s/0", pid, epoch, "new", 10, 1, 0, 0, 1.0)
    broker.kill()
    result: list[bool] = []
    committer = threading.Thread(
        target=lambda: result.append(commit_batch(options, None, "r", 3, [message]))
    )
    committer.start()  # fails retriably while the broker is down, and retries
    broker.restart()
    committer.join(timeout=120)
    assert result == [True]
    with BrokerClient(broker.address) as fresh:
        table = fresh.read_table("w", 0)
        assert table is not None and table.column("id").to_pylist() == list(range(10))
        # The same commit again (Spark re-commits after a driver restart): not twice.
        assert commit_batch(options, None, "r", 3, [message]) is False
        assert fresh.read_table("w", 0).num_rows == 10  # type: ignore[union-attr]


def test_time_zone_and_nullability_do_not_change_the_topic_schema() -> None:
    spark_a = pa.schema([pa.field("t", pa.timestamp("us", tz="Etc/UTC"), nullable=False)])
    spark_b = pa.schema([pa.field("t", pa.timestamp("us", tz="Europe/Paris"))])
    assert normalise(spark_a).equals(normalise(spark_b))
    check_compatible("topic", normalise(spark_a), normalise(spark_b))
    batch = pa.record_batch([pa.array([1, 2], pa.timestamp("us", tz="Europe/Paris"))], ["t"])
    assert conform(batch, normalise(spark_a)).schema.equals(normalise(spark_a))
    with pytest.raises(SchemaMismatchError, match=r"changed types t \(timestamp"):
        check_compatible("topic", normalise(spark_a), normalise(pa.schema([("t", pa.int64())])))
