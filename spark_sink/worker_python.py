"""The interpreter Spark's Python workers run, checked when the format is registered.

A session's Python workers (tasks, and the driver-side planning and commit of a Python
data source) run ``SparkContext.pythonExec``: ``PYSPARK_PYTHON`` as it was when the
SparkContext started, else ``python3``. When that is not the interpreter idemlog is
installed in, the first query fails deep in a task with ``ModuleNotFoundError: No module
named 'spark_sink'``. :func:`check_worker_python` finds that out at ``register(spark)``
and says what to set (docs/deployment.md, "Registering the format").

Only a ``local`` master can be checked from here: a cluster's executors run on other
hosts, where the same path must hold idemlog (docs/deployment.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from pyspark.sql import SparkSession

from broker_core.errors import InvalidConfigError

# Starting an interpreter and importing the package: generous for a loaded machine.
CHECK_TIMEOUT_S = 60.0


class WorkerPythonError(InvalidConfigError):
    """Spark's Python workers would run an interpreter that cannot import idemlog
    (INVALID_CONFIG: the environment the session was started with, not a request)."""


def check_worker_python(spark: SparkSession) -> None:
    """Raise WorkerPythonError when ``spark`` is local and its Python workers' interpreter
    cannot import ``spark_sink``; return at once when it is this interpreter (as
    ``local_session()`` sets it) or the master is not local (unknowable from here)."""
    context = spark.sparkContext
    if not (context.master or "").startswith("local"):
        return
    configured = context.pythonExec
    resolved = shutil.which(configured) or configured
    if os.path.realpath(resolved) == os.path.realpath(sys.executable):
        return
    source = (
        "PYSPARK_PYTHON" if "PYSPARK_PYTHON" in os.environ else "the default, PYSPARK_PYTHON unset"
    )
    try:
        done = subprocess.run(
            [resolved, "-c", "import spark_sink"],
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        reason = f"{type(exc).__name__}: {exc}"
    else:
        if done.returncode == 0:
            return
        lines = done.stderr.strip().splitlines()
        reason = lines[-1] if lines else f"exit {done.returncode}"
    raise WorkerPythonError(
        f"Spark's Python workers run {configured!r} ({source}, read when the SparkContext "
        f"started), which cannot import idemlog ({reason}): set "
        f"PYSPARK_PYTHON={sys.executable} before the session starts, or build it with "
        "spark_sink.local_session()"
    )
