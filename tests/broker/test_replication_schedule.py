"""Issue 15, required test 5: a seeded randomized schedule of kills, clean stops and
pauses over three replicating brokers, with an invariant checker over every run.

Each seed is one schedule (``tests/harness/schedule.py``: :func:`plan` draws every fault,
its target role, duration and the gap before it from ``random.Random(seed)``) run against
a 3-broker :class:`ReplicatedCluster` and a topic with ``replication.factor=3`` and two
partitions, while an idempotent ``acks=all`` producer sends a steady stream of ids. The
faults: SIGKILL of a leader or follower and a restart after a random downtime; a clean
stop (SIGTERM: leadership moved away first) and a restart; SIGSTOP for less than the
ZooKeeper session (the ISR may shrink); SIGSTOP for longer than it (a frozen leader is
replaced and wakes up as a zombie). At most one broker is down at a time and each fault
waits until every replica is back in the ISR, so a partition always has a live in-sync
replica to elect (unclean elections are out of scope).

Checked after every step and at quiescence: (1) every acknowledged id read back
(``read_committed``, from the current leaders) exactly once, no id twice; (2) the in-sync
replicas' batches below the leader's high watermark identical to the leader's (segment
files of running brokers); (3) after a clean stop of all, the same log bytes, newest
producer-state snapshot and epochs on every replica. Each run asserts its faults
happened: an election for every fault that took a leader away, every killed or stopped
broker back in the ISR, at least one leader change overall.

Seeds: ``DEFAULT_SEEDS``, or ``IDEMLOG_SCHEDULE_SEEDS=1,2,3`` (``IDEMLOG_SCHEDULE_STEPS``
for the number of faults). A failure names the seed and every step done, with times,
elections and ISR changes seen, and the command to replay it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.harness.broker import BrokerFactory
from tests.harness.replicated import ReplicatedCluster
from tests.harness.schedule import ScheduleRun
from tests.harness.zookeeper import ZooKeeperHarness

DEFAULT_SEEDS = (1, 2, 3)
DEFAULT_STEPS = 8


def _seeds() -> list[int]:
    chosen = os.environ.get("IDEMLOG_SCHEDULE_SEEDS", "")
    return [int(s) for s in chosen.replace(" ", "").split(",") if s] or list(DEFAULT_SEEDS)


@pytest.fixture
def cluster(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> Iterator[ReplicatedCluster]:
    cluster = ReplicatedCluster(zk_chroot, broker_factory)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", _seeds(), ids=lambda s: f"seed{s}")
def test_randomized_fault_schedule_keeps_the_invariants(
    cluster: ReplicatedCluster, seed: int
) -> None:
    """One seeded schedule of faults under a steady acks=all idempotent producer: no
    acknowledged id lost or doubled, in-sync replicas equal below the high watermark, and
    equal logs and producer state on every replica at quiescence."""
    steps = int(os.environ.get("IDEMLOG_SCHEDULE_STEPS", DEFAULT_STEPS))
    run = ScheduleRun(cluster, seed, steps)
    run.run()
    print(run.report())
