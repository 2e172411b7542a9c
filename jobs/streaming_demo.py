"""The main job (``make demo``): a Spark stream written exactly once through injected failures.

A deterministic stream of payments (``--files`` parquet files of ``--rows`` rows, one
file per micro-batch) is written with ``writeStream.format("idemlog")`` to the embedded
default broker, while the demo breaks things on purpose:

* a task raises on its first attempt (Spark retries it: the retry fences the attempt);
* a Python worker is killed with SIGKILL halfway through its write;
* the driver process is killed with SIGKILL while its commit request is in flight, and
  the query is restarted from its checkpoint (Spark re-runs and re-commits that batch).

The driver runs in a child process (this module with ``--child``) so it can be killed
for real. At the end the topic is read back with ``spark.read.format("idemlog")`` and
compared with the input: every payment exactly once, each account's payments in order.
The last lines are the verdict and a table of what the broker deduplicated and fenced.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from spark_sink.payments import KEY, SCHEMA, TOPIC, make_input
from spark_sink.verify import Verdict, verify_exactly_once

# testkit.spark_failpoints, named, not imported: jobs sit below the testkit.
FAULT_HOOKS = "testkit.spark_failpoints:SparkFailpoints"
CHECKOUT = Path(__file__).resolve().parents[1]
FAILPOINTS = (
    "before_write@1/1=raise",  # a task crashes on its first attempt
    "mid_write@2/2=kill_worker",  # a Python worker dies mid-write
    "inside_commit@3=kill_driver",  # the driver dies with its commit in flight
)


# -- the driver (child process) ------------------------------------------------------------
def run_driver(work: Path) -> int:
    os.environ["IDEMLOG_DRIVER_PGID"] = str(os.getpgrp())  # kill_driver kills this group
    from pyspark.sql.streaming.listener import StreamingQueryListener

    from spark_sink import local_session, progress, progress_spool

    # The sink's per-batch figures stay with the demo's files (set before Spark starts).
    os.environ.setdefault(progress_spool.ENV_DIR, str(work / "progress"))

    spark = local_session(
        "idemlog-demo",
        cores=2,
        max_failures=4,
        # The demo prints its own lines; the bar would cut through them (the UI stays).
        conf={"spark.ui.showConsoleProgress": "false"},
    )

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            sink = progress(p)  # the sink's figures of this batch (docs/spark.md)
            figures = (
                f" duplicates_acked={sink.duplicates_acked} tasks_reused={sink.tasks_reused} "
                f"commit_ms={sink.commit_ms:.0f}"
                if sink is not None
                else ""
            )
            print(
                f"progress batch={p.batchId} rows={p.numInputRows} "
                f"duration_ms={p.durationMs.get('triggerExecution', 0)}{figures}",
                flush=True,
            )

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    spark.streams.addListener(Progress())
    store = str(work / "store")
    query = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(work / "incoming"))
        .repartition(4, KEY)
        .writeStream.format("idemlog")
        .option("topic", TOPIC)
        .option("key", KEY)
        .option("path", store)
        .option("checkpointLocation", str(work / "checkpoint"))
        # The demo injects failures (IDEMLOG_SPARK_FAILPOINTS): through hooks the job names,
        # from the checkout's testkit/ (never shipped; docs/security.md, Test hooks).
        .option("hooks", FAULT_HOOKS)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    # Read back through the source, read_committed, with where each row sits in the log.
    table = (
        spark.read.format("idemlog")
        .option("topic", TOPIC)
        .option("path", store)
        .option("includeMetadata", "true")
        .load()
        .toArrow()
    )
    pq.write_table(table, work / "readback.parquet")
    spark.stop()
    return 0


# -- the demo (parent) -----------------------------------------------------------------------
def _launch(work: Path, env: dict[str, str]) -> int:
    """Run one driver; its output is relayed line by line. Returns its exit status."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs.streaming_demo", "--child", "--workdir", str(work)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=open(work / "driver.log", "ab"),  # noqa: SIM115 - owned by the child
        text=True,
        start_new_session=True,  # its own process group: kill_driver takes all of it
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        print(f"  {line.rstrip()}", flush=True)
    return proc.wait()


def _metrics(store: str) -> dict[str, Any]:
    from broker_core.client.broker_client import BrokerClient
    from spark_sink.embedded import ensure_broker

    with BrokerClient(ensure_broker(store)) as client:
        return client.metrics()


def metrics_table(doc: dict[str, Any], restarts: int) -> str:
    totals, txns = doc["totals"], doc["transactions"]
    rows = [
        ("driver restarts from the checkpoint", restarts),
        ("duplicate batches answered with their offsets", totals["duplicates_in_window"]),
        ("duplicate batches beyond the window", totals["duplicates_beyond_window"]),
        ("out-of-order batches rejected", totals["out_of_order"]),
        ("zombie appends fenced", totals["fenced_appends"]),
        ("task attempts fenced (their transaction aborted)", txns["transactions_fenced"]),
        ("transactions aborted", txns["transactions_aborted"]),
        ("transactions committed", txns["transactions_committed"]),
        ("batch commits repeated after restart (aborted)", txns["sink_batches_repeated"]),
        ("attempts reusing a prepared transaction", txns.get("sink_attempts_reused", 0)),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"{'dedup metric':<{width}}  value", f"{'-' * width}  -----"]
    lines += [f"{name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jobs.streaming_demo`` (``make demo``): stream the generated payments
    into the embedded broker through a driver child that the injected failures kill and
    that is restarted from its checkpoint, then read the topic back and check it.

    Returns 0 if every payment is there exactly once with each key in order, 1 otherwise
    or if the driver failed other than by an injected kill (the verdict or the status is
    printed). The embedded broker is stopped and the work directory removed (unless
    ``--workdir`` or ``--keep``) in every case.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", help="default: a new temporary directory, removed after")
    parser.add_argument("--files", type=int, default=8, help="micro-batches (input files)")
    parser.add_argument("--rows", type=int, default=25_000, help="rows per micro-batch")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    if args.child:
        return run_driver(Path(args.workdir))

    work = Path(args.workdir or tempfile.mkdtemp(prefix="idemlog-demo-"))
    if args.files < 4:
        parser.error("--files must be at least 4 (the failures hit batches 1 to 3)")
    shutil.rmtree(work, ignore_errors=True)
    (work / "failpoints").mkdir(parents=True)
    expected = make_input(work / "incoming", args.files, args.rows)
    store = str(work / "store")
    env = dict(os.environ)
    env["IDEMLOG_SPARK_FAILPOINTS"] = ";".join(FAILPOINTS)
    env["IDEMLOG_SPARK_FAILPOINTS_DIR"] = str(work / "failpoints")
    # The hooks live in the checkout, not in the package: Spark's Python workers find them
    # through the PYTHONPATH they inherit.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), env.get("PYTHONPATH")) if p)
    print(f"streaming {expected} payments in {args.files} micro-batches into {store}")
    print(f"injected failures: {', '.join(FAILPOINTS)}")
    restarts = 0
    try:
        while True:
            status = _launch(work, env)
            if status == 0:
                break
            if status != -signal.SIGKILL or restarts >= len(FAILPOINTS):
                print(f"exactly_once=FAIL driver exited with status {status} (see {work})")
                return 1
            restarts += 1
            print("driver killed (SIGKILL); restarting the query from its checkpoint")
        table = pq.read_table(work / "readback.parquet")
        verdict: Verdict = verify_exactly_once(
            table, id_column="payment_id", key_column=KEY, expected_ids=range(expected)
        )
        doc = _metrics(store)
        print(verdict.line())
        print(metrics_table(doc, restarts))
        return 0 if verdict.ok else 1
    finally:
        from spark_sink.embedded import stop_broker

        stop_broker(store)
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
