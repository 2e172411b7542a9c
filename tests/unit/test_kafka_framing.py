"""The Kafka listener's framing and ApiVersions, over a real socket: requests encoded by
kio as a Kafka client encodes them, pipelined on one connection and answered in order;
ApiVersions at every served version, flexible ones with the v0 response header Kafka
requires; a version not served answered at v0 with UNSUPPORTED_VERSION; an API not
served, a frame too large or cut short closing the connection; every served version of
Metadata, ListOffsets and OffsetForLeaderEpoch answered in its own layout (kio reads the
answer back whole)."""

from __future__ import annotations

import datetime
import io
import socket
import struct
import sys
import uuid
from collections.abc import Iterator
from dataclasses import fields
from types import SimpleNamespace
from typing import Any, cast

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i16, i32, i64

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.records import BrokerInfo, PartitionState, TopicAssignment
from broker_core.errors import (
    InvalidRequestError,
    MessageTooLargeError,
    UnknownTopicOrPartitionError,
)
from broker_core.producer_ids.manager import ProducerIdManager
from broker_core.server.config.kafka import KafkaListenerConfig
from broker_core.server.kafka.apis import API_VERSIONS, KafkaApis
from broker_core.server.kafka.consume import (
    FETCH,
    LIST_OFFSETS,
    OFFSET_FOR_LEADER_EPOCH,
    ConsumeApis,
    KafkaTopics,
    ReadCuts,
)
from broker_core.server.kafka.framing import KafkaRequest, read_frame
from broker_core.server.kafka.init_producer_id import INIT_PRODUCER_ID, InitProducerIdApi
from broker_core.server.kafka.listener import KafkaListener
from broker_core.server.kafka.metadata import METADATA, MetadataApi
from broker_core.server.kafka.produce import PRODUCE, ProduceApi
from broker_core.server.observability.metrics import Metrics
from tests.harness.kafka_wire import read_response, request_bytes

MAX_BYTES = 64 * 1024


# Every InitProducerId is given producer id 7.
FIXED_PRODUCER_IDS = SimpleNamespace(generate_producer_id=lambda: 7)


def kafka_apis(topics: Any, cluster: Any) -> KafkaApis:
    """The broker's families over ``topics`` and ``cluster`` (fakes)."""
    return KafkaApis(
        [
            MetadataApi(lambda: cast(ClusterMetadata, cluster)),
            ConsumeApis(
                cast(KafkaTopics, topics),
                lambda: cast(ClusterMetadata, cluster),
                cast(ReadCuts, SimpleNamespace(refresh_s=0.1, ends=lambda topic, topic_id: {})),
            ),
            ProduceApi(cast(KafkaTopics, topics), lambda: None, Metrics()),
            InitProducerIdApi(lambda: cast(ProducerIdManager, FIXED_PRODUCER_IDS)),
        ]
    )


SERVED = kafka_apis(None, None).served


def api_versions_request(version: int) -> Any:
    schema = load_request_schema(API_VERSIONS, version)
    if version >= 3:
        return schema(client_software_name="test", client_software_version="1")
    return schema()


def unknown(topic: str, partition: int, topic_id: str | None = None) -> Any:
    raise UnknownTopicOrPartitionError(f"no topic {topic!r}")


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def listener(metrics: Metrics) -> Iterator[KafkaListener]:
    info = BrokerInfo(0, "127.0.0.1", 1, kafka_listener=("127.0.0.1", 1))
    cluster = SimpleNamespace(brokers=lambda: [info], topics=lambda: {}, controller=lambda: info)
    # No topic: every ListOffsets partition is UNKNOWN_TOPIC_OR_PARTITION.
    topics = SimpleNamespace(leader_log=unknown, partition=unknown)
    apis = kafka_apis(topics, cluster)
    config = KafkaListenerConfig(True, "127.0.0.1", 0, "127.0.0.1", 0)
    served = KafkaListener(
        config, apis, gate=lambda: None, max_request_bytes=MAX_BYTES, metrics=metrics
    )
    served.start()
    try:
        yield served
    finally:
        served.stop()


def connect(listener: KafkaListener) -> socket.socket:
    assert listener.port is not None
    return socket.create_connection(("127.0.0.1", listener.port), timeout=10)


def closed(sock: socket.socket) -> bool:
    return sock.recv(1) == b""


@pytest.mark.parametrize("version", range(SERVED[API_VERSIONS][0], SERVED[API_VERSIONS][1] + 1))
def test_api_versions_lists_exactly_what_is_served(listener: KafkaListener, version: int) -> None:
    with connect(listener) as sock:
        sock.sendall(request_bytes(41, api_versions_request(version)))
        correlation_id, body = read_response(sock.makefile("rb"), API_VERSIONS, version)
    assert correlation_id == 41 and body.error_code == ErrorCode.none
    listed = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
    assert listed == dict(SERVED)


def test_pipelined_requests_are_answered_in_order_and_counted(
    listener: KafkaListener, metrics: Metrics
) -> None:
    metadata = load_request_schema(METADATA, 12)(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    asked = [(1, API_VERSIONS, 3), (2, METADATA, 12), (3, API_VERSIONS, 0), (4, METADATA, 12)]
    frames = {API_VERSIONS: {3: api_versions_request(3), 0: api_versions_request(0)}}
    with connect(listener) as sock:
        sock.sendall(
            b"".join(
                request_bytes(c, metadata if key == METADATA else frames[key][v])
                for c, key, v in asked
            )
        )
        stream = sock.makefile("rb")
        answers = [read_response(stream, key, v) for _, key, v in asked]
    assert [c for c, _ in answers] == [1, 2, 3, 4]
    counted = metrics.document(0, {}, None)["requests"]
    assert counted["kafka_api_versions"]["count"] == counted["kafka_metadata"]["count"] == 2
    assert counted["kafka_list_offsets"]["count"] == 0
    brokers = answers[1][1].brokers
    assert [(b.node_id, b.host, b.port) for b in brokers] == [(0, "127.0.0.1", 1)]


def test_an_api_versions_version_not_served_is_answered_at_v0(listener: KafkaListener) -> None:
    # A client newer than the listener: ApiVersions v9, whose layout is unknown here.
    frame = struct.pack(">hhih", API_VERSIONS, 9, 77, -1) + b"\x00\x00\x00"
    with connect(listener) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        stream = sock.makefile("rb")
        correlation_id, body = read_response(stream, API_VERSIONS, 0)
        assert correlation_id == 77 and body.error_code == ErrorCode.unsupported_version
        assert {k.api_key for k in body.api_keys} == set(SERVED)
        # The connection stays open: the client asks again at a version listed.
        sock.sendall(request_bytes(78, api_versions_request(2)))
        assert read_response(stream, API_VERSIONS, 2)[0] == 78


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">hhih", 0, 9, 5, -1),  # Produce: not served yet
        struct.pack(">hhih", METADATA, 0, 5, -1),  # Metadata v0: below the versions served
        struct.pack(">hhi", METADATA, 12, 5) + b"\x7f",  # cut inside the header
    ],
)
def test_a_request_not_served_or_not_decodable_closes_the_connection(
    listener: KafkaListener, frame: bytes
) -> None:
    with connect(listener) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        assert closed(sock)


def test_a_frame_larger_than_max_request_bytes_closes_the_connection(
    listener: KafkaListener,
) -> None:
    with connect(listener) as sock:
        sock.sendall(struct.pack(">i", MAX_BYTES + 1) + b"\x00" * 16)
        assert closed(sock)


def test_read_frame_says_what_is_wrong() -> None:
    assert read_frame(io.BytesIO(b""), MAX_BYTES) is None  # closed between requests
    with pytest.raises(MessageTooLargeError, match=r"max\.request\.bytes=65536"):
        read_frame(io.BytesIO(struct.pack(">i", MAX_BYTES + 1)), MAX_BYTES)
    with pytest.raises(InvalidRequestError, match="2 bytes short"):
        read_frame(io.BytesIO(struct.pack(">i", 10) + b"\x00" * 8), MAX_BYTES)
    with pytest.raises(InvalidRequestError, match="below a header's"):
        read_frame(io.BytesIO(struct.pack(">i", -1)), MAX_BYTES)


def test_stop_closes_open_connections(listener: KafkaListener) -> None:
    with connect(listener) as sock:
        sock.sendall(request_bytes(1, api_versions_request(3)))
        read_response(sock.makefile("rb"), API_VERSIONS, 3)
        listener.stop()
        assert closed(sock)


def _build_request(api_key: int, version: int) -> Any:
    """A request of every served version, built from the fields each version has."""
    schema = load_request_schema(api_key, version)
    module = sys.modules[schema.__module__]
    values: dict[str, Any] = {
        "client_software_name": "test",
        "client_software_version": "1",
        "allow_auto_topic_creation": False,
        "include_cluster_authorized_operations": False,
        "include_topic_authorized_operations": False,
        "replica_id": i32(-1),
        "isolation_level": i8(1),
        "timeout": datetime.timedelta(seconds=1),
    }
    if api_key == METADATA:
        topic = module.MetadataRequestTopic
        names = {f.name for f in fields(topic)}
        kw = {"name": "t"} | ({"topic_id": None} if "topic_id" in names else {})
        values["topics"] = (topic(**kw),)
    elif api_key == LIST_OFFSETS:
        partition = module.ListOffsetsPartition
        names = {f.name for f in fields(partition)}
        kw = {"partition_index": i32(0), "timestamp": i64(-1)}
        if "current_leader_epoch" in names:
            kw["current_leader_epoch"] = i32(-1)
        values["topics"] = (module.ListOffsetsTopic(name="t", partitions=(partition(**kw),)),)
    elif api_key == OFFSET_FOR_LEADER_EPOCH:
        asked = module.OffsetForLeaderPartition(
            partition=i32(0), current_leader_epoch=i32(-1), leader_epoch=i32(0)
        )
        values["topics"] = (module.OffsetForLeaderTopic(topic="t", partitions=(asked,)),)
    elif api_key == PRODUCE:
        values |= {"acks": i16(-1), "transactional_id": None}
        data = module.PartitionProduceData(index=i32(0), records=None)
        values["topic_data"] = (module.TopicProduceData(name="t", partition_data=(data,)),)
    elif api_key == INIT_PRODUCER_ID:
        values |= {
            "transactional_id": None,
            "transaction_timeout": datetime.timedelta(seconds=60),
            "producer_id": i64(-1),
            "producer_epoch": i16(-1),
        }
    elif api_key == FETCH:
        values |= {"max_wait": datetime.timedelta(0), "min_bytes": i32(1)}
        values["forgotten_topics_data"] = ()
        fetched = module.FetchPartition(
            partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1024)
        )
        by_id = "topic_id" in {f.name for f in fields(module.FetchTopic)}  # v13 on
        named = {"topic_id": uuid.uuid4()} if by_id else {"topic": "t"}
        values["topics"] = (module.FetchTopic(**named, partitions=(fetched,)),)
    wanted = {f.name for f in fields(schema)}
    return schema(**{k: v for k, v in values.items() if k in wanted})


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(key, v) for key, (low, high) in sorted(SERVED.items()) for v in range(low, high + 1)],
)
def test_every_served_version_is_answered_in_its_own_layout(
    listener: KafkaListener, api_key: int, version: int
) -> None:
    with connect(listener) as sock:
        sock.sendall(request_bytes(9, _build_request(api_key, version)))
        correlation_id, body = read_response(sock.makefile("rb"), api_key, version)
    assert correlation_id == 9
    if api_key == METADATA:
        (topic,) = body.topics
        assert (topic.name, topic.error_code) == ("t", ErrorCode.unknown_topic_or_partition)
    elif api_key == LIST_OFFSETS:
        (answer,) = body.topics[0].partitions
        assert (answer.error_code, answer.offset) == (ErrorCode.unknown_topic_or_partition, -1)
    elif api_key == PRODUCE:
        (answer,) = body.responses[0].partition_responses
        assert answer.error_code == ErrorCode.unknown_topic_or_partition
    elif api_key == INIT_PRODUCER_ID:
        assert (body.error_code, body.producer_id, body.producer_epoch) == (ErrorCode.none, 7, 0)
    elif api_key == FETCH:
        (answer,) = body.responses[0].partitions
        unknown = (
            ErrorCode.unknown_topic_id if version >= 13 else ErrorCode.unknown_topic_or_partition
        )
        assert (answer.error_code, answer.records) == (unknown, b"")
        assert getattr(body, "session_id", 0) == 0  # sessionless (KIP-227), v7 on
    elif api_key == OFFSET_FOR_LEADER_EPOCH:
        (answer,) = body.topics[0].partitions
        assert (answer.error_code, answer.end_offset) == (
            ErrorCode.unknown_topic_or_partition, -1,
        )  # fmt: skip


def test_metadata_names_a_leader_only_where_a_kafka_client_can_reach_it() -> None:
    # Broker 1 serves a Kafka listener, broker 2 does not, broker 3 is down (unregistered).
    with_kafka = BrokerInfo(1, "h1", 1, kafka_listener=("k1", 9093))
    brokers = [with_kafka, BrokerInfo(2, "h2", 2)]
    states = {
        0: PartitionState((1, 2, 3), 1, 4, (1, 2)),
        1: PartitionState((2, 1, 3), 2, 7, (2, 1)),
        2: PartitionState((3, 1), 3, 2, (3,)),
    }
    topic = TopicAssignment.of("t", states, None, {}, topic_id="ab" * 16)
    cluster = SimpleNamespace(
        brokers=lambda: brokers, topics=lambda: {"t": topic}, controller=lambda: brokers[1]
    )
    apis = kafka_apis(SimpleNamespace(), cluster)
    request = _build_request(METADATA, 12)
    body = apis.handle(KafkaRequest(METADATA, 12, 1, "test", request))
    assert [(b.node_id, b.host, b.port) for b in body.brokers] == [(1, "k1", 9093)]
    assert body.controller_id == -1  # broker 2 controls but serves no Kafka listener
    (answer,) = body.topics
    assert answer.topic_id == uuid.UUID(hex="ab" * 16)
    shown = {
        p.partition_index: (p.error_code, p.leader_id, p.leader_epoch, p.offline_replicas)
        for p in answer.partitions
    }
    assert shown == {
        0: (ErrorCode.none, 1, 4, (3,)),
        1: (ErrorCode.leader_not_available, -1, 7, (3,)),  # no Kafka listener on 2
        2: (ErrorCode.leader_not_available, -1, 2, (3,)),  # 3 is down
    }


def test_a_listener_other_machines_reach_is_warned_about(
    metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    apis = kafka_apis(SimpleNamespace(), None)
    for host, warned in (("127.0.0.1", False), ("0.0.0.0", True)):
        caplog.clear()
        config = KafkaListenerConfig(True, host, 0, "h", 0)
        exposed = KafkaListener(
            config, apis, gate=lambda: None, max_request_bytes=MAX_BYTES, metrics=metrics
        )
        exposed.start()
        exposed.stop()
        assert ("without TLS or authentication" in caplog.text) is warned, host
