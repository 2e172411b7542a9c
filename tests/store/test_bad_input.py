"""Bad input to the store: each is rejected with its error class, its code and a message
naming the offending value, and nothing becomes partially visible."""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pytest

from broker_core import errors
from broker_core.errors import (
    CorruptRecordError,
    IdemlogError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidRecordError,
    InvalidTopicError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    SchemaMismatchError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from broker_core.log.partition_log import PartitionLog
from broker_core.log.segment import LOG_SUFFIX
from broker_core.log.snapshot import SUFFIX as SNAPSHOT_SUFFIX
from broker_core.log.store import TOPIC_FILE, LogStore
from broker_core.record.batch import HEADER_SIZE, ipc_stream_size
from tests.store.helpers import SCHEMA, open_log, producer_states, read_ids, rows

E = TypeVar("E", bound=IdemlogError)


def raises(error: type[E], code: int, call: Callable[[], object], *named: str) -> E:
    """``call`` raises exactly ``error`` with ``code``, and its message contains ``named``."""
    with pytest.raises(error) as info:
        call()
    assert type(info.value) is error
    assert info.value.code == code
    for text in named:
        assert text in info.value.message, (text, info.value.message)
    return info.value


def assert_empty(log: PartitionLog) -> None:
    assert log.log_end_offset == 0
    assert log.active.size == 0
    assert list(log.active.batches()) == []
    assert read_ids(log, "read_uncommitted") == []


@pytest.fixture
def store(tmp_path: Path) -> LogStore:
    return LogStore(tmp_path / "data")


# -- names and numbers --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "named"),
    [
        ("a/b", "'a/b'"),
        ("..", "'..'"),
        (".", "'.'"),
        (".lock", "'.lock' is reserved"),
        ("", "''"),
        ("x" * 250, "250 characters"),
        ("sp ace", "' '"),
        (42, "42"),
        (None, "None"),
    ],
)
def test_illegal_topic_name(store: LogStore, name: object, named: str) -> None:
    raises(InvalidTopicError, 17, lambda: store.create_topic(name), named)  # type: ignore[arg-type]
    raises(InvalidTopicError, 17, lambda: store.topic(name), named)  # type: ignore[arg-type]
    assert list(store.data_dir.iterdir()) == []
    assert store.topics() == []


def test_longest_legal_topic_name_is_accepted(store: LogStore) -> None:
    store.create_topic("x" * 249)
    assert store.topics() == ["x" * 249]


@pytest.mark.parametrize(
    ("partitions", "named"),
    [(0, "partitions=0"), (-1, "partitions=-1"), (10_001, "partitions=10001"), ("3", "'3'")],
)
def test_illegal_partition_count(store: LogStore, partitions: object, named: str) -> None:
    raises(
        InvalidPartitionsError,
        37,
        lambda: store.create_topic("t", partitions),  # type: ignore[arg-type]
        named,
    )
    assert list(store.data_dir.iterdir()) == []


@pytest.mark.parametrize(("partition", "named"), [(3, "not 3"), (-1, "not -1"), ("0", "'0'")])
def test_partition_index_out_of_range(store: LogStore, partition: object, named: str) -> None:
    store.create_topic("t", 3)
    raises(
        UnknownTopicOrPartitionError,
        3,
        lambda: store.partition("t", partition),  # type: ignore[arg-type]
        named,
    )
    assert sorted(p.name for p in (store.data_dir / "t").iterdir()) == [TOPIC_FILE]


def test_unknown_topic(store: LogStore) -> None:
    error = raises(UnknownTopicOrPartitionError, 3, lambda: store.partition("nope", 0), "'nope'")
    assert error.retriable


def test_read_offset_negative_or_past_the_end(store: LogStore) -> None:
    store.create_topic("t")
    log = store.partition("t", 0)
    log.append(rows(3))
    raises(OffsetOutOfRangeError, 1, lambda: log.read(-1), "offset=-1")
    raises(OffsetOutOfRangeError, 1, lambda: log.read(4), "offset 4", "[0, 3]")
    raises(InvalidRecordError, 87, lambda: log.read(0, max_bytes=0), "max_bytes=0")
    raises(InvalidRecordError, 87, lambda: log.read(0, isolation="dirty"), "'dirty'")


# -- batches ------------------------------------------------------------------------------
def _schema_variants() -> list[tuple[str, pa.RecordBatch, str]]:
    base = rows(3)
    return [
        ("missing", base.drop_columns(["key"]), "missing field(s) key"),
        (
            "extra",
            base.append_column("extra", pa.array([1.0, 2.0, 3.0])),
            "unexpected field(s) extra",
        ),
        ("type", base.set_column(0, "id", base.column(0).cast(pa.int32())), "field 'id' is int32"),
    ]


@pytest.mark.parametrize(("kind", "batch", "named"), _schema_variants())
@pytest.mark.parametrize("schema_from", ["create_topic", "first_append"])
def test_schema_mismatch_writes_nothing(
    store: LogStore, kind: str, batch: pa.RecordBatch, named: str, schema_from: str
) -> None:
    if schema_from == "create_topic":
        store.create_topic("t", 2, schema=SCHEMA)
        log = store.partition("t", 0)
    else:
        store.create_topic("t", 2)
        store.partition("t", 1).append(rows(1))  # fixes the topic's schema
        log = store.partition("t", 0)
    topic_file = (store.data_dir / "t" / TOPIC_FILE).read_bytes()

    raises(SchemaMismatchError, 10001, lambda: log.append(batch), "topic 't'", named)
    raises(
        SchemaMismatchError,
        10001,
        lambda: log.append(batch, producer_id=1, producer_epoch=0, base_sequence=0),
    )
    assert_empty(log)
    assert (store.data_dir / "t" / TOPIC_FILE).read_bytes() == topic_file
    # The producer's sequence was not consumed by the rejected batch.
    assert log.append(rows(3), producer_id=1, producer_epoch=0, base_sequence=0).base_offset == 0


def test_oversize_batch_names_both_sizes_and_writes_nothing(store: LogStore) -> None:
    store.create_topic("t", config={"max.message.bytes": 1024})
    log = store.partition("t", 0)
    batch = rows(100)
    size = HEADER_SIZE + ipc_stream_size(batch)
    assert size > 1024
    raises(
        MessageTooLargeError,
        10,
        lambda: log.append(batch),
        f"{size} bytes",
        "max.message.bytes=1024",
    )
    assert_empty(log)
    small = rows(2)
    assert HEADER_SIZE + ipc_stream_size(small) <= 1024
    assert log.append(small).base_offset == 0


def test_empty_batch_or_non_arrow_records(store: LogStore) -> None:
    store.create_topic("t")
    log = store.partition("t", 0)
    raises(InvalidRecordError, 87, lambda: log.append(rows(0)), "t-0", "at least one row")
    empty_table = pa.Table.from_batches([], schema=SCHEMA)
    raises(InvalidRecordError, 87, lambda: log.append(empty_table), "at least one row")
    raises(InvalidRecordError, 87, lambda: log.append([1, 2]), "list")
    assert_empty(log)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"producer_id": -2}, "producer_id=-2"),
        (
            {"producer_id": 1, "producer_epoch": 0, "base_sequence": 2**31},
            "base_sequence=2147483648",
        ),
        ({"producer_id": 1, "producer_epoch": 0, "base_sequence": -5}, "base_sequence=-5"),
        ({"producer_id": 1, "producer_epoch": 32_768, "base_sequence": 0}, "producer_epoch=32768"),
        ({"producer_id": 1, "producer_epoch": -1, "base_sequence": 0}, "producer_epoch=-1"),
        ({"base_sequence": 5}, "base_sequence=5"),
        ({"producer_epoch": 3}, "producer_epoch=3"),
        ({"transactional": True}, "transactional"),
        ({"producer_id": -1, "transactional": True, "base_sequence": 0}, "producer_id"),
    ],
)
def test_invalid_producer_fields(tmp_path: Path, fields: dict[str, object], named: str) -> None:
    log = open_log(tmp_path / "p")
    raises(InvalidRecordError, 87, lambda: log.append(rows(2), **fields), named)  # type: ignore[arg-type]
    assert_empty(log)
    assert len(log.state) == 0


# -- configuration ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"segment.byte": 4096}, ("'segment.byte'", "did you mean 'segment.bytes'")),
        ({"retention.msec": 5}, ("'retention.msec'", "did you mean 'retention.ms'")),
        ({"no.such.thing": 1}, ("'no.such.thing'",)),
        ({"segment.bytes": "lots"}, ("segment.bytes='lots'", "not an integer")),
        ({"segment.bytes": 1.5}, ("segment.bytes=1.5", "not an integer")),
        ({"retention.ms": True}, ("retention.ms=True", "not an integer")),
        ({"segment.bytes": 100}, ("segment.bytes=100", "minimum 1024")),
        ({"retention.ms": -2}, ("retention.ms=-2", "minimum -1")),
        ({"producer.state.batch.window": 0}, ("producer.state.batch.window=0", "minimum 1")),
        (
            {"producer.state.batch.window": 1001},
            ("producer.state.batch.window=1001", "maximum 1000"),
        ),
        ({"segment.bytes": 2**31}, ("segment.bytes=2147483648", "maximum")),
        (
            {"segment.bytes": 2048, "max.message.bytes": 4096},
            ("max.message.bytes=4096", "segment.bytes=2048"),
        ),
    ],
)
def test_invalid_config(tmp_path: Path, config: dict[str, object], named: tuple[str, ...]) -> None:
    raises(InvalidConfigError, 40, lambda: LogStore(tmp_path / "a", config), *named)
    # The same mistake as a per-topic override leaves no topic behind.
    store = LogStore(tmp_path / "b")
    raises(InvalidConfigError, 40, lambda: store.create_topic("t", config=config), *named)
    assert store.topics() == []
    assert not (tmp_path / "b" / "t").exists()


def test_config_values_as_strings_are_parsed(tmp_path: Path) -> None:
    store = LogStore(tmp_path, {"segment.bytes": "2_048", "max.message.bytes": "2048"})
    assert store.defaults.segment_bytes == 2048 == store.defaults.max_message_bytes


# -- garbage on disk ----------------------------------------------------------------------
def test_garbage_topic_metadata(tmp_path: Path) -> None:
    store = LogStore(tmp_path)
    store.create_topic("t")
    store.close()
    path = tmp_path / "t" / TOPIC_FILE
    path.write_bytes(b"\x00{not json")
    raises(CorruptRecordError, 2, lambda: LogStore(tmp_path), str(path))
    # Well-formed JSON that describes another topic is just as unusable.
    path.write_text(json.dumps({"version": 1, "name": "other", "partitions": 1}))
    raises(CorruptRecordError, 2, lambda: LogStore(tmp_path), str(path), "topic t")


def _fill(log: PartitionLog, batches: int, pid: int = 7) -> None:
    for i in range(batches):
        log.append(rows(10, 10 * i), producer_id=pid, producer_epoch=0, base_sequence=10 * i)


@pytest.mark.parametrize("garbage", ["random", "zeros", "torn_batch"])
def test_garbage_after_active_segment_is_truncated_on_reopen(
    tmp_path: Path, garbage: str, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "p"
    log = open_log(directory)
    _fill(log, 3)
    state = producer_states(log)
    segment = log.active.log_path
    valid = log.active.size
    whole_batch = bytes(next(log.active.batches()).data)
    log.abandon()
    tail = {
        "random": bytes(range(7, 250)),
        "zeros": bytes(4096),  # a preallocated, never-written tail
        "torn_batch": whole_batch[: len(whole_batch) // 2],
    }[garbage]
    with segment.open("ab") as f:
        f.write(tail)

    with caplog.at_level(logging.WARNING):
        log = open_log(directory)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(segment.name in m and f"at byte {valid}" in m for m in warnings), warnings
    assert segment.stat().st_size == valid
    assert read_ids(log) == list(range(30))
    assert producer_states(log) == state
    assert (
        log.append(rows(10, 30), producer_id=7, producer_epoch=0, base_sequence=30).base_offset
        == 30
    )


@pytest.mark.parametrize("where", ["payload", "header"])
def test_garbage_inside_sealed_segment_fails_reads_never_returns_garbage(
    tmp_path: Path, where: str
) -> None:
    directory = tmp_path / "p"
    log = open_log(directory)
    _fill(log, 3)  # offsets 0-29 in segment 0
    positions = [b.position for b in log.active.batches()]
    log.roll()  # seals segment 0 and snapshots at offset 30
    log.append(rows(10, 30))
    log.abandon()
    # The middle batch (offsets 10-19) of the sealed segment; the snapshot is newer, so
    # recovery trusts this segment instead of re-scanning it.
    segment = directory / f"{0:020d}{LOG_SUFFIX}"
    data = bytearray(segment.read_bytes())
    bad = positions[1]
    if where == "payload":
        at = positions[2] - 40  # inside the string column's bytes
        data[at : at + 10] = b"Z" * 10
    else:
        data[bad + 8 : bad + 20] = b"\xee" * 12  # batch_length, magic, crc
    segment.write_bytes(bytes(data))

    log = open_log(directory)
    assert log.log_end_offset == 40
    if where == "payload":
        # The batch before the damage is intact and readable on its own.
        first = log.read(0, max_bytes=1).batches
        assert [b.records.column("id").to_pylist() for b in first] == [list(range(10))]
    # A read that reaches the damaged batch fails, whatever its isolation and start. (With
    # a damaged header even a read stopping just before it fails: the reader needs that
    # header to know where to stop. Failing is safe; returning garbage would not be.)
    starts = (10, 15) if where == "payload" else (0, 10, 15)
    for isolation in ("read_committed", "read_uncommitted"):
        for start in starts:
            with pytest.raises(CorruptRecordError) as info:
                log.read(start, isolation=isolation)
            assert info.value.code == 2
            assert str(segment) in info.value.message and f"at byte {bad}" in info.value.message
    if where == "payload":
        raises(CorruptRecordError, 2, lambda: log.read(0), "CRC mismatch")
    # Reads past the damage still work.
    assert read_ids(log, start=20) == list(range(20, 40))


def test_garbage_snapshot_is_deleted_and_log_replayed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "p"
    log = open_log(directory)
    _fill(log, 4)
    log.append(rows(2, 40), producer_id=8, producer_epoch=1, base_sequence=0, transactional=True)
    state = producer_states(log)
    log.close()
    snapshots = sorted(directory.glob(f"*{SNAPSHOT_SUFFIX}"))
    assert [p.name for p in snapshots] == [f"{42:020d}{SNAPSHOT_SUFFIX}"]
    snapshots[0].write_bytes(b"garbage, not a producer snapshot")

    with caplog.at_level(logging.INFO):
        log = open_log(directory)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(snapshots[0].name in m for m in warnings), warnings
    assert not snapshots[0].exists()
    assert "replayed from 0" in caplog.text
    assert producer_states(log) == state
    assert log.last_stable_offset == 40
    retry = log.append(rows(10, 30), producer_id=7, producer_epoch=0, base_sequence=30)
    assert retry.duplicate and retry.base_offset == 30


@pytest.mark.parametrize("name", ["abc.log", "1.log", "abc.index", "abc.txnindex"])
def test_garbage_segment_file_name(tmp_path: Path, name: str) -> None:
    directory = tmp_path / "p"
    log = open_log(directory)
    log.append(rows(1))
    log.close()
    (directory / name).write_bytes(b"not a segment")
    raises(CorruptRecordError, 2, lambda: open_log(directory), str(directory / name))


# -- error codes --------------------------------------------------------------------------
def _error_classes() -> list[type[IdemlogError]]:
    return [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, IdemlogError) and cls is not IdemlogError
    ]


def test_error_codes_are_unique_and_round_trip() -> None:
    classes = _error_classes()
    codes = [cls.error_code.code for cls in classes]
    assert len(codes) == len(set(codes)), sorted(codes)
    for cls in classes:
        rebuilt = error_for_code(cls.error_code.code, "why")
        assert type(rebuilt) is cls
        assert rebuilt.message == "why"
        assert rebuilt.code == cls.error_code.code
        assert rebuilt.retriable == cls.error_code.retriable
    # A code nobody knows is an unknown server error, not a crash.
    assert type(error_for_code(123_456)) is errors.UnknownServerError


def test_kafka_error_numbers() -> None:
    required = {
        errors.OutOfOrderSequenceError: 45,
        errors.DuplicateSequenceError: 46,
        errors.InvalidProducerEpochError: 47,
        errors.InvalidTxnStateError: 48,
        errors.UnknownProducerIdError: 59,
        errors.ProducerFencedError: 90,
    }
    assert {cls: cls().code for cls in required} == required
    assert {cls: cls.error_code.name for cls in required} == {
        errors.OutOfOrderSequenceError: "OUT_OF_ORDER_SEQUENCE_NUMBER",
        errors.DuplicateSequenceError: "DUPLICATE_SEQUENCE_NUMBER",
        errors.InvalidProducerEpochError: "INVALID_PRODUCER_EPOCH",
        errors.InvalidTxnStateError: "INVALID_TXN_STATE",
        errors.UnknownProducerIdError: "UNKNOWN_PRODUCER_ID",
        errors.ProducerFencedError: "PRODUCER_FENCED",
    }
    # None of them may be retried as-is: each needs the client to change something.
    assert not any(cls().retriable for cls in required)
    assert str(errors.OutOfOrderSequenceError("x")) == "OUT_OF_ORDER_SEQUENCE_NUMBER (45): x"
