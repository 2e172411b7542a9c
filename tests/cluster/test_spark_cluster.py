"""idemlog on a Spark standalone cluster and a three-broker cluster, each part on a host
of its own (``tests/cluster/stack.py``), every row checked exactly once in per-key order
by a reader independent of Spark (the broker client):

* the stream, the batch write and both readers work as on one machine;
* speculative twins, launched by Spark on the other worker's host (its event log shows
  them), in both orders and killed mid-write;
* an executor JVM SIGKILLed, a worker's host and the driver's host cut off and healed.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pyarrow.parquet as pq

from spark_sink.verify import verify_exactly_once
from tests.cluster.stack import Stack, executor_of, fired_by, host_of
from tests.harness.cluster import TaskAttempt, read_back, spark_events, task_attempts
from tests.spark.helpers import (
    DriverLauncher,
    assert_succeeded,
    batch_spec,
    make_input,
    stream_spec,
)
from tests.spark.test_faults import fired

FILES, ROWS = 4, 5000


def task_hosts(events: Path) -> set[str]:
    """The hosts Spark's event logs say tasks ran on."""
    return {e["Task Info"]["Host"] for e in spark_events(events, "SparkListenerTaskEnd")}  # type: ignore[index]


def assert_exactly_once(stack: Stack, topic: str, ids: list[int]) -> None:
    with stack.brokers.client() as client:
        table = read_back(client, topic)
    verdict = verify_exactly_once(table, id_column="id", key_column="account", expected_ids=ids)
    assert verdict.ok, verdict.line()
    assert verdict.order_violations == 0


def test_stream_batch_and_both_readers_on_the_cluster(
    stack: Stack, drivers: DriverLauncher, tmp_path: Path
) -> None:
    """One application on the cluster: a stream, then ``df.write`` of the same rows to
    another topic, then ``spark.read`` and ``readStream`` of the first topic."""
    src = tmp_path / "src"
    ids = make_input(src, FILES, ROWS)
    events = tmp_path / "events"
    out = {mode: tmp_path / f"{mode}.out" for mode in ("read", "read_stream")}
    steps = [
        stream_spec(src, "", "cl_stream", tmp_path / "ck", FILES),
        batch_spec(src, "", "cl_batch"),
        {"mode": "read", "topic": "cl_stream", "out": str(out["read"])},
        {
            "mode": "read_stream",
            "topic": "cl_stream",
            "out": str(out["read_stream"]),
            "checkpoint": str(tmp_path / "ck-read"),
        },
    ]
    spec = stack.spec(events, steps=steps)
    run = stack.start(drivers, spec)
    run.wait()
    assert_succeeded(run)
    # The stream's micro-batches, one per file (the readStream step's follow).
    assert run.progress_batches()[:FILES] == list(range(FILES))
    assert sum(line.startswith("DONE") for line in run.lines) == len(steps)
    workers = {h.address for h in stack.spark.worker_hosts}
    assert task_hosts(events) == workers, "tasks ran on both worker hosts"
    assert_exactly_once(stack, "cl_stream", ids)
    assert_exactly_once(stack, "cl_batch", ids)
    for mode, path in out.items():
        table = pq.read_table(path)
        verdict = verify_exactly_once(table, id_column="id", key_column="account", expected_ids=ids)
        assert verdict.ok and verdict.order_violations == 0, f"{mode}: {verdict.line()}"


SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "1s",
    # A task asleep at a failpoint processes no rows; judge stragglers by time alone.
    "spark.speculation.efficiency.enabled": "false",
}
# Spark partition 2 straggles in micro-batches 1-3; entries at one point fire in order,
# so the first attempt to get there takes the first, its twin the second.
TWIN_FAILPOINTS = (
    # 1: the twin finishes first (the original sleeps mid-write; the twin fences it).
    "mid_write@1/2=sleep:40",
    # 2: the original finishes first (prepared, then slow); the twin is held back before
    # it writes anything and is killed when the original succeeds.
    "before_write@2/2=sleep:0",
    # Long enough for speculation to start the twin on a loaded machine: that it did is
    # checked below (before_write@2/2 fires a second time).
    "after_prepare@2/2=sleep:20",
    "before_write@2/2=sleep:60",
    # 3: the twin is killed mid-write (SIGKILL of its Python worker) while the original
    # sleeps mid-write; the original, fenced by the twin, fails; a retry writes.
    "mid_write@3/2=sleep:15",
    "mid_write@3/2=kill_worker",
)


def test_speculative_twins_on_another_host_commit_one_copy(
    stack: Stack, drivers: DriverLauncher, tmp_path: Path
) -> None:
    stream = stack.start_stream(
        drivers,
        tmp_path,
        "cl_twins",
        files=FILES,
        rows=ROWS,
        failpoints=TWIN_FAILPOINTS,
        conf=SPECULATION,
    )
    run, ids, events, marks = stream.run, stream.ids, stream.events, stream.marks
    run.wait()
    assert_succeeded(run)
    assert fired(marks) == set(TWIN_FAILPOINTS), "every straggler and twin reached its point"
    attempts = [a for a in task_attempts(events) if a.index == 2 and a.batch in (1, 2, 3)]
    print("\n".join(map(str, attempts)))

    def of(batch: int) -> tuple[list[TaskAttempt], list[TaskAttempt]]:
        mine = [a for a in attempts if a.batch == batch]
        return [a for a in mine if not a.speculative], [a for a in mine if a.speculative]

    for batch in (1, 2, 3):
        originals, twins = of(batch)
        assert twins, f"batch {batch}: Spark launched no speculative attempt"
        assert twins[0].host != originals[0].host, f"batch {batch}: the twin ran on another host"
    originals, twins = of(1)
    assert twins[0].reason == "Success" and originals[0].reason != "Success"
    originals, twins = of(2)
    assert originals[0].reason == "Success" and twins[0].reason != "Success"
    originals, twins = of(3)
    assert twins[0].reason != "Success", "the twin was killed mid-write"
    assert any(a.reason == "Success" for a in originals + twins)
    assert_exactly_once(stack, "cl_twins", ids)


LOSS_FAILPOINTS = (
    "mid_write@1/1=sleep:30",  # the test SIGKILLs this task's executor JVM
    "mid_write@2/2=sleep:30",  # the test cuts this task's worker host off for 20 s
    "before_commit@3=sleep:4",  # the test cuts the driver's host off for 10 s
)
LOSS_CONF = {
    # Lost executors are noticed in seconds, not the default two minutes.
    "spark.network.timeout": "15s",
    "spark.network.timeoutInterval": "5s",
    "spark.executor.heartbeatInterval": "2s",
}
WORKER_CUT_S, DRIVER_CUT_S = 20.0, 10.0


def test_executor_killed_worker_host_and_driver_host_cut_off_one_copy(
    stack: Stack, drivers: DriverLauncher, tmp_path: Path
) -> None:
    # The run's transactions must outlive the lost host until Spark notices the loss
    # (spark.network.timeout) and the retry writes: with the default 20 s the coordinator
    # aborts them first and the batch's commit fails (PRODUCER_FENCED, naming the option).
    stream = stack.start_stream(
        drivers,
        tmp_path,
        "cl_loss",
        files=FILES,
        rows=ROWS,
        failpoints=LOSS_FAILPOINTS,
        conf=LOSS_CONF,
        sink_options={"transaction.timeout.ms": "60000"},
    )
    run, ids, events, marks = stream.run, stream.ids, stream.events, stream.marks

    # 1. An executor JVM SIGKILLed while its task sleeps mid-write.
    worker_pid = fired_by(marks, LOSS_FAILPOINTS[0], run)
    executor = executor_of(worker_pid)
    executor.send_signal(signal.SIGKILL)
    executor.wait(30)

    # 2. The host of another task, asleep mid-write, cut off (all its links) and healed.
    worker_host = host_of(stack, fired_by(marks, LOSS_FAILPOINTS[1], run))
    assert worker_host in stack.spark.worker_hosts
    worker_host.cut()
    try:
        time.sleep(WORKER_CUT_S)  # the fault: the host stays cut off this long
    finally:
        worker_host.heal()

    # 3. The driver's host cut off just before its commit request of batch 3 leaves.
    assert host_of(stack, fired_by(marks, LOSS_FAILPOINTS[2], run)) == stack.driver
    stack.driver.cut()
    try:
        time.sleep(DRIVER_CUT_S)  # the fault: the commit's request meets a dead link
    finally:
        stack.driver.heal()
    healed = time.monotonic() - run.started

    code = run.wait()
    if code != 0:  # allowed: a clear error, then a restart from the checkpoint
        failed = [line for line in run.lines if line.startswith("FAILED")]
        assert failed, run.describe()
        print(f"query failed: {failed[0]}; restarting from its checkpoint")
        run = stack.restart(drivers, stream)
        run.wait()
    assert_succeeded(run)
    assert fired(marks) == set(LOSS_FAILPOINTS)
    removed = spark_events(events, "SparkListenerExecutorRemoved")
    assert len(removed) >= 2, f"Spark lost the killed and the cut-off executor: {removed}"
    if code == 0:
        batch3 = [
            t
            for t, line in zip(run.times, run.lines, strict=True)
            if line.startswith("PROGRESS batch=3")
        ]
        assert batch3 and batch3[0] > healed, "batch 3's commit waited for the driver's link"
    assert_exactly_once(stack, "cl_loss", ids)
