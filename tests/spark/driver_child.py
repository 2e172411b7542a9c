"""A Spark driver for the fault tests, run as its own process (``tests/spark/helpers.py``
launches it with ``start_new_session=True``).

Why a process: failpoints reach Spark's Python workers only through the environment the
JVM had when it started, and ``kill_driver`` SIGKILLs a whole driver (JVM + Python),
which must not be the pytest process. One JSON argument says what to run:

``{"mode": "stream" | "batch" | "read" | "read_stream", "src", "store", "topic",
"checkpoint", "conf": {...}, "trigger": "availableNow" | "processingTime", "files": K,
"spark_partitions": 4, "bad_partition": P, "bad_rank": 0.8, "arrow_batch_rows": N,
"sink_options": {...}, "test_hooks": true (the launcher armed failpoints: the writes name
the hooks that fire them, the option hooks), "progress_out": path (stream: each
progress's JSON appended),
"stop_on_file": path (processingTime: query.stop() once it exists), "steps": [{...}, ...]
(jobs run in turn in one session, each step's keys over the outer spec's), "out": path
(read modes: the rows read, as parquet), "master": "spark://host:port"
and "driver_host": address (a standalone cluster, ``tests/harness/cluster.py``; default:
local mode)}``. Without "store" the sink gets no ``path`` (a broker cluster named by
``sink_options["brokers"]``).

Output on stdout, one line each, flushed at once (the parent reads them as events):
``PROGRESS batch=<id> rows=<n> end=<file log offset>`` per micro-batch (a
StreamingQueryListener), ``BAD id=<id>`` (batch mode with a poisoned row),
``TIMED write_s=<s>`` (batch mode: the ``save()``'s wall time), ``FAILED <error>`` then
exit 3 when the query or job fails, ``DONE batches=<n>`` then exit 0 when it succeeds.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Any

SCHEMA_DDL = "id BIGINT, account BIGINT, amount BIGINT"
EXIT_FAILED = 3


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def file_offset(progress: Any) -> int:
    """The file source's end offset (the index of the last file read) of a progress."""
    sources = progress.sources
    if not sources or not sources[0].endOffset:
        return -1
    end = json.loads(sources[0].endOffset)
    return int(end.get("logOffset", -1)) if isinstance(end, dict) else int(end)


def stop_when_present(query: Any, path: str, timeout_s: float = 180.0) -> None:
    """``query.stop()`` once ``path`` exists (written by a task in another process)."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            say(f"FAILED {path} never appeared")
            return
        time.sleep(0.01)  # polling a file another process creates
    say("STOPPING mid-batch")
    query.stop()


def sink_options(spec: dict[str, Any]) -> dict[str, str]:
    store = {"path": spec["store"]} if spec.get("store") else {}
    return {**store, **spec.get("sink_options", {})}


def write_options(spec: dict[str, Any]) -> dict[str, str]:
    """The sink's options, with the hooks that fire the failpoints when the launcher armed
    some (``"test_hooks": true``; docs/security.md, Test hooks)."""
    from testkit.spark_failpoints import HOOKS

    hooks = {"hooks": HOOKS} if spec.get("test_hooks") else {}
    return {**sink_options(spec), **hooks}


def run_read(spark: Any, spec: dict[str, Any]) -> int:
    """``spark.read`` (mode "read") or ``readStream`` to parquet (mode "read_stream") of
    the topic, with its metadata columns; the rows go to ``spec["out"]``."""
    import pyarrow.parquet as pq

    reader = spark.readStream if spec["mode"] == "read_stream" else spark.read
    frame = (
        reader.format("idemlog")
        .option("topic", spec["topic"])
        .option("includeMetadata", "true")
        .options(**sink_options(spec))
        .load()
    )
    if spec["mode"] == "read":
        pq.write_table(frame.toArrow(), spec["out"])
    else:
        query = (
            frame.writeStream.format("parquet")
            .option("path", spec["out"])
            .option("checkpointLocation", spec["checkpoint"])
            .start()
        )
        query.processAllAvailable()
        query.stop()
    say("DONE batches=1")
    return 0


def cluster_session(spec: dict[str, Any], conf: dict[str, str]) -> Any:
    """A session on the standalone master ``spec["master"]``, the driver bound to
    ``spec["driver_host"]``, with ``format("idemlog")`` registered."""
    from pyspark.sql import SparkSession

    from spark_sink import register

    os.environ["PYSPARK_PYTHON"] = sys.executable  # the executors' Python (same venv)
    settings = {
        "spark.driver.host": spec["driver_host"],
        "spark.driver.bindAddress": spec["driver_host"],
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.executor.cores": "1",
        "spark.executor.memory": "1g",
        "spark.task.maxFailures": "4",
        "spark.sql.streaming.stopTimeout": "60s",
        **conf,
    }
    builder = SparkSession.builder.master(spec["master"]).appName("idemlog-cluster-test")
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


def run_stream(spark: Any, spec: dict[str, Any]) -> int:
    from pyspark.sql.streaming import StreamingQueryListener

    last_file = int(spec["files"]) - 1
    reached_end = threading.Event()

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            say(f"STARTED id={event.id}")

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            end = file_offset(progress)
            say(
                f"PROGRESS batch={progress.batchId} rows={progress.numInputRows} end={end} "
                f"ms={json.dumps(progress.durationMs, separators=(',', ':'))}"
            )
            if spec.get("progress_out"):  # every progress, whole, as lastProgress shows it
                with open(spec["progress_out"], "a", encoding="utf-8") as out:
                    out.write(progress.json + "\n")
            if end >= last_file:
                reached_end.set()

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            reached_end.set()  # wakes the main thread; it then reads the query's exception

    spark.streams.addListener(Progress())
    frame = (
        spark.readStream.schema(SCHEMA_DDL)
        .option("maxFilesPerTrigger", 1)
        .parquet(spec["src"])
        .repartition(int(spec.get("spark_partitions", 4)), "account")
    )
    writer = (
        frame.writeStream.format("idemlog")
        .option("topic", spec["topic"])
        .option("key", "account")
        .options(**write_options(spec))
        .option("checkpointLocation", spec["checkpoint"])
    )
    if spec.get("trigger", "availableNow") == "availableNow":
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
    else:
        query = writer.trigger(processingTime="200 milliseconds").start()
        stop_on = spec.get("stop_on_file")
        if stop_on:
            # query.stop() mid-batch: once the file appears (a failpoint fired in a task).
            threading.Thread(target=stop_when_present, args=(query, stop_on), daemon=True).start()
        # A processing-time query never ends by itself: stop it once the progress of the
        # batch that read the last file has been reported (that batch is committed).
        reached_end.wait()
        if query.exception() is None:
            query.stop()
        query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    # The listener is asynchronous; the query's own record of this run is complete now.
    say(f"DONE batches={len(query.recentProgress)}")
    return 0


def run_batch(spark: Any, spec: dict[str, Any]) -> int:
    from pyspark.sql import functions as F

    parts = int(spec.get("spark_partitions", 4))
    frame = spark.read.schema(SCHEMA_DDL).parquet(spec["src"])
    # Rows of one account in one Spark partition, in id order: per-key order is kept.
    frame = frame.repartition(parts, "account").sortWithinPartitions("id")
    if spec.get("bad_partition") is not None:
        # Spark's hash partitioning is pmod(murmur3 hash(col, seed 42), n), i.e. F.hash.
        ids = [
            r.id
            for r in spark.read.schema(SCHEMA_DDL)
            .parquet(spec["src"])
            .where(F.pmod(F.hash("account"), F.lit(parts)) == int(spec["bad_partition"]))
            .select("id")
            .orderBy("id")
            .collect()
        ]
        bad = ids[int(len(ids) * float(spec.get("bad_rank", 0.8)))]
        say(f"BAD id={bad}")
        frame = frame.withColumn(
            "amount",
            F.when(F.col("id") == bad, F.raise_error(F.lit(f"boom: poisoned row {bad}"))).otherwise(
                F.col("amount")
            ),
        )
    started = time.perf_counter()
    (
        frame.write.format("idemlog")
        .mode("append")
        .option("topic", spec["topic"])
        .option("key", "account")
        .options(**write_options(spec))
        .save()
    )
    say(f"TIMED write_s={time.perf_counter() - started:.3f}")
    say("DONE batches=1")
    return 0


def main() -> int:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    # kill_driver failpoints SIGKILL this process group: this process and its JVM.
    os.environ["IDEMLOG_DRIVER_PGID"] = str(os.getpgrp())
    from spark_sink import local_session
    from tests.harness.jvm import SHORT_LIVED_JVM_OPTIONS

    conf = {
        "spark.sql.shuffle.partitions": "4",
        # Short-lived drivers: most of a fault test's time is drivers starting.
        "spark.driver.extraJavaOptions": SHORT_LIVED_JVM_OPTIONS,
        **spec.get("conf", {}),
    }
    if spec.get("arrow_batch_rows"):
        conf["spark.sql.execution.arrow.maxRecordsPerBatch"] = str(spec["arrow_batch_rows"])
    if spec.get("master"):
        spark = cluster_session(spec, conf)
    else:
        spark = local_session("idemlog-fault-test", conf=conf, quiet=True)
    say(f"SESSION pid={os.getpid()} pgid={os.getpgrp()}")
    try:
        # "steps": jobs run one after another in this one session, each its own spec
        # on top of the outer one (a driver's start-up is paid once).
        for step in spec.get("steps") or [{}]:
            job = {**spec, **step}
            if job["mode"] == "stream":
                run_stream(spark, job)
            elif job["mode"] in ("read", "read_stream"):
                run_read(spark, job)
            else:
                run_batch(spark, job)
        return 0
    except Exception as exc:
        traceback.print_exc()
        first = " ".join(str(exc).split())[:2000]
        say(f"FAILED {type(exc).__name__}: {first}")
        return EXIT_FAILED
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
