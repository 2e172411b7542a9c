"""The sink's figures reach users through an explicit API, and ``register(spark)`` changes
nothing outside idemlog (issue 26): no pyspark class attribute, no listener, no callback
server. ``spark_sink.progress(query)``, ``progress_history(query)`` and a
``SinkProgressListener`` give each micro-batch's figures; the enriched ``lastProgress`` is
an opt-in (``register(spark, patch_progress=True)``) that ``disable_enriched_progress``
undoes, leaving pyspark's own objects in place.

The module starts its own bare session (not ``local_session``, which registers the format)
so the snapshot before ``register`` is of pyspark as a user's session has it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession

from spark_sink import SinkProgressListener, progress, progress_history, register
from spark_sink.payments import KEY, SCHEMA, make_input
from spark_sink.query_progress import disable_enriched_progress, enriched_progress_enabled
from spark_sink.worker_python import WorkerPythonError

_MISSING = object()
Snapshot = dict[str, dict[str, object]]


def pyspark_classes() -> Snapshot:
    """``vars()`` of every class defined in a loaded pyspark module, by qualified name."""
    found: Snapshot = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "pyspark" or name.startswith("pyspark.")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, type) and value.__module__ == name:
                found[f"{name}.{attr}"] = dict(vars(value))
    return found


def changed(before: Snapshot, after: Snapshot) -> list[str]:
    """The attributes (``module.Class.attr``) of classes in ``before`` whose value is not
    the very object it was: replaced, added or deleted."""
    return sorted(
        f"{cls}.{attr}"
        for cls, attrs in before.items()
        for attr in set(attrs) | set(after[cls])
        if after[cls].get(attr, _MISSING) is not attrs.get(attr, _MISSING)
    )


def callback_server_started() -> bool:
    gateway = SparkContext._gateway
    return gateway is not None and gateway.__dict__.get("_callback_server") is not None


@pytest.fixture(scope="module")
def bare_spark() -> Iterator[SparkSession]:
    # A module before this one in the process may have built a local_session(), which
    # enriches lastProgress process-wide: this one starts from pyspark's own classes.
    disable_enriched_progress()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYSPARK_PYTHON", sys.executable)
        mp.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        session = (
            SparkSession.builder.master("local[2]")
            .appName("idemlog-progress-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        yield session
        session.stop()


@pytest.mark.serial
def test_register_changes_no_pyspark_class_and_figures_come_through_the_api(
    bare_spark: SparkSession, store: str, tmp_path: Path
) -> None:
    spark = bare_spark
    assert not enriched_progress_enabled()
    before = pyspark_classes()
    assert "pyspark.sql.streaming.query.StreamingQuery" in before
    assert len(before) > 100  # the snapshot covers pyspark's classes, not just one
    server_before = callback_server_started()
    register(spark)
    register(spark)  # a repeat is harmless
    assert changed(before, pyspark_classes()) == []
    assert callback_server_started() == server_before  # no listener was added

    files, rows = 3, 400
    make_input(tmp_path / "in", files, rows)
    listener = SinkProgressListener()
    spark.streams.addListener(listener)
    query = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "in"))
        .repartition(2, KEY)
        .writeStream.format("idemlog")
        .option("path", store)
        .option("topic", "progress_api")
        .option("key", KEY)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    with_rows = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in with_rows] == [rows] * files
    history = progress_history(query)
    assert [f.batch_id for f in history] == [p["batchId"] for p in with_rows]
    for p, figures in zip(with_rows, history, strict=True):
        assert progress(p) == figures
        assert figures.committed and figures.rows == rows and 1 <= figures.tasks <= 2
        assert p["sink"]["metrics"] == {}  # Spark's own progress, as Spark made it
    assert progress(query) == history[-1]
    assert listener.wait_for_batch(str(query.id), history[-1].batch_id) == history[-1]
    spark.streams.removeListener(listener)  # after its last event: they arrive asynchronously
    assert query.lastProgress is not None and query.lastProgress["sink"]["metrics"] == {}

    # The opt-in: the same query's progress enriched, and exactly two attributes replaced.
    register(spark, patch_progress=True)
    try:
        assert enriched_progress_enabled()
        enriched = [p for p in query.recentProgress if p["numInputRows"] > 0]
        assert [p["sink"]["metrics"] for p in enriched] == [f.metrics() for f in history]
        assert changed(before, pyspark_classes()) == [
            "pyspark.sql.streaming.query.StreamingQuery.lastProgress",
            "pyspark.sql.streaming.query.StreamingQuery.recentProgress",
        ]
    finally:
        disable_enriched_progress()
    assert changed(before, pyspark_classes()) == []
    assert not enriched_progress_enabled()


def test_register_refuses_a_session_whose_workers_cannot_import_idemlog(
    bare_spark: SparkSession, tmp_path: Path
) -> None:
    """Issue 37: a user's own session whose workers run an interpreter without idemlog
    (``python3`` by default) is told at ``register`` what to set, not in its first task."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')  # no site: no idemlog
    python.chmod(0o755)
    context = bare_spark.sparkContext
    started_with = context.pythonExec
    context.pythonExec = str(python)  # as a SparkContext started with that PYSPARK_PYTHON has it
    try:
        with pytest.raises(WorkerPythonError) as err:
            register(bare_spark)
    finally:
        context.pythonExec = started_with
    assert f"Spark's Python workers run {str(python)!r}" in str(err.value)
    assert f"set PYSPARK_PYTHON={sys.executable}" in str(err.value)
    register(bare_spark)  # with the interpreter it started with: accepted
