"""Fetch on the Kafka listener, read by a Kafka client no one on this project wrote:
kafka-python's ``KafkaConsumer``, assigned (no group), reads a Kafka-shaped topic written
by idemlog's own transactional ``Producer`` with committed and aborted transactions.
read_committed: every committed row once, at the offset it has over Flight, keys, values,
headers and timestamps equal, no aborted row; read_uncommitted: the aborted rows too. A
consumer waiting at the end is answered when rows come (the long poll); a topic that is
not Kafka-shaped is served as JSON records; an offset past the end is OFFSET_OUT_OF_RANGE;
read_committed stops at the stable cut; offsets are found by timestamp."""

from __future__ import annotations

import datetime
import threading
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
from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsTopic
from kio.static.primitive import i8, i32, i64

from broker_core.client.broker_client import BrokerClient
from broker_core.kafka.record_batch import HEADERS_TYPE, decode_batches
from broker_core.producer.producer import Producer
from broker_core.protocol.wire import SinkAttempt
from broker_core.server.kafka.consume import FETCH, LIST_OFFSETS
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
    address: str,
    offset: int,
    max_wait_ms: int = 0,
    partition_max_bytes: int = 1 << 20,
    *,
    topic: str = TOPIC,
    partition: int = 0,
    isolation: int = 1,
) -> Any:
    body = wire.request(
        FETCH,
        12,
        replica_id=i32(-1),
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=i32(1),
        max_bytes=i32(1 << 20),
        isolation_level=i8(isolation),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(
            FetchTopic(
                topic=topic,
                partitions=(
                    FetchPartition(
                        partition=i32(partition),
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


def test_fetch_serves_other_schemas_as_json_and_refuses_offsets_past_the_end(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory({"kafka.listener": "PLAINTEXT://127.0.0.1:0"})
    client = BrokerClient(broker.address)
    client.create_topic(TOPIC, 1, schema=pa.schema([pa.field("id", pa.int64())]))
    with Producer(broker.address) as producer:
        producer.send(TOPIC, pa.table({"id": pa.array([1, 2], pa.int64())}))
        producer.flush()
    address = kafka_address(broker)
    # Not Kafka-shaped: each row a JSON object (kafka.format's default), null keys.
    as_json = fetch_v12(address, 0)
    (batch,) = decode_batches(as_json.records)
    assert batch.rows.column("value").to_pylist() == [b'{"id":1}', b'{"id":2}']
    assert batch.rows.column("key").to_pylist() == [None, None]
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


def _send_transactional(
    client: BrokerClient, topic: str, tid: str, p: int, rows: pa.Table, pid: int, epoch: int
) -> tuple[int, int]:
    with client.produce_stream(topic, p, transactional_id=tid) as stream:
        acked = stream.send(
            rows.to_batches()[0],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            transactional=True,
        ).offsets(10)
    return acked[0], acked[1]


def latest_committed(address: str, topic: str, partition: int) -> int:
    asked = ListOffsetsPartition(
        partition_index=i32(partition), current_leader_epoch=i32(-1), timestamp=i64(-1)
    )
    body = wire.request(
        LIST_OFFSETS,
        7,
        replica_id=i32(-1),
        isolation_level=i8(1),
        topics=(ListOffsetsTopic(name=topic, partitions=(asked,)),),
    )
    (answer,) = wire.ask(address, body).topics[0].partitions
    assert answer.error_code == ErrorCode.none
    return int(answer.offset)


def test_read_committed_holds_a_sink_batch_back_until_it_is_whole_everywhere(
    broker_factory: BrokerFactory,
) -> None:
    """A sink batch B writes both partitions; another writer's open transaction sits on
    partition 1 below B's rows there. Once B commits, partition 0's own last stable
    offset passes B's rows, but B is not whole anywhere yet (its rows on partition 1
    wait for the other transaction): a Kafka read_committed consumer is held at the
    stable cut, as idemlog's readers are, on ListOffsets and on Fetch, and a fetch
    waiting there is answered when the other transaction ends."""
    broker = broker_factory({"kafka.listener": "PLAINTEXT://127.0.0.1:0"})
    client = BrokerClient(broker.address)
    topic = "cut"
    client.create_topic(topic, 2, schema=KAFKA_SCHEMA)
    other_pid, other_epoch = client.init_producer_id("other")
    client.add_partitions_to_txn("other", other_pid, other_epoch, [(topic, 1)])
    _send_transactional(client, topic, "other", 1, kafka_rows("o", 1), other_pid, other_epoch)
    tid = "b/0"
    pid, epoch, _ = client.init_sink_producer(tid, 60_000, SinkAttempt("b", "run", 1))
    client.add_partitions_to_txn(tid, pid, epoch, [(topic, 0), (topic, 1)])
    ranges = [
        (topic, p, *_send_transactional(client, topic, tid, p, kafka_rows(f"b{p}", 2), pid, epoch))
        for p in (0, 1)
    ]
    client.prepare_sink_txn(tid, pid, epoch, 1, ranges)
    assert client.commit_sink_batch("b", 1, [(tid, pid, epoch)], "run")
    address = kafka_address(broker)
    # The scenario: partition 0 alone would show B's rows (its marker is written).
    assert client.list_offsets(topic, 0)["last_stable_offset"] == 3
    assert client.list_offsets(topic, 1)["last_stable_offset"] == 0
    assert client.stable_ends(topic) == {0: 0, 1: 0}

    assert latest_committed(address, topic, 0) == 0
    held = fetch_v12(address, 0, max_wait_ms=300, topic=topic)
    assert (held.error_code, held.records, held.last_stable_offset) == (ErrorCode.none, b"", 0)
    uncommitted = fetch_v12(address, 0, topic=topic, isolation=0)
    assert len(decode_batches(uncommitted.records)) == 2  # B's rows and their marker

    waiting: list[Any] = []
    fetcher = threading.Thread(
        target=lambda: waiting.append(fetch_v12(address, 0, max_wait_ms=10_000, topic=topic))
    )
    fetcher.start()
    started = time.monotonic()
    client.end_txn("other", other_pid, other_epoch, commit=True)
    fetcher.join(DEADLINE_S)
    waited = time.monotonic() - started
    (answer,) = waiting
    values = [
        v for b in decode_batches(answer.records) if not b.is_control
        for v in b.rows.column("value").to_pylist()
    ]  # fmt: skip
    assert values == [b"b0-v0", b"b0-v1"] and answer.last_stable_offset == 3
    assert waited < 5.0  # woken when the cut moved, not at max_wait
    assert latest_committed(address, topic, 0) == 3


def test_offsets_by_timestamp_are_the_records_a_consumer_sees(
    written: tuple[BrokerProcess, BrokerClient],
) -> None:
    """Rows c1 (offsets 0-4), aborted ab (6-9), c2 (11-16), each at start + its index:
    the first record at or after a time, as librdkafka's offsets_for_times asks, and the
    largest (-3, KIP-734) over the wire, read_committed and not."""
    broker, _ = written
    bootstrap, start = kafka_address(broker), 1_700_000_000_000

    def at(timestamp: int, isolation: int) -> tuple[int, int]:
        asked = ListOffsetsPartition(
            partition_index=i32(0), current_leader_epoch=i32(-1), timestamp=i64(timestamp)
        )
        body = wire.request(
            LIST_OFFSETS,
            7,
            replica_id=i32(-1),
            isolation_level=i8(isolation),
            topics=(ListOffsetsTopic(name=TOPIC, partitions=(asked,)),),
        )
        (answer,) = wire.ask(bootstrap, body).topics[0].partitions
        assert answer.error_code == ErrorCode.none
        return int(answer.offset), int(answer.timestamp)

    assert at(start + 3, 1) == (3, start + 3)
    assert at(-3, 1) == (16, start + 5)
    assert at(start + 5, 0) == (16, start + 5)  # no aborted row has it
    assert at(-3, 0) == (16, start + 5)

    consumer = confluent(bootstrap, "read_committed")
    try:
        found = [
            consumer.offsets_for_times([CkPartition(TOPIC, 0, start + t)], timeout=DEADLINE_S)
            for t in (0, 4, 5, 100)  # a partition once per request: twice is refused
        ]
    finally:
        consumer.close()
    assert [tp.offset for (tp,) in found] == [0, 4, 16, -1]
