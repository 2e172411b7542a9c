"""The Kafka listener (``kafka.listener``) of real broker processes, asked by librdkafka
(``confluent-kafka``, a Kafka client no one on this project wrote): Metadata through
``AdminClient.list_topics`` (brokers at their Kafka addresses, partitions, leaders,
replicas, ISR, topic ids), ListOffsets through ``Consumer.get_watermark_offsets`` and
``AdminClient.list_offsets`` with both isolation levels over an open transaction; the
listener off by default, a taken port refusing the start in one line; ListOffsets' fencing
by leader epoch and its refusals, and OffsetForLeaderEpoch, in requests written by kio;
a replicated cluster whose Metadata names every broker's Kafka listener, one cluster id
and each partition's leader as ZooKeeper has it (a topic created over Kafka's
CreateTopics on every broker too), and the new leader at its new epoch once the old one
is SIGKILLed, where Fetch is fenced and refused as ListOffsets is."""

from __future__ import annotations

import datetime
import re
import signal
import socket
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    IsolationLevel,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.schema.list_offsets.v7.request import ListOffsetsPartition as LoPartition
from kio.schema.list_offsets.v7.request import ListOffsetsTopic as LoTopic
from kio.schema.metadata.v12.request import MetadataRequestTopic as MdTopic
from kio.schema.offset_for_leader_epoch.v4.request import (
    OffsetForLeaderPartition as EpochPartition,
)
from kio.schema.offset_for_leader_epoch.v4.request import OffsetForLeaderTopic as EpochTopic
from kio.static.primitive import i8, i32, i64

from broker_core.client.broker_client import BrokerClient
from broker_core.protocol.wire import Action
from broker_core.server.config.broker_config import BrokerConfig
from broker_core.server.config.kafka import KAFKA_LISTENER, KAFKA_MAX_CONNECTIONS
from broker_core.server.kafka.apis import API_VERSIONS
from broker_core.server.kafka.consume import (
    EARLIEST,
    FETCH,
    LATEST,
    LIST_OFFSETS,
    OFFSET_FOR_LEADER_EPOCH,
)
from broker_core.server.kafka.metadata import METADATA
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import rows
from tests.harness import kafka_wire as wire
from tests.harness.broker import BrokerFactory, BrokerHarnessError, BrokerProcess
from tests.harness.replicated import ReplicatedCluster
from tests.harness.waiting import wait_until

KAFKA_LINE = re.compile(r"kafka listener: PLAINTEXT://127\.0\.0\.1:(\d+)")
KAFKA_ON = {KAFKA_LISTENER: "PLAINTEXT://127.0.0.1:0"}
TIMEOUT = 15.0
TOPIC = "repl"


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


def test_a_taken_kafka_port_refuses_the_start_in_one_line(broker_factory: BrokerFactory) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        broker = broker_factory({KAFKA_LISTENER: f"PLAINTEXT://127.0.0.1:{taken}"}, start=False)
        with pytest.raises(BrokerHarnessError):
            broker.start()
    assert broker.process is not None and broker.process.returncode == 2  # a config error
    assert f"kafka.listener=PLAINTEXT://127.0.0.1:{taken}: the address is already in use" in (
        broker.log_text()
    )
    assert "Traceback" not in broker.log_text()


def test_connections_past_the_bound_are_closed_and_the_open_ones_served(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory({**KAFKA_ON, KAFKA_MAX_CONNECTIONS: "2"})
    host, port = kafka_address(broker).split(":")
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(2)]
    try:
        versions = wire.request(
            API_VERSIONS, 3, client_software_name="test", client_software_version="1"
        )
        for sock in held:  # both are served: each is counted open once it answers
            sock.sendall(wire.request_bytes(1, versions))
            assert wire.read_response(sock.makefile("rb"), API_VERSIONS, 3)[0] == 1
        with socket.create_connection((host, int(port)), timeout=10) as third:
            assert third.recv(1) == b"", "the third connection was closed at once"
        # Logged after the close the client saw: waited for, not raced.
        said = "kafka: 1 connection(s) closed at once (the last from"
        wait_until(lambda: said in broker.log_text(), "the refusal logged")
        assert f"{KAFKA_MAX_CONNECTIONS}=2 are open" in broker.log_text()
    finally:
        for sock in held:
            sock.close()

    # A place freed is taken again, once the listener has seen the two close.
    def served() -> bool:
        try:
            return bool(wire.ask(kafka_address(broker), versions).error_code == ErrorCode.none)
        except (AssertionError, OSError):  # closed at once: the places are not free yet
            return False

    wait_until(served, "a connection served after the held ones closed")


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
    # Counted by API in the broker's metrics (and so on its Prometheus endpoint).
    counted = client.action(kafka_broker.address, Action.METRICS, {})["requests"]
    assert counted["kafka_metadata"]["count"] >= 2 and counted["kafka_api_versions"]["count"] >= 1
    assert counted["kafka_metadata"]["errors"] == 0


def metadata_topic_id(address: str, name: str) -> str:
    """The topic id the Kafka listener's Metadata v12 gives ``name``, as 32 hex digits."""
    answer = wire.ask(
        address,
        wire.request(
            METADATA,
            12,
            topics=(MdTopic(topic_id=None, name=name),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        ),
    )
    (topic,) = answer.topics
    assert topic.error_code == ErrorCode.none
    return str(topic.topic_id.hex)


def test_a_topic_recreated_under_its_name_has_another_id(
    kafka_broker: BrokerProcess, client: BrokerClient
) -> None:
    address = kafka_address(kafka_broker)
    client.create_topic("again", 1)
    first = metadata_topic_id(address, "again")
    assert first == client.topic_id("again")
    client.delete_topic("again")
    client.create_topic("again", 1)
    second = wait_until(
        lambda: (found := metadata_topic_id(address, "again")) != first and found,
        "Metadata to give the recreated topic its id",
    )
    assert second == client.topic_id("again", refresh=True)


def test_an_unknown_topic_is_unknown(kafka_broker: BrokerProcess) -> None:
    metadata = admin(kafka_address(kafka_broker)).list_topics("nope", timeout=TIMEOUT)
    error = metadata.topics["nope"].error
    assert error is not None and error.code() == 3  # UNKNOWN_TOPIC_OR_PARTITION
    invalid = wire.ask(
        kafka_address(kafka_broker),
        wire.request(
            METADATA,
            12,
            topics=(MdTopic(topic_id=None, name="no/such"), MdTopic(topic_id=None, name="__x")),
            allow_auto_topic_creation=True,  # asked: never created all the same
            include_topic_authorized_operations=False,
        ),
    )
    assert [(t.name, t.error_code) for t in invalid.topics] == [
        ("no/such", ErrorCode.invalid_topic_exception),
        ("__x", ErrorCode.invalid_topic_exception),  # the broker's internal prefix
    ]


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


def list_offsets(partition: int, timestamp: int, current_epoch: int = -1) -> Any:
    """ListOffsets v7 for ``repl``-style one-partition asks (read_uncommitted)."""
    return wire.request(
        LIST_OFFSETS,
        7,
        replica_id=i32(-1),
        isolation_level=i8(0),
        topics=(
            LoTopic(
                name=TOPIC,
                partitions=(
                    LoPartition(
                        partition_index=i32(partition),
                        current_leader_epoch=i32(current_epoch),
                        timestamp=i64(timestamp),
                    ),
                ),
            ),
        ),
    )


def offset_answer(address: str, partition: int, timestamp: int, epoch: int = -1) -> Any:
    (topic,) = wire.ask(address, list_offsets(partition, timestamp, epoch)).topics
    (answer,) = topic.partitions
    return answer


def test_list_offsets_fences_a_leader_epoch_and_refuses_what_it_does_not_serve(
    kafka_broker: BrokerProcess, client: BrokerClient
) -> None:
    client.create_topic(TOPIC, 1)
    address = kafka_address(kafka_broker)
    ok = offset_answer(address, 0, LATEST, epoch=0)
    assert (ok.error_code, ok.offset, ok.leader_epoch) == (ErrorCode.none, 0, 0)
    # An epoch this leader has not reached: the client knows of an election it has not.
    assert offset_answer(address, 0, LATEST, epoch=5).error_code == 75  # UNKNOWN_LEADER_EPOCH
    # By timestamp in an empty partition: no record at or after it (-1), not an error.
    empty = offset_answer(address, 0, 1_000)
    assert (empty.error_code, empty.offset, empty.timestamp) == (ErrorCode.none, -1, -1)
    assert offset_answer(address, 0, -5).error_code == ErrorCode.unsupported_version
    assert offset_answer(address, 7, LATEST).error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
    twice = list_offsets(0, LATEST)
    twice = replace(twice, topics=(twice.topics[0], twice.topics[0]))
    (first, second) = wire.ask(address, twice).topics
    assert [p.error_code for p in (*first.partitions, *second.partitions)] == [
        ErrorCode.invalid_request,
        ErrorCode.invalid_request,
    ]


def end_offset_answer(address: str, epoch: int, current_epoch: int = -1) -> Any:
    """OffsetForLeaderEpoch v4 for partition 0 of TOPIC: (error, epoch, end offset)."""
    asked = EpochPartition(
        partition=i32(0), current_leader_epoch=i32(current_epoch), leader_epoch=i32(epoch)
    )
    body = wire.request(
        OFFSET_FOR_LEADER_EPOCH,
        4,
        replica_id=i32(-1),
        topics=(EpochTopic(topic=TOPIC, partitions=(asked,)),),
    )
    ((answer,),) = (t.partitions for t in wire.ask(address, body).topics)
    return answer.error_code, answer.leader_epoch, answer.end_offset


def test_offset_for_leader_epoch_answers_where_an_epoch_ended(
    kafka_broker: BrokerProcess, client: BrokerClient
) -> None:
    client.create_topic(TOPIC, 1)
    pid, epoch = client.init_producer_id()
    with client.produce_stream(TOPIC, 0) as stream:
        stream.send(rows(4), producer_id=pid, producer_epoch=epoch, base_sequence=0).offsets(10)
    address = kafka_address(kafka_broker)
    # Epoch 0 is the latest: it ends at the log end.
    assert end_offset_answer(address, 0) == (ErrorCode.none, 0, 4)
    assert end_offset_answer(address, 0, current_epoch=0) == (ErrorCode.none, 0, 4)
    # An epoch above every one this log knows: undefined.
    assert end_offset_answer(address, 3) == (ErrorCode.none, -1, -1)
    # A client ahead of this leader's epoch is told so, not answered.
    assert end_offset_answer(address, 0, current_epoch=2)[0] == 75  # UNKNOWN_LEADER_EPOCH


def fetch_error(address: str, current_epoch: int = -1) -> Any:
    """Fetch v12 of partition 0 of TOPIC from offset 0: the partition's error code."""
    asked = FetchPartition(
        partition=i32(0),
        current_leader_epoch=i32(current_epoch),
        fetch_offset=i64(0),
        partition_max_bytes=i32(1 << 20),
    )
    body = wire.request(
        FETCH,
        12,
        max_wait=datetime.timedelta(0),
        min_bytes=i32(1),
        topics=(FetchTopic(topic=TOPIC, partitions=(asked,)),),
        forgotten_topics_data=(),
    )
    ((answer,),) = (t.partitions for t in wire.ask(address, body).responses)
    return answer.error_code


def test_a_replicated_cluster_names_every_brokers_kafka_listener_and_follows_elections(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    cluster = ReplicatedCluster(zk_chroot, broker_factory, extra=KAFKA_ON)
    try:
        cluster.create_topic(TOPIC, 2, replication_factor=3)
        addresses = {i: kafka_address(b) for i, b in cluster.brokers.items()}
        kafka = admin(addresses[1])
        metadata = kafka.list_topics(TOPIC, timeout=TIMEOUT)
        assert {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()} == addresses
        # One cluster, one id (ZooKeeper's <root>/cluster_id), whichever broker answers.
        ids = {admin(a).list_topics(timeout=TIMEOUT).cluster_id for a in addresses.values()}
        assert len(ids) == 1 and metadata.cluster_id in ids and None not in ids
        # A topic created over Kafka on one broker (factor -1: the cluster's, here 3) is
        # the cluster's: its replicas on every broker, in another broker's Metadata.
        (made,) = kafka.create_topics([NewTopic("made", 2)]).values()
        made.result(TIMEOUT)
        assert sorted(cluster.state("made", 0).replicas) == sorted(addresses)
        other = admin(addresses[2])
        wait_until(lambda: "made" in other.list_topics(timeout=TIMEOUT).topics, "made in Metadata")
        for index, partition in metadata.topics[TOPIC].partitions.items():
            state = cluster.state(TOPIC, index)
            assert partition.leader == state.leader
            assert partition.replicas == list(state.replicas)
            assert sorted(partition.isrs) == sorted(state.isr)

        # 6 rows acknowledged by every replica (acks=all) at the first leader's epoch.
        pid, producer_epoch = cluster.client.init_producer_id()
        with cluster.client.produce_stream(TOPIC, 0) as stream:
            stream.send(
                rows(6), producer_id=pid, producer_epoch=producer_epoch, base_sequence=0
            ).offsets(10)
        cluster.wait_in_sync(TOPIC, 0)

        # The leader of partition 0 SIGKILLed: the survivors' Metadata names the new leader
        # at its new epoch, the dead broker offline and gone from the brokers.
        before = cluster.state(TOPIC, 0)
        assert cluster.brokers[before.leader].kill(signal.SIGKILL) == -signal.SIGKILL
        after = cluster.wait_leader_change(TOPIC, 0, before.leader)
        assert after.leader_epoch > before.leader_epoch
        survivor = next(a for b, a in addresses.items() if b != before.leader)
        ask_metadata = wire.request(
            METADATA,
            12,
            topics=(MdTopic(topic_id=None, name=TOPIC),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )

        def without_the_dead() -> Any:
            answer = wire.ask(survivor, ask_metadata)
            return answer if before.leader not in {b.node_id for b in answer.brokers} else None

        # The survivor's registrations cache follows ZooKeeper's watch: polled, not slept.
        answer = wait_until(without_the_dead, f"broker {before.leader} gone from Metadata")
        (topic,) = answer.topics
        p0 = next(p for p in topic.partitions if p.partition_index == 0)
        assert (p0.error_code, p0.leader_id, p0.leader_epoch) == (
            ErrorCode.none, after.leader, after.leader_epoch,
        )  # fmt: skip
        assert list(p0.offline_replicas) == [before.leader]
        assert uuid.UUID(bytes=topic.topic_id.bytes).hex == cluster.client.topic_id(TOPIC)

        # ListOffsets at the new leader with the old epoch is fenced; at a follower, refused.
        leader = addresses[after.leader]
        fenced = offset_answer(leader, 0, LATEST, epoch=before.leader_epoch)
        assert fenced.error_code == 74  # FENCED_LEADER_EPOCH
        current = offset_answer(leader, 0, EARLIEST, epoch=after.leader_epoch)
        assert (current.error_code, current.leader_epoch) == (ErrorCode.none, after.leader_epoch)
        follower = next(a for b, a in addresses.items() if b not in (before.leader, after.leader))
        assert offset_answer(follower, 0, LATEST).error_code == 6  # NOT_LEADER_OR_FOLLOWER
        assert end_offset_answer(follower, before.leader_epoch)[0] == 6
        # Fetch: the same fencing and refusal; at the current epoch the rows are served.
        assert fetch_error(follower) == 6  # NOT_LEADER_OR_FOLLOWER
        assert fetch_error(leader, before.leader_epoch) == 74  # FENCED_LEADER_EPOCH
        assert fetch_error(leader, after.leader_epoch + 1) == 75  # UNKNOWN_LEADER_EPOCH
        assert fetch_error(leader, after.leader_epoch) == ErrorCode.none

        # A consumer that read at the old epoch asks where it ended: at the 6 rows every
        # replica has, so nothing it read was truncated by the election.
        assert end_offset_answer(leader, before.leader_epoch, after.leader_epoch) == (
            ErrorCode.none, before.leader_epoch, 6,
        )  # fmt: skip
    finally:
        cluster.close()
