"""Issue 15, required test 5: a seeded randomized schedule of kills, clean stops, pauses
and link cuts over three replicating brokers, with an invariant checker over every run.

Each seed is one schedule (``tests/harness/schedule.py``: :func:`plan` draws every fault,
its target (a partition's leader or follower, or the controller), its duration and the
gap before it from ``random.Random(seed)``) run against a 3-broker
:class:`ReplicatedCluster` and a topic with ``replication.factor=3``, two partitions and
512 KiB segments, while an idempotent ``acks=all`` producer sends a steady stream of ids.
The faults: SIGKILL and a restart after a random downtime (the controller's once its
session expired, so that a new one elects); a clean stop (SIGTERM:
leadership moved away first) and a restart; a crash loop (SIGKILL, a restart once its
session expired, SIGKILL again while it truncates and catches up, restart); SIGSTOP for
less than the ZooKeeper session
(the ISR may shrink); SIGSTOP for longer (a frozen leader is replaced and wakes up as a
zombie); the producer's link to a leader cut through a TCP proxy. Each fault hits a
partition's leader or follower, the controller, or the sink's transaction coordinator (the
leader of its ``__transaction_state`` partition -- four of them here -- found with
``find_coordinator`` and the sink's key); every plan kills, freezes (past the session:
deposed, then resumed) or cuts off the coordinator (every client's link to it) at least
once, while a sink
(``tests/harness/sink_chaos.py``: each task's InitProducerId, rows and prepare, then the
driver's ``commit_sink_batch``, a commit failed for good re-run by a new run, a seeded
5 % of the drivers dying right after sending their commit) and a
plain transactional producer (commits and aborts) write a second topic. At most one broker is
down at a time and each fault waits until every replica is back in the ISR, so a
partition always has a live in-sync replica to elect (unclean elections are out of
scope).

Checked after every step and at quiescence: (1) every acknowledged id read back
(``read_committed``, from the current leaders) exactly once and at the offsets its
acknowledgement gave, no id twice, none never sent; (2) the in-sync replicas' batches below
the leader's high watermark identical to the leader's (segment files of running brokers);
(3) after a clean stop of all, the same log bytes, newest producer-state snapshot and
epochs on every replica (both topics); (4) right after each fault ends and after each
step, read_committed below the readers' cut (``readable_offsets``) holds every sink batch
whole or not at all; after every step the next sink batches and transactions commit and
the sink topic's last stable offsets reach their log end, and
at the end (read_committed) every sink batch whose commit returned is whole and once, no
batch is in part or twice, a failed batch's rows appear only as its re-run's, every
committed transaction is whole and no transaction never asked to commit shows. Each run
asserts its faults happened: a new coordinator at a higher leader epoch of its state
partition for every kill, stop or long pause of the coordinator, an election for every
fault that took a leader away, a new controller for every one that took the controller
away, every killed or stopped broker restarted and back in the ISR, producer traffic
through a cut link before the cut and after it healed, at least one leader change.

Seeds: ``DEFAULT_SEEDS``, one schedule whose faults take every kind and hit every role
(checked below), or ``IDEMLOG_SCHEDULE_SEEDS=1,2,3`` (``IDEMLOG_SCHEDULE_STEPS`` for the
number of faults); ``make chaos`` runs campaigns of seeds outside the suite. A failure
names the seed and every step done, with times, elections, controller and ISR changes
seen, and the command to replay it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from testkit.zookeeper import ZooKeeperHarness
from tests.harness.broker import BrokerFactory
from tests.harness.replicated import ReplicatedCluster
from tests.harness.schedule import (
    CONTROLLER,
    COORDINATOR,
    COORDINATOR_KINDS,
    FOLLOWER,
    KINDS,
    LEADER,
    TAKES_A_LEADER_AWAY,
    plan,
)
from tests.harness.schedule_run import ScheduleRun

# One seed in the suite (the serial phase runs it alone): its 8 faults take every
# kind in KINDS and hit every role (leader, follower, controller, coordinator).
DEFAULT_SEEDS = (12,)
DEFAULT_STEPS = 8
STATE_PARTITIONS = 4


def _seeds() -> list[int]:
    chosen = os.environ.get("IDEMLOG_SCHEDULE_SEEDS", "")
    return [int(s) for s in chosen.replace(" ", "").split(",") if s] or list(DEFAULT_SEEDS)


@pytest.fixture
def cluster(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> Iterator[ReplicatedCluster]:
    # Several state partitions: the sink's coordinator is the leader of its key's one
    # (found by key), the transactional producer's may be another broker's.
    extra = {"transaction.state.log.num.partitions": STATE_PARTITIONS}
    cluster = ReplicatedCluster(zk_chroot, broker_factory, extra=extra)
    try:
        yield cluster
    finally:
        cluster.close()


# Serial (docs/contributing.md): each fault's effect is awaited within fixed deadlines.
@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize("seed", _seeds(), ids=lambda s: f"seed{s}")
def test_randomized_fault_schedule_keeps_the_invariants(
    cluster: ReplicatedCluster, seed: int
) -> None:
    """One seeded schedule of faults under a steady acks=all idempotent producer, a sink
    and a transactional producer: no acknowledged id lost or doubled, in-sync replicas
    equal below the high watermark, every committed sink batch and transaction whole and
    once and nothing else visible, no partition held back, and equal logs and producer
    state on every replica at quiescence."""
    steps = int(os.environ.get("IDEMLOG_SCHEDULE_STEPS", DEFAULT_STEPS))
    run = ScheduleRun(cluster, seed, steps)
    run.run()
    print(run.report())


def test_a_seed_names_one_schedule() -> None:
    """The plan is a function of the seed alone (a failing seed replays), every plan
    takes a leader away at least once and kills, freezes or cuts off the coordinator at
    least once; over the seeds, each of those three hits the coordinator."""
    kinds = set()
    for seed in range(50):
        faults = plan(seed, DEFAULT_STEPS, 2)
        assert faults == plan(seed, DEFAULT_STEPS, 2)
        assert any(f.role == LEADER and f.kind in TAKES_A_LEADER_AWAY for f in faults)
        aimed = [f.kind for f in faults if f.role == COORDINATOR]
        assert set(aimed) & set(COORDINATOR_KINDS), (seed, faults)
        kinds |= set(aimed)
    assert set(COORDINATOR_KINDS) <= kinds, kinds
    assert plan(1, DEFAULT_STEPS, 2) != plan(2, DEFAULT_STEPS, 2)
    default = [f for seed in DEFAULT_SEEDS for f in plan(seed, DEFAULT_STEPS, 2)]
    assert {f.kind for f in default} == set(KINDS), default
    assert {f.role for f in default} == {LEADER, FOLLOWER, CONTROLLER, COORDINATOR}, default
