"""A topic deleted and recreated under its name, as the Spark side meets it (issue 35).

Every reader, sink and export pins the topic's id when it is planned and sends it with
its requests: a recreated topic fails it with one line naming the topic and saying it was
recreated, and no row of the new topic is read (or written) as if it followed the old.

One session with Delta (``local_session(conf=delta_conf())``) and one embedded broker
(a real process) for the module; each test uses its own topics.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from broker_core.client.broker_client import BrokerClient
from spark_sink.embedded import ensure_broker, stop_broker
from spark_sink.export.delta import ExportError, Source, export
from spark_sink.schema import arrow_schema_for
from tests.spark.helpers import delta_test_session


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = str(tmp_path_factory.mktemp("recreate_store"))
    yield path
    stop_broker(path)


@pytest.fixture(scope="module")
def spark(store: str) -> Iterator[SparkSession]:
    with delta_test_session("idemlog-topic-recreate-tests") as session:
        yield session


def payments(spark: SparkSession, first: int, n: int) -> DataFrame:
    return spark.range(first, first + n, numPartitions=2).selectExpr(
        "id", "cast(id % 3 as int) AS region"
    )


def append(df: DataFrame, store: str, topic: str) -> None:
    (
        df.write.format("idemlog")
        .option("topic", topic)
        .option("path", store)
        .option("partitions", "2")
        .mode("append")
        .save()
    )


def topic_id(store: str, topic: str) -> str:
    with BrokerClient(ensure_broker(store)) as client:
        return client.topic_id(topic, refresh=True)


def recreate(spark: SparkSession, store: str, topic: str, first: int, n: int) -> str:
    """Delete ``topic``, write ``n`` rows from id ``first`` into a new topic of its name
    (more than the old one held, so its offsets run past the old ones); its new id."""
    old = topic_id(store, topic)
    with BrokerClient(ensure_broker(store)) as client:
        client.delete_topic(topic)
    append(payments(spark, first, n), store, topic)
    new = topic_id(store, topic)
    assert new != old, "the recreated topic kept its id"
    return new


def log_ends(store: str, topic: str) -> list[int]:
    with BrokerClient(ensure_broker(store)) as client:
        parts = len(client.describe_topics([topic])[0].partitions)
        return [client.list_offsets(topic, p)["log_end_offset"] for p in range(parts)]


def recreated_line(topic: str) -> str:
    return f"topic {topic!r} was recreated"


# -- reads ----------------------------------------------------------------------------------
def test_a_stream_fails_when_its_topic_is_recreated_running_or_restarted(
    spark: SparkSession, store: str, tmp_path: Path
) -> None:
    topic = "recreated_stream"
    append(payments(spark, 0, 1_000), store, topic)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def start(recreate_after_first: bool) -> StreamingQuery:
        def deliver(batch: DataFrame, batch_id: int) -> None:
            batch.write.mode("append").parquet(out)
            if recreate_after_first and batch_id == 0:
                # Between two triggers of the running query, so the next one plans on a
                # topic of the same name and another id.
                recreate(spark, store, topic, 100_000, 3_000)

        return (
            spark.readStream.format("idemlog")
            .option("topic", topic)
            .option("path", store)
            .load()
            .writeStream.foreachBatch(deliver)
            .option("checkpointLocation", checkpoint)
            .start()
        )

    query = start(recreate_after_first=True)
    with pytest.raises(PySparkException) as running:
        query.processAllAvailable()
    query.stop()
    assert spark.read.parquet(out).count() == 1_000, "the first batch was not delivered"
    assert recreated_line(topic) + " since the streaming query started" in str(running.value)

    # Restarted from its checkpoint (the old topic's offsets, and its id): refused too.
    restarted = start(recreate_after_first=False)
    with pytest.raises(PySparkException) as again:
        restarted.processAllAvailable()
    restarted.stop()
    assert recreated_line(topic) in str(again.value), str(again.value)[-2000:]
    assert "its offsets belong to the old topic" in str(again.value)

    ids = [r["id"] for r in spark.read.parquet(out).select("id").collect()]
    assert sorted(ids) == list(range(1_000)), "a row of the new topic was delivered"


def test_a_batch_read_planned_before_the_recreate_fails(spark: SparkSession, store: str) -> None:
    topic = "recreated_batch"
    append(payments(spark, 0, 1_000), store, topic)
    df = spark.read.format("idemlog").option("topic", topic).option("path", store).load()
    # Planned: the reader is made and its partitions are fixed on the driver (the scan's
    # RDD is made; the action below runs this same physical plan).
    df._jdf.queryExecution().executedPlan().execute()
    recreate(spark, store, topic, 100_000, 3_000)
    with pytest.raises(PySparkException) as failed:
        df.collect()
    assert recreated_line(topic) in str(failed.value), str(failed.value)[-2000:]
    assert "after this read was planned under id" in str(failed.value)
    # A read planned now reads the new topic, all of it.
    fresh = spark.read.format("idemlog").option("topic", topic).option("path", store).load()
    assert fresh.count() == 3_000


# -- the sink -------------------------------------------------------------------------------
def test_a_write_whose_topic_is_recreated_after_its_plan_writes_nothing(
    spark: SparkSession, store: str, tmp_path: Path
) -> None:
    topic = "recreated_sink"
    append(payments(spark, 0, 100), store, topic)
    planned = topic_id(store, topic)
    address = ensure_broker(store)
    schema = arrow_schema_for(payments(spark, 0, 1).schema)
    marker = str(tmp_path / "recreated")

    def recreate_first(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # In the first task that runs, after the driver planned the write: the topic is
        # deleted and created again, empty (O_EXCL: one task of all does it).
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pass
        else:
            with BrokerClient(address) as client:
                client.delete_topic(topic)
                client.create_topic(topic, 2, schema=schema)
        yield from batches

    df = payments(spark, 1_000, 2_000).mapInArrow(recreate_first, payments(spark, 0, 1).schema)
    with pytest.raises(PySparkException) as failed:
        append(df, store, topic)
    assert os.path.exists(marker), "the recreate never ran"
    assert topic_id(store, topic) != planned
    assert recreated_line(topic) in str(failed.value), str(failed.value)[-2000:]
    assert "after this write was planned under id" in str(failed.value)
    assert "none of which reach the new topic" in str(failed.value)
    assert log_ends(store, topic) == [0, 0], "rows reached the recreated topic"


# -- the Delta export ----------------------------------------------------------------------
def test_a_delta_export_does_not_continue_into_a_recreated_topic(
    spark: SparkSession, store: str, tmp_path: Path
) -> None:
    topic, table = "recreated_export", str(tmp_path / "table")
    append(payments(spark, 0, 1_000), store, topic)
    first = export(spark, Source(topic, path=store), table, "region", log=lambda _l: None)
    assert first.rows == 1_000 and first.plan.topic_id == topic_id(store, topic)
    recreate(spark, store, topic, 100_000, 3_000)
    with pytest.raises(ExportError) as refused:
        export(spark, Source(topic, path=store), table, "region", log=lambda _l: None)
    line = str(refused.value)
    assert line.startswith(recreated_line(topic) + " since run 1 of the export"), line
    assert f"id {first.plan.topic_id} is now" in line and "\n" not in line
    assert spark.read.format("delta").load(table).count() == 1_000
