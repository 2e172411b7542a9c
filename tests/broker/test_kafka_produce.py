"""Produce and InitProducerId on the Kafka listener, written by Kafka clients no one on
this project wrote: librdkafka's idempotent producer (confluent-kafka) and kafka-python's
producer write into a Kafka-shaped topic; the rows read back over Flight (idemlog's
BrokerClient) and by a Kafka consumer equal what was acknowledged, at the same offsets.
acks=0 and 1 too. Requests written by kio force what a client's API does not show: a
retried batch answered NONE with its original offsets (and the broker's duplicate
counter moved), a sequence gap refused, a transactional id refused, a topic that is not
Kafka-shaped refused naming its columns; librdkafka's gzip, snappy, lz4 and zstd
batches written as their rows. The fault
test: librdkafka's idempotent producer through a proxy that resets and stalls its
connections mid-stream; every acknowledged record is in the log exactly once, in order,
and the broker answered duplicates."""

from __future__ import annotations

import datetime
import socket
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer
from confluent_kafka import Producer as CkProducer
from confluent_kafka import TopicPartition as CkPartition
from kafka import KafkaProducer
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData
from kio.static.primitive import i16, i32

from broker_core.client.broker_client import BrokerClient
from broker_core.kafka.record_batch import encode_batch
from broker_core.server.kafka.init_producer_id import INIT_PRODUCER_ID
from broker_core.server.kafka.produce import PRODUCE
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.test_kafka_fetch import KAFKA_SCHEMA
from tests.broker.test_kafka_listener import KAFKA_ON, kafka_address
from tests.harness import kafka_wire as wire
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.kafka_fault_proxy import KafkaFaultProxy
from tests.harness.replicated import ReplicatedCluster

DEADLINE_S = 30.0
# (partition, offset, key, value) of a record as acknowledged or read
Row = tuple[int, int, bytes | None, bytes]


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("kafka-produce"))
    try:
        yield factory(KAFKA_ON, name="kproduce")
    finally:
        factory.close()


@pytest.fixture(scope="module")
def client(kafka_broker: BrokerProcess) -> Iterator[BrokerClient]:
    with BrokerClient(kafka_broker.address, timeout_s=20.0) as c:
        yield c


def over_flight(client: BrokerClient, topic: str, partition: int) -> list[Row]:
    found: list[Row] = []
    offset = 0
    while True:
        answer = client.fetch_once(topic, partition, offset)
        for meta, batch in answer.batches:
            for i, row in enumerate(batch.to_pylist()):
                found.append((partition, meta.base_offset + i, row["key"], row["value"]))
        if answer.trailer.next_offset == offset:
            return found
        offset = answer.trailer.next_offset


def over_kafka(bootstrap: str, topic: str, partitions: int, count: int) -> list[Row]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "kp", "enable.auto.commit": False}
    )
    found: list[Row] = []
    try:
        consumer.assign([CkPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + DEADLINE_S
        while len(found) < count and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is None:
                continue
            assert m.error() is None, m.error()
            found.append((m.partition(), m.offset(), m.key(), m.value()))
    finally:
        consumer.close()
    return sorted(found)


def duplicates(client: BrokerClient) -> int:
    totals = client.metrics()["totals"]
    return int(totals["duplicates_in_window"]) + int(totals["duplicates_beyond_window"])


def confluent_produce(
    bootstrap: str, topic: str, values: list[bytes], partitions: int = 2, **config: Any
) -> list[Row]:
    """Each value (key ``k<i>``, partition i % ``partitions``) produced; the acknowledged
    rows."""
    acked: list[Row] = []
    errors: list[Any] = []

    def report(error: Any, m: Any) -> None:
        if error is not None:
            errors.append(error)
        else:
            acked.append((m.partition(), m.offset(), m.key(), m.value()))

    producer = CkProducer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    for i, value in enumerate(values):
        producer.produce(topic, value, key=b"k%d" % i, partition=i % partitions, on_delivery=report)
        producer.poll(0)
    assert producer.flush(DEADLINE_S) == 0
    assert errors == []
    return sorted(acked)


def test_idempotent_kafka_producers_write_what_both_protocols_read(
    kafka_broker: BrokerProcess, client: BrokerClient
) -> None:
    client.create_topic("kp", 2, schema=KAFKA_SCHEMA)
    bootstrap = kafka_address(kafka_broker)
    acked = confluent_produce(
        bootstrap, "kp", [b"ck-%d" % i for i in range(40)], **{"enable.idempotence": True}
    )
    assert len(acked) == 40
    # kafka-python 3 (idempotent by default).
    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all")
    futures = [
        producer.send("kp", value=b"kp-%d" % i, key=b"j%d" % i, partition=1) for i in range(10)
    ]
    producer.flush(DEADLINE_S)
    acked += [
        (1, f.get(DEADLINE_S).offset, b"j%d" % i, b"kp-%d" % i) for i, f in enumerate(futures)
    ]
    producer.close()
    acked.sort()
    flight = over_flight(client, "kp", 0) + over_flight(client, "kp", 1)
    assert sorted(flight) == acked
    assert over_kafka(bootstrap, "kp", 2, len(acked)) == acked
    # Each Kafka batch is one idemlog batch under its producer's id: two producers.
    producers = {
        meta.producer_id
        for p in (0, 1)
        for meta, _ in client.fetch_once("kp", p, 0, max_bytes=1 << 20).batches
    }
    assert len(producers) == 2 and min(producers) >= 0


@pytest.mark.parametrize("acks", [0, 1])
def test_acks_0_and_1(kafka_broker: BrokerProcess, client: BrokerClient, acks: int) -> None:
    topic = f"acks{acks}"
    client.create_topic(topic, 2, schema=KAFKA_SCHEMA)
    values = [b"a%d-%d" % (acks, i) for i in range(10)]
    acked = confluent_produce(kafka_address(kafka_broker), topic, values, acks=acks)
    assert len(acked) == 10
    rows = over_flight(client, topic, 0) + over_flight(client, topic, 1)
    deadline = time.monotonic() + DEADLINE_S
    while len(rows) < 10 and time.monotonic() < deadline:  # acks=0: not waited for
        time.sleep(0.1)
        rows = over_flight(client, topic, 0) + over_flight(client, topic, 1)
    assert sorted(r[3] for r in rows) == sorted(values)
    if acks == 1:
        assert sorted(rows) == acked


def init_producer_id(address: str, txn_id: str | None = None) -> Any:
    body = wire.request(
        INIT_PRODUCER_ID,
        4,
        transactional_id=txn_id,
        transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=-1,
        producer_epoch=i16(-1),
    )
    return wire.ask(address, body)


def produce(address: str, topic: str, records: bytes) -> Any:
    """One Produce v9 (acks=-1) of ``records`` to partition 0; that partition's answer."""
    body = produce_request(topic, records)
    ((answer,),) = (t.partition_responses for t in wire.ask(address, body).responses)
    return answer


def produce_request(topic: str, records: bytes, acks: int = -1) -> Any:
    return wire.request(
        PRODUCE,
        9,
        transactional_id=None,
        acks=i16(acks),
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            TopicProduceData(
                name=topic,
                partition_data=(PartitionProduceData(index=i32(0), records=records),),
            ),
        ),
    )


def kafka_rows(count: int, tag: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"key": [None] * count, "value": [f"{tag}{i}".encode() for i in range(count)]},
        schema=pa.schema([("key", pa.binary()), ("value", pa.binary())]),
    )


def test_a_retry_is_answered_with_the_original_offsets_and_a_gap_refused(
    kafka_broker: BrokerProcess, client: BrokerClient
) -> None:
    client.create_topic("retry", 1, schema=KAFKA_SCHEMA)
    address = kafka_address(kafka_broker)
    given = init_producer_id(address)
    assert given.error_code == ErrorCode.none and given.producer_epoch == 0
    pid = int(given.producer_id)
    assert int(init_producer_id(address).producer_id) != pid  # a fresh id each time
    produce(address, "retry", encode_batch(kafka_rows(2, "x"), base_offset=0))  # no pid
    batch = encode_batch(
        kafka_rows(3, "r"), base_offset=0, producer_id=pid, producer_epoch=0, base_sequence=0
    )
    before = duplicates(client)
    first = produce(address, "retry", batch)
    again = produce(address, "retry", batch)
    assert (first.error_code, int(first.base_offset)) == (ErrorCode.none, 2)
    assert (again.error_code, int(again.base_offset)) == (ErrorCode.none, 2)
    assert duplicates(client) == before + 1
    gap = encode_batch(
        kafka_rows(1, "g"), base_offset=0, producer_id=pid, producer_epoch=0, base_sequence=7
    )
    refused = produce(address, "retry", gap)
    assert refused.error_code == ErrorCode.out_of_order_sequence_number
    assert "expected sequence 3" in refused.error_message
    # Five more batches (the window): the first retried again is beyond it.
    for seq in range(3, 8):
        later = encode_batch(
            kafka_rows(1, f"w{seq}"),
            base_offset=0,
            producer_id=pid,
            producer_epoch=0,
            base_sequence=seq,
        )
        assert produce(address, "retry", later).error_code == ErrorCode.none
    beyond = produce(address, "retry", batch)
    assert (beyond.error_code, int(beyond.base_offset)) == (
        ErrorCode.duplicate_sequence_number, -1,
    )  # fmt: skip
    assert duplicates(client) == before + 2
    # A newer epoch fences the older one; an id never issued is unknown.
    bumped = encode_batch(
        kafka_rows(1, "e"), base_offset=0, producer_id=pid, producer_epoch=1, base_sequence=0
    )
    assert produce(address, "retry", bumped).error_code == ErrorCode.none
    stale = encode_batch(
        kafka_rows(1, "s"), base_offset=0, producer_id=pid, producer_epoch=0, base_sequence=8
    )
    assert produce(address, "retry", stale).error_code == ErrorCode.invalid_producer_epoch
    stranger = encode_batch(
        kafka_rows(1, "u"), base_offset=0, producer_id=10**12, producer_epoch=0, base_sequence=0
    )
    assert produce(address, "retry", stranger).error_code == ErrorCode.unknown_producer_id
    assert [r[3] for r in over_flight(client, "retry", 0)] == [
        b"x0", b"x1", b"r0", b"r1", b"r2", *(b"w%d0" % s for s in range(3, 8)), b"e0",
    ]  # fmt: skip


def test_what_is_refused_is_named(kafka_broker: BrokerProcess, client: BrokerClient) -> None:
    address = kafka_address(kafka_broker)
    assert init_producer_id(address, "txn-1").error_code == ErrorCode.unsupported_version
    assert "InitProducerId for transactional id 'txn-1'" in kafka_broker.log_text()
    assert init_producer_id(address, "").error_code == ErrorCode.invalid_request
    client.create_topic("small", 1, schema=KAFKA_SCHEMA, config={"max.message.bytes": "2000"})
    big = pa.RecordBatch.from_pydict({"value": [b"b" * 3000]})
    answer = produce(address, "small", encode_batch(big, base_offset=0))
    assert answer.error_code == ErrorCode.message_too_large
    assert "max.message.bytes=2000" in answer.error_message
    client.create_topic("ids", 1, schema=pa.schema([("id", pa.int64())]))
    one_row = encode_batch(kafka_rows(1, "n"), base_offset=0)
    answer = produce(address, "ids", one_row)
    assert answer.error_code == ErrorCode.invalid_record
    assert "topic 'ids' (id: int64) cannot hold Kafka records" in answer.error_message
    client.create_topic("bytes", 1, schema=KAFKA_SCHEMA)
    flipped = bytearray(one_row)
    flipped[-2] ^= 0x01
    answer = produce(address, "bytes", bytes(flipped))
    assert answer.error_code == ErrorCode.corrupt_message and "CRC-32C" in answer.error_message
    answer = produce(address, "bytes", one_row + one_row)
    assert answer.error_code == ErrorCode.invalid_record
    assert "exactly one per partition" in answer.error_message
    # With acks=0 there is no answer: the connection is closed, as Kafka closes it.
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(wire.request_bytes(1, produce_request("ids", one_row, acks=0)))
        assert sock.recv(1) == b""
    client.create_topic("strings", 1, schema=pa.schema([("value", pa.string())]))
    bad = pa.RecordBatch.from_pydict({"value": [b"\xff\xfe"]})
    answer = produce(address, "strings", encode_batch(bad, base_offset=0))
    assert answer.error_code == ErrorCode.invalid_record
    assert "value is not UTF-8" in answer.error_message
    txn = encode_batch(
        kafka_rows(1, "t"),
        base_offset=0,
        producer_id=int(init_producer_id(address).producer_id),
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
    )
    answer = produce(address, "strings", txn)
    assert answer.error_code == ErrorCode.unsupported_version
    assert "Kafka transactions are not served" in answer.error_message
    assert client.list_offsets("strings", 0)["high_watermark"] == 0  # nothing written


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_are_written_as_their_rows(
    kafka_broker: BrokerProcess, client: BrokerClient, codec: str
) -> None:
    topic = f"codec-{codec}"
    client.create_topic(topic, 2, schema=KAFKA_SCHEMA)
    # Values librdkafka shrinks (it sends what does not shrink uncompressed).
    values = [(b"%s-%d " % (codec.encode(), i)) * 50 for i in range(20)]
    acked = confluent_produce(
        kafka_address(kafka_broker),
        topic,
        values,
        **{"enable.idempotence": True, "compression.type": codec},
    )
    assert sorted(over_flight(client, topic, 0) + over_flight(client, topic, 1)) == acked
    assert sorted(r[3] for r in acked) == sorted(values)


def test_librdkafka_through_resets_and_stalls_writes_each_acked_record_once(
    broker_factory: BrokerFactory,
) -> None:
    with KafkaFaultProxy(reset_every=4, stall_every=7, stall_s=1.2) as proxy:
        broker = broker_factory(
            {**KAFKA_ON, "kafka.advertised.listener": f"PLAINTEXT://{proxy.address}"}
        )
        proxy.point_at(kafka_address(broker))
        client = BrokerClient(broker.address, timeout_s=20.0)
        client.create_topic("faults", 2, schema=KAFKA_SCHEMA)
        proxy.armed.set()
        values = [b"f%d" % i for i in range(200)]
        acked = confluent_produce(
            proxy.address,
            "faults",
            values,
            **{
                "enable.idempotence": True,
                "batch.num.messages": 10,
                "request.timeout.ms": 1000,  # below the stall: a request given up on
                "reconnect.backoff.max.ms": 200,
                "retry.backoff.ms": 50,
                "message.timeout.ms": 60_000,
            },
        )
        proxy.armed.clear()
        assert proxy.resets > 0 and proxy.stalls > 0  # the faults fired
        assert len(acked) == len(values)
        for partition in (0, 1):
            log = over_flight(client, "faults", partition)
            assert log == [r for r in acked if r[0] == partition]  # once each, in order
            sent = [v for i, v in enumerate(values) if i % 2 == partition]
            assert [r[3] for r in log] == sent
        assert duplicates(client) > 0
        client.close()


def test_acks_all_on_a_zookeeper_cluster_waits_for_the_in_sync_replicas(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    cluster = ReplicatedCluster(zk_chroot, broker_factory, count=2, extra=KAFKA_ON)
    try:
        # No schema: the first Kafka batch gives the topic the decoded one.
        cluster.create_topic("repl", 1, replication_factor=2, min_insync_replicas=2)
        leader = cluster.leader_of("repl", 0)
        follower = next(b for b in cluster.brokers.values() if b is not leader)
        # Each ZooKeeper broker issues ids from its own block: never the same one.
        ids = {int(init_producer_id(kafka_address(b)).producer_id) for b in (leader, follower)}
        assert len(ids) == 2
        acked = confluent_produce(
            kafka_address(follower),  # bootstrapped elsewhere: Metadata leads it to the leader
            "repl",
            [b"r%d" % i for i in range(10)],
            partitions=1,
            **{"enable.idempotence": True, "acks": "all"},
        )
        assert [r[1] for r in acked] == list(range(10))
        # Acknowledged only once the follower had them: the leader's high watermark.
        assert cluster.offsets(leader, "repl", 0)["high_watermark"] == 10
        assert over_flight(cluster.client, "repl", 0) == acked
        one = encode_batch(kafka_rows(1, "f"), base_offset=0)
        refused = produce(kafka_address(follower), "repl", one)
        assert refused.error_code == ErrorCode.not_leader_or_follower
    finally:
        cluster.close()
