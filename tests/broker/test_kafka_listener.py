"""The Kafka listener (``kafka.listener``) of real broker processes, asked by librdkafka
(``confluent-kafka``, a Kafka client no one on this project wrote): Metadata through
``AdminClient.list_topics`` (brokers at their Kafka addresses, partitions, leaders,
replicas, ISR, topic ids), ListOffsets through ``Consumer.get_watermark_offsets`` and
``AdminClient.list_offsets`` with both isolation levels over an open transaction; the
listener off by default; a replicated cluster whose Metadata names every broker's Kafka
listener and each partition's leader as ZooKeeper has it."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import (
    Consumer,
    IsolationLevel,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from broker_core.client.broker_client import BrokerClient
from broker_core.server.config.broker_config import BrokerConfig
from broker_core.server.config.kafka import KAFKA_LISTENER
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import rows
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.replicated import ReplicatedCluster

KAFKA_LINE = re.compile(r"kafka listener: PLAINTEXT://127\.0\.0\.1:(\d+)")
KAFKA_ON = {KAFKA_LISTENER: "PLAINTEXT://127.0.0.1:0"}
TIMEOUT = 15.0


def kafka_address(broker: BrokerProcess) -> str:
    """The Kafka listener's bound address, from the broker's log (port 0: any free one)."""
    found = KAFKA_LINE.findall(broker.log_text())
    assert found, broker.log_tail()
    return f"127.0.0.1:{found[-1]}"


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10_000})


@pytest.fixture
def kafka_broker(broker_factory: BrokerFactory) -> BrokerProcess:
    return broker_factory(KAFKA_ON)


@pytest.fixture
def client(kafka_broker: BrokerProcess) -> Iterator[BrokerClient]:
    with BrokerClient(kafka_broker.address) as c:
        yield c


def test_the_listener_is_off_by_default(broker: BrokerProcess) -> None:
    assert not BrokerConfig.from_mapping({}).kafka.enabled
    assert "kafka listener" not in broker.log_text()


def test_list_topics_names_the_broker_topics_partitions_and_ids(
    kafka_broker: BrokerProcess, client: BrokerClient
) -> None:
    client.create_topic("orders", 3)
    client.create_topic("events", 1)
    bootstrap = kafka_address(kafka_broker)
    kafka = admin(bootstrap)  # held: a client dropped fails its pending futures
    metadata = kafka.list_topics(timeout=TIMEOUT)
    host, port = bootstrap.split(":")
    assert {b.id: (b.host, b.port) for b in metadata.brokers.values()} == {0: (host, int(port))}
    assert metadata.controller_id == 0
    # The broker's internal topics hold no Kafka records: not listed.
    assert set(metadata.topics) == {"orders", "events"}
    orders = metadata.topics["orders"]
    assert orders.error is None and sorted(orders.partitions) == [0, 1, 2]
    for p in orders.partitions.values():
        assert (p.leader, p.replicas, p.isrs, p.error) == (0, [0], [0], None)
    # The topic's id, as librdkafka's describe_topics reads it from Metadata (KIP-516):
    # idemlog's own, chosen at creation.
    described = kafka.describe_topics(TopicCollection(["orders"]))
    description = described["orders"].result(TIMEOUT)
    kafka_id = description.topic_id
    most, least = kafka_id.get_most_significant_bits(), kafka_id.get_least_significant_bits()
    as_int = ((most % 2**64) << 64) | (least % 2**64)  # the halves are signed longs
    assert uuid.UUID(int=as_int).hex == client.topic_id("orders")
    assert [p.leader.id for p in description.partitions] == [0, 0, 0]


def test_an_unknown_topic_is_unknown(kafka_broker: BrokerProcess) -> None:
    metadata = admin(kafka_address(kafka_broker)).list_topics("nope", timeout=TIMEOUT)
    error = metadata.topics["nope"].error
    assert error is not None and error.code() == 3  # UNKNOWN_TOPIC_OR_PARTITION


def test_watermarks_and_list_offsets_with_both_isolation_levels(
    kafka_broker: BrokerProcess, client: BrokerClient
) -> None:
    client.create_topic("wm", 1)
    pid, epoch = client.init_producer_id()
    with client.produce_stream("wm", 0) as stream:
        for seq in (0, 5):
            stream.send(
                rows(5, start=seq), producer_id=pid, producer_epoch=epoch, base_sequence=seq
            ).offsets(10)
    # A transaction left open: 3 rows the high watermark counts and read_committed not.
    txn_pid, txn_epoch = client.init_producer_id("open-txn")
    client.add_partitions_to_txn("open-txn", txn_pid, txn_epoch, [("wm", 0)])
    with client.produce_stream("wm", 0, transactional_id="open-txn") as stream:
        stream.send(
            rows(3, start=100), producer_id=txn_pid, producer_epoch=txn_epoch,
            base_sequence=0, transactional=True,
        ).offsets(10)  # fmt: skip
    bootstrap = kafka_address(kafka_broker)
    for isolation, latest in (("read_uncommitted", 13), ("read_committed", 10)):
        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "wm", "isolation.level": isolation}
        )
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition("wm", 0), TIMEOUT)
        finally:
            consumer.close()
        assert (low, high) == (0, latest), isolation
    tp = TopicPartition("wm", 0)
    kafka = admin(bootstrap)
    for spec, level, expected in (
        (OffsetSpec.earliest(), IsolationLevel.READ_COMMITTED, 0),
        (OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED, 13),
        (OffsetSpec.latest(), IsolationLevel.READ_COMMITTED, 10),
    ):
        answer = kafka.list_offsets({tp: spec}, isolation_level=level)[tp].result(TIMEOUT)
        assert answer.offset == expected, (spec, level)
        assert answer.leader_epoch == 0


def test_a_replicated_cluster_names_every_brokers_kafka_listener(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    cluster = ReplicatedCluster(zk_chroot, broker_factory, extra=KAFKA_ON)
    try:
        cluster.create_topic("repl", 2, replication_factor=3)
        addresses = {i: kafka_address(b) for i, b in cluster.brokers.items()}
        metadata = admin(addresses[1]).list_topics("repl", timeout=TIMEOUT)
        assert {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()} == addresses
        for index, partition in metadata.topics["repl"].partitions.items():
            state = cluster.state("repl", index)
            assert partition.leader == state.leader
            assert partition.replicas == list(state.replicas)
            assert sorted(partition.isrs) == sorted(state.isr)
    finally:
        cluster.close()
