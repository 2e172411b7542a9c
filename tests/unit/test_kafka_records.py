"""Kafka's record batch v2 (broker_core/kafka/record_batch.py) against itself and against
a Kafka client no one on this project wrote: kafka-python's DefaultRecordBatch reads what
idemlog encodes, and idemlog's bytes equal kafka-python's DefaultRecordBatchBuilder's for
the same records (the format is deterministic without compression)."""

from __future__ import annotations

import gzip
import struct
from typing import Any

import cramjam
import crc32c
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.util import encode_varint

from broker_core.errors import CorruptRecordError, InvalidRecordError, MessageTooLargeError
from broker_core.kafka import varint
from broker_core.kafka.compression import UnsupportedCompressionError
from broker_core.kafka.record_batch import (
    DECODED_SCHEMA,
    HEADERS_TYPE,
    BatchToEncode,
    KafkaBatch,
    TimestampType,
    decode_batches,
    encode_batch,
    encode_batches,
    encode_control_batch,
)
from broker_core.record.batch import ControlRecord, ControlType

Row = tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]


def _rows(rows: list[Row], *, headers: bool = True) -> pa.RecordBatch:
    columns: dict[str, pa.Array] = {
        "key": pa.array([r[0] for r in rows], pa.binary()),
        "value": pa.array([r[1] for r in rows], pa.binary()),
        "timestamp": pa.array([r[2] for r in rows], pa.timestamp("ms")),
    }
    if headers:
        columns["headers"] = pa.array(
            [[{"key": k, "value": v} for k, v in r[3]] for r in rows], HEADERS_TYPE
        )
    return pa.RecordBatch.from_pydict(columns)


def _kafka_python_reads(batch: bytes) -> tuple[DefaultRecordBatch, list[Any]]:
    reader = DefaultRecordBatch(batch)
    assert reader.validate_crc()
    return reader, list(reader)


def _kafka_python_builds(
    rows: list[Row],
    *,
    producer: tuple[int, int, int] = (-1, -1, -1),
    transactional: bool = False,
) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, transactional, *producer, batch_size=1 << 30)
    for offset, (key, value, timestamp, headers) in enumerate(rows):
        assert builder.append(offset, timestamp, key, value, headers) is not None
    return bytes(builder.build())


def _decoded(batch: KafkaBatch) -> list[Row]:
    columns = batch.rows.to_pydict()
    millis = batch.rows.column("timestamp").cast(pa.int64()).to_pylist()
    return [
        (k, v, t, [(h["key"], h["value"]) for h in hs])
        for k, v, t, hs in zip(
            columns["key"], columns["value"], millis, columns["headers"], strict=True
        )
    ]


MIXED: list[Row] = [
    (b"k0", b"v0", 1_700_000_000_000, []),
    (None, b"no key", 1_700_000_000_005, [("trace", b"abc"), ("empty", b"")]),
    (b"null value", None, 1_699_999_999_000, [("n", None)]),  # a negative delta
    (b"", b"", 1_700_000_000_001, []),
    (b"big", bytes(range(256)) * 80, 1_700_000_000_002, [("h" * 200, b"x" * 20_000)]),
    (None, None, 1_700_000_000_002, [("\u00e9t\u00e9", b"\x00\xff")]),
]


def test_varints_match_kafka_pythons_for_extremes_and_boundaries() -> None:
    values = [0, 1, -1, 63, -64, 64, -65, 8191, 8192, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]
    values += [(-1) ** i * 2 ** (7 * i // 2) for i in range(1, 18)]
    unsigned = varint.zigzag(values)
    sizes = varint.sizes(unsigned)
    out = np.zeros(int(sizes.sum()), np.uint8)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    varint.write(out, starts, unsigned, sizes)
    expected = bytearray()
    for v in values:
        encode_varint(v, expected.append)
    assert out.tobytes() == bytes(expected)
    decoded, taken = varint.read(out, starts, varint.VARLONG_MAX_BYTES, "test")
    assert decoded.tolist() == values
    assert taken.tolist() == sizes.tolist()


def test_kafka_python_reads_every_field_idemlog_encodes() -> None:
    batch = encode_batch(
        _rows(MIXED),
        base_offset=1000,
        partition_leader_epoch=7,
        producer_id=42,
        producer_epoch=3,
        base_sequence=17,
        is_transactional=True,
    )
    reader, records = _kafka_python_reads(batch)
    assert (reader.base_offset, reader.leader_epoch, reader.magic) == (1000, 7, 2)
    assert (reader.producer_id, reader.producer_epoch, reader.base_sequence) == (42, 3, 17)
    assert reader.is_transactional and not reader.is_control_batch
    assert reader.compression_type == 0 and reader.timestamp_type == 0
    assert reader.last_offset_delta == len(MIXED) - 1
    assert reader.first_timestamp == MIXED[0][2]
    assert reader.max_timestamp == max(r[2] for r in MIXED)
    assert [r.offset for r in records] == list(range(1000, 1000 + len(MIXED)))
    assert [(r.key, r.value, r.timestamp, r.headers) for r in records] == [
        (k, v, t, h) for k, v, t, h in MIXED
    ]


def test_idemlog_bytes_equal_kafka_pythons_builder() -> None:
    ours = encode_batch(
        _rows(MIXED),
        base_offset=0,
        producer_id=9,
        producer_epoch=1,
        base_sequence=5,
        is_transactional=True,
    )
    theirs = _kafka_python_builds(MIXED, producer=(9, 1, 5), transactional=True)
    assert ours == theirs
    plain = [(k, v, t, []) for k, v, t, _ in MIXED]
    assert encode_batch(_rows(plain, headers=False), base_offset=0) == _kafka_python_builds(plain)


def test_idemlog_decodes_what_kafka_python_builds() -> None:
    theirs = _kafka_python_builds(MIXED, producer=(9, 1, 5), transactional=True)
    (batch,) = decode_batches(theirs)
    assert _decoded(batch) == MIXED
    assert batch.rows.schema == DECODED_SCHEMA
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (9, 1, 5)
    assert batch.is_transactional and not batch.is_control and batch.control is None
    assert batch.timestamp_type is TimestampType.CREATE_TIME
    assert batch.size == len(theirs)


@pytest.mark.parametrize("control_type", [ControlType.ABORT, ControlType.COMMIT])
def test_control_batches_read_as_kafkas_markers(control_type: ControlType) -> None:
    batch = encode_control_batch(
        control_type,
        base_offset=55,
        partition_leader_epoch=4,
        producer_id=8,
        producer_epoch=2,
        coordinator_epoch=11,
        timestamp=1_700_000_000_000,
    )
    reader, (record,) = _kafka_python_reads(batch)
    assert reader.is_control_batch and reader.is_transactional
    assert (reader.producer_id, reader.producer_epoch, reader.base_sequence) == (8, 2, -1)
    assert record.offset == 55 and record.version == 0 and record.type == int(control_type)
    assert struct.unpack(">hi", record.value) == (0, 11)
    (decoded,) = decode_batches(batch)
    assert decoded.is_control and decoded.control == ControlRecord(control_type, 11)


def test_round_trips_zero_one_and_many_records() -> None:
    empty = encode_batch(_rows([]), base_offset=3)
    (decoded,) = decode_batches(empty)
    assert decoded.rows.num_rows == 0 and decoded.last_offset_delta == -1
    assert DefaultRecordBatch(empty).validate_crc() and list(DefaultRecordBatch(empty)) == []

    one: list[Row] = [(b"k", b"v", 5, [("a", b"b")])]
    assert _decoded(decode_batches(encode_batch(_rows(one), base_offset=0))[0]) == one

    count = 100_000
    rng = np.random.default_rng(39)
    lengths = rng.integers(0, 300, count)
    values = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in lengths[:100]] * 1000
    many = pa.RecordBatch.from_pydict(
        {
            "key": pa.array([str(i).encode() if i % 7 else None for i in range(count)]),
            "value": pa.array(values, pa.binary()),
            "timestamp": pa.array(1_700_000_000_000 + rng.integers(-5000, 5000, count)),
        }
    )
    encoded = encode_batch(many, base_offset=10**9)
    (decoded,) = decode_batches(encoded)
    assert decoded.base_offset == 10**9
    assert decoded.rows.column("key").equals(many.column("key").cast(pa.binary()))
    assert decoded.rows.column("value").equals(many.column("value"))
    assert decoded.rows.column("timestamp").cast(pa.int64()).equals(many.column("timestamp"))
    _, records = _kafka_python_reads(encoded)
    assert len(records) == count and records[-1].offset == 10**9 + count - 1
    assert records[12345].value == values[12345] and records[7].key is None


def test_string_sliced_large_and_timestamp_units_are_read_as_kafka_columns() -> None:
    rows = pa.RecordBatch.from_pydict(
        {
            "key": pa.array(["a", None, "c", "d"], pa.large_string()),
            "value": pa.array(["x", "yy", None, "é"], pa.string()),
            "timestamp": pa.array([1_000_001, None, 3_000_999, -5_000], pa.timestamp("us")),
        }
    ).slice(1, 3)
    (batch,) = decode_batches(encode_batch(rows, base_offset=0, default_timestamp=77))
    assert _decoded(batch) == [
        (None, b"yy", 77, []),
        (b"c", None, 3_000, []),
        (b"d", "é".encode(), -5, []),
    ]


def test_a_null_slot_owning_bytes_is_written_as_null() -> None:
    offsets = pa.array([0, 3, 6], pa.int32())
    values = pa.Array.from_buffers(
        pa.binary(),
        2,
        [
            pa.py_buffer(np.packbits([True, False], bitorder="little").tobytes()),
            offsets.buffers()[1],
            pa.py_buffer(b"abcdef"),
        ],
    )
    rows = pa.RecordBatch.from_pydict({"value": values})
    (batch,) = decode_batches(encode_batch(rows, base_offset=0))
    assert batch.rows.column("value").to_pylist() == [b"abc", None]
    assert batch.rows.column("key").to_pylist() == [None, None]


def test_several_batches_back_to_back() -> None:
    first = encode_batch(_rows(MIXED[:2]), base_offset=0)
    second = encode_control_batch(
        ControlType.COMMIT,
        base_offset=2,
        partition_leader_epoch=0,
        producer_id=1,
        producer_epoch=0,
        coordinator_epoch=0,
        timestamp=9,
    )
    third = encode_batch(_rows(MIXED[2:]), base_offset=3)
    batches = decode_batches(first + second + third)
    assert [b.base_offset for b in batches] == [0, 2, 3]
    assert _decoded(batches[0]) + _decoded(batches[2]) == MIXED


def _with_attributes(batch: bytes, attributes: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">h", out, 21, attributes)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def test_corruption_is_named() -> None:
    batch = encode_batch(_rows(MIXED), base_offset=0)
    flipped = bytearray(batch)
    flipped[-3] ^= 0x40
    with pytest.raises(CorruptRecordError, match="CRC-32C is"):
        decode_batches(bytes(flipped))
    with pytest.raises(CorruptRecordError, match="does not fit"):
        decode_batches(batch[:-1])
    with pytest.raises(CorruptRecordError, match="fewer than a header"):
        decode_batches(batch + batch[:30])
    wrong_magic = bytearray(batch)
    wrong_magic[16] = 1
    with pytest.raises(CorruptRecordError, match="magic 1"):
        decode_batches(bytes(wrong_magic))
    with pytest.raises(UnsupportedCompressionError, match="compression type 5 is none"):
        decode_batches(_with_attributes(batch, 5))
    with pytest.raises(CorruptRecordError, match="do not decompress with zstd"):
        decode_batches(_with_attributes(batch, 4))  # uncompressed bytes flagged zstd


def test_a_records_framing_is_checked() -> None:
    # kafka-python's builder with a record whose offset delta skips one
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, batch_size=1 << 20)
    builder.append(0, 1, b"a", b"b", [])
    builder.append(2, 1, b"a", b"b", [])
    with pytest.raises(CorruptRecordError, match="lastOffsetDelta 2"):
        decode_batches(bytes(builder.build()))
    # a record whose length claims one byte more than its fields take
    batch = bytearray(encode_batch(_rows([(b"k", b"v", 1, [])]), base_offset=0))
    # 8 bytes: attributes, timestamp and offset deltas, key length, "k", value length, "v",
    # and 0 headers; each varint one byte, zigzagged
    assert batch[61] == 2 * 8
    batch[61] += 2
    batch += b"\0"
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    with pytest.raises(
        CorruptRecordError, match="record 0's length says 9 bytes, its fields take 8"
    ):
        decode_batches(bytes(batch))


def test_rows_that_are_not_kafka_shaped_are_refused_by_name() -> None:
    with pytest.raises(InvalidRecordError, match=r"\['amount'\] are not Kafka-shaped"):
        encode_batch(pa.RecordBatch.from_pydict({"value": [b"v"], "amount": [1]}), base_offset=0)
    with pytest.raises(InvalidRecordError, match="no 'value' column"):
        encode_batch(pa.RecordBatch.from_pydict({"key": [b"k"]}), base_offset=0)
    with pytest.raises(InvalidRecordError, match="column 'value' is int64"):
        encode_batch(pa.RecordBatch.from_pydict({"value": [1]}), base_offset=0)
    with pytest.raises(InvalidRecordError, match="column 'timestamp' is string"):
        encode_batch(
            pa.RecordBatch.from_pydict({"value": [b"v"], "timestamp": ["now"]}), base_offset=0
        )


def test_null_and_sliced_header_lists_and_a_multi_megabyte_value() -> None:
    huge = bytes(range(256)) * (3 * 4096)  # 3 MiB: a four-byte length varint
    rows: list[Row] = [
        (b"a", b"1", 10, [("x", b"1")]),
        (b"b", huge, 11, [("y", None), ("z", b"")]),
        (b"c", b"3", 12, []),
        (b"d", b"4", 13, [("w", b"4")]),
    ]
    batch = _rows(rows)
    headers = batch.column("headers").to_pylist()
    headers[2] = None  # a null list: no headers, as Kafka has no null header list
    with_null = pa.RecordBatch.from_arrays(
        [*batch.columns[:3], pa.array(headers, HEADERS_TYPE)], names=batch.schema.names
    ).slice(1, 3)
    expected = rows[1:]
    encoded = encode_batch(with_null, base_offset=1)
    _, records = _kafka_python_reads(encoded)
    assert [(r.offset, r.key, r.value, r.headers) for r in records] == [
        (1 + i, k, v, h) for i, (k, v, _, h) in enumerate(expected)
    ]
    assert _decoded(decode_batches(encoded)[0]) == expected
    assert encoded[12:] == _kafka_python_builds(expected)[12:]  # all but the base offset


_bytes_or_none = st.none() | st.binary(max_size=300)
_row = st.tuples(
    _bytes_or_none,
    _bytes_or_none,
    st.integers(-(2**40), 2**42),
    st.lists(st.tuples(st.text(max_size=20), _bytes_or_none), max_size=3),
)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(_row, min_size=1, max_size=40),
    producer=st.tuples(
        st.integers(0, 2**63 - 1), st.integers(0, 2**15 - 1), st.integers(0, 2**31 - 1)
    ),
    transactional=st.booleans(),
)
def test_any_rows_encode_as_kafka_pythons_builder_does(
    rows: list[Row], producer: tuple[int, int, int], transactional: bool
) -> None:
    ours = encode_batch(
        _rows(rows),
        base_offset=0,
        producer_id=producer[0],
        producer_epoch=producer[1],
        base_sequence=producer[2],
        is_transactional=transactional,
    )
    assert ours == _kafka_python_builds(rows, producer=producer, transactional=transactional)
    assert _decoded(decode_batches(ours)[0]) == rows


def _with_count(batch: bytes, count: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">i", out, 23, count - 1)  # lastOffsetDelta
    struct.pack_into(">i", out, 57, count)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def test_a_record_count_that_disagrees_with_the_bytes_is_named() -> None:
    batch = encode_batch(_rows(MIXED[:2]), base_offset=0)
    with pytest.raises(CorruptRecordError, match=r"bytes after the last record"):
        decode_batches(_with_count(batch, 1))
    with pytest.raises(CorruptRecordError, match=r"3 records' lengths run past the batch's end"):
        decode_batches(_with_count(batch, 3))


def test_log_append_time_gives_every_record_the_batchs_max_timestamp() -> None:
    batch = _with_attributes(encode_batch(_rows(MIXED), base_offset=0), 8)  # bit 3
    (decoded,) = decode_batches(batch)
    assert decoded.timestamp_type is TimestampType.LOG_APPEND_TIME
    newest = max(r[2] for r in MIXED)
    assert [r[2] for r in _decoded(decoded)] == [newest] * len(MIXED)
    assert [r.timestamp for r in DefaultRecordBatch(batch)] == [newest] * len(MIXED)


def test_an_error_in_a_later_batch_names_that_batch_and_its_record() -> None:
    first = encode_batch(_rows(MIXED), base_offset=0)
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, batch_size=1 << 20)
    for offset in (0, 1, 3):  # a gap: the third record's offsetDelta is 3, not 2...
        builder.append(offset, 1, b"a", b"b", [])
    second = bytearray(builder.build())
    struct.pack_into(">i", second, 23, 2)  # ...behind a lastOffsetDelta that agrees with the count
    struct.pack_into(">I", second, 17, crc32c.crc32c(bytes(second[21:])))
    with pytest.raises(
        CorruptRecordError,
        match=rf"batch at offset 0 \(byte {len(first)}\): record 2 has offsetDelta 3, not 2",
    ):
        decode_batches(first + bytes(second))


def test_a_header_key_that_is_not_utf8_is_corrupt() -> None:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, batch_size=1 << 20)
    builder.append(0, 1, b"a", b"b", [("ab", b"v")])
    batch = bytearray(builder.build())
    at = bytes(batch).index(b"ab\x02v")  # the key "ab", then the value's length and "v"
    batch[at] = 0xFF
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    with pytest.raises(CorruptRecordError, match="header key is not UTF-8"):
        decode_batches(bytes(batch))
    assert decode_batches(b"") == []


def test_batches_encoded_together_equal_each_encoded_alone() -> None:
    plain = [(k, v, t, h) for k, v, t, h in MIXED]
    specs = [
        BatchToEncode(
            _rows(plain[:2]),
            base_offset=10,
            producer_id=5,
            producer_epoch=1,
            base_sequence=0,
            is_transactional=True,
        ),
        BatchToEncode(_rows([]), base_offset=12, partition_leader_epoch=3),
        BatchToEncode(
            _rows(plain[2:5]), base_offset=12, partition_leader_epoch=4, default_timestamp=99
        ),
        BatchToEncode(_rows(plain[5:]), base_offset=15),
    ]
    alone = b"".join(
        encode_batch(
            s.rows,
            base_offset=s.base_offset,
            partition_leader_epoch=s.partition_leader_epoch,
            producer_id=s.producer_id,
            producer_epoch=s.producer_epoch,
            base_sequence=s.base_sequence,
            is_transactional=s.is_transactional,
            default_timestamp=s.default_timestamp,
        )
        for s in specs
    )
    together = encode_batches(specs)
    assert together == alone
    decoded = decode_batches(together)
    assert [b.base_offset for b in decoded] == [10, 12, 12, 15]
    assert [r for b in decoded for r in _decoded(b)] == plain
    with pytest.raises(InvalidRecordError, match="batch 1's schema differs"):
        encode_batches([specs[0], BatchToEncode(_rows(plain, headers=False), base_offset=0)])


def _compressed(batch: bytes, codec: int, records: bytes) -> bytes:
    """``batch`` with its records section replaced by ``records`` flagged ``codec``."""
    out = bytearray(batch[:61]) + records
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">h", out, 21, codec)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def _xerial(raw_blocks: list[bytes]) -> bytes:
    """Snappy in xerial's stream framing, as the Java client writes it."""
    head = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    return head + b"".join(struct.pack(">i", len(b)) + b for b in raw_blocks)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "xerial-snappy", "lz4", "zstd"])
def test_a_compressed_batch_decodes_to_its_records(codec: str) -> None:
    rows = _rows(MIXED)
    plain = encode_batch(rows, base_offset=5, producer_id=9, producer_epoch=1, base_sequence=3)
    records = plain[61:]
    half = len(records) // 2
    bits, packed = {
        "gzip": (1, gzip.compress(records)),
        "snappy": (2, bytes(cramjam.snappy.compress_raw(records))),
        "xerial-snappy": (
            2,
            _xerial(
                [bytes(cramjam.snappy.compress_raw(p)) for p in (records[:half], records[half:])]
            ),
        ),
        "lz4": (3, bytes(cramjam.lz4.compress(records))),
        "zstd": (4, bytes(cramjam.zstd.compress(records))),
    }[codec]
    compressed = _compressed(plain, bits, packed)
    # Between two plain batches: positions after it are the buffer's, not the copy's.
    (before, batch, after) = decode_batches(plain + compressed + plain)
    assert batch.rows.equals(before.rows) and after.rows.equals(before.rows)
    assert (batch.compression, batch.size, batch.base_sequence) == (bits, len(compressed), 3)
    with pytest.raises(MessageTooLargeError, match="decompress"):
        decode_batches(compressed, max_decompressed=len(records) - 1)
