"""``spark_sink/export/delta.py`` (and its entries, ``python -m jobs.delta_export`` and
``idemlog export delta``) against a real Delta table in a real local session.

One session with Delta (``local_session(conf=delta_conf())``, the jars from ``make
jars``) and one embedded broker for the module; each test uses its own topics and tables.
The session is stopped at the end of the module, before the broker (only one SparkContext
per process: the other modules start and stop their own).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from broker_core.client.broker_client import BrokerClient
from jobs.delta_export import main
from spark_sink.embedded import ensure_broker, stop_broker
from spark_sink.export.delta import (
    ExportError,
    Source,
    export,
    format_offsets,
    plan_export,
    write_export,
)
from spark_sink.metrics_recorder import SCHEMA as METRICS_SCHEMA
from spark_sink.metrics_recorder import MetricsRecorder, read_metrics
from tests.harness.waiting import wait_until
from tests.spark.helpers import delta_test_session


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = str(tmp_path_factory.mktemp("delta_store"))
    yield path
    stop_broker(path)


@pytest.fixture(scope="module")
def spark(store: str) -> Iterator[SparkSession]:
    with delta_test_session("idemlog-delta-export-tests") as session:
        yield session


def quiet(_line: str) -> None:
    pass


def payments(spark: SparkSession, first: int, n: int) -> DataFrame:
    return spark.range(first, first + n).selectExpr(
        "id", "cast(id % 3 as int) AS region", "id * 10 AS amount"
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


def stable_offsets(store: str, topic: str) -> dict[int, int]:
    with BrokerClient(ensure_broker(store)) as client:
        parts = len(client.describe_topics([topic])[0].partitions)
        return {p: client.list_offsets(topic, p)["last_stable_offset"] for p in range(parts)}


def ids(spark: SparkSession, table: str, version: int | None = None) -> list[int]:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return sorted(int(r["id"]) for r in reader.load(table).select("id").collect())


def latest_version(spark: SparkSession, table: str) -> int:
    row = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").first()
    assert row is not None
    return int(row["version"])


# -- incremental export ---------------------------------------------------------------------
def test_export_is_incremental_exactly_once_partitioned_and_time_travels(
    spark: SparkSession, store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic, table = "dx_incr", str(tmp_path / "payments")
    source = Source(topic, path=store)
    append(payments(spark, 0, 50), store, topic)
    append(payments(spark, 50, 50), store, topic)

    first = export(spark, source, table, "region", log=quiet)
    assert first.wrote and first.rows == 100 and first.delta_version == 0
    assert first.plan.run == 1
    assert first.plan.start == {0: 0, 1: 0}
    assert first.plan.end == stable_offsets(store, topic)
    assert ids(spark, table) == list(range(100))
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").first()
    assert detail is not None and list(detail["partitionColumns"]) == ["region"]
    assert spark.read.format("delta").load(table).columns == [
        "id",
        "region",
        "amount",
        "_partition",
        "_offset",
    ]

    # Nothing new: no rows, no commit.
    again = export(spark, source, table, "region", log=quiet)
    assert again.line() == "nothing new" and not again.wrote
    assert latest_version(spark, table) == 0

    # More rows: only those; through the command line this time.
    append(payments(spark, 100, 30), store, topic)
    assert (
        main(["--topic", topic, "--path", store, "--table", table, "--partition-by", "region"]) == 0
    )
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == (
        f"exported rows=30 from={format_offsets(first.plan.end)} "
        f"to={format_offsets(stable_offsets(store, topic))} delta_version=1"
    ), out
    rows = spark.read.format("delta").load(table)
    assert ids(spark, table) == list(range(130))  # each id once
    assert rows.select("_partition", "_offset").distinct().count() == 130

    # Time travel: version 0 is the first export; the history chains the ranges.
    assert ids(spark, table, version=0) == list(range(100))
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").orderBy("version").collect()
    assert [h["version"] for h in history] == [0, 1]
    assert '"run":2' in history[1]["userMetadata"]
    assert f'"from":{format_offsets(first.plan.end)}' in history[1]["userMetadata"]


# -- idempotence ----------------------------------------------------------------------------
def test_a_run_repeated_after_its_commit_writes_nothing(
    spark: SparkSession, store: str, tmp_path: Path
) -> None:
    topic, table = "dx_replay", str(tmp_path / "replay")
    source = Source(topic, path=store)
    append(payments(spark, 0, 40), store, topic)

    plan = plan_export(spark, source, table, "region", log=quiet)
    first = write_export(spark, source, plan, log=quiet)
    assert first.wrote and first.rows == 40
    # The process "crashed" after the Delta commit: the same run (same txnVersion, same
    # offsets) is written again, and Delta skips it.
    second = write_export(spark, source, plan, log=quiet)
    assert second.already_committed and not second.wrote
    assert second.delta_version == first.delta_version == latest_version(spark, table)
    assert second.line().startswith("nothing new (run 1 ")
    assert ids(spark, table) == list(range(40))

    # The next run continues after the committed one.
    assert export(spark, source, table, "region", log=quiet).line() == "nothing new"
    append(payments(spark, 40, 20), store, topic)
    third = export(spark, source, table, "region", log=quiet)
    assert third.plan.run == 2 and third.rows == 20 and third.plan.start == plan.end
    assert ids(spark, table) == list(range(60))


def _export_killed_when(table: Path, store: str, topic: str, seen: Callable[[], bool]) -> None:
    """Run the export job in its own process group and SIGKILL the group as soon as
    ``seen()`` (a file of the write appeared). The job's Spark driver dies with it."""
    args = ["--topic", topic, "--path", store, "--table", str(table), "--partition-by", "region"]
    job = subprocess.Popen(
        [sys.executable, "-m", "jobs.delta_export", *args],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def reached() -> bool:  # watching the table directory for the event
        if seen():
            return True
        assert job.poll() is None, f"the export ended ({job.returncode}) before the event"
        return False

    try:
        # A short interval: the kill must land right after the event, not a while later.
        wait_until(reached, "the export to reach the event", timeout=180, interval=0.002)
        os.killpg(job.pid, signal.SIGKILL)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        assert job.wait(30) == -signal.SIGKILL


def _data_files(table: Path) -> list[Path]:
    return [p for p in table.rglob("*.parquet") if "_delta_log" not in p.parts]


@pytest.mark.slow
def test_an_export_killed_while_writing_or_after_its_commit_is_rerun_once(
    spark: SparkSession, store: str, tmp_path: Path
) -> None:
    topic = "dx_killed"
    source = Source(topic, path=store)
    append(payments(spark, 0, 20_000), store, topic)

    # SIGKILL once the first data file exists: Delta has not committed yet (or only just).
    table = tmp_path / "killed_mid_write"
    _export_killed_when(table, store, topic, lambda: bool(_data_files(table)))
    committed = (table / "_delta_log" / "00000000000000000000.json").exists()
    print(f"killed mid-write: committed before the kill: {committed}")
    rerun = export(spark, source, str(table), "region", log=quiet)
    assert rerun.line() == "nothing new" if committed else rerun.rows == 20_000
    assert ids(spark, str(table)) == list(range(20_000))  # the killed run left no rows

    # SIGKILL right after the Delta commit, before the job could report: the rerun finds
    # the run committed in the table's history and writes nothing.
    table = tmp_path / "killed_after_commit"
    first_commit = table / "_delta_log" / "00000000000000000000.json"
    _export_killed_when(table, store, topic, first_commit.exists)
    assert export(spark, source, str(table), "region", log=quiet).line() == "nothing new"
    append(payments(spark, 20_000, 100), store, topic)
    assert export(spark, source, str(table), "region", log=quiet).rows == 100
    assert ids(spark, str(table)) == list(range(20_100))


# -- refusals -------------------------------------------------------------------------------
def test_missing_topic_column_or_other_partitioning_is_refused_with_status_2(
    spark: SparkSession, store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = str(tmp_path / "refused")
    args = ["--path", store, "--table", table]
    assert main(["--topic", "dx_nope", *args, "--partition-by", "region"]) == 2
    err = capsys.readouterr().err
    assert "topic 'dx_nope' does not exist" in err, err

    append(payments(spark, 0, 6), store, "dx_cols")
    assert main(["--topic", "dx_cols", *args, "--partition-by", "nope"]) == 2
    err = capsys.readouterr().err
    assert "partition column 'nope' is not a column of topic 'dx_cols'" in err, err
    assert "id, region, amount, _partition, _offset" in err

    export(spark, Source("dx_cols", path=store), table, "region", log=quiet)
    with pytest.raises(ExportError, match=r"partitioned by \['region'\], not by \['amount'\]"):
        export(spark, Source("dx_cols", path=store), table, "amount", log=quiet)
    assert ids(spark, table) == list(range(6))


# -- the metrics table -----------------------------------------------------------------------
def test_the_metrics_table_reads_the_same_in_spark_and_pandas(
    spark: SparkSession, store: str, tmp_path: Path
) -> None:
    append(payments(spark, 0, 30), store, "dx_metrics")
    table = str(tmp_path / "metrics")
    recorder = MetricsRecorder(table, lambda: ensure_broker(store), interval_s=3600)
    recorder.record_once()
    append(payments(spark, 30, 30), store, "dx_metrics")
    recorder.record_once()
    frame = read_metrics(table)
    df = spark.read.format("delta").load(table)
    assert df.count() == len(frame) == recorder.rows_written
    assert [f.name for f in df.schema.fields] == [f.name for f in METRICS_SCHEMA]
    values = [
        r["value"]
        for r in df.where("scope = 'total' AND metric = 'records_appended'")
        .orderBy("recorded_at")
        .select("value")
        .collect()
    ]
    assert values[-1] - values[0] == 30
    assert df.select("day").distinct().count() == 1  # the partition column


# -- Delta on this Spark --------------------------------------------------------------------
# Guards the pyspark and delta-spark pins in pyproject.toml: Delta's jars are compiled against
# one Spark release and use its internals (Delta 4.1.0, built for Spark 4.1.0, failed here on
# Spark 4.1.2 with NoSuchMethodError ParquetToSparkSchemaConverter), and reading a table that
# has a checkpoint is where such a mismatch showed.
def test_the_table_stays_usable_past_a_checkpoint(spark: SparkSession, tmp_path: Path) -> None:
    # Last in the module: on an incompatible Spark the JVM error may leave the session odd.
    table = str(tmp_path / "checkpointed")
    key = "spark.databricks.delta.properties.defaults.checkpointInterval"
    spark.conf.set(key, "2")
    try:
        for i in range(3):
            spark.range(i * 2, i * 2 + 2).write.format("delta").mode("append").save(table)
    finally:
        spark.conf.unset(key)
    assert any(p.name.endswith(".checkpoint.parquet") for p in Path(table, "_delta_log").iterdir())
    assert ids(spark, table) == list(range(6))
    assert latest_version(spark, table) == 2


def test_idemlog_export_delta_reports_progress_and_its_result_line(
    spark: SparkSession, store: str, tmp_path: Path
) -> None:
    """The installed spelling, ``idemlog export delta``, in a process of its own: the
    steps and progress on stderr, the result line alone on stdout."""
    topic = "dx_cli"
    append(payments(spark, 0, 25), store, topic)
    table = str(tmp_path / "cli")
    args = ["--topic", topic, "--path", store, "--table", table, "--partition-by", "region"]
    command = [sys.executable, "-m", "broker_core.cli.main", "export", "delta", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"exported rows=25 from={format_offsets({p: 0 for p in stable_offsets(store, topic)})} "
        f"to={format_offsets(stable_offsets(store, topic))} delta_version=0"
    ], done.stdout
    assert "export delta: run 1: " in done.stderr and " offsets to read over " in done.stderr
    assert "export delta: run 1: 25 rows committed" in done.stderr, done.stderr
    # The Spark job's tasks, as they finished: at least the closing line, all of them done.
    finished = re.findall(r"export delta: run 1: writing: (\d+)/(\d+) \(100%\)", done.stderr)
    assert finished and finished[-1][0] == finished[-1][1] != "0", done.stderr
    assert ids(spark, table) == list(range(25))
