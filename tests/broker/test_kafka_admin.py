"""The Kafka listener's admin APIs, asked by clients no one on this project wrote, of one
real broker process for the module: librdkafka's ``AdminClient`` creates (and validates
only), describes and deletes topics, describes their configs, the broker's and the
cluster; every version in requests written by kio, DeleteTopics by topic id; a Kafka
producer's records in a topic CreateTopics made; Kafka 4.1's own tools from
``jars/kafka-broker`` (``make kafka-jars``): ``kafka-topics.sh``'s TopicCommand creates
a topic and ``--describe`` prints its partitions with leaders, replicas and ISR, and
``kafka-console-consumer.sh``'s ConsoleConsumer with read_committed prints exactly the
committed rows of a topic created over Kafka where a transaction was aborted."""

from __future__ import annotations

import base64
import datetime
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kio.index import load_request_schema
from kio.schema.delete_topics.v6.request import DeleteTopicState
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i16, i32

from broker_core.client.broker_client import BrokerClient
from broker_core.producer.producer import Producer
from broker_core.server.kafka.admin import (
    CREATE_TOPICS,
    DELETE_TOPICS,
    DESCRIBE_CLUSTER,
    DESCRIBE_CONFIGS,
    KAFKA_TOPIC_SCHEMA,
    TOPIC_RESOURCE,
)
from broker_core.server.kafka.messages import build, nested
from tests.broker.test_kafka_listener import KAFKA_ON, kafka_address
from tests.harness import kafka_wire as wire
from tests.harness.broker import BrokerFactory, BrokerProcess

REPO = Path(__file__).resolve().parents[2]
KAFKA_JARS = REPO / "jars" / "kafka-broker"
TIMEOUT = 15.0
TOOL_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("kafka-admin"))
    try:
        yield factory(KAFKA_ON, name="kadmin")
    finally:
        factory.close()


@pytest.fixture(scope="module")
def admin(kafka_broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_address(kafka_broker)})


def create(admin: AdminClient, *topics: NewTopic, validate_only: bool = False) -> dict[str, str]:
    """Each topic's outcome: "" when created, else its error's name and message."""
    outcome = {}
    for name, future in admin.create_topics(list(topics), validate_only=validate_only).items():
        try:
            future.result(TIMEOUT)
            outcome[name] = ""
        except KafkaException as exc:
            error = exc.args[0]
            outcome[name] = f"{error.name()}: {error.str()}"
    return outcome


def kafka_tool(main: str, *args: str) -> subprocess.CompletedProcess[str]:
    """One of Kafka's command-line tools (their main class), as kafka-*.sh runs it."""
    assert (KAFKA_JARS / "kafka-tools-4.1.2.jar").exists(), "run `make kafka-jars`"
    return subprocess.run(
        ["java", "-cp", f"{KAFKA_JARS}/*", main, *args],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT_S,
        check=False,
    )


def test_admin_client_creates_describes_and_deletes_topics(
    kafka_broker: BrokerProcess, admin: AdminClient
) -> None:
    assert create(admin, NewTopic("checked", 2), validate_only=True) == {"checked": ""}
    assert "checked" not in admin.list_topics(timeout=TIMEOUT).topics  # only validated
    created = create(admin, NewTopic("orders", 3, 1, config={"retention.ms": "60000"}))
    assert created == {"orders": ""}
    refused = create(
        admin,
        NewTopic("orders", 1),
        NewTopic("zipped", 1, config={"compression.type": "gzip"}),
        NewTopic("copies", 1, 2),
        NewTopic("__mine", 1),
    )
    assert refused["orders"].startswith("TOPIC_ALREADY_EXISTS")
    assert refused["zipped"] == ("INVALID_CONFIG: unknown topic config key 'compression.type'"), (
        refused
    )
    assert (
        refused["copies"].startswith("INVALID_REPLICATION_FACTOR") and "live" in (refused["copies"])
    )
    assert refused["__mine"].startswith("TOPIC_EXCEPTION")  # librdkafka's name of 17
    # The same refusals without creating anything when only validated.
    assert create(admin, NewTopic("orders", 1), validate_only=True)["orders"].startswith(
        "TOPIC_ALREADY_EXISTS"
    )

    metadata = admin.list_topics(timeout=TIMEOUT)
    assert sorted(metadata.topics["orders"].partitions) == [0, 1, 2]
    with BrokerClient(kafka_broker.address) as client:
        (described,) = client.describe_topics(["orders"])
        # Kafka-shaped, as Spark's Kafka columns: what Kafka clients read and Spark writes.
        assert described.schema == KAFKA_TOPIC_SCHEMA
        assert dict(described.config) == {"retention.ms": "60000", "replication.factor": "1"}

    (configs,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "orders")]).values()
    entries = configs.result(TIMEOUT)
    retention = entries["retention.ms"]
    assert (retention.value, retention.source) == ("60000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    segment = entries["segment.bytes"]
    assert (segment.value, segment.source) == ("1073741824", ConfigSource.DEFAULT_CONFIG.value)
    assert all(e.is_read_only for e in entries.values())  # fixed at creation
    assert entries["cleanup.policy"].value == "delete"

    own_id = str(broker_id(kafka_broker))
    (mine,) = admin.describe_configs([ConfigResource(ResourceType.BROKER, own_id)]).values()
    broker_entries = mine.result(TIMEOUT)
    assert broker_entries["broker.id"].value == own_id
    assert broker_entries["kafka.listener"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    secret = broker_entries["sasl.inter.broker.password"]
    assert secret.is_sensitive and secret.value is None

    cluster = admin.describe_cluster().result(TIMEOUT)
    assert cluster.cluster_id is not None and len(cluster.cluster_id) == 22
    assert cluster.cluster_id == metadata.cluster_id  # Metadata answers the same id
    assert admin.describe_cluster().result(TIMEOUT).cluster_id == cluster.cluster_id
    assert cluster.controller.id == broker_id(kafka_broker)
    assert [(n.id, f"{n.host}:{n.port}") for n in cluster.nodes] == [
        (broker_id(kafka_broker), kafka_address(kafka_broker))
    ]

    (deleting,) = admin.delete_topics(["orders"]).values()
    deleting.result(TIMEOUT)
    assert "orders" not in admin.list_topics(timeout=TIMEOUT).topics
    (again,) = admin.delete_topics(["orders"]).values()
    with pytest.raises(KafkaException) as unknown:
        again.result(TIMEOUT)
    assert unknown.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_delete_topics_by_id(kafka_broker: BrokerProcess, admin: AdminClient) -> None:
    assert create(admin, NewTopic("by-id", 1)) == {"by-id": ""}
    with BrokerClient(kafka_broker.address) as client:
        topic_id = uuid.UUID(hex=client.topic_id("by-id"))

    def delete(asked: uuid.UUID) -> tuple[ErrorCode, str | None]:
        body = wire.request(
            DELETE_TOPICS,
            6,
            topics=(DeleteTopicState(name=None, topic_id=asked),),
            timeout=datetime.timedelta(seconds=10),
        )
        (result,) = wire.ask(kafka_address(kafka_broker), body).responses
        return result.error_code, result.name

    assert delete(uuid.uuid4())[0] == ErrorCode.unknown_topic_id
    assert delete(topic_id) == (ErrorCode.none, "by-id")
    assert "by-id" not in admin.list_topics(timeout=TIMEOUT).topics
    assert delete(topic_id)[0] == ErrorCode.unknown_topic_id  # gone: its id with it


def test_every_admin_version_is_answered_in_its_own_layout(kafka_broker: BrokerProcess) -> None:
    """CreateTopics v2-v7, DescribeConfigs v1-v4, DeleteTopics v1-v6 and DescribeCluster
    v0-v1, each version written by kio: the fields each version has, answered."""
    address = kafka_address(kafka_broker)
    timeout = datetime.timedelta(seconds=10)

    def ask(api_key: int, version: int, **values: object) -> Any:
        return wire.ask(address, build(load_request_schema(api_key, version), **values))

    ids = set()
    for version in range(2, 8):
        schema = load_request_schema(CREATE_TOPICS, version)
        config = nested(schema, "CreatableTopicConfig")(name="retention.ms", value="1000")
        topic = nested(schema, "CreatableTopic")(
            name=f"v{version}",
            num_partitions=i32(2),
            replication_factor=i16(-1),
            assignments=(),
            configs=(config,),
        )
        (created,) = ask(CREATE_TOPICS, version, topics=(topic,), timeout=timeout).topics
        assert (created.name, created.error_code) == (f"v{version}", ErrorCode.none)
        if version >= 5:
            assert (created.num_partitions, created.replication_factor) == (2, 1)
            assert {c.name: c.value for c in created.configs}["retention.ms"] == "1000"
        if version >= 7:
            ids.add(created.topic_id)
    assert len(ids) == 1 and uuid.UUID(int=0) not in ids
    for version in range(1, 5):
        schema = load_request_schema(DESCRIBE_CONFIGS, version)
        resource = nested(schema, "DescribeConfigsResource")(
            resource_type=i8(TOPIC_RESOURCE), resource_name="v2", configuration_keys=None
        )
        answer = ask(
            DESCRIBE_CONFIGS,
            version,
            resources=(resource,),
            include_synonyms=True,
            include_documentation=True,
        )
        (result,) = answer.results
        assert result.error_code == ErrorCode.none
        retention = {c.name: c for c in result.configs}["retention.ms"]
        assert (retention.value, retention.read_only, retention.config_source) == ("1000", True, 1)
        assert [(s.value, s.source) for s in retention.synonyms] == [("1000", 1), ("604800000", 5)]
    for version in range(1, 7):
        name = f"v{version + 1}"
        schema = load_request_schema(DELETE_TOPICS, version)
        if version >= 6:
            named = {"topics": (nested(schema, "DeleteTopicState")(name=name, topic_id=None),)}
        else:
            named = {"topic_names": (name,)}
        (deleted,) = ask(DELETE_TOPICS, version, timeout=timeout, **named).responses
        assert (deleted.name, deleted.error_code) == (name, ErrorCode.none)
    clusters = [
        ask(DESCRIBE_CLUSTER, v, include_cluster_authorized_operations=False) for v in (0, 1)
    ]
    assert {c.cluster_id for c in clusters} == {clusters[0].cluster_id}
    assert all(c.error_code == ErrorCode.none and len(c.brokers) == 1 for c in clusters)
    controllers = ask(
        DESCRIBE_CLUSTER, 1, include_cluster_authorized_operations=False, endpoint_type=i8(2)
    )
    assert controllers.error_code == ErrorCode.unsupported_endpoint_type


@pytest.mark.slow  # two JVMs of Kafka's tools (~4 s each)
def test_kafka_topics_creates_and_describes_the_partitions(kafka_broker: BrokerProcess) -> None:
    bootstrap = kafka_address(kafka_broker)
    made = kafka_tool(
        "org.apache.kafka.tools.TopicCommand",
        "--bootstrap-server",
        bootstrap,
        "--create",
        "--topic",
        "described",
        "--partitions",
        "2",
        "--config",
        "cleanup.policy=compact",
    )
    assert (made.returncode, made.stdout.strip()) == (0, "Created topic described."), made.stderr
    shown = kafka_tool(
        "org.apache.kafka.tools.TopicCommand",
        "--bootstrap-server",
        bootstrap,
        "--describe",
        "--topic",
        "described",
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.strip().splitlines()
    with BrokerClient(kafka_broker.address) as client:
        topic_id = uuid.UUID(hex=client.topic_id("described"))
    header = lines[0].split("\t")
    assert header[:4] == [
        "Topic: described",
        f"TopicId: {_kafka_uuid(topic_id)}",
        "PartitionCount: 2",
        "ReplicationFactor: 1",
    ]
    assert header[4] == "Configs: cleanup.policy=compact"  # the factor: the cluster's choice
    broker = broker_id(kafka_broker)
    for p, line in enumerate(lines[1:]):
        fields = line.strip().split("\t")
        assert fields[:5] == [
            "Topic: described",
            f"Partition: {p}",
            f"Leader: {broker}",
            f"Replicas: {broker}",
            f"Isr: {broker}",
        ]
    assert len(lines) == 3


def _kafka_uuid(topic_id: uuid.UUID) -> str:
    """A topic id as Kafka prints it: base64url of its 16 bytes, unpadded."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()


def kafka_rows(tag: str, count: int) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([f"{tag}-k{i}".encode() for i in range(count)], pa.binary()),
            "value": pa.array([f"{tag}-v{i}".encode() for i in range(count)], pa.binary()),
            "timestamp": pa.array(
                [1_700_000_000_000_000 + i for i in range(count)], pa.timestamp("us", tz="UTC")
            ),
            "headers": pa.array([[] for _ in range(count)], KAFKA_TOPIC_SCHEMA.field(3).type),
        },
        schema=KAFKA_TOPIC_SCHEMA,
    )


def transaction(address: str, topic: str, txn_id: str, rows: pa.Table, *, commit: bool) -> None:
    with Producer(address, **{"transactional.id": txn_id}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, rows)  # one partition: every row in partition 0
        producer.flush()
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()


@pytest.mark.slow  # a JVM of Kafka's tools (~4 s)
def test_console_consumer_prints_only_the_committed_rows(
    kafka_broker: BrokerProcess, admin: AdminClient
) -> None:
    assert create(admin, NewTopic("console", 1)) == {"console": ""}
    transaction(kafka_broker.address, "console", "c1", kafka_rows("c1", 4), commit=True)
    transaction(kafka_broker.address, "console", "ab", kafka_rows("ab", 3), commit=False)
    transaction(kafka_broker.address, "console", "c2", kafka_rows("c2", 5), commit=True)
    committed = [f"c1-v{i}" for i in range(4)] + [f"c2-v{i}" for i in range(5)]

    printed = kafka_tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server",
        kafka_address(kafka_broker),
        "--topic",
        "console",
        "--partition",
        "0",
        "--offset",
        "earliest",
        "--max-messages",
        str(len(committed)),
        "--isolation-level",
        "read_committed",
        "--timeout-ms",
        "30000",
    )
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == committed
    assert f"Processed a total of {len(committed)} messages" in printed.stderr


def broker_id(broker: BrokerProcess) -> int:
    return int(str(broker.config.get("broker.id", 0)))


def test_a_topic_created_over_kafka_takes_a_kafka_producers_records(
    kafka_broker: BrokerProcess, admin: AdminClient
) -> None:
    """Kafka's CreateTopics then an idempotent librdkafka producer: the records land as
    rows of the Kafka-shaped schema, headers and timestamps with them."""
    assert create(admin, NewTopic("produced", 1)) == {"produced": ""}
    producer = KafkaProducer(
        {"bootstrap.servers": kafka_address(kafka_broker), "enable.idempotence": True}
    )
    failures: list[object] = []
    for i in range(5):
        producer.produce(
            "produced",
            value=b"v%d" % i,
            key=b"k%d" % i,
            headers=[("h", b"%d" % i)],
            timestamp=1_700_000_000_000 + i,
            on_delivery=lambda error, _m: failures.append(error) if error else None,
        )
    assert producer.flush(TIMEOUT) == 0 and failures == []
    with BrokerClient(kafka_broker.address) as client:
        answer = client.fetch_once("produced", 0, 0, isolation="read_uncommitted")
    rows = [row for _, batch in answer.batches for row in batch.to_pylist()]
    assert [(r["key"], r["value"], r["headers"]) for r in rows] == [
        (b"k%d" % i, b"v%d" % i, [{"key": "h", "value": b"%d" % i}]) for i in range(5)
    ]
    assert [int(r["timestamp"].timestamp() * 1000) for r in rows] == [
        1_700_000_000_000 + i for i in range(5)
    ]


@pytest.mark.slow  # two JVMs of Kafka's tools
def test_console_consumer_in_a_group_and_kafka_consumer_groups_describe_its_lag(
    kafka_broker: BrokerProcess, admin: AdminClient
) -> None:
    """``kafka-console-consumer.sh --group`` reads in a consumer group (subscribe, commits
    on close); ``kafka-consumer-groups.sh --describe`` then shows the group's committed
    offset, the partition's end and the lag, as the AdminClient reads them."""
    topic, group = "grouped_console", "console-group"
    bootstrap = kafka_address(kafka_broker)
    assert create(admin, NewTopic(topic, 1)) == {topic: ""}
    transaction(kafka_broker.address, topic, "g1", kafka_rows("g1", 4), commit=True)
    transaction(kafka_broker.address, topic, "g2", kafka_rows("g2", 3), commit=False)
    consumed = kafka_tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--group",
        group,
        "--from-beginning",
        "--max-messages",
        "4",
        "--isolation-level",
        "read_committed",
        "--timeout-ms",
        "30000",
    )
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == [f"g1-v{i}" for i in range(4)]

    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    (committed,) = offsets[group].result(TIMEOUT).topic_partitions
    described = kafka_tool(
        "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
        "--bootstrap-server",
        bootstrap,
        "--describe",
        "--group",
        group,
    )
    assert described.returncode == 0, described.stderr
    rows = [line.split() for line in described.stdout.splitlines() if topic in line]
    # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG ...
    ((name, shown_topic, partition, current, end, lag, *_),) = rows
    assert (name, shown_topic, partition) == (group, topic, "0")
    assert committed.offset >= 4  # past the four rows read
    assert (int(current), int(end)) == (committed.offset, 9)  # 4 rows, 3 aborted, 2 markers
    assert int(lag) == 9 - committed.offset
