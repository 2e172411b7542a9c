"""A consumer group's coordinator SIGKILLed mid-rebalance on a 3-broker ZooKeeper cluster.

``__consumer_offsets`` (created by the first FindCoordinator, 3 replicas) and the data
topic are replicated; confluent-kafka members commit every record (acks=all on the
coordinator's partition) before counting it. A member that joined by hand with the wire
protocol and then went silent holds the group in PreparingRebalance when a third member
joins; the coordinator is killed then. Its partition's new leader loads the group and the
offsets: the members find it, the group rebalances there, and every row (before and after
the kill) is counted exactly once: no committed offset was lost (a lost one would read its
rows again), none was acknowledged by the old coordinator past its leadership."""

from __future__ import annotations

import datetime
import signal
import struct
import threading
from typing import Any

from confluent_kafka import ConsumerGroupState, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode
from kio.schema.join_group.v5.request import JoinGroupRequestProtocol

from testkit.zookeeper import ZooKeeperHarness
from tests.broker.test_kafka_groups import Member, write
from tests.broker.test_kafka_listener import kafka_address
from tests.harness import kafka_wire as wire
from tests.harness.broker import BrokerFactory
from tests.harness.replicated import ReplicatedCluster
from tests.harness.waiting import wait_until

TOPIC, GROUP, PARTITIONS = "failover", "failover-readers", 6
FIND_COORDINATOR, JOIN_GROUP = 10, 11
GHOST_SESSION_MS = 5_000  # how long the silent member holds the rebalance open


def subscription(topic: str) -> bytes:
    """Kafka's ConsumerProtocolSubscription v0 for ``topic`` (what the leader's assignor
    reads from every member's metadata), no user data."""
    name = topic.encode()
    return struct.pack(">hih", 0, 1, len(name)) + name + struct.pack(">i", -1)


def find_coordinator(address: str) -> int:
    answer = wire.ask(address, wire.request(FIND_COORDINATOR, 1, key=GROUP, key_type=0))
    assert answer.error_code == ErrorCode.none, answer
    return int(answer.node_id)


def join_silently(address: str) -> Any:
    """A member that joins (its JoinGroup answered once the others rejoined) and then never
    heartbeats, syncs nor rejoins: removed only when its session times out."""
    body = wire.request(
        JOIN_GROUP,
        5,
        group_id=GROUP,
        session_timeout=datetime.timedelta(milliseconds=GHOST_SESSION_MS),
        rebalance_timeout=datetime.timedelta(seconds=30),
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(JoinGroupRequestProtocol(name="range", metadata=subscription(TOPIC)),),
    )
    return wire.ask(address, body)


def test_the_coordinator_killed_mid_rebalance_loses_no_commit(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    cluster = ReplicatedCluster(
        zk_chroot,
        broker_factory,
        extra={
            "kafka.listener": "PLAINTEXT://127.0.0.1:0",
            "group.min.session.timeout.ms": 1_000,
            "group.initial.rebalance.delay.ms": 300,
            "offsets.topic.num.partitions": 2,
        },
    )
    members: list[Member] = []
    try:
        cluster.create_topic(TOPIC, PARTITIONS, replication_factor=3)
        addresses = {i: kafka_address(b) for i, b in cluster.brokers.items()}
        bootstrap = ",".join(addresses.values())
        write(cluster.bootstrap, TOPIC, "a", 60)
        old = find_coordinator(addresses[1])  # creates __consumer_offsets
        admin = AdminClient({"bootstrap.servers": bootstrap})

        def described() -> Any:
            return admin.describe_consumer_groups([GROUP])[GROUP].result(15)

        def counted() -> list[str]:
            return [r for m in members for r in m.records()]

        members.extend(Member(bootstrap, GROUP, TOPIC, "range") for _ in range(2))
        wait_until(lambda: len(counted()) >= 60, "the first 60 rows read", timeout=60)

        # The silent member joins; then a third member's join opens a rebalance that waits
        # for it (until its session times out).
        ghost_answer: list[Any] = []
        ghost = threading.Thread(
            target=lambda: ghost_answer.append(join_silently(addresses[old])), daemon=True
        )
        ghost.start()
        wait_until(
            lambda: (d := described()).state == ConsumerGroupState.STABLE and len(d.members) == 3,
            "the silent member in a stable generation",
            timeout=20,
        )
        ghost.join(10)
        assert ghost_answer and ghost_answer[0].error_code == ErrorCode.none, ghost_answer
        members.append(Member(bootstrap, GROUP, TOPIC, "range"))
        wait_until(
            lambda: described().state == ConsumerGroupState.PREPARING_REBALANCING,
            "the rebalance the third member opened",
            timeout=10,
        )
        victim = cluster.brokers[old]
        assert victim.kill(signal.SIGKILL) == -signal.SIGKILL
        acked_before = len(counted())
        assert acked_before == 60  # the silent member's partitions had been read before

        # A new coordinator at a higher leader epoch of the group's partition.
        survivors = [a for i, a in addresses.items() if i != old]
        new = wait_until(
            lambda: (n := _found(survivors[0])) not in (None, old) and n,
            "a new coordinator named by a survivor",
            timeout=30,
        )
        write(cluster.bootstrap, TOPIC, "b", 30)
        wait_until(lambda: len(counted()) >= 90, "90 rows read after the failover", timeout=90)
        final = wait_until(
            lambda: (
                (d := described()).state == ConsumerGroupState.STABLE and len(d.members) == 3 and d
            ),
            "the three live members stable on the new coordinator",
            timeout=30,
        )
        assert final.coordinator.id == new

        values = [r.split()[2] for r in counted()]
        assert len(values) == 90  # nothing read twice after a commit
        assert sorted(values) == sorted(
            [f"a-{i}" for i in range(60)] + [f"b-{i}" for i in range(30)]
        )
        ends = {
            p: cluster.client.list_offsets(TOPIC, p)["high_watermark"] for p in range(PARTITIONS)
        }
        for m in members:
            m.stop()
        committed = members[0].consumer.committed(
            [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], 15
        )
        assert {c.partition: c.offset for c in committed} == ends
    finally:
        for m in members:
            m.stop()
            m.consumer.close()
        cluster.close()


def _found(address: str) -> int | None:
    answer = wire.ask(address, wire.request(FIND_COORDINATOR, 1, key=GROUP, key_type=0))
    return int(answer.node_id) if answer.error_code == ErrorCode.none else None
