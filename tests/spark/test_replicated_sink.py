"""The Spark sink on a replicated cluster: three broker processes on a real ZooKeeper, a
real Spark driver (local mode, its own process) streaming into a topic with
``replication.factor=3`` while its brokers are SIGKILLed or restarted one by one.

Each test asserts its faults happened (the leader changed at a higher epoch; every
broker was restarted while the query ran) and then that every row is there exactly once
in per-key order, read back by the broker client from the current leaders.
"""

from __future__ import annotations

import itertools
import signal
import time
from pathlib import Path

from tests.harness.replicated import ReplicatedCluster
from tests.spark.helpers import (
    DriverLauncher,
    assert_one_copy,
    assert_succeeded,
    make_input,
    stream_spec,
)

TOPIC_PARTITIONS = 4
# One election's worth: the ZooKeeper session (2 s) a crash would wait out, the election,
# the clients' metadata refresh and retry backoff, and a micro-batch's own time.
ELECTION_BOUND_S = 15.0


def _stream(
    tmp_path: Path, cluster: ReplicatedCluster, topic: str, files: int, rows: int
) -> tuple[dict[str, object], list[int]]:
    cluster.create_topic(topic, TOPIC_PARTITIONS, replication_factor=3)
    ids = make_input(tmp_path / "src", files, rows)
    spec = stream_spec(
        tmp_path / "src",
        "",
        topic,
        tmp_path / "ck",
        files,
        trigger="processingTime",
        sink_options={"brokers": cluster.bootstrap},
    )
    return spec, ids


def test_stream_goes_on_when_a_leader_is_sigkilled(
    tmp_path: Path, replicated_cluster: ReplicatedCluster, launcher: DriverLauncher
) -> None:
    """A partition leader (not the coordinator, which the commits need) is
    SIGKILLed while the query writes; its partitions fail over to in-sync followers and
    the query runs to its end: every row once."""
    files = 12
    spec, ids = _stream(tmp_path, replicated_cluster, "replicated_kill", files, 2_000)
    run = launcher.start(spec)
    run.wait_for_line("PROGRESS", lambda line: line.startswith("PROGRESS batch=2 "))
    states = {p: replicated_cluster.state("replicated_kill", p) for p in range(TOPIC_PARTITIONS)}
    coordinator = replicated_cluster.coordinator()
    victim_id = next(s.leader for s in states.values() if s.leader != coordinator)
    victim = replicated_cluster.brokers[victim_id]
    victim.kill(signal.SIGKILL)
    for p, before in states.items():
        if before.leader == victim_id:
            after = replicated_cluster.wait_leader_change("replicated_kill", p, victim_id)
            assert after.leader_epoch > before.leader_epoch
    assert run.wait() == 0, run.describe()
    assert_succeeded(run)
    batches_after = [b for b in run.progress_batches() if b > 2]
    assert batches_after, "the query ended before the kill: nothing was proven"
    assert_one_copy("", "replicated_kill", ids, brokers=replicated_cluster.bootstrap)


def test_rolling_restart_of_every_broker_during_a_stream(
    tmp_path: Path, replicated_cluster: ReplicatedCluster, launcher: DriverLauncher
) -> None:
    """Every broker, the controller last, stopped cleanly (leadership handed over first)
    and started again, one after another, while the query writes: every row once."""
    files = 16
    spec, ids = _stream(tmp_path, replicated_cluster, "rolling", files, 2_000)
    run = launcher.start(spec)
    run.wait_for_line("PROGRESS", lambda line: line.startswith("PROGRESS batch=1 "))
    began = time.monotonic() - run.started
    epochs = {
        p: replicated_cluster.state("rolling", p).leader_epoch for p in range(TOPIC_PARTITIONS)
    }
    for broker_id in (3, 2, 1):
        broker = replicated_cluster.brokers[broker_id]
        broker.stop()
        broker.restart()
        for p in range(TOPIC_PARTITIONS):
            replicated_cluster.wait_in_sync("rolling", p, timeout=60.0)
        assert run.proc.poll() is None, "the query ended before the restarts did"
    ended = time.monotonic() - run.started
    assert run.wait() == 0, run.describe()
    assert_succeeded(run)
    assert_one_copy("", "rolling", ids, brokers=replicated_cluster.bootstrap)
    # Every partition changed leader (each broker led some and handed them over).
    for p, epoch in epochs.items():
        assert replicated_cluster.state("rolling", p).leader_epoch > epoch, (
            f"rolling-{p} never moved"
        )
    # No unavailability longer than one election: the longest gap between two committed
    # micro-batches while the brokers restarted, against the session timeout an election
    # after a crash would wait out (clean stops hand leadership over at once).
    progress = [
        t for t, line in zip(run.times, run.lines, strict=False) if line.startswith("PROGRESS")
    ]
    during = [t for t in progress if began <= t <= ended]
    longest = max(b - a for a, b in itertools.pairwise([began, *during, ended]))
    print(
        f"rolling restart: {ended - began:.1f}s for the three restarts, {len(during)} "
        f"micro-batches committed meanwhile, longest gap {longest:.1f}s"
    )
    assert longest < ELECTION_BOUND_S, run.timeline()
