"""Fetch on the Kafka listener, read by a Kafka client no one on this project wrote:
kafka-python's ``KafkaConsumer``, assigned (no group), reads a Kafka-shaped topic written
by idemlog's own transactional ``Producer`` with committed and aborted transactions.
read_committed: every committed row once, at the offset it has over Flight, keys, values,
headers and timestamps equal, no aborted row; read_uncommitted: the aborted rows too. A
consumer waiting at the end is answered when rows come (the long poll); a topic that is
not Kafka-shaped is refused per partition with UNSUPPORTED_FOR_MESSAGE_FORMAT; an offset
past the end is OFFSET_OUT_OF_RANGE."""

from __future__ import annotations

import datetime
import time
import uuid
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as CkPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KpPartition
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.schema.fetch.v16.request import FetchPartition as PartitionById
from kio.schema.fetch.v16.request import FetchTopic as TopicById
from kio.static.primitive import i8, i32, i64

from broker_core.client.broker_client import BrokerClient
from broker_core.kafka.record_batch import HEADERS_TYPE, decode_batches
from broker_core.producer.producer import Producer
from broker_core.server.kafka.consume import FETCH
from tests.broker.test_kafka_listener import kafka_address
from tests.harness import kafka_wire as wire
from tests.harness.broker import BrokerFactory, BrokerProcess

TOPIC = "kshaped"
DEADLINE_S = 20.0
KAFKA_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", pa.timestamp("ms")),
        pa.field("headers", HEADERS_TYPE),
    ]
)
# One record as a client sees it: (offset, key, value, timestamp ms, headers).
Record = tuple[int, bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]


def kafka_rows(tag: str, count: int, start_ms: int = 1_700_000_000_000) -> pa.Table:
    """``count`` Kafka-shaped rows named by ``tag``: a null key and no headers on every
    third, two headers on the others (one with a null value)."""
    keys = [None if i % 3 == 0 else f"{tag}-k{i}".encode() for i in range(count)]
    headers = [
        [] if i % 3 == 0 else [{"key": "h", "value": f"{i}".encode()}, {"key": "n", "value": None}]
        for i in range(count)
    ]
    return pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array([f"{tag}-v{i}".encode() for i in range(count)], pa.binary()),
            "timestamp": pa.array([start_ms + i for i in range(count)], pa.timestamp("ms")),
            "headers": pa.array(headers, HEADERS_TYPE),
        },
        schema=KAFKA_SCHEMA,
    )


def transaction(address: str, txn_id: str, rows: pa.Table, *, commit: bool) -> None:
    with Producer(address, **{"transactional.id": txn_id}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(TOPIC, rows)
        producer.flush()
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()


def over_flight(client: BrokerClient, isolation: str) -> list[Record]:
    """The rows as idemlog's own reader gives them, each at its offset."""
    found: list[Record] = []
    offset = 0
    while True:
        answer = client.fetch_once(TOPIC, 0, offset, isolation=isolation)
        for meta, batch in answer.batches:
            for i, row in enumerate(batch.to_pylist()):
                ts = int(row["timestamp"].timestamp() * 1000)
                headers = [(h["key"], h["value"]) for h in row["headers"]]
                found.append((meta.base_offset + i, row["key"], row["value"], ts, headers))
        if answer.trailer.next_offset == offset:
            return found
        offset = answer.trailer.next_offset


def read_kafka_python(bootstrap: str, isolation: str, count: int) -> list[Record]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level=isolation,
        fetch_max_wait_ms=200,
    )
    try:
        tp = KpPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        found: list[Record] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(found) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                found.extend(
                    (r.offset, r.key, r.value, r.timestamp, [(k, v) for k, v in r.headers])
                    for r in records
                )
        return found
    finally:
        consumer.close()


def confluent(bootstrap: str, isolation: str, **extra: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "kafka-fetch",  # librdkafka wants one; nothing is committed
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "fetch.wait.max.ms": 200,
            **extra,
        }
    )


def poll_confluent(consumer: Consumer, count: int, seconds: float = DEADLINE_S) -> list[Record]:
    found: list[Record] = []
    deadline = time.monotonic() + seconds
    while len(found) < count and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is None:
            continue
        error = message.error()
        assert error is None or error.code() == KafkaError._PARTITION_EOF, error
        if error is None:
            headers = list(message.headers() or [])
            _, ts = message.timestamp()
            found.append((message.offset(), message.key(), message.value(), ts, headers))
    return found


@pytest.fixture
def written(broker_factory: BrokerFactory) -> tuple[BrokerProcess, BrokerClient]:
    broker = broker_factory({"kafka.listener": "PLAINTEXT://127.0.0.1:0"})
    client = BrokerClient(broker.address)
    client.create_topic(TOPIC, 1, schema=KAFKA_SCHEMA)
    transaction(broker.address, "first", kafka_rows("c1", 5), commit=True)
    transaction(broker.address, "aborted", kafka_rows("ab", 4), commit=False)
    transaction(broker.address, "second", kafka_rows("c2", 6), commit=True)
    return broker, client


def test_kafka_clients_read_committed_rows_once_and_no_aborted_row(
    written: tuple[BrokerProcess, BrokerClient],
) -> None:
    broker, client = written
    committed = over_flight(client, "read_committed")
    everything = over_flight(client, "read_uncommitted")
    assert len(committed) == 11 and len(everything) == 15
    assert [r[2] for r in everything if r not in committed] == [
        f"ab-v{i}".encode() for i in range(4)
    ]
    bootstrap = kafka_address(broker)

    assert read_kafka_python(bootstrap, "read_committed", len(committed)) == committed
    assert read_kafka_python(bootstrap, "read_uncommitted", len(everything)) == everything
    for isolation, expected in (("read_committed", committed), ("read_uncommitted", everything)):
        consumer = confluent(bootstrap, isolation)
        try:
            consumer.assign([CkPartition(TOPIC, 0, 0)])
            assert poll_confluent(consumer, len(expected)) == expected, isolation
        finally:
            consumer.close()


def test_a_consumer_waiting_at_the_end_gets_rows_produced_after_it_started(
    written: tuple[BrokerProcess, BrokerClient],
) -> None:
    broker, client = written
    end = client.list_offsets(TOPIC, 0)["last_stable_offset"]
    consumer = KafkaConsumer(
        bootstrap_servers=kafka_address(broker),
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        fetch_max_wait_ms=5_000,  # the long poll: answered when the rows come, not after
    )
    try:
        tp = KpPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, end)
        assert consumer.poll(timeout_ms=1_000) == {}  # nothing yet: it waits
        transaction(broker.address, "later", kafka_rows("late", 3), commit=True)
        started, late = time.monotonic(), []
        while len(late) < 3 and time.monotonic() < started + DEADLINE_S:
            for records in consumer.poll(timeout_ms=500).values():
                late.extend((r.offset, r.value) for r in records)
        waited = time.monotonic() - started
    finally:
        consumer.close()
    assert late == [(end + i, f"late-v{i}".encode()) for i in range(3)]
    assert waited < 4.0  # woken by the commit, not by fetch_max_wait_ms

    # librdkafka too, from the new end.
    end += 4  # the 3 rows and their commit marker
    consumer = confluent(kafka_address(broker), "read_committed", **{"fetch.wait.max.ms": 5000})
    try:
        consumer.assign([CkPartition(TOPIC, 0, end)])
        assert poll_confluent(consumer, 1, seconds=1.0) == []
        transaction(broker.address, "latest", kafka_rows("last", 2), commit=True)
        last = poll_confluent(consumer, 2)
    finally:
        consumer.close()
    assert [(r[0], r[2]) for r in last] == [(end + i, f"last-v{i}".encode()) for i in range(2)]


def fetch_v12(
    address: str, offset: int, max_wait_ms: int = 0, partition_max_bytes: int = 1 << 20
) -> Any:
    body = wire.request(
        FETCH,
        12,
        replica_id=i32(-1),
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=i32(1),
        max_bytes=i32(1 << 20),
        isolation_level=i8(1),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(
            FetchTopic(
                topic=TOPIC,
                partitions=(
                    FetchPartition(
                        partition=i32(0),
                        fetch_offset=i64(offset),
                        partition_max_bytes=i32(partition_max_bytes),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    ((answer,),) = (t.partitions for t in wire.ask(address, body).responses)
    return answer


def test_fetch_refuses_what_it_does_not_serve(broker_factory: BrokerFactory) -> None:
    broker = broker_factory({"kafka.listener": "PLAINTEXT://127.0.0.1:0"})
    client = BrokerClient(broker.address)
    client.create_topic(TOPIC, 1, schema=pa.schema([pa.field("id", pa.int64())]))
    with Producer(broker.address) as producer:
        producer.send(TOPIC, pa.table({"id": pa.array([1, 2], pa.int64())}))
        producer.flush()
    address = kafka_address(broker)
    refused = fetch_v12(address, 0)
    assert refused.error_code == ErrorCode.unsupported_for_message_format
    past = fetch_v12(address, 5)
    assert past.error_code == ErrorCode.offset_out_of_range
    # At the end with nothing to read: answered after max_wait, empty, not an error.
    started = time.monotonic()
    empty = fetch_v12(address, 2, max_wait_ms=300)
    assert time.monotonic() - started >= 0.3
    assert (empty.error_code, empty.records, empty.high_watermark) == (ErrorCode.none, b"", 2)


def test_fetch_by_topic_id(written: tuple[BrokerProcess, BrokerClient]) -> None:
    broker, client = written
    address = kafka_address(broker)

    def fetch_v16(topic_id: uuid.UUID) -> Any:
        asked = PartitionById(
            partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)
        )
        body = wire.request(
            FETCH,
            16,
            max_wait=datetime.timedelta(0),
            min_bytes=i32(1),
            isolation_level=i8(1),
            topics=(TopicById(topic_id=topic_id, partitions=(asked,)),),
            forgotten_topics_data=(),
        )
        (topic,) = wire.ask(address, body).responses
        assert topic.topic_id == topic_id
        (answer,) = topic.partitions
        return answer

    known = fetch_v16(uuid.UUID(hex=client.topic_id(TOPIC)))
    assert (known.error_code, known.last_stable_offset) == (ErrorCode.none, 18)
    assert len(known.records) > 0 and [a.producer_id for a in known.aborted_transactions] == [1]
    assert fetch_v16(uuid.uuid4()).error_code == ErrorCode.unknown_topic_id


def test_batches_are_whole_with_their_producer_fields_and_limits_keep_one(
    written: tuple[BrokerProcess, BrokerClient],
) -> None:
    broker, _ = written
    address = kafka_address(broker)
    answer = fetch_v12(address, 0)
    batches = decode_batches(answer.records)
    # Each stored batch one Kafka batch, each marker a control batch, at idemlog's offsets.
    assert [(b.base_offset, b.rows.num_rows, b.is_control) for b in batches] == [
        (0, 5, False), (5, 1, True), (6, 4, False), (10, 1, True), (11, 6, False), (17, 1, True),
    ]  # fmt: skip
    assert [(b.producer_id, b.is_transactional) for b in batches if not b.is_control] == [
        (0, True), (1, True), (2, True),
    ]  # fmt: skip
    assert [b.base_sequence for b in batches if not b.is_control] == [0, 0, 0]
    assert [a.producer_id for a in answer.aborted_transactions] == [1]
    # A limit below one batch: that batch all the same, and only it; asked from inside a
    # batch, the whole batch (the client skips the rows before its offset).
    one = decode_batches(fetch_v12(address, 2, partition_max_bytes=1).records)
    assert [(b.base_offset, b.rows.num_rows) for b in one] == [(0, 5)]
