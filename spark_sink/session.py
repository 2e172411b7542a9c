"""A correct local SparkSession for idemlog: jobs, tests, benchmarks and the notebook.

Executors run the sink in Python workers, which must be this interpreter (the one with
the project installed), so ``PYSPARK_PYTHON`` is set before the JVM starts. ``local[N,F]``
gives task retries (plain ``local[N]`` never retries, docs/design.md §6). Jars the set-up fetched
into a checkout's ``jars/`` (Delta) are passed with ``spark.jars``: nothing is downloaded at
run time. An installed wheel has no ``jars/``: the Delta export then names Delta's package
with ``spark.jars.packages`` (``spark_sink.export.delta.delta_jars_conf``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from .datasource import register

REPO = Path(__file__).resolve().parents[1]
JARS_DIR = REPO / "jars"


def project_jars() -> list[str]:
    return sorted(str(p) for p in JARS_DIR.glob("*.jar")) if JARS_DIR.is_dir() else []


def local_session(
    app_name: str = "idemlog",
    *,
    cores: int = 2,
    max_failures: int = 4,
    conf: Mapping[str, str] | None = None,
    patch_progress: bool = True,
    quiet: bool = False,
) -> SparkSession:
    """A local session with ``format("idemlog")`` registered; a session already running
    in this process is returned as is.

    As a user expects of Spark, it keeps Spark's web UI and its console progress bar. The
    Python workers run this interpreter (``PYSPARK_PYTHON`` is set to it).

    Args:
        app_name: Spark's application name.
        cores: The local cores (``local[cores, max_failures]``); shuffles use twice as
            many partitions.
        max_failures: Attempts of a task before its job fails (Spark's task retries).
        conf: Spark settings that override any default here.
        patch_progress: Put the sink's figures in ``lastProgress``/``recentProgress``
            and show every source's offsets there as JSON (``spark_sink.query_progress``;
            off in :func:`register`); False leaves pyspark's classes untouched.
        quiet: Turn off the web UI and the progress bar (tests, benchmarks and tools
            that print their own progress).

    Returns:
        The session.

    Raises:
        WorkerPythonError: As :func:`register`.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    settings = {
        "spark.ui.enabled": str(not quiet).lower(),
        "spark.ui.showConsoleProgress": str(not quiet).lower(),
        "spark.sql.shuffle.partitions": str(cores * 2),
        "spark.sql.session.timeZone": "UTC",
        # A bounded retry wait keeps fault runs fast.
        "spark.sql.streaming.stopTimeout": "60s",
        # Workers that do not re-read pyspark.zip before every task (docs/spark.md).
        "spark.python.daemon.module": "spark_sink.worker_daemon",
    }
    jars = project_jars()
    if jars:
        settings["spark.jars"] = ",".join(jars)
    settings.update(conf or {})
    builder = SparkSession.builder.master(f"local[{cores},{max_failures}]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark, patch_progress=patch_progress)
    return spark
