"""Malformed and hostile requests get clear errors, and the broker keeps serving others.

After every bad request a second, independent client produces and fetches on its own
topic: one client's garbage must never take the broker down or wedge a partition.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import (
    IdemlogError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidRequestError,
    InvalidRequiredAcksError,
    InvalidTopicError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    SchemaMismatchError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.requests import ACKS_ALL, ACKS_LEADER
from broker_core.protocol.wire import Action, ProduceRequestMeta, encode_json, parse_error_message
from tests.broker.helpers import SCHEMA, ids, rows
from tests.harness import raw_flight
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.store.helpers import rows_with_bad_offsets

ClientFor = Callable[[BrokerProcess], BrokerClient]
_witness_seq = itertools.count()


@pytest.fixture
def client(shared_broker: BrokerProcess, client_for: ClientFor) -> BrokerClient:
    return client_for(shared_broker)


@pytest.fixture
def witness(shared_broker: BrokerProcess, client_for: ClientFor) -> Iterator[BrokerClient]:
    """A second client; after the test it must still produce and read back on its topic."""
    other = client_for(shared_broker)
    topic = f"witness-{next(_witness_seq)}"
    other.create_topic(topic, 1, schema=SCHEMA)
    yield other
    with other.produce_stream(topic, 0) as stream:
        assert stream.send(rows(3, start=7)).offsets(10) == (0, 2)
    assert ids(other, topic) == [7, 8, 9]
    assert other.ping()["broker_id"] == 0


def _raw(broker: BrokerProcess) -> flight.FlightClient:
    return flight.connect(f"grpc://{broker.address}")


def _stream_error(
    broker: BrokerProcess, descriptor: flight.FlightDescriptor, batch: pa.RecordBatch, meta: bytes
) -> IdemlogError:
    """Send one batch on a raw DoPut and return the typed error that ends the stream."""
    raw = _raw(broker)
    try:
        writer, reader = raw.do_put(descriptor, batch.schema)
        with pytest.raises(flight.FlightError) as info:
            writer.write_with_metadata(batch, pa.py_buffer(meta))
            reader.read()
            writer.done_writing()
            writer.close()
        error = parse_error_message(str(info.value))
        assert error is not None, f"not an idemlog error: {info.value}"
        return error
    finally:
        raw.close()


def _produce_descriptor(topic: str, partition: int = 0) -> flight.FlightDescriptor:
    return flight.FlightDescriptor.for_command(
        encode_json({"op": "produce", "topic": topic, "partition": partition})
    )


def test_truncated_produce_metadata_fails_the_stream(
    client: BrokerClient, shared_broker: BrokerProcess, witness: BrokerClient
) -> None:
    client.create_topic("truncated", 1)
    error = _stream_error(shared_broker, _produce_descriptor("truncated"), rows(2), b"\x01\x00\x07")
    assert isinstance(error, InvalidRequestError)
    assert "produce batch metadata must be 24 bytes, or 56 with a producer token, got 3" in (
        error.message
    )
    good = ProduceRequestMeta(-1, -1, -1, False, 0).encode()
    error = _stream_error(
        shared_broker, _produce_descriptor("truncated"), rows(2), b"\x09" + good[1:]
    )
    assert "unsupported produce metadata version 9" in error.message
    assert client.list_offsets("truncated", 0)["log_end_offset"] == 0  # nothing written


@pytest.mark.parametrize("damage", ["garbage", "cut short"])
def test_an_ipc_message_that_is_garbage_or_cut_short_is_refused(
    client: BrokerClient, shared_broker: BrokerProcess, witness: BrokerClient, damage: str
) -> None:
    """Issue 36's low finding: a produce stream whose record-batch message is not a
    flatbuffer, or whose body is shorter than its header says (bytes pyarrow's writer never
    sends, so they go as raw gRPC), is INVALID_REQUEST in one line naming the partition;
    it was UNKNOWN_SERVER_ERROR with an OSError traceback in the broker's log."""
    topic = f"raw-{damage.replace(' ', '-')}"
    client.create_topic(topic, 1, schema=SCHEMA)
    batch = rows(1000)
    header, body = raw_flight.ipc_parts(batch.serialize())
    assert len(body) > 2  # the cut below leaves a message shorter than its header says
    meta = ProduceRequestMeta(-1, -1, -1, False, 0).encode()
    second = (
        raw_flight.flight_data(header=b"\x00not a flatbuffer", app_metadata=meta, body=body)
        if damage == "garbage"
        else raw_flight.flight_data(header=header, app_metadata=meta, body=body[: len(body) // 2])
    )
    command = encode_json({"op": "produce", "topic": topic, "partition": 0})
    first = raw_flight.flight_data(command=command, header=raw_flight.schema_header(SCHEMA))
    refused = raw_flight.do_put(shared_broker.address, [first, second])
    error = parse_error_message(refused.details() or "")
    assert isinstance(error, InvalidRequestError), refused.details()
    assert error.message.startswith(f"produce to {topic}-0: unreadable message ("), error.message
    assert "\n" not in error.message
    assert client.list_offsets(topic, 0)["log_end_offset"] == 0  # nothing written


def test_garbage_descriptor_is_rejected(
    shared_broker: BrokerProcess, witness: BrokerClient
) -> None:
    garbage = flight.FlightDescriptor.for_command(b"\xff{not json")
    error = _stream_error(shared_broker, garbage, rows(1), b"")
    assert isinstance(error, InvalidRequestError) and "body is not JSON" in error.message
    missing = flight.FlightDescriptor.for_command(encode_json({"op": "produce", "topic": "x"}))
    error = _stream_error(shared_broker, missing, rows(1), b"")
    assert "missing field 'partition'" in error.message
    wrong_op = flight.FlightDescriptor.for_command(encode_json({"op": "fetch"}))
    assert (
        "field 'op' must be 'produce'"
        in _stream_error(shared_broker, wrong_op, rows(1), b"").message
    )
    path = flight.FlightDescriptor.for_path("a", "b")
    assert "must be a command" in _stream_error(shared_broker, path, rows(1), b"").message


def test_produce_acks_leader_and_all_are_answered_any_other_is_refused(
    client: BrokerClient, shared_broker: BrokerProcess, witness: BrokerClient
) -> None:
    client.create_topic("acks", 1, schema=SCHEMA)
    with client.produce_stream("acks", 0, acks=ACKS_LEADER) as leader:
        assert leader.send(rows(2)).offsets(10) == (0, 1)
    with client.produce_stream("acks", 0, acks=ACKS_ALL) as every_isr:
        assert every_isr.send(rows(1, start=2)).offsets(10) == (2, 2)
    meta = ProduceRequestMeta(-1, -1, -1, False, 0).encode()
    two = flight.FlightDescriptor.for_command(
        encode_json({"op": "produce", "topic": "acks", "partition": 0, "acks": 2})
    )
    error = _stream_error(shared_broker, two, rows(1, start=3), meta)
    assert isinstance(error, InvalidRequiredAcksError) and error.code == 21
    assert "acks=2 must be -1 (all in-sync replicas) or 1 (the leader)" in error.message
    # 0 (no answer) through the client: the stream fails with the typed error.
    with pytest.raises(InvalidRequiredAcksError, match="acks=0 must be -1") as zero:
        client.produce_stream("acks", 0, acks=0).send(rows(1, start=3)).result(10)
    assert zero.value.code == 21
    mistyped = flight.FlightDescriptor.for_command(
        encode_json({"op": "produce", "topic": "acks", "partition": 0, "acks": "all"})
    )
    error = _stream_error(shared_broker, mistyped, rows(1, start=3), meta)
    assert isinstance(error, InvalidRequestError)
    assert "field 'acks' must be int, got str" in error.message
    assert ids(client, "acks") == [0, 1, 2]  # nothing of the refused streams written


def test_wrong_schema_is_rejected_at_stream_start(
    client: BrokerClient, witness: BrokerClient
) -> None:
    client.create_topic("typed", 1, schema=SCHEMA)
    wrong = pa.record_batch([pa.array([1, 2]), pa.array(["a", "b"])], names=["id", "note"])
    stream = client.produce_stream("typed", 0)
    with pytest.raises(SchemaMismatchError) as info:
        stream.send(wrong).result(10)
    stream.close()
    assert info.value.code == 10001
    assert "missing field(s) key, value" in info.value.message
    assert "unexpected field(s) note" in info.value.message
    with client.produce_stream("typed", 0) as good:
        assert good.send(rows(2)).offsets(10) == (0, 1)


def test_unknown_topic_and_partition(client: BrokerClient, witness: BrokerClient) -> None:
    with pytest.raises(UnknownTopicOrPartitionError, match="'nope' does not exist") as info:
        client.produce_stream("nope", 0).send(rows(1)).result(10)
    assert info.value.code == 3
    with pytest.raises(UnknownTopicOrPartitionError, match="'nope' does not exist"):
        client.fetch_once("nope", 0, 0)
    client.create_topic("two", 2)
    with pytest.raises(UnknownTopicOrPartitionError, match=r"partitions 0\.\.1, not 5"):
        client.list_offsets("two", 5)
    with pytest.raises(OffsetOutOfRangeError, match="outside the log's range") as oor:
        client.fetch_once("two", 0, 17)
    assert oor.value.code == 1
    with pytest.raises(InvalidRequestError, match="field 'isolation' must be one of"):
        client.fetch_once("two", 0, 0, isolation="read_whatever")
    with pytest.raises(InvalidRequestError, match=r"field 'max_bytes' must be in 1\.\."):
        client.fetch_once("two", 0, 0, max_bytes=0)
    empty = client.fetch_once("two", 1, 0)  # no schema yet: an empty one, and a trailer
    assert len(empty.schema) == 0 and empty.batches == [] and empty.trailer.next_offset == 0


def test_forged_producer_id_and_stale_epoch(client: BrokerClient, witness: BrokerClient) -> None:
    client.create_topic("forged", 1)
    pid, _ = client.init_producer_id()
    with client.produce_stream("forged", 0) as stream:
        forged = stream.send(rows(1), producer_id=10**12, producer_epoch=0, base_sequence=0)
        issued_later_epoch = stream.send(
            rows(2, start=1), producer_id=pid, producer_epoch=3, base_sequence=0
        )
        stale = stream.send(rows(2, start=3), producer_id=pid, producer_epoch=2, base_sequence=0)
        negative = stream.send(rows(1), producer_id=-7, producer_epoch=0, base_sequence=0)
        # No token was issued for it: refused before the validator (issue 36).
        assert forged.result(10).error_code == 49
        assert "1000000000000 carries no producer token" in forged.result().error_message
        assert issued_later_epoch.result(10).error_code == 0
        assert stale.result(10).error_code == 47
        assert "epoch 2 is older than the current epoch 3" in stale.result().error_message
        assert negative.result(10).error_code == 87  # INVALID_RECORD: a client bug
    assert ids(client, "forged") == [1, 2]
    part = next(p for p in client.metrics()["partitions"] if p["topic"] == "forged")
    assert (part["unknown_producer_ids"], part["fenced_appends"], part["rejected"]) == (0, 1, 2)


def test_oversize_batch_and_action_body(client: BrokerClient, witness: BrokerClient) -> None:
    client.create_topic("big", 1)
    big = rows(3000, width=100)  # ~330 KB, over the test broker's max.request.bytes=256 KiB
    with client.produce_stream("big", 0) as stream:
        too_big = stream.send(big).result(10)
        after = stream.send(rows(2)).result(10)  # the stream goes on
    assert too_big.error_code == 10
    assert "over max.request.bytes=262144" in too_big.error_message
    assert (after.error_code, after.base_offset) == (0, 0)
    with pytest.raises(MessageTooLargeError, match=r"over max\.request\.bytes=262144"):
        client.action(client.metadata().brokers[0].address, Action.PING, {"pad": "x" * 300_000})


def test_unknown_action_and_malformed_bodies(
    client: BrokerClient, shared_broker: BrokerProcess, witness: BrokerClient
) -> None:
    address = shared_broker.address
    with pytest.raises(InvalidRequestError, match="unknown action 'drop_everything'") as info:
        client.action_raw(address, "drop_everything", b"{}")
    assert info.value.code == 42
    with pytest.raises(InvalidRequestError, match="action create_topic: body is not JSON"):
        client.action_raw(address, "create_topic", b"\x00\x01garbage")
    with pytest.raises(InvalidRequestError, match="body must be a JSON object"):
        client.action_raw(address, "create_topic", b"[1, 2]")
    cases: list[tuple[Action, dict[str, object], str]] = [
        (Action.CREATE_TOPIC, {"name": "t"}, "missing field 'partitions'"),
        (Action.CREATE_TOPIC, {"name": "t", "partitions": "3"}, "'partitions' must be int, got"),
        (Action.CREATE_TOPIC, {"name": 5, "partitions": 1}, "'name' must be str, got int"),
        (Action.CREATE_TOPIC, {"name": "t", "partitions": True}, "'partitions' must be int"),
        (Action.CREATE_TOPIC, {"name": "t", "partitions": 1, "schema": "%%%"}, "'schema'"),
        (Action.LIST_OFFSETS, {"topic": "t", "partition": 1.5}, "'partition' must be int"),
        (Action.END_TXN, {"transactional_id": "a", "producer_id": 1, "producer_epoch": 0,
                          "commit": "yes"}, "field 'commit' must be bool, got str"),
        (Action.END_TXN, {"transactional_id": "a", "producer_id": -4, "producer_epoch": 0,
                          "commit": True}, "'producer_id' must be >= 0, got -4"),
        (Action.ADD_PARTITIONS_TO_TXN, {"transactional_id": "a", "producer_id": 1,
                                        "producer_epoch": 0, "partitions": [["t"]]},
         "field 'partitions[0]' must be [topic: str, partition: int]"),
        (Action.COMMIT_SINK_BATCH, {"sink_id": "s", "batch_id": 0,
                                    "transactions": [["a", 1, 0], ["b", "1", 0]]},
         "field 'transactions[1]' must be [transactional_id: str"),
        (Action.COMMIT_SINK_BATCH, {"sink_id": "s", "batch_id": -1, "transactions": []},
         "'batch_id' must be >= 0"),
        (Action.INIT_PRODUCER_ID, {"transaction_timeout_ms": 5}, "needs a transactional_id"),
        (Action.DESCRIBE_TOPICS, {"names": ["ok", 3]}, "field 'names[1]' must be str"),
    ]  # fmt: skip
    for action, body, message in cases:
        with pytest.raises(InvalidRequestError) as err:
            client.action(address, action, body)
        assert message in err.value.message, (action, body, err.value.message)


def test_bad_topic_requests_name_the_problem(client: BrokerClient, witness: BrokerClient) -> None:
    with pytest.raises(InvalidTopicError, match="contains '/'") as bad:
        client.create_topic("a/b", 1)
    assert bad.value.code == 17
    with pytest.raises(InvalidTopicError, match="reserved for internal topics"):
        client.create_topic("__transaction_state", 1)
    with pytest.raises(InvalidTopicError, match="is internal"):
        client.list_offsets("__transaction_state", 0)
    with pytest.raises(InvalidPartitionsError, match="partitions=0 must be between 1 and"):
        client.create_topic("zero", 0)
    with pytest.raises(InvalidConfigError, match=r"'segment\.byte'.*did you mean 'segment\.bytes'"):
        client.create_topic("cfg", 1, config={"segment.byte": 1 << 20})
    with pytest.raises(InvalidConfigError, match=r"flush\.messages='often' is not an integer"):
        client.create_topic("cfg", 1, config={"flush.messages": "often"})
    assert "cfg" not in client.refresh_metadata().topics  # nothing half-created


def test_metadata_only_message_fails_the_stream(
    client: BrokerClient, shared_broker: BrokerProcess, witness: BrokerClient
) -> None:
    client.create_topic("nobatch", 1)
    raw = _raw(shared_broker)
    writer, reader = raw.do_put(_produce_descriptor("nobatch"), SCHEMA)
    with pytest.raises(flight.FlightError, match="carries metadata but no record batch"):
        writer.write_metadata(pa.py_buffer(ProduceRequestMeta(-1, -1, -1, False, 4).encode()))
        reader.read()
        writer.done_writing()
        writer.close()
    raw.close()


@pytest.mark.parametrize(
    ("text", "overrides", "named"),
    [
        ("listener.port=0\nlistener.prot=9\n", [], "unknown broker config key 'listener.prot'"),
        ("listener.port=0\n", ["log.flush.mesages=1"], "'log.flush.mesages'"),
        ("listener.port=0\nmax.request.bytes=lots\n", [], "max.request.bytes='lots' is not"),
        ("listener.port=0\nlog.segment.bytes=2048\n", [], "larger than segment.bytes=2048"),
        ("listener.port\n", [], "expected key=value"),
    ],
)
def test_bad_config_exits_non_zero_naming_the_key(
    broker_factory: BrokerFactory, tmp_path: Path, text: str, overrides: list[str], named: str
) -> None:
    broker = broker_factory(name="bad", start=False)
    broker.raw_config = text + f"log.dir={tmp_path / 'data'}\n"
    broker.extra_args = [a for o in overrides for a in ("--override", o)]
    broker.spawn()
    assert broker.wait_exit(30) == 2  # the CLI's status for a configuration error
    log = broker.log_text()
    assert named in log, log
    assert "LISTENING" not in log


def test_hostile_sizes_get_their_codes(
    client: BrokerClient, shared_broker: BrokerProcess, witness: BrokerClient
) -> None:
    address = shared_broker.address
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(InvalidRequestError, match="create_topic: body is nested too deeply"):
        client.action_raw(address, "create_topic", deep)


def test_rows_that_fail_arrows_full_validation_are_refused(
    client: BrokerClient, witness: BrokerClient
) -> None:
    client.create_topic("poison", 1, schema=SCHEMA)
    with client.produce_stream("poison", 0) as stream:
        refused = stream.send(rows_with_bad_offsets()).result(10)
        after = stream.send(rows(2)).result(10)  # the stream goes on
    assert refused.error_code == 87, refused
    assert "produce to poison-0: invalid Arrow data" in refused.error_message
    assert (after.error_code, after.base_offset) == (0, 0)  # nothing of it was written
    assert ids(client, "poison") == [0, 1]
