"""docs/design.md §8, the rows that involve Spark: real Spark local mode (``local[2,4]``, so
tasks are retried), a real embedded broker process, real SIGKILLs.

Every Spark query runs in a driver child process (``driver_child.py``): failpoints
(``testkit.spark_failpoints``, the hooks its writes name) reach the Python workers only
through the environment the JVM starts with, and ``kill_driver`` must kill a driver that
is not pytest. The proof is always the same (``helpers.assert_one_copy``): read every
partition back ``read_committed`` and compare with the input -- every id once, nothing
else, each key in one partition with increasing ids.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.producer import Producer
from spark_sink.embedded import broker_pid, ensure_broker
from testkit import spark_failpoints
from testkit.spark_failpoints import POINTS
from tests.harness.waiting import wait_until
from tests.spark.helpers import (
    ACCOUNTS,
    EXIT_FAILED,
    ROOMY_TIMEOUT,
    DriverLauncher,
    assert_lso_not_stuck,
    assert_one_copy,
    assert_succeeded,
    batch_spec,
    make_input,
    read_back,
    stream_spec,
    transaction_metrics,
    wait_gone,
)

FILES = 3
ROWS = 2000
TASK_POINTS = ("before_write", "mid_write", "after_prepare")
# Where the driver can be killed: lost_ack is a transport fault (action drop:<n> only).
KILL_POINTS = tuple(p for p in POINTS if p != "lost_ack")
# Driver kills in test_driver_sigkilled_at_random_points_then_restarted: by default each
# kill point once; IDEMLOG_DRIVER_KILLS=N (more than the points) adds random ones.
DRIVER_KILLS = int(os.environ.get("IDEMLOG_DRIVER_KILLS", len(KILL_POINTS)))


def fired(failpoints_dir: Path) -> set[str]:
    """The failpoint entries that fired (their one-shot marker files hold the entry, then
    the pid that fired it)."""
    if not failpoints_dir.is_dir():
        return set()
    return {p.read_text().splitlines()[0] for p in failpoints_dir.iterdir()}


def speculative_launches(event_dir: Path) -> list[tuple[int, int]]:
    """(stage, partition) of every speculative task attempt in Spark's event logs."""
    found = []
    for path in event_dir.rglob("*"):
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if '"SparkListenerTaskStart"' not in line:
                continue
            event = json.loads(line)
            info = event["Task Info"]
            if info.get("Speculative"):
                found.append((event["Stage ID"], info["Index"]))
    return found


def marker_name(entry: str) -> str:
    """The one-shot marker file a failpoint entry creates when it fires."""
    return Path(spark_failpoints.marker_path("", entry)).name


def wait_for_file(path: Path, timeout_s: float = 180.0) -> None:
    """Block until ``path`` exists (a failpoint fired in some Spark process)."""
    wait_until(path.exists, f"{path} to appear", timeout=timeout_s)


def test_task_exception_before_and_mid_write_is_retried_once(
    tmp_path: Path, store: str, drivers: DriverLauncher
) -> None:
    ids = make_input(tmp_path / "src", FILES, ROWS)
    marks = tmp_path / "failpoints"
    entries = ["before_write@1/2=raise", "mid_write@2/1=raise"]
    run = drivers.run(
        stream_spec(
            tmp_path / "src", store, "t_raise", tmp_path / "ck", FILES, sink_options=ROOMY_TIMEOUT
        ),
        failpoints=entries,
        failpoints_dir=marks,
    )
    assert_succeeded(run)
    assert fired(marks) == set(entries)
    assert_one_copy(store, "t_raise", ids)
    txns = transaction_metrics(store)
    # The mid_write attempt left an open transaction with rows in the log; its retry's
    # InitProducerId fenced and aborted it.
    assert txns["transactions_fenced"] >= 1, txns
    assert txns["sink_batches_committed"] == FILES, txns


def test_failpoints_without_the_hooks_option_do_not_fire(
    tmp_path: Path, store: str, drivers: DriverLauncher
) -> None:
    # The same variables as the test above, inherited by every Spark process, but the job
    # names no hooks: the sink has nothing that reads them, nothing fires
    # (docs/security.md, Test hooks).
    ids = make_input(tmp_path / "src", FILES, ROWS)
    marks = tmp_path / "failpoints"
    entries = ["before_write@1/2=raise", "mid_write@2/1=raise"]
    run = drivers.run(
        stream_spec(
            tmp_path / "src",
            store,
            "t_no_hooks",
            tmp_path / "ck",
            FILES,
            sink_options=ROOMY_TIMEOUT,
        ),
        failpoints=entries,
        failpoints_dir=marks,
        test_hooks=False,
    )
    assert_succeeded(run)
    assert fired(marks) == set()
    assert_one_copy(store, "t_no_hooks", ids)
    txns = transaction_metrics(store)
    assert txns["transactions_fenced"] == 0, txns  # no task failed and was retried
    assert txns["sink_batches_committed"] == FILES, txns


def test_slow_task_with_speculation_enabled_commits_one_copy(
    tmp_path: Path, store: str, drivers: DriverLauncher
) -> None:
    """A straggler with speculation on. Local mode cannot launch the twin (see below), so
    this shows only that speculation settings change nothing; a real twin needs a
    cluster with two hosts (docs/failure-model.md)."""
    ids = make_input(tmp_path / "src", FILES, ROWS)
    marks = tmp_path / "failpoints"
    events = tmp_path / "events"
    events.mkdir()
    entries = ["mid_write@1/0=sleep:4"]
    conf = {
        "spark.speculation": "true",
        "spark.speculation.multiplier": "1.1",
        "spark.speculation.quantile": "0.5",
        "spark.speculation.minTaskRuntime": "100ms",
        "spark.speculation.interval": "100ms",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": str(events),
    }
    run = drivers.run(
        stream_spec(
            tmp_path / "src",
            store,
            "t_spec",
            tmp_path / "ck",
            FILES,
            conf=conf,
            sink_options=ROOMY_TIMEOUT,
        ),
        failpoints=entries,
        failpoints_dir=marks,
    )
    assert_succeeded(run)
    assert fired(marks) == set(entries)
    assert_one_copy(store, "t_spec", ids)
    txns = transaction_metrics(store)
    twins = speculative_launches(events)
    print(f"speculative attempts: {twins}; coordinator: {txns}")
    # Spark never launches a speculative attempt on a host that already ran an attempt of
    # the task (TaskSetManager.dequeueTaskFromList: `speculative && hasAttemptOnHost`),
    # and local mode has one host: the twin cannot happen here. If a Spark version ever
    # launches one, it must have fenced the slow attempt's open transaction.
    if twins:
        assert txns["transactions_fenced"] >= 1, txns


def test_python_worker_killed_mid_write_is_retried_once(
    tmp_path: Path, store: str, drivers: DriverLauncher
) -> None:
    ids = make_input(tmp_path / "src", FILES, ROWS)
    marks = tmp_path / "failpoints"
    entries = ["mid_write@1/3=kill_worker"]
    run = drivers.run(
        stream_spec(
            tmp_path / "src",
            store,
            "t_kill_worker",
            tmp_path / "ck",
            FILES,
            sink_options=ROOMY_TIMEOUT,
        ),
        failpoints=entries,
        failpoints_dir=marks,
    )
    assert_succeeded(run)
    assert fired(marks) == set(entries)
    assert_one_copy(store, "t_kill_worker", ids)
    txns = transaction_metrics(store)
    assert txns["transactions_fenced"] >= 1, txns  # the dead attempt's rows were flushed


@pytest.mark.slow
def test_driver_sigkilled_at_random_points_then_restarted(
    tmp_path: Path, store: str, drivers: DriverLauncher
) -> None:
    """One kill per batch from batch 1 on, then a last batch without: the first kills take
    every kill point once, in an order drawn from a fixed seed (the point, not the draw,
    is what is covered), further ones a random point; each kill's task partition is
    drawn from its seed."""
    seeds = DRIVER_KILLS
    files = seeds + 2
    ids = make_input(tmp_path / "src", files, ROWS)
    marks = tmp_path / "failpoints"
    each_once = list(KILL_POINTS)
    random.Random(0).shuffle(each_once)
    entries = []
    for seed in range(seeds):
        rng = random.Random(seed)
        point = each_once[seed] if seed < len(each_once) else rng.choice(KILL_POINTS)
        batch = seed + 1
        where = f"{batch}/{rng.randrange(4)}" if point in TASK_POINTS else f"{batch}"
        entries.append(f"{point}@{where}=kill_driver")
        print(f"seed {seed}: {point} batch {batch} -> {entries[-1]}")
    spec = stream_spec(tmp_path / "src", store, "t_kill_driver", tmp_path / "ck", files)
    codes = []
    for _ in range(2 * seeds + 2):
        run = drivers.run(spec, failpoints=entries, failpoints_dir=marks)
        codes.append(run.proc.returncode)
        done = run.progress_batches()
        print(f"launch {len(codes)}: rc {codes[-1]} after {run.elapsed:.1f} s, batches {done}")
        if run.proc.returncode == 0:
            break
        assert run.proc.returncode == -signal.SIGKILL, run.describe()
    print(f"launch exit codes: {codes}; fired: {sorted(fired(marks))}")
    assert codes[-1] == 0, f"the query never finished: {codes}"
    assert codes.count(-signal.SIGKILL) >= seeds, codes
    assert fired(marks) == set(entries)
    if seeds >= len(KILL_POINTS):
        assert {e.split("@")[0] for e in fired(marks)} == set(KILL_POINTS), entries
    assert_one_copy(store, "t_kill_driver", ids)
    if any(e.startswith("after_prepare@") for e in entries):
        # That task's transaction was prepared when the driver died: the restarted run
        # re-plans the batch, so it fences it (never reuses it) and writes its own plan.
        txns = transaction_metrics(store)
        assert txns["sink_leftovers_aborted"] >= 1, txns


@pytest.mark.serial
def test_rerun_after_a_restart_with_another_parallelism_commits_once(
    tmp_path: Path, store: str, drivers: DriverLauncher
) -> None:
    """Issue 11 item 1: the driver dies with some tasks of a batch prepared; the query is
    restarted with ``.repartition(2, key)`` instead of 4 (and then 4 again after a second
    death). Each re-run commits exactly its own plan's rows; the dead run's prepared
    transactions are neither reused nor left open."""
    files = 4
    ids = make_input(tmp_path / "src", files, ROWS)
    marks = tmp_path / "failpoints"
    # Run 1 (4 tasks) dies once task 0 of batch 1 prepared; run 2 (2 tasks) re-runs batch
    # 1, then dies once task 1 of batch 2 prepared; run 3 (4 tasks) re-runs batch 2.
    entries = ["after_prepare@1/0=kill_driver", "after_prepare@2/1=kill_driver"]
    codes = []
    for partitions in (4, 2, 4):
        spec = stream_spec(
            tmp_path / "src",
            store,
            "t_reparted",
            tmp_path / "ck",
            files,
            spark_partitions=partitions,
        )
        run = drivers.run(spec, failpoints=entries, failpoints_dir=marks)
        codes.append(run.proc.returncode)
        print(f"{partitions} partitions: rc {codes[-1]}, batches {run.progress_batches()}")
    assert codes == [-signal.SIGKILL, -signal.SIGKILL, 0], codes
    assert fired(marks) == set(entries)
    # Read back at once: every row once, and nothing held back (the LSO at the log end).
    assert_one_copy(store, "t_reparted", ids)
    txns = transaction_metrics(store)
    assert txns["sink_leftovers_aborted"] >= 2, txns
    assert txns["sink_attempts_reused"] == 0, txns


@pytest.mark.serial
def test_broker_sigkilled_and_restarted_while_query_runs(
    tmp_path: Path, store: str, drivers: DriverLauncher
) -> None:
    files = 8
    ids = make_input(tmp_path / "src", files, ROWS)
    marks = tmp_path / "failpoints"
    # A task of batch 3 stops for a while after its first Arrow batch was sent: the broker
    # dies with that transaction open and rows of it in the log (or in flight).
    pause = "mid_write@3/0=sleep:3"
    spec = stream_spec(
        tmp_path / "src", store, "t_kill_broker", tmp_path / "ck", files, trigger="processingTime"
    )
    run = drivers.start(spec, failpoints=[pause], failpoints_dir=marks)
    run.wait_for_line("PROGRESS", lambda line: line.startswith("PROGRESS batch=2 "))
    wait_for_file(marks / marker_name(pause))
    pid = broker_pid(store)
    assert pid is not None, "no embedded broker is running"
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    ensure_broker(store)  # a task or the driver's commit may have restarted it already
    assert broker_pid(store) not in (None, pid)
    assert run.wait() == 0, run.describe()
    assert_succeeded(run)
    assert max(run.progress_batches()) >= files - 1, run.describe()
    assert_one_copy(store, "t_kill_broker", ids)


@pytest.mark.serial
def test_batch_write_failing_midway_leaves_nothing_visible(
    tmp_path: Path, store: str, drivers: DriverLauncher
) -> None:
    ids = make_input(tmp_path / "src", FILES, ROWS)
    topic = "t_batch_fail"
    # The poisoned row is late in the last Spark partition: the other tasks prepare their
    # transactions, the poisoned task writes some Arrow batches before it fails (4 times).
    failed = drivers.run(
        batch_spec(tmp_path / "src", store, topic, bad_partition=3, arrow_batch_rows=500)
    )
    assert failed.proc.returncode == EXIT_FAILED, failed.describe()
    failure = [line for line in failed.lines if line.startswith("FAILED")]
    assert failure and "boom" in failure[0], failed.describe()

    committed = read_back(store, topic)
    assert committed.rows == 0, f"{committed.rows} rows of a failed job are visible"
    assert_lso_not_stuck(committed)  # aborted, not left open: readers never block
    uncommitted = read_back(store, topic, isolation="read_uncommitted")
    assert uncommitted.rows > 0, "no task wrote anything: the failure came too early"

    rerun = drivers.run(batch_spec(tmp_path / "src", store, topic))
    assert_succeeded(rerun)
    assert_one_copy(store, topic, ids)


@pytest.mark.serial
def test_a_task_far_slower_than_the_transaction_timeout_commits_once(
    tmp_path: Path, store: str, drivers: DriverLauncher
) -> None:
    """Issue 11 item 3: transaction.timeout.ms of 6 s, and task 0 of batch 1 sleeps 18 s
    mid-write while the batch's other tasks prepared long before. The tasks' heartbeats
    keep the run alive: nothing times out, the batch commits once, the query goes on.

    The timeout still has to cover what no heartbeat covers: from the slow task's
    prepare to the driver's commit request (the task's end, Spark's job end, the Python
    process Spark starts for the commit). Under a loaded CI run that window overran 2 s
    once (2004 ms) and 4 s once (4185 ms), so the test gives it 6 s and keeps the task
    3 times slower than the timeout."""
    ids = make_input(tmp_path / "src", FILES, ROWS)
    marks = tmp_path / "failpoints"
    entries = ["mid_write@1/0=sleep:18"]
    spec = stream_spec(
        tmp_path / "src",
        store,
        "t_slow",
        tmp_path / "ck",
        FILES,
        sink_options={"transaction.timeout.ms": "6000"},
    )
    run = drivers.run(spec, failpoints=entries, failpoints_dir=marks)
    assert_succeeded(run)
    assert fired(marks) == set(entries)  # the slow task really slept 18 s mid-write
    assert_one_copy(store, "t_slow", ids)
    txns = transaction_metrics(store)
    assert txns["transactions_timed_out"] == 0, txns
    assert txns["sink_batches_committed"] == FILES, txns


@pytest.mark.serial
def test_a_killed_batch_jobs_leftovers_hold_other_writers_back_at_most_the_bound(
    tmp_path: Path, store: str, drivers: DriverLauncher
) -> None:
    """Issue 11 item 4: a df.write job's driver is SIGKILLed with one task mid-write (its
    other tasks' transactions prepared or open). Another writer then commits rows to
    every partition. They stay invisible to read_committed readers only until the dead
    job's transactions time out: transaction.timeout.ms (3 s here) + the broker's
    cleanup interval (2 s by default) after the job's last heartbeat."""
    topic, timeout_s, cleanup_s = "t_dead_job", 3.0, 2.0
    make_input(tmp_path / "src", FILES, ROWS)
    marks = tmp_path / "failpoints"
    entries = ["mid_write@0/1=kill_driver"]
    spec = batch_spec(
        tmp_path / "src", store, topic, sink_options={"transaction.timeout.ms": "3000"}
    )
    killed = drivers.run(spec, failpoints=entries, failpoints_dir=marks)
    died = time.monotonic()
    assert killed.proc.returncode == -signal.SIGKILL, killed.describe()
    assert fired(marks) == set(entries)
    visible_after_another_writer(store, topic, expect_held=True)
    waited = time.monotonic() - died
    print(f"second writer's committed rows visible {waited:.2f} s after the kill")
    assert waited <= timeout_s + cleanup_s + 3.0, waited


@pytest.mark.serial
def test_query_stopped_mid_batch_holds_other_writers_back_at_most_the_bound(
    tmp_path: Path, store: str, drivers: DriverLauncher
) -> None:
    """Issue 11 item 4: ``query.stop()`` while task 0 of batch 1 is mid-write (its rows
    in the log, open). Another writer then commits rows to every partition; they become
    visible within transaction.timeout.ms (6 s) + the cleanup interval of the stop.

    6 s, not less: batch 0's transactions wait, prepared and without a task beating for
    them, for the driver's first commit, which starts its Python process cold; a slow
    machine took 3.06 s for that, and a 3 s timeout aborted batch 0 (PRODUCER_FENCED)."""
    topic, timeout_s, cleanup_s = "t_stopped", 6.0, 2.0
    make_input(tmp_path / "src", FILES, ROWS)
    marks = tmp_path / "failpoints"
    entry = "mid_write@1/0=sleep:30"
    spec = stream_spec(
        tmp_path / "src",
        store,
        topic,
        tmp_path / "ck",
        FILES,
        trigger="processingTime",
        sink_options={"transaction.timeout.ms": "6000"},
        stop_on_file=str(marks / marker_name(entry)),
    )
    run = drivers.run(spec, failpoints=[entry], failpoints_dir=marks)
    stopped = time.monotonic()
    assert "STOPPING mid-batch" in run.lines, run.describe()
    assert fired(marks) == {entry}
    visible_after_another_writer(store, topic)
    waited = time.monotonic() - stopped
    print(f"second writer's committed rows visible {waited:.2f} s after the stop")
    assert waited <= timeout_s + cleanup_s + 3.0, waited


def visible_after_another_writer(store: str, topic: str, *, expect_held: bool = False) -> None:
    """Another producer commits rows to every partition of ``topic``; wait until a
    read_committed reader (at the coordinator's stable ends) sees all of them.
    ``expect_held``: assert that an open transaction held them back at first."""
    address = ensure_broker(store)
    with BrokerClient(address, timeout_s=60.0) as client:
        (doc,) = client.describe_topics([topic])
        partitions = len(doc.partitions)
        if expect_held:
            offsets = [client.list_offsets(topic, p) for p in range(partitions)]
            held = [o for o in offsets if o["last_stable_offset"] < o["log_end_offset"]]
            assert held, f"no open transaction was left: {offsets}"
        second = list(range(10_000_000, 10_000_000 + 400))
        with Producer(address, **{"transactional.id": f"second-writer-{topic}"}) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(
                topic,
                pa.table(
                    {
                        "id": pa.array(second, pa.int64()),
                        "account": pa.array([i % ACCOUNTS for i in second], pa.int64()),
                        "amount": pa.array([(i * 7919) % 100_000 for i in second], pa.int64()),
                    }
                ),
                key="account",
            )
            producer.commit_transaction()

        def visible() -> int:
            found = 0
            for p, o in client.readable_offsets(topic, partitions).items():
                table = client.read_table(topic, p) if o["last_stable_offset"] else None
                if table is not None:
                    found += sum(1 for i in table.column("id").to_pylist() if i >= second[0])
            return found

        if expect_held:
            assert visible() < len(second), "nothing held the second writer's rows back"
        wait_until(lambda: visible() == len(second), "the second writer's rows", timeout=60)
