"""Partition states against a real ZooKeeper: alter_partition, the controller's elections,
fencing, preferred leaders and a clean shutdown's hand-over. Each ZkCluster has its own
kazoo client and session, so each one is a broker as far as ZooKeeper can tell."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from broker_core.cluster.records import BrokerInfo, PartitionState, TopicAssignment
from broker_core.cluster.zk import ZkCluster
from broker_core.cluster.zk_leaders import ControllerFencedError
from broker_core.errors import InvalidRequestError, UnknownTopicOrPartitionError
from testkit.zookeeper import ZooKeeperHarness
from tests.harness.waiting import Recorder, wait_until

ROOT = "/idemlog"
RF3 = {"replication.factor": "3"}
S = PartitionState  # (replicas, leader, leader_epoch, isr)


class Member:
    """A simulated broker: its own client (session) and cluster view; ``states`` records
    the topic's partition states each time the topics callback fires."""

    def __init__(self, harness: ZooKeeperHarness, broker_id: int) -> None:
        self.broker_id = broker_id
        self.client = harness.client()
        self.cluster = ZkCluster(self.client, ROOT)
        self.states = Recorder()
        self.cluster.on_topics_change(lambda: self.states(self.snapshot()))
        self.cluster.register(BrokerInfo(broker_id, "10.0.0.1", 9000 + broker_id))

    def snapshot(self) -> dict[str, dict[int, PartitionState]]:
        return {name: dict(t.states) for name, t in self.cluster.topics().items()}

    def state(self, topic: str, partition: int) -> PartitionState | None:
        assignment = self.cluster.topics().get(topic)
        return None if assignment is None else assignment.states.get(partition)

    def stored(self, topic: str) -> tuple[TopicAssignment, int]:
        """The topic node as stored, and its version."""
        data, stat = self.client.get(f"{ROOT}/topics/{topic}")
        return TopicAssignment.from_doc(topic, json.loads(data), topic), int(stat.version)


@pytest.fixture
def members(zk_chroot: ZooKeeperHarness) -> Iterator[Callable[[int], Member]]:
    made: list[Member] = []

    def make(broker_id: int) -> Member:
        made.append(Member(zk_chroot, broker_id))
        return made[-1]

    yield make
    for member in made:
        member.cluster.close()


def three(members: Callable[[int], Member]) -> dict[int, Member]:
    group = {i: members(i) for i in (1, 2, 3)}
    for member in group.values():
        wait_until(lambda m=member: len(m.cluster.brokers()) == 3, "all three brokers listed")
    return group


def controller_of(group: dict[int, Member]) -> Member:
    [member] = [m for m in group.values() if m.cluster.is_controller()]
    return member


def seen_everywhere(
    group: list[Member], topic: str, partition: int, expected: PartitionState
) -> None:
    """Every member's cache shows ``expected``, and its topics callback reported it."""
    for member in group:
        member.states.wait(
            lambda v: any(same(_state_in(s, topic, partition), expected) for s in v),
            f"broker {member.broker_id} to report {topic}-{partition} as {expected}",
        )
        wait_until(
            lambda m=member: same(m.state(topic, partition), expected),
            f"broker {member.broker_id} to show {topic}-{partition} as {expected}",
        )


def same(actual: object, expected: PartitionState) -> bool:
    """``actual`` is ``expected``; where ``expected`` names no broker epochs, whatever
    epochs ``actual`` recorded (those tests are about leaders and ISRs)."""
    if isinstance(actual, PartitionState) and not expected.isr_epochs:
        actual = replace(actual, isr_epochs=())
    return actual == expected


def _state_in(snapshot: object, topic: str, partition: int) -> object:
    assert isinstance(snapshot, dict)
    return snapshot.get(topic, {}).get(partition)


def bump_epoch(assignment: TopicAssignment, partition: int) -> TopicAssignment:
    s = assignment.state(partition)
    return assignment.with_states({partition: S(s.replicas, s.leader, s.leader_epoch + 1, s.isr)})


def create(group: dict[int, Member], topic: str, partitions: int, **config: str) -> TopicAssignment:
    created = group[1].cluster.create_topic(topic, partitions, None, {**RF3, **config})
    for member in group.values():
        wait_until(lambda m=member: topic in m.cluster.topics(), f"{topic} everywhere")
    return created


def led_by(assignment: TopicAssignment, broker_id: int) -> int:
    [partition] = assignment.partitions_of(broker_id)
    return partition


# -- alter_partition ------------------------------------------------------------------------


def test_alter_partition_is_seen_everywhere_and_retried_on_a_conflict(
    members: Callable[[int], Member],
) -> None:
    group = three(members)
    created = create(group, "t", 2)
    state = created.state(0)
    leader, follower = group[state.leader], state.replicas[-1]
    shrunk = S(state.replicas, state.leader, 0, tuple(b for b in state.isr if b != follower))

    def shrink(s: PartitionState) -> PartitionState | None:
        # A leader's ISR shrink: only while it still leads at the epoch it knows.
        if s.leader != leader.broker_id or s.leader_epoch != 0:
            return None
        return S(s.replicas, s.leader, s.leader_epoch, tuple(b for b in s.isr if b != follower))

    assert leader.cluster.alter_partition("t", 0, shrink) == shrunk
    assert leader.cluster.topic("t").state(0) == shrunk  # read-your-writes
    seen_everywhere(list(group.values()), "t", 0, shrunk)
    assert leader.stored("t")[0].state(0) == shrunk

    # Partition 1's leader writes the same node while partition 0's leader expands its
    # ISR: the expansion's conditional write fails, re-reads, and both changes survive.
    other = created.state(1)
    other_shrunk = S(other.replicas, other.leader, 0, (other.leader,))
    seen: list[PartitionState] = []

    def expand(s: PartitionState) -> PartitionState | None:
        seen.append(s)
        if len(seen) == 1:  # the rival write lands between this read and this write
            group[other.leader].cluster.alter_partition("t", 1, lambda _: other_shrunk)
        return S(s.replicas, s.leader, s.leader_epoch, (*s.isr, follower))

    expanded = leader.cluster.alter_partition("t", 0, expand)
    assert expanded == S(state.replicas, state.leader, 0, (*shrunk.isr, follower))
    assert seen == [shrunk, shrunk]  # called again after the conflict
    stored, version = leader.stored("t")
    assert stored.state(0) == expanded and stored.state(1) == other_shrunk
    assert version == 3  # shrink, the rival's write, the expansion: no lost update
    seen_everywhere(list(group.values()), "t", 1, other_shrunk)
    seen_everywhere(list(group.values()), "t", 0, expanded)

    # update() returning None writes nothing; a deposed leader's update (it no longer leads
    # at epoch 0) returns None after the conflict that deposed it.
    assert leader.cluster.alter_partition("t", 0, lambda s: None) is None
    assert leader.stored("t")[1] == version
    moved = S(state.replicas, follower, 1, expanded.isr)
    calls: list[PartitionState] = []

    def deposed(s: PartitionState) -> PartitionState | None:
        calls.append(s)
        if len(calls) == 1:
            group[follower].cluster.alter_partition("t", 0, lambda _: moved)
        return shrink(s)

    assert leader.cluster.alter_partition("t", 0, deposed) is None
    assert calls == [expanded, moved]
    stored, after = leader.stored("t")
    assert stored.state(0) == moved and after == version + 1  # only the rival's write
    seen_everywhere(list(group.values()), "t", 0, moved)
    with pytest.raises(UnknownTopicOrPartitionError):
        leader.cluster.alter_partition("t", 2, shrink)
    with pytest.raises(UnknownTopicOrPartitionError):
        leader.cluster.alter_partition("gone", 0, shrink)
    with pytest.raises(InvalidRequestError, match="leader epoch 0 is below the current 1"):
        leader.cluster.alter_partition("t", 0, lambda s: S(s.replicas, s.leader, 0, s.isr))


# -- the controller's elections --------------------------------------------------------------


def test_a_dead_leader_is_replaced_and_a_dead_follower_leaves_the_isr(
    zk_chroot: ZooKeeperHarness, members: Callable[[int], Member]
) -> None:
    group = three(members)
    created = create(group, "t", 3)
    controller = controller_of(group)
    victim = next(m for m in group.values() if m is not controller)
    others = [m for m in group.values() if m is not victim]
    live = {m.broker_id for m in others}
    expected = {}
    for p, s in created.states.items():
        isr = tuple(b for b in s.isr if b != victim.broker_id)
        if s.leader == victim.broker_id:
            # The first replica in replicas order that is in sync and live; epoch + 1.
            new_leader = next(b for b in s.replicas if b in isr and b in live)
            expected[p] = replace(s.with_isr(isr), leader=new_leader, leader_epoch=1)
        else:
            expected[p] = s.with_isr(isr)  # no epoch bump

    with zk_chroot.session_expired(victim.client):
        for p, state in expected.items():
            seen_everywhere(others, "t", p, state)
        stored, _ = controller.stored("t")
        assert stored.states == expected

    # The victim comes back in a new session: it sees the new states, and it is not put
    # back into any ISR (its leaders do that once it has caught up).
    wait_until(lambda: len(controller.cluster.brokers()) == 3, "the victim registered again")
    for p, state in expected.items():
        seen_everywhere([victim], "t", p, state)
    assert controller.stored("t")[0].states == expected


def test_no_live_in_sync_replica_leaves_the_partition_offline_unless_unclean_is_enabled(
    zk_chroot: ZooKeeperHarness,
    members: Callable[[int], Member],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="idemlog.cluster")
    group = three(members)
    controller = controller_of(group)
    victim = next(m for m in group.values() if m is not controller)
    alone: dict[str, PartitionState] = {}
    for name, config in (("clean", {}), ("dirty", {"unclean.leader.election.enable": "true"})):
        create(group, name, 1, **config)
        # The victim leads, alone in the ISR (its followers fell behind).
        written = group[1].cluster.alter_partition(
            name,
            0,
            lambda s: S(s.replicas, victim.broker_id, s.leader_epoch + 1, (victim.broker_id,)),
        )
        assert written is not None and written.leader == victim.broker_id
        alone[name] = written
    others = [m for m in group.values() if m is not victim]
    replicas = alone["dirty"].replicas
    first_live = next(b for b in replicas if b != victim.broker_id)
    unclean = S(replicas, first_live, alone["dirty"].leader_epoch + 1, (first_live,))

    with zk_chroot.session_expired(victim.client):
        seen_everywhere(others, "dirty", 0, unclean)
        # The pass goes through the topics in name order: "clean" was decided first.
        assert f"partition clean-0 is offline: its leader {victim.broker_id}" in caplog.text
        assert controller.stored("clean")[0].state(0) == alone["clean"]
        assert all(m.state("clean", 0) == alone["clean"] for m in group.values())
        assert "partition dirty-0: unclean leader election" in caplog.text
        assert "acknowledged batches it lacks may be lost" in caplog.text
        unclean_records = [r for r in caplog.records if "unclean leader election" in r.message]
        assert [r.levelno for r in unclean_records] == [logging.WARNING]

    # Back, the victim is the clean partition's live leader again: nothing to elect.
    wait_until(lambda: len(controller.cluster.brokers()) == 3, "the victim registered again")
    assert controller.stored("clean")[0].state(0) == alone["clean"]


def test_a_new_controller_elects_leaders_for_the_dead_controllers_partitions(
    zk_chroot: ZooKeeperHarness, members: Callable[[int], Member]
) -> None:
    group = three(members)
    created = create(group, "t", 3)
    old = controller_of(group)
    old_epoch = old.cluster.controller_epoch()
    others = [m for m in group.values() if m is not old]
    p = led_by(created, old.broker_id)
    s = created.state(p)
    isr = tuple(b for b in s.isr if b != old.broker_id)
    leader = next(b for b in s.replicas if b in isr)
    expected = replace(s.with_isr(isr), leader=leader, leader_epoch=1)

    with zk_chroot.session_expired(old.client):
        wait_until(lambda: any(m.cluster.is_controller() for m in others), "a new controller")
        seen_everywhere(others, "t", p, expected)
        new = next(m for m in others if m.cluster.is_controller())
        assert new.cluster.controller_epoch() > old_epoch
        assert new.stored("t")[0].state(p) == expected


def test_a_deposed_controllers_election_write_is_refused(
    zk_chroot: ZooKeeperHarness,
    members: Callable[[int], Member],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="idemlog.cluster")
    group = three(members)
    created = create(group, "t", 3)
    controller = controller_of(group)
    victim, bystander = [m for m in group.values() if m is not controller]
    # A newer controllership bumps the epoch (as a successor does the moment it wins);
    # the old controller has not heard of it and still acts.
    assert (
        bystander.cluster._control.bump_controller_epoch() > controller.cluster.controller_epoch()
    )
    assert controller.cluster.is_controller()

    # A fenced write that conflicts with another writer of the node (a leader's ISR
    # change) is re-read and redone, not mistaken for fencing.
    fence = controller.cluster._control.controller_fence()
    assert fence is not None
    current_fence = (bystander.cluster._control.controller_epoch(), fence[1] + 1)
    p0 = created.state(0)
    calls: list[int] = []

    def change(current: TopicAssignment) -> TopicAssignment | None:
        calls.append(len(calls))
        if len(calls) == 1:
            group[p0.leader].cluster.alter_partition(
                "t", 0, lambda s: S(s.replicas, s.leader, 0, (s.leader,))
            )
        return bump_epoch(current, 1)

    written = controller.cluster.rewrite_topic("t", change, "a fenced test write", current_fence)
    assert calls == [0, 1] and written is not None
    assert controller.stored("t")[0].state(0).isr == (p0.leader,)  # both writes kept
    assert controller.stored("t")[0].state(1).leader_epoch == 1
    # With the stale fence the same write is refused, whatever the node's version.
    with pytest.raises(ControllerFencedError, match="controller epoch 1 is no longer current"):
        controller.cluster.rewrite_topic("t", lambda a: bump_epoch(a, 2), "a stale write", fence)
    assert controller.stored("t")[0].state(2).leader_epoch == 0
    before = controller.stored("t")

    with zk_chroot.session_expired(victim.client):
        wait_until(
            lambda: "controller pass refused, this broker is deposed" in caplog.text,
            "the old controller's election write to be refused",
        )
        assert controller.stored("t") == before  # nothing written
        p = led_by(created, victim.broker_id)
        assert controller.cluster.topic("t").state(p).leader == victim.broker_id


def test_preferred_leaders_and_moving_leadership_away(members: Callable[[int], Member]) -> None:
    group = three(members)
    created = create(group, "t", 3)
    controller = controller_of(group)
    leaving = next(m for m in group.values() if m is not controller)
    assert controller.cluster.elect_preferred_leaders() == {}  # every preferred one leads
    with pytest.raises(InvalidRequestError, match="this broker is not the controller"):
        leaving.cluster.elect_preferred_leaders()
    with pytest.raises(UnknownTopicOrPartitionError):
        controller.cluster.elect_preferred_leaders(["nope"])

    # A clean shutdown's first step, from the leaving broker itself.
    p = led_by(created, leaving.broker_id)
    s = created.state(p)
    isr = tuple(b for b in s.isr if b != leaving.broker_id)
    handed = S(s.replicas, next(b for b in s.replicas if b in isr), 1, isr)
    assert leaving.cluster.move_leadership_away(leaving.broker_id) == 1
    assert same(leaving.cluster.topic("t").state(p), handed)
    seen_everywhere(list(group.values()), "t", p, handed)
    assert leaving.cluster.move_leadership_away(leaving.broker_id) == 0  # nothing left

    # It came back and caught up: the new leader puts it back in the ISR...
    rejoined = S(s.replicas, handed.leader, 1, (*handed.isr, leaving.broker_id))
    group[handed.leader].cluster.alter_partition("t", p, lambda st: rejoined)
    seen_everywhere([controller], "t", p, rejoined)
    # ...and the preferred-leader election gives it its partition back.
    assert controller.cluster.elect_preferred_leaders(["t"]) == {"t": {p: leaving.broker_id}}
    back = S(s.replicas, leaving.broker_id, 2, rejoined.isr)
    seen_everywhere(list(group.values()), "t", p, back)
    assert same(controller.stored("t")[0].state(p), back)
    assert controller.cluster.elect_preferred_leaders() == {}


# -- the watches and the cache's ordering ----------------------------------------------------


def test_a_recreated_topic_is_watched_again_and_an_older_read_never_wins(
    members: Callable[[int], Member],
) -> None:
    group = three(members)
    create(group, "t", 1)
    group[2].cluster.delete_topic("t")
    for member in group.values():
        wait_until(lambda m=member: "t" not in m.cluster.topics(), "the deletion everywhere")
    created = create(group, "t", 1)
    s = created.state(0)
    # A data change of the new node reaches every instance: its data watch was started
    # afresh (the old node's watch ended with the deletion).
    shrunk = S(s.replicas, s.leader, 0, (s.leader,))
    assert group[s.leader].cluster.alter_partition("t", 0, lambda _: shrunk) == shrunk
    seen_everywhere(list(group.values()), "t", 0, shrunk)

    # A read of the node older than the cached version (as a slow concurrent refresh
    # would deliver) is not installed; the cache keeps the newer state.
    observer = group[1 if s.leader != 1 else 2]
    _, stat = observer.client.get(f"{ROOT}/topics/t")
    stale = observer.cluster.topic("t").with_states({0: s})
    assert observer.cluster._apply_topic("t", stale, stat.czxid, stat.mzxid - 1) is False
    assert observer.cluster.topic("t").state(0) == shrunk
    # ...and an older listing (a smaller child zxid) is ignored as a whole.
    older = observer.cluster._topics_zxid - 1
    observer.cluster._apply_listing(older, {}, {})
    assert observer.cluster.topic("t").state(0) == shrunk
