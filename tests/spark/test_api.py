"""``format("idemlog")`` as a Spark user meets it: writes, reads, streams, modes, bad input.

One in-process SparkSession (``local[2,4]``) and one embedded broker for the module; each
test uses its own topics. Fault injection lives in ``test_faults.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_core.client.broker_client import BrokerClient
from spark_sink import SinkProgressListener, local_session, progress, progress_history
from spark_sink.embedded import broker_pid, ensure_broker, stop_broker
from spark_sink.verify import verify_exactly_once


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = str(tmp_path_factory.mktemp("store"))
    yield path
    stop_broker(path)


@pytest.fixture(scope="module")
def spark(store: str) -> Iterator[SparkSession]:
    session = local_session("idemlog-api-tests", cores=2, max_failures=4, quiet=True)
    yield session
    session.stop()


def payments(spark: SparkSession, n: int, first: int = 0) -> DataFrame:
    return spark.range(first, first + n).selectExpr(
        "id", "cast(id % 13 as int) AS account", "concat('p', id) AS note"
    )


def write(df: DataFrame, store: str, topic: str, **options: str) -> None:
    writer = df.write.format("idemlog").option("topic", topic).option("path", store)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.mode("append").save()


def read(spark: SparkSession, store: str, topic: str, **options: str) -> pa.Table:
    reader = spark.read.format("idemlog").option("topic", topic).option("path", store)
    for key, value in options.items():
        reader = reader.option(key, value)
    table: pa.Table = reader.load().toArrow()
    return table


def end_offsets(store: str, topic: str) -> list[int]:
    with BrokerClient(ensure_broker(store)) as client:
        parts = len(client.describe_topics([topic])[0].partitions)
        return [client.list_offsets(topic, p)["log_end_offset"] for p in range(parts)]


# -- writing and reading back ---------------------------------------------------------------
def test_batch_write_then_read_returns_every_row_once_in_key_order(
    spark: SparkSession, store: str
) -> None:
    # Per-key order is the order within a task: give each task its keys' rows sorted.
    df = payments(spark, 20_000).repartition(3, "account").sortWithinPartitions("id")
    write(df, store, "api_roundtrip", key="account")
    table = read(spark, store, "api_roundtrip", includeMetadata="true")
    verdict = verify_exactly_once(
        table, id_column="id", key_column="account", expected_ids=range(20_000)
    )
    assert verdict.ok, verdict.line()
    assert verdict.order_violations == 0
    assert table.schema.names == ["id", "account", "note", "_partition", "_offset"]
    # Rows of one key live in one partition.
    per_key = table.group_by("account").aggregate([("_partition", "count_distinct")])
    assert set(per_key.column("_partition_count_distinct").to_pylist()) == {1}


def test_each_append_job_is_one_copy_and_the_embedded_broker_is_reused(
    spark: SparkSession, store: str
) -> None:
    write(payments(spark, 1000), store, "api_twice")
    pid = broker_pid(store)
    write(payments(spark, 1000, first=1000), store, "api_twice")
    assert broker_pid(store) == pid  # started on first use, then shared
    table = read(spark, store, "api_twice")
    verdict = verify_exactly_once(table, id_column="id", key_column=None, expected_ids=range(2000))
    assert verdict.ok, verdict.line()


def test_read_uncommitted_and_a_spark_filter(spark: SparkSession, store: str) -> None:
    write(payments(spark, 500), store, "api_iso", partitions="2")
    df = (
        spark.read.format("idemlog")
        .option("topic", "api_iso")
        .option("path", store)
        .option("isolation", "read_uncommitted")
        .load()
    )
    assert df.filter(F.col("account") == 3).count() == sum(1 for i in range(500) if i % 13 == 3)


def test_stream_from_idemlog_to_idemlog_is_exactly_once_end_to_end(
    spark: SparkSession, store: str, tmp_path: Path
) -> None:
    source = payments(spark, 6000).repartition(3, "account").sortWithinPartitions("id")
    write(source, store, "api_src", key="account", partitions="3")  # keys in id order
    listener = SinkProgressListener()  # the listener path: added by the user, per session
    spark.streams.addListener(listener)
    query = (
        spark.readStream.format("idemlog")
        .option("topic", "api_src")
        .option("path", store)
        .option("maxOffsetsPerTrigger", "1500")
        .load()
        .writeStream.format("idemlog")
        .option("topic", "api_dst")
        .option("key", "account")
        .option("path", store)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        query.processAllAvailable()
        batches = len(query.recentProgress)
        recent = query.recentProgress
    finally:
        query.stop()
    assert batches >= 4  # maxOffsetsPerTrigger split the 6000 rows
    # Each batch's sink figures, through spark_sink.progress (Spark's own progress untouched).
    with_rows = [p for p in recent if p["numInputRows"] > 0]
    assert len(with_rows) >= 4
    for p in with_rows:
        figures = progress(p)
        assert figures is not None and figures.committed and figures.batch_id == p["batchId"]
        assert figures.rows == p["numInputRows"] == p["sink"]["numOutputRows"]
        assert figures.tasks >= 1 and figures.commit_ms > 0
        # local_session() enriches lastProgress: the sink's figures, the offsets as JSON.
        assert p["sink"]["metrics"] == figures.metrics()
        (source,) = p["sources"]
        assert {"0", "1", "2"} <= set(json.loads(source["endOffset"]))
    # Every batch the sink committed; the last one's progress may not be reported yet
    # (Spark reports it after its commit), so the history can run one batch ahead.
    history = progress_history(query)
    assert {p["batchId"] for p in with_rows} <= {f.batch_id for f in history}
    assert sum(f.rows for f in history) == 6000
    assert progress(query) == history[-1]
    assert listener.wait_for_batch(str(query.id), history[-1].batch_id) == history[-1]
    spark.streams.removeListener(listener)  # after its last event: they arrive asynchronously
    table = read(spark, store, "api_dst", includeMetadata="true")
    verdict = verify_exactly_once(
        table, id_column="id", key_column="account", expected_ids=range(6000)
    )
    assert verdict.ok, verdict.line()


# -- modes ----------------------------------------------------------------------------------
def test_available_now_with_a_limit_reads_every_row_once_in_batches_of_at_most_it(
    spark: SparkSession, store: str, tmp_path: Path
) -> None:
    """A catch-up, Spark's contract for Trigger.AvailableNow with maxOffsetsPerTrigger: ONE
    run reads every row readable at its start, in several batches of at most the limit,
    every row once, and none written after it started. Those late rows are written by the
    run's first batch itself (foreachBatch), so they are in the log before the run plans
    its second batch: were the run's end not fixed at its start, it would read them. The
    next run reads them."""
    source = payments(spark, 2000).repartition(2, "account").sortWithinPartitions("id")
    write(source, store, "api_catchup", key="account", partitions="2")  # keys in id order
    limit, late = 600, 500

    def sink(batch: DataFrame, batch_id: int) -> None:
        write(batch, store, "api_catchup_dst", key="account")
        if batch_id == 0:
            more = payments(spark, late, first=2000).repartition(2, "account")
            write(more.sortWithinPartitions("id"), store, "api_catchup", key="account")

    def run() -> list[int]:
        query = (
            spark.readStream.format("idemlog")
            .option("topic", "api_catchup")
            .option("path", store)
            .option("maxOffsetsPerTrigger", str(limit))
            .load()
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert not query.isActive and query.exception() is None
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]

    first = run()
    assert sum(first) == 2000 and len(first) >= 4 and max(first) <= limit, first
    table = read(spark, store, "api_catchup_dst", includeMetadata="true")
    verdict = verify_exactly_once(
        table, id_column="id", key_column="account", expected_ids=range(2000)
    )
    assert verdict.ok, verdict.line()
    second = run()
    assert sum(second) == late and max(second) <= limit, second
    table = read(spark, store, "api_catchup_dst", includeMetadata="true")
    verdict = verify_exactly_once(
        table, id_column="id", key_column="account", expected_ids=range(2000 + late)
    )
    assert verdict.ok, verdict.line()


def test_overwrite_is_refused_and_nothing_is_written(spark: SparkSession, store: str) -> None:
    write(payments(spark, 100), store, "api_modes")
    before = end_offsets(store, "api_modes")
    with pytest.raises(Exception, match="mode 'overwrite' is not supported"):
        payments(spark, 100).write.format("idemlog").option("topic", "api_modes").option(
            "path", store
        ).mode("overwrite").save()
    assert end_offsets(store, "api_modes") == before


@pytest.mark.parametrize("mode", ["errorifexists", "ignore"])
def test_modes_spark_does_not_offer_python_sources_are_refused_by_spark(
    spark: SparkSession, store: str, mode: str
) -> None:
    with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        payments(spark, 10).write.format("idemlog").option("topic", "api_modes2").option(
            "path", store
        ).mode(mode).save()


def test_complete_output_mode_is_refused(spark: SparkSession, store: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    payments(spark, 10).write.parquet(str(src))
    counts = spark.readStream.schema("id bigint, account int, note string").parquet(str(src))
    query = (
        counts.groupBy("account")
        .count()
        .writeStream.format("idemlog")
        .outputMode("complete")
        .option("topic", "api_complete")
        .option("path", store)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    with pytest.raises(Exception, match="output mode 'complete' is not supported"):
        query.processAllAvailable()
    query.stop()


# -- bad input: clear errors, nothing visible ------------------------------------------------
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topik": "x"}, "unknown idemlog option 'topik' (did you mean 'topic'?)"),
        ({}, "option 'topic' is required"),
        ({"topic": "bad name!"}, "option 'topic'='bad name!': topic name 'bad name!' contains"),
        ({"topic": "api_bad", "key": "nope"}, "option 'key'='nope' names no column"),
        ({"topic": "api_bad", "partitions": "0"}, "partitions='0' is below the minimum 1"),
        ({"topic": "api_bad", "isolation": "dirty"}, "applies to reads only"),
        ({"topic": "api_bad", "producer.transactional.id": "x"}, "sets producer key"),
        ({"topic": "api_bad", "producer.linger.mss": "1"}, "linger.mss"),
        ({"topic": "api_bad", "brokers": "nohost"}, "option 'brokers'='nohost'"),
    ],
)
def test_bad_write_options_name_the_problem_and_write_nothing(
    spark: SparkSession, store: str, options: dict[str, str], message: str
) -> None:
    writer = payments(spark, 10).write.format("idemlog").option("path", store)
    for key, value in options.items():
        writer = writer.option(key, value)
    with pytest.raises(Exception, match=_escaped(message)):
        writer.mode("append").save()
    with BrokerClient(ensure_broker(store)) as client:
        assert "api_bad" not in {t.name for t in client.describe_topics()}


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        # Spark itself refuses calendar intervals in a table schema ...
        ("make_interval(0, 0, 0, 1)", 'Cannot use "INTERVAL" type in the table schema'),
        # ... and the sink refuses what has no Arrow form, naming the column.
        ("INTERVAL '1' YEAR", "column 'wait' of type interval year cannot be written"),
    ],
)
def test_unsupported_column_type_is_named(
    spark: SparkSession, store: str, expr: str, message: str
) -> None:
    df = payments(spark, 10).withColumn("wait", F.expr(expr))
    with pytest.raises(Exception, match=message):
        write(df, store, "api_types")
    with BrokerClient(ensure_broker(store)) as client:
        assert "api_types" not in {t.name for t in client.describe_topics()}


def test_schema_change_between_writes_is_refused_naming_columns(
    spark: SparkSession, store: str
) -> None:
    write(payments(spark, 100), store, "api_schema")
    before = end_offsets(store, "api_schema")
    changed = payments(spark, 100).withColumn("account", F.col("account").cast("string"))
    with pytest.raises(Exception, match=r"changed types account \(int32 -> string\)"):
        write(changed, store, "api_schema")
    extra = payments(spark, 100).withColumn("fee", F.lit(1))
    with pytest.raises(Exception, match="new columns fee"):
        write(extra, store, "api_schema")
    assert end_offsets(store, "api_schema") == before


def test_stream_whose_schema_changed_across_restarts_fails_before_writing(
    spark: SparkSession, store: str, tmp_path: Path
) -> None:
    write(payments(spark, 100), store, "api_stream_schema")
    before = end_offsets(store, "api_stream_schema")
    src = tmp_path / "src"
    payments(spark, 100).withColumn("fee", F.lit(1)).write.parquet(str(src))
    query = (
        spark.readStream.schema("id bigint, account int, note string, fee int")
        .parquet(str(src))
        .writeStream.format("idemlog")
        .option("topic", "api_stream_schema")
        .option("path", store)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    with pytest.raises(Exception, match="new columns fee"):
        query.processAllAvailable()
    query.stop()
    assert end_offsets(store, "api_stream_schema") == before


def test_reading_a_missing_topic_names_it(spark: SparkSession, store: str) -> None:
    with pytest.raises(Exception, match="topic 'api_nothing' does not exist"):
        read(spark, store, "api_nothing")


def test_read_options_are_validated(spark: SparkSession, store: str) -> None:
    write(payments(spark, 10), store, "api_read_opts")
    with pytest.raises(Exception, match="'key' applies to writes only"):
        read(spark, store, "api_read_opts", key="account")
    with pytest.raises(Exception, match="isolation='dirty' is not one of"):
        read(spark, store, "api_read_opts", isolation="dirty")


def test_batch_read_takes_a_range_of_offsets_as_kafkas_source(
    spark: SparkSession, store: str
) -> None:
    topic = "api_range"
    write(payments(spark, 400), store, topic, partitions="2", key="account")
    ends = end_offsets(store, topic)
    whole = read(spark, store, topic, includeMetadata="true")
    # Rows only: each batch's commit marker is an offset no row has.
    kept = [
        (p, o)
        for p, o in zip(whole["_partition"].to_pylist(), whole["_offset"].to_pylist(), strict=True)
    ]
    start0, end1 = 50, 120
    ranged = read(
        spark,
        store,
        topic,
        includeMetadata="true",
        startingOffsets=json.dumps({topic: {"0": start0, "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": -1, "1": end1}}),
    )
    got = sorted(zip(ranged["_partition"].to_pylist(), ranged["_offset"].to_pylist(), strict=True))
    want = sorted((p, o) for p, o in kept if (p == 0 and o >= start0) or (p == 1 and o < end1))
    assert got == want and len(got) > 100
    with pytest.raises(Exception, match=_escaped("option 'startingOffsets'='latest': a batch")):
        read(spark, store, topic, startingOffsets="latest")
    past = json.dumps({topic: {"0": ends[0] + 5, "1": -1}})
    with pytest.raises(Exception, match=_escaped(f"partition 0 is readable up to {ends[0]}")):
        read(spark, store, topic, endingOffsets=past)


def test_errors_reach_the_user_as_idemlogs_one_line(spark: SparkSession, store: str) -> None:
    """Spark wraps a Python data source's error in its own (PYTHON_DATA_SOURCE_ERROR):
    idemlog's errors arrive there as their one line, without the Python traceback, and
    as the error's ``msg`` parameter alone."""
    cases = [
        ({"topc": "x"}, "unknown idemlog option 'topc' (did you mean 'topic'?)"),
        (
            {"topic": "x", "kafka.bootstrap.servers": "h:9092"},
            "an option of Spark's Kafka connector: idemlog's is 'brokers'",
        ),
        (
            {"topic": "x", "brokers": "127.0.0.1:1"},
            "NETWORK_EXCEPTION (13): option 'brokers'='127.0.0.1:1': no broker reachable",
        ),
        ({"topic": "api_no_such_topic", "path": store}, "topic 'api_no_such_topic' does not"),
    ]
    for options, line in cases:
        reader = spark.read.format("idemlog")
        for key, value in options.items():
            reader = reader.option(key, value)
        with pytest.raises(Exception) as failure:
            reader.load()
        text = str(failure.value)
        assert line in text and "Traceback" not in text, text
        assert len(text.splitlines()) <= 2, text
        # Spark's prefix comes first (its error class's template, docs/spark.md "Errors"):
        # the line alone is the error's "msg" parameter.
        error = failure.value
        assert isinstance(error, AnalysisException)
        assert error.getCondition() == "PYTHON_DATA_SOURCE_ERROR"
        msg = (error.getMessageParameters() or {})["msg"]
        assert msg.startswith("broker_core.errors.") and line in msg, msg


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def test_python_workers_run_without_the_redundant_pyspark_zip(spark: SparkSession) -> None:
    """``local_session`` runs Spark's Python workers from ``spark_sink.worker_daemon``: the
    archives Spark puts first on their path (``pyspark.zip``, its ``spark-core`` jar) are
    dropped, so a task does not re-read them."""

    def where(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import os
        import sys
        from pathlib import Path

        import pyspark

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict(
            {
                "pythonpath": [os.environ.get("PYTHONPATH", "")],
                "on_path": [any(p.endswith(("pyspark.zip", ".jar")) for p in sys.path)],
                "pyspark": [pyspark.__file__ or ""],
                "daemon": [Path(f"/proc/{os.getppid()}/cmdline").read_text().replace("\0", " ")],
            }
        )

    row = (
        spark.range(1, numPartitions=1)
        .mapInArrow(where, "pythonpath string, on_path boolean, pyspark string, daemon string")
        .collect()[0]
    )
    # Spark did put the archive and its core jar on the workers' path: the scenario the
    # daemon is for.
    assert "pyspark.zip" in row.pythonpath and ".jar" in row.pythonpath
    assert "-m spark_sink.worker_daemon" in row.daemon
    assert not row.on_path
    assert ".zip" not in row.pyspark
