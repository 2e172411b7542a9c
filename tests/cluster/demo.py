"""``make demo-cluster``: the streaming demo on a cluster of hosts of their own.

The multi-host test bed (``tests/harness/netns.py``; root needed) gets ZooKeeper and three
brokers, a Spark standalone master and two workers, and the driver, each on a host (a
network namespace) of its own (``tests/cluster/stack.py``). A stream of ``--files``
micro-batches is written with ``writeStream.format("idemlog")`` and the ``brokers``
option while the demo breaks things on purpose:

* batch 1: a task raises on its first attempt (Spark retries it, the retry fences it);
* batch 2: the executor JVM running a task is SIGKILLed mid-write;
* batch 3: a worker's host is cut off the network mid-write for 20 s, then healed;
* batch 4: the driver is SIGKILLed with its commit request in flight, and the query is
  restarted from its checkpoint.

Then every row is read back by the broker client (not Spark) and checked: the last lines
are the same ``exactly_once=OK ...`` verdict as ``make demo`` and a table of the faults.
Everything is removed at the end, also on failure or Ctrl-C.

``--secured`` (``make demo-cluster DEMO_ARGS=--secured``) runs it on the secured stack of
``tests/cluster/secured.py``: TLS with client certificates and SCRAM on every link,
ZooKeeper over TLS with node ACLs, the authorizer on, the job as user ``writer`` with the
minimal ACLs of a job (its topic is then ``sec_payments``, its query id fixed).
"""

from __future__ import annotations

import argparse
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from spark_sink.verify import verify_exactly_once
from tests.cluster.secured import TOPIC_PREFIX, Security, fix_query_id
from tests.cluster.stack import Stack, executor_of, fired_by, host_of, running_stack
from tests.harness.cluster import read_back, spark_events
from tests.spark.helpers import DriverLauncher, DriverRun

TOPIC = "payments"
FAILPOINTS = (
    "before_write@1/1=raise",  # a task crashes on its first attempt
    "mid_write@2/1=sleep:30",  # the demo SIGKILLs this task's executor JVM
    "mid_write@3/2=sleep:30",  # the demo cuts this task's worker host off
    "inside_commit@4=kill_driver",  # the driver dies with its commit in flight
)
WORKER_CUT_S = 20.0
CONF = {
    # Lost executors noticed in seconds (Spark's default is two minutes).
    "spark.network.timeout": "15s",
    "spark.network.timeoutInterval": "5s",
    "spark.executor.heartbeatInterval": "2s",
}


def _relay(run: DriverRun) -> None:
    """Print the driver's progress lines as they come."""

    def pump() -> None:
        while True:
            try:
                line = run.events.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                return
            print(f"  driver: {line[:150]}", flush=True)

    threading.Thread(target=pump, daemon=True).start()


def _break_things(stack: Stack, marks: Path, run: DriverRun) -> dict[str, str]:
    """Act on the faults the failpoints announce; what was done, for the table."""
    done: dict[str, str] = {}
    executor = executor_of(fired_by(marks, FAILPOINTS[1], run))
    print(f"SIGKILL of the executor JVM (pid {executor.pid}) running a task of batch 2")
    executor.send_signal(signal.SIGKILL)
    executor.wait(30)
    done["executor JVM SIGKILLed mid-write"] = f"pid {executor.pid}"
    host = host_of(stack, fired_by(marks, FAILPOINTS[2], run))
    print(f"cutting {host.name} ({host.address}) off the network for {WORKER_CUT_S:.0f} s")
    host.cut()
    try:
        time.sleep(WORKER_CUT_S)  # the fault: the host stays cut off this long
    finally:
        host.heal()
    done["worker host cut off mid-write, healed"] = f"{host.name}, {WORKER_CUT_S:.0f} s"
    return done


def run_demo(stack: Stack, work: Path, files: int, rows: int) -> int:
    topic = TOPIC
    if stack.security is not None:
        # The writer's ACLs name the topics prefixed TOPIC_PREFIX and the stream's sink id
        # fixed by the checkpoint's metadata (tests/cluster/secured.py, Security.grant).
        topic = f"{TOPIC_PREFIX}{TOPIC}"
        fix_query_id(work / "checkpoint")
    for host in stack.bed.hosts:
        print(f"  host {host.name:<8} {host.address}")
    print(f"streaming {files * rows} rows in {files} micro-batches to {stack.brokers.bootstrap}")
    print(f"injected failures: {', '.join(FAILPOINTS)}")
    drivers = DriverLauncher(work)
    try:
        stream = stack.start_stream(
            drivers,
            work,
            topic,
            files=files,
            rows=rows,
            failpoints=FAILPOINTS,
            conf=CONF,
            # The run's transactions outlive a lost host until Spark has retried its task.
            sink_options={"transaction.timeout.ms": "60000"},
        )
        _relay(stream.run)
        done = _break_things(stack, stream.marks, stream.run)
        restarts = 0
        while stream.run.wait() == -signal.SIGKILL and restarts < 2:
            restarts += 1
            print(
                "driver killed (SIGKILL) with its commit in flight; restarting from the checkpoint"
            )
            _relay(stack.restart(drivers, stream))
        if stream.run.proc.returncode != 0:
            print(f"exactly_once=FAIL driver exited with status {stream.run.proc.returncode}")
            print(stream.run.describe())
            return 1
    finally:
        drivers.close()
    done["driver SIGKILLed, commit in flight; restarts"] = str(restarts)
    removed = len(spark_events(stream.events, "SparkListenerExecutorRemoved"))
    done["executors Spark lost (event log)"] = str(removed)
    with stack.brokers.client() as client:
        table = read_back(client, topic)
        txns = client.metrics()["transactions"] or {}
    verdict = verify_exactly_once(
        table, id_column="id", key_column="account", expected_ids=stream.ids
    )
    done["transactions fenced / aborted / committed"] = (
        f"{txns.get('transactions_fenced', 0)} / {txns.get('transactions_aborted', 0)} / "
        f"{txns.get('transactions_committed', 0)}"
    )
    print(verdict.line())
    width = max(map(len, done))
    print(f"{'fault or figure':<{width}}  value\n{'-' * width}  -----")
    for name, value in done.items():
        print(f"{name:<{width}}  {value}")
    return 0 if verdict.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Build the test bed, run the demo, remove everything; 0 if every row is there
    exactly once in per-key order."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", type=int, default=6, help="micro-batches (input files)")
    parser.add_argument("--rows", type=int, default=20_000, help="rows per micro-batch")
    parser.add_argument("--workdir", help="default: a new temporary directory, removed after")
    parser.add_argument(
        "--secured",
        action="store_true",
        help="SASL_SSL with client certificates on every link, ZooKeeper over TLS",
    )
    args = parser.parse_args(argv)
    if args.files < 5:
        parser.error("--files must be at least 5 (the failures hit batches 1 to 4)")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="idemlog-cluster-demo-"))
    print("starting ZooKeeper, 3 brokers, a Spark master and 2 workers, each on a host of its own")
    try:
        security = Security.create(work / "security") if args.secured else None
        if security is not None:
            print(
                "secured: SASL_SSL, client certificates required, the authorizer with the "
                "minimal ACLs, ZooKeeper over TLS with node ACLs"
            )
        with running_stack(work, security=security) as stack:
            return run_demo(stack, work, args.files, args.rows)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
