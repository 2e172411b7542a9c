"""Cluster metadata against a real ZooKeeper: each ZkCluster has its own kazoo client and
session, so each one is a broker as far as ZooKeeper can tell."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

from broker_core.cluster.records import BrokerInfo, PartitionState, TopicAssignment
from broker_core.cluster.zk import ZkCluster
from broker_core.errors import (
    DuplicateBrokerRegistrationError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from testkit.zookeeper import ZooKeeperHarness
from tests.harness.waiting import Recorder, wait_until

ROOT = "/idemlog"
WAIT_S = 15.0
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())]).serialize().to_pybytes()


class SimBroker:
    """A simulated broker: its own client (session), cluster view and callback recorders."""

    def __init__(self, harness: ZooKeeperHarness, broker_id: int | None, **options: Any) -> None:
        self.client = harness.client()
        # Single replicas unless a test asks: these scenarios are about the metadata and
        # the election of the controller (replicas: tests/zk/test_partition_states.py).
        options.setdefault("default_replication_factor", 1)
        self.cluster = ZkCluster(self.client, ROOT, **options)
        self.control = Recorder()
        self.topics_changed = Recorder()
        self.cluster.on_controller_change(self.control)
        # Each topics callback records the topic names the cluster shows at that moment.
        self.cluster.on_topics_change(lambda: self.topics_changed(set(self.cluster.topics())))
        self.info = (
            None if broker_id is None else BrokerInfo(broker_id, "10.0.0.1", 9000 + broker_id)
        )
        if self.info is not None:
            self.cluster.register(self.info)

    def session(self) -> int:
        return int(self.client.client_id[0])

    def owner(self, path: str) -> int | None:
        stat = self.client.exists(path)
        return None if stat is None else int(stat.ephemeralOwner)


@pytest.fixture
def brokers(zk_chroot: ZooKeeperHarness) -> Iterator[Callable[..., SimBroker]]:
    made: list[SimBroker] = []

    def make(broker_id: int | None, **options: Any) -> SimBroker:
        made.append(SimBroker(zk_chroot, broker_id, **options))
        return made[-1]

    yield make
    for broker in made:
        broker.cluster.close()


def controllers(group: list[SimBroker]) -> list[int]:
    return [b.info.broker_id for b in group if b.info and b.cluster.is_controller()]


def settled(group: list[SimBroker], controller_id: int) -> bool:
    """Every member sees ``controller_id`` as the controller, and only it holds control."""
    return controllers(group) == [controller_id] and all(
        (c := b.cluster.controller()) is not None and c.broker_id == controller_id for b in group
    )


# -- registration and election ---------------------------------------------------------------


def test_registration_lists_live_brokers_everywhere(brokers: Callable[..., SimBroker]) -> None:
    group = [brokers(i) for i in (3, 1, 2)]
    observer = brokers(None)  # an unregistered client (e.g. the CLI) sees them too

    expected = [BrokerInfo(i, "10.0.0.1", 9000 + i) for i in (1, 2, 3)]
    for member in [*group, observer]:
        wait_until(lambda m=member: m.cluster.brokers() == expected, "every broker in the list")
    for member in group:
        path = f"{ROOT}/brokers/ids/{member.info.broker_id}"
        data, stat = member.client.get(path)
        assert json.loads(data) == {"version": 1, "host": "10.0.0.1", "port": member.info.port}
        assert stat.ephemeralOwner == member.session()
    assert observer.cluster.is_controller() is False
    assert observer.control.values == []


def test_exactly_one_controller_among_concurrent_registrations(
    zk_chroot: ZooKeeperHarness, brokers: Callable[..., SimBroker]
) -> None:
    group = [brokers(None) for _ in range(3)]
    start = threading.Barrier(3)
    errors: list[BaseException] = []

    def register(member: SimBroker, broker_id: int) -> None:
        try:
            member.info = BrokerInfo(broker_id, "10.0.0.1", 9000 + broker_id)
            start.wait(WAIT_S)
            member.cluster.register(member.info)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=register, args=(m, i + 1)) for i, m in enumerate(group)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert errors == []

    winners = controllers(group)
    assert len(winners) == 1, winners
    wait_until(lambda: settled(group, winners[0]), "every broker to name the controller")
    winner = next(m for m in group if m.info.broker_id == winners[0])
    data, stat = winner.client.get(f"{ROOT}/controller")
    assert json.loads(data) == {"version": 1, "broker_id": winners[0]}
    assert stat.ephemeralOwner == winner.session()
    winner.control.wait(lambda v: v == [True], "the winner's callback")
    assert all(m.control.values == [] for m in group if m is not winner)


def test_expired_controller_session_moves_control_to_another_broker(
    zk_chroot: ZooKeeperHarness, brokers: Callable[..., SimBroker]
) -> None:
    group = [brokers(i) for i in (1, 2, 3)]
    [old_id] = controllers(group)
    old = group[old_id - 1]
    others = [m for m in group if m is not old]
    old_session = old.session()

    # The old controller is held in its expired state, so it cannot win the election again.
    with zk_chroot.session_expired(old.client):
        wait_until(lambda: len(controllers(others)) == 1, "another broker to take control")
        [new_id] = controllers(others)
        new = group[new_id - 1]
        new.control.wait(lambda v: v == [True], "the new controller's callback")

    old.control.wait(lambda v: v == [True, False], "the expired controller's loss callback")
    assert old.cluster.is_controller() is False
    # It registers again in its new session and sees the other broker as the controller.
    ids_path = f"{ROOT}/brokers/ids/{old_id}"
    wait_until(lambda: old.owner(ids_path) == old.session() != old_session, "re-registration")
    wait_until(lambda: settled(group, new_id), "every broker to name the new controller")
    live = [m.info for m in group]
    for member in group:
        wait_until(lambda m=member: m.cluster.brokers() == live, "all three listed again")
    assert old.control.values == [True, False]
    assert all(m.control.values == [] for m in others if m is not new)


def test_lone_controller_reports_the_loss_then_regains_control(
    zk_chroot: ZooKeeperHarness, brokers: Callable[..., SimBroker]
) -> None:
    only = brokers(7)
    assert only.cluster.is_controller()
    only.control.wait(lambda v: v == [True], "control")
    late = Recorder()
    only.cluster.on_controller_change(late)  # a late subscriber still hears of the gain
    late.wait(lambda v: v == [True], "the late subscriber's gain")

    zk_chroot.expire_session(only.client)

    only.control.wait(lambda v: v == [True, False, True], "loss, then control again")
    late.wait(lambda v: v == [True, False, True], "the same for the late subscriber")
    assert only.owner(f"{ROOT}/controller") == only.session()
    assert only.owner(f"{ROOT}/brokers/ids/7") == only.session()


def test_dropped_connection_keeps_registration_and_control(
    zk_chroot: ZooKeeperHarness, brokers: Callable[..., SimBroker]
) -> None:
    group = [brokers(i) for i in (1, 2)]
    [leader_id] = controllers(group)
    leader = group[leader_id - 1]
    session = leader.session()
    live = [m.info for m in group]
    for member in group:
        wait_until(lambda m=member: m.cluster.brokers() == live, "both brokers listed")

    zk_chroot.drop_connection(leader.client)

    assert leader.session() == session
    assert leader.owner(f"{ROOT}/brokers/ids/{leader_id}") == session
    assert leader.owner(f"{ROOT}/controller") == session
    wait_until(lambda: settled(group, leader_id), "control to stay with the same broker")
    for member in group:
        wait_until(lambda m=member: m.cluster.brokers() == live, "both brokers still listed")
    assert leader.control.values == [True]  # never reported a loss


def test_zookeeper_outage_resigns_control_and_fails_admin_calls_retriably(
    zk_chroot: ZooKeeperHarness, brokers: Callable[..., SimBroker]
) -> None:
    only = brokers(4, suspended_grace_s=0.3, request_timeout_s=0.5)
    only.cluster.create_topic("kept", 1, None, {})
    only.control.wait(lambda v: v == [True], "control")
    session = only.session()

    zk_chroot.stop_server()
    try:
        only.control.wait(lambda v: v == [True, False], "resignation after the grace period")
        assert only.cluster.is_controller() is False
        for call, what in [
            (lambda: only.cluster.create_topic("new", 1, None, {}), "creating topic 'new'"),
            (lambda: only.cluster.delete_topic("kept"), "deleting topic 'kept'"),
        ]:
            began = time.monotonic()
            with pytest.raises(RequestTimedOutError, match=f"ZooKeeper unavailable while {what}"):
                call()
            assert time.monotonic() - began < 3.0
        assert only.cluster.topics().keys() == {"kept"}  # the cache still answers
    finally:
        zk_chroot.start_server()

    only.control.wait(lambda v: v == [True, False, True], "control again in the same session")
    assert only.session() == session
    # Nothing was written while ZooKeeper was away.
    assert only.client.get_children(f"{ROOT}/topics") == ["kept"]


def test_register_waits_for_a_previous_session_to_expire(
    zk_chroot: ZooKeeperHarness,
    brokers: Callable[..., SimBroker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="idemlog.cluster")
    newcomer = brokers(None)
    # A killed predecessor: its ephemeral registration lingers until its session expires.
    predecessor = zk_chroot.client()
    predecessor.create(
        f"{ROOT}/brokers/ids/5", b'{"version":1,"host":"old","port":1}', ephemeral=True
    )
    info = BrokerInfo(5, "10.0.0.1", 9005)
    outcome: list[BaseException | None] = []
    thread = threading.Thread(
        target=lambda: outcome.append(_capture(newcomer.cluster.register, info))
    )
    thread.start()
    wait_until(
        lambda: "broker id 5 is registered by another ZooKeeper session" in caplog.text,
        "the newcomer to see the old registration",
    )
    assert thread.is_alive(), "register() returned while the old registration was there"

    zk_chroot.expire_session(predecessor, wait_reconnect=False)
    thread.join(WAIT_S)

    assert outcome == [None]
    assert newcomer.owner(f"{ROOT}/brokers/ids/5") == newcomer.session()
    assert newcomer.cluster.is_controller()
    assert newcomer.cluster.brokers() == [info]


def test_register_fails_naming_the_broker_id_held_by_a_live_broker(
    brokers: Callable[..., SimBroker],
) -> None:
    holder = brokers(5)
    impostor = brokers(None, registration_timeout_s=0.5)

    began = time.monotonic()
    with pytest.raises(DuplicateBrokerRegistrationError) as excinfo:
        impostor.cluster.register(BrokerInfo(5, "10.0.0.2", 9999))

    assert 0.5 <= time.monotonic() - began < 5.0
    message = str(excinfo.value)
    assert "broker id 5 is already registered at 10.0.0.1:9005" in message
    assert "broker.id=5" in message and f"{ROOT}/brokers/ids/5" in message
    assert excinfo.value.code == 101 and excinfo.value.retriable is False
    # Nothing changed: the holder keeps its registration and its control.
    assert holder.owner(f"{ROOT}/brokers/ids/5") == holder.session()
    assert holder.cluster.is_controller() and not impostor.cluster.is_controller()
    # After the failure the impostor may register under its own id.
    impostor.cluster.register(BrokerInfo(6, "10.0.0.2", 9999))
    assert impostor.owner(f"{ROOT}/brokers/ids/6") == impostor.session()


def test_closed_broker_leaves_the_live_list_but_keeps_its_partitions(
    brokers: Callable[..., SimBroker],
) -> None:
    group = [brokers(i) for i in (1, 2, 3)]
    assignment = group[0].cluster.create_topic("orders", 6, None, {})
    [leader_id] = controllers(group)
    leaving = group[leader_id - 1]
    staying = [m for m in group if m is not leaving]

    leaving.cluster.close()

    leaving.control.wait(lambda v: v == [True, False], "the closing controller's loss")
    assert leaving.client.exists(f"{ROOT}/brokers/ids/{leader_id}") is None
    live = [m.info for m in staying]
    for member in staying:
        wait_until(lambda m=member: m.cluster.brokers() == live, "the closed broker to go")
    wait_until(lambda: len(controllers(staying)) == 1, "a new controller")
    # With a single replica there is nobody to take over: the partitions stay assigned
    # to the closed broker (offline until it returns).
    for member in staying:
        assert member.cluster.topic("orders") == assignment
        assert assignment.partitions_of(leader_id) == member.cluster.topic("orders").partitions_of(
            leader_id
        )
    assert len(assignment.partitions_of(leader_id)) == 2
    # New topics only go to live brokers.
    later = staying[0].cluster.create_topic("later", 4, None, {})
    assert set(later.partitions.values()) == {m.info.broker_id for m in staying}


# -- topics --------------------------------------------------------------------------------


def test_topic_creation_is_seen_by_every_instance(brokers: Callable[..., SimBroker]) -> None:
    group = [brokers(i) for i in (1, 2, 3)]
    observer = brokers(None)

    created = group[1].cluster.create_topic(
        "payments", 6, SCHEMA, {"retention.ms": "1000", "segment.bytes": "1048576"}
    )

    # Each single replica admitted to the ISR at its broker's epoch (registration czxid).
    epochs = {m.info.broker_id: m.cluster.broker_epoch() for m in group}
    assert all(e > 0 for e in epochs.values())
    assert created == TopicAssignment.of(
        "payments",
        {
            p: PartitionState((b,), b, 0, (b,), ((b, epochs[b]),))
            for p, b in created.partitions.items()
        },
        SCHEMA,
        {"retention.ms": "1000", "segment.bytes": "1048576"},
        topic_id=created.topic_id,
    )
    assert len(created.topic_id) == 32  # chosen at creation
    assert group[1].cluster.topic("payments") == created  # at once on the creator
    for member in [*group, observer]:
        member.topics_changed.wait(lambda v: {"payments"} in v, "the topics-change callback")
        assert member.cluster.topics() == {"payments": created}
    data = json.loads(group[0].client.get(f"{ROOT}/topics/payments")[0])
    assert data["version"] == 2
    assert data["partitions"] == {
        str(p): {
            "replicas": [b],
            "leader": b,
            "leader_epoch": 0,
            "isr": [b],
            "isr_epochs": {str(b): epochs[b]},
        }
        for p, b in created.partitions.items()
    }
    assert data["config"] == {"retention.ms": "1000", "segment.bytes": "1048576"}
    assert data["topic_id"] == created.topic_id


def test_assignment_spreads_partitions_round_robin_over_live_brokers(
    brokers: Callable[..., SimBroker],
) -> None:
    group = [brokers(i) for i in (10, 20, 30)]
    ids = [10, 20, 30]

    big = group[0].cluster.create_topic("big", 7, None, {})
    leaders = [big.partitions[p] for p in range(7)]
    start = ids.index(leaders[0])
    assert leaders == [ids[(start + p) % 3] for p in range(7)]  # round-robin in id order
    assert sorted(leaders.count(i) for i in ids) == [2, 2, 3]

    # Single-partition topics start at a position derived from the name, so they spread.
    firsts = [group[0].cluster.create_topic(f"small-{n}", 1, None, {}).leader(0) for n in range(12)]
    assert set(firsts) == set(ids), firsts
    # The assignment is a function of the name and the live brokers: stable everywhere.
    for member in group:
        wait_until(lambda m=member: len(m.cluster.topics()) == 13, "all topics")
        assert member.cluster.topic("big") == big


def test_duplicate_create_and_bad_requests_are_refused(brokers: Callable[..., SimBroker]) -> None:
    first, second = brokers(1), brokers(2)
    first.cluster.create_topic("dup", 2, None, {})

    # Refused by ZooKeeper even before the other instance's cache has seen the topic.
    with pytest.raises(TopicAlreadyExistsError, match="'dup' already exists"):
        second.cluster.create_topic("dup", 3, None, {})
    with pytest.raises(TopicAlreadyExistsError):
        first.cluster.create_topic("dup", 2, None, {})
    with pytest.raises(InvalidTopicError, match="'bad/name'"):
        first.cluster.create_topic("bad/name", 1, None, {})
    with pytest.raises(InvalidPartitionsError, match="partitions=0"):
        first.cluster.create_topic("zero", 0, None, {})
    with pytest.raises(InvalidPartitionsError, match="10001"):
        first.cluster.create_topic("many", 10_001, None, {})
    with pytest.raises(InvalidConfigError, match=r"'retention.msec'"):
        first.cluster.create_topic("conf", 1, None, {"retention.msec": "1"})
    with pytest.raises(InvalidRequestError, match="not a serialized Arrow schema"):
        first.cluster.create_topic("schema", 1, b"not arrow", {})
    with pytest.raises(UnknownTopicOrPartitionError, match="'nope'"):
        first.cluster.topic("nope")
    with pytest.raises(UnknownTopicOrPartitionError, match="'nope'"):
        first.cluster.delete_topic("nope")
    # Nothing but the first topic was written.
    assert first.client.get_children(f"{ROOT}/topics") == ["dup"]
    assert first.cluster.topic("dup").partitions.keys() == {0, 1}


def test_delete_topic_disappears_everywhere(brokers: Callable[..., SimBroker]) -> None:
    group = [brokers(i) for i in (1, 2)]
    group[0].cluster.create_topic("gone", 2, None, {})
    group[0].cluster.create_topic("kept", 1, None, {})
    for member in group:
        member.topics_changed.wait(lambda v: {"gone", "kept"} in v, "both topics")

    group[1].cluster.delete_topic("gone")

    for member in group:
        member.topics_changed.wait(lambda v: v[-1] == {"kept"}, "the deletion callback")
        assert set(member.cluster.topics()) == {"kept"}
        with pytest.raises(UnknownTopicOrPartitionError):
            member.cluster.topic("gone")
    # The name can be used again; everybody sees the new assignment.
    recreated = group[0].cluster.create_topic("gone", 3, None, {})
    wait_until(lambda: group[1].cluster.topics().get("gone") == recreated, "the new topic")


def test_a_version_1_topic_node_is_read_as_single_replicas_and_a_newer_one_refused(
    brokers: Callable[..., SimBroker], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="idemlog.cluster")
    member = brokers(1)
    old = b'{"version":1,"partitions":{"0":1,"1":2},"schema":null,"config":{"retention.ms":"9"}}'
    member.client.create(f"{ROOT}/topics/old", old)
    member.client.create(f"{ROOT}/topics/future", b'{"version":3,"partitions":{}}')

    wait_until(lambda: "old" in member.cluster.topics(), "the version 1 topic")
    topic = member.cluster.topic("old")
    assert topic.partitions == {0: 1, 1: 2} and topic.leader(1) == 2
    assert topic.state(1) == PartitionState((2,), 2, 0, (2,))
    assert topic.config == {"retention.ms": "9"}
    wait_until(lambda: f"{ROOT}/topics/future" in caplog.text, "the newer node to be reported")
    assert "has version 3; this broker reads versions 1, 2" in caplog.text
    assert "future" not in member.cluster.topics()


def test_replication_factor_up_to_the_live_brokers_is_accepted_above_refused(
    brokers: Callable[..., SimBroker],
) -> None:
    group = [brokers(i) for i in (1, 2, 3)]
    for member in group:
        wait_until(lambda m=member: len(m.cluster.brokers()) == 3, "all three brokers listed")
    with pytest.raises(InvalidReplicationFactorError, match="larger than the number") as excinfo:
        group[0].cluster.create_topic("r", 2, None, {"replication.factor": "4"})
    assert excinfo.value.code == 38 and "replication.factor=4" in str(excinfo.value)
    assert group[0].client.get_children(f"{ROOT}/topics") == []
    created = group[0].cluster.create_topic("r", 3, None, {"replication.factor": "3"})
    for p in range(3):
        state = created.state(p)
        assert sorted(state.replicas) == [1, 2, 3] and state.isr == state.replicas
        assert state.leader == state.replicas[0] and state.leader_epoch == 0
    assert sorted(created.partitions.values()) == [1, 2, 3]  # leaders spread


def test_corrupt_topic_node_is_ignored_with_an_error(
    zk_chroot: ZooKeeperHarness, brokers: Callable[..., SimBroker], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="idemlog.cluster")
    member = brokers(1)
    member.client.create(f"{ROOT}/topics/junk", b"{not json")
    member.cluster.create_topic("fine", 1, None, {})

    wait_until(lambda: "junk" in caplog.text, "the corrupt node to be reported")
    assert set(member.cluster.topics()) == {"fine"}
    assert f"{ROOT}/topics/junk" in caplog.text


def _capture(function: Callable[..., object], *args: object) -> BaseException | None:
    try:
        function(*args)
    except BaseException as exc:
        return exc
    return None


# -- controller epoch -> coordinator epoch -> partitions ---------------------------------------


def _stored_epoch(client: Any) -> int:
    data, _ = client.get(f"{ROOT}/controller_epoch")
    doc = json.loads(data)
    assert doc["version"] == 1
    return int(doc["controller_epoch"])


def test_each_election_increments_the_controller_epoch(
    zk_chroot: ZooKeeperHarness, brokers: Callable[..., SimBroker]
) -> None:
    first = brokers(1)
    assert first.cluster.is_controller()
    assert first.cluster.controller_epoch() == _stored_epoch(first.client) == 1
    second, third = brokers(2), brokers(3)
    assert not second.cluster.is_controller()
    wait_until(lambda: second.cluster.controller_epoch() == 1, "a follower to read the epoch")

    # Whoever wins next reads its new epoch from inside its gain callback: the epoch is
    # bumped before the controllership is reported.
    seen: list[tuple[int, bool, int]] = []

    def recorder(member: SimBroker, broker_id: int) -> Callable[[bool], None]:
        return lambda gained: seen.append((broker_id, gained, member.cluster.controller_epoch()))

    for member, broker_id in ((second, 2), (third, 3)):
        member.cluster.on_controller_change(recorder(member, broker_id))
    first.cluster.close()
    wait_until(lambda: len(controllers([second, third])) == 1, "a new controller")
    [winner_id] = controllers([second, third])
    winner = second if winner_id == 2 else third
    wait_until(lambda: seen == [(winner_id, True, 2)], "the gain callback with epoch 2")
    assert winner.cluster.controller_epoch() == _stored_epoch(winner.client) == 2
    assert winner.cluster.controller_epoch() > first.cluster.controller_epoch()

    # A session expiry is a new controllership too: another broker takes over, epoch 3.
    with zk_chroot.session_expired(winner.client):
        wait_until(lambda: len(controllers([second, third])) == 1, "control to move")
        [after_id] = controllers([second, third])
        after = second if after_id == 2 else third
        assert after is not winner
        assert after.cluster.controller_epoch() == _stored_epoch(after.client) == 3


def test_concurrent_epoch_bumps_never_lose_an_increment(
    brokers: Callable[..., SimBroker],
) -> None:
    group = [brokers(None) for _ in range(3)]
    results: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(len(group))

    def bump(member: SimBroker) -> None:
        try:
            start.wait(WAIT_S)
            for _ in range(10):
                results.append(member.cluster._control.bump_controller_epoch())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=bump, args=(m,)) for m in group]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert errors == []
    # Version-conditional sets: every bump got a value of its own, none overwrote another.
    assert sorted(results) == list(range(1, 31))
    assert _stored_epoch(group[0].client) == 30
