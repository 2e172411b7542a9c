"""JVM options of the suite's Spark JVMs: drivers, standalone masters, workers, executors.

A test's JVM lives seconds to minutes and spends most of its CPU starting: loading
Spark's classes and compiling its start-up paths. The client compiler alone (C1, no C2)
and the serial collector cut that: a local session started and running one small job
took 27 CPU s with the defaults and 17 with these on this 2-core machine (the figures
are in the commit that set them). No test measures Spark's steady-state speed (the
benchmarks' smoke runs assert no figure), and none of these options changes what a
job computes.

Set for every JVM the suite starts, in three ways: ``SPARK_SUBMIT_OPTS`` for every driver
``spark-submit`` launches (PySpark's sessions in the pytest workers, the jobs, tools and
benchmarks run as subprocesses, the wheel smoke), ``SPARK_DAEMON_JAVA_OPTS`` for the
standalone master and workers, ``spark.executor.extraJavaOptions`` for their executors.
"""

from __future__ import annotations

from collections.abc import MutableMapping

SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SUBMIT_OPTS_ENV = "SPARK_SUBMIT_OPTS"
DAEMON_OPTS_ENV = "SPARK_DAEMON_JAVA_OPTS"
EXECUTOR_OPTS_CONF = "spark.executor.extraJavaOptions"


def with_short_lived_options(current: str | None) -> str:
    """``current`` JVM options (the environment's, kept: they come later on the command
    line and so win) after :data:`SHORT_LIVED_JVM_OPTIONS`."""
    return " ".join(o for o in (SHORT_LIVED_JVM_OPTIONS, current) if o)


def set_submit_options(environ: MutableMapping[str, str]) -> None:
    """Every Spark driver started with ``environ`` (or a copy of it) gets the options."""
    current = environ.get(SUBMIT_OPTS_ENV)
    if SHORT_LIVED_JVM_OPTIONS not in (current or ""):
        environ[SUBMIT_OPTS_ENV] = with_short_lived_options(current)
