"""Kafka's record batch, format v2 ("magic 2"), from and to Arrow columns.

Byte layout (big-endian; Kafka's DefaultRecordBatch and DefaultRecord):

    offset size  field
    0      8     baseOffset            int64   offset of the first record
    8      4     batchLength           int32   bytes that follow this field
    12     4     partitionLeaderEpoch  int32
    16     1     magic                 int8    2
    17     4     crc                   uint32  CRC-32C of bytes [21, end)
    21     2     attributes            int16   bits 0-2 compression (0: none), bit 3
                                               timestamp type (1: LogAppendTime), bit 4
                                               transactional, bit 5 control batch
    23     4     lastOffsetDelta       int32
    27     8     baseTimestamp         int64   the first record's timestamp
    35     8     maxTimestamp          int64
    43     8     producerId            int64   -1 when not idempotent
    51     2     producerEpoch         int16
    53     4     baseSequence          int32
    57     4     recordsCount          int32
    61     ...   records, each:
                   length varint (bytes after it), attributes int8 (unused, 0),
                   timestampDelta varlong, offsetDelta varint,
                   keyLength varint (-1: null), key, valueLength varint (-1: null), value,
                   headersCount varint, per header: keyLength varint, key (UTF-8),
                   valueLength varint (-1: null), value

A control batch (KIP-98's transaction markers) holds one record whose key is version
int16 (0) + type int16 (0 ABORT, 1 COMMIT) and whose value is version int16 (0) +
coordinatorEpoch int32. Batches are written uncompressed; read compressed with any of
Kafka's codecs (gzip, snappy, lz4, zstd: ``compression.py``), each decompressed into an
uncompressed copy of itself before the records are decoded.

Rows map one to one: a Kafka-shaped Arrow batch (``key`` and ``value`` binary or string,
nullable; optional ``timestamp``, timestamp[any unit] or int64 milliseconds; optional
``headers``, list<struct<key: string, value: binary>>) is record N per row N, with offset
``base_offset + N``, the same offset the row has in idemlog.

Both directions work on whole columns with numpy: varint sizes and bytes per column, key,
value and header bytes moved by one masked copy each. The one step left in Python per
record is the decoder's walk along the records' length prefixes (each record's start
depends on the previous one's length, so it cannot be computed column-wise); everything
after that walk is column-wise again, but the header entries of records that have any,
which are read one entry at a time.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import crc32c
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from broker_core.errors import CorruptRecordError, InvalidRecordError
from broker_core.kafka import varint
from broker_core.kafka.compression import Codec, codec_of, decompress
from broker_core.record.batch import (
    CONTROL_FLAG,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    TRANSACTIONAL_FLAG,
    ControlRecord,
    ControlType,
)

Int64s = npt.NDArray[np.int64]
Bytes = npt.NDArray[np.uint8]

MAGIC = 2
HEADER_SIZE = 61
LENGTH_PREFIX_SIZE = 12  # baseOffset + batchLength: what batchLength does not count
CRC_START = 21  # the attributes: the CRC covers them and everything after
COMPRESSION_MASK = 0x07
# A compressed batch's records decompressed past this are refused (MessageTooLargeError):
# a few bytes of zeros must not make the broker allocate gigabytes.
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
TIMESTAMP_TYPE_FLAG = 1 << 3

_HEADER = struct.Struct(">qiibIhiqqqhii")
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")
assert _HEADER.size == HEADER_SIZE

_COLUMNS = ("key", "value", "timestamp", "headers")
HEADERS_TYPE = pa.list_(
    pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])
)
_NO_HEADERS = pa.array([], HEADERS_TYPE.value_type)
# What the decoder gives: the columns of Spark's Kafka source, less topic/partition/offset
# (the offsets are base_offset + row index; the batch says the rest).
DECODED_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", pa.timestamp("ms"), nullable=False),
        pa.field("headers", HEADERS_TYPE, nullable=False),
    ]
)


class TimestampType(IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


@dataclass(frozen=True, slots=True)
class KafkaBatch:
    """One decoded batch: its header's fields and its records as rows (``DECODED_SCHEMA``);
    ``control`` is the marker of a control batch, whose ``rows`` are then its one record."""

    base_offset: int
    partition_leader_epoch: int
    crc: int
    compression: int
    timestamp_type: TimestampType
    is_transactional: bool
    is_control: bool
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    rows: pa.RecordBatch
    control: ControlRecord | None
    size: int  # bytes of the batch in the buffer, length prefix included


# -- encoding ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Varints:
    """One varint per item (values already zigzagged where the format says signed)."""

    values: npt.NDArray[np.uint64]
    sizes: Int64s

    @staticmethod
    def signed(values: npt.ArrayLike) -> _Varints:
        u = varint.zigzag(values)
        return _Varints(u, varint.sizes(u))


@dataclass(frozen=True, slots=True)
class _Spans:
    """Bytes per item: item i's are ``data[cumsum(lengths)[i-1]:cumsum(lengths)[i]]``."""

    lengths: Int64s
    data: Bytes


_Field = _Varints | _Spans


def _field_sizes(field: _Field) -> Int64s:
    return field.sizes if isinstance(field, _Varints) else field.lengths


def _mask(total: int, starts: Int64s, lengths: Int64s) -> npt.NDArray[np.bool_]:
    """True on the bytes of the ranges [start, start + length) within ``total`` bytes. The
    ranges of one field come in order and never overlap (other fields lie between them),
    so the mask is runs of False (the gaps) and True (the ranges), which ``np.repeat``
    lays out at memset speed."""
    count = len(starts)
    ends = starts + lengths
    runs = np.empty(2 * count + 1, dtype=np.int64)
    runs[0:-1:2] = starts - np.concatenate(([0], ends[:-1]))
    runs[1::2] = lengths
    runs[-1] = total - (int(ends[-1]) if count else 0)
    kinds = np.zeros(2 * count + 1, dtype=np.bool_)
    kinds[1::2] = True
    return np.repeat(kinds, runs)


def _write_items(out: Bytes, starts: Int64s, fields: Sequence[_Field]) -> None:
    """Writes item i's fields one after another from ``starts[i]``, field by field over
    all items at once."""
    at = starts.copy()
    for field in fields:
        if isinstance(field, _Varints):
            varint.write(out, at, field.values, field.sizes)
        elif len(field.data):
            out[_mask(len(out), at, field.lengths)] = field.data
        at += _field_sizes(field)


def _items_size(fields: Sequence[_Field], count: int) -> Int64s:
    total = np.zeros(count, dtype=np.int64)
    for field in fields:
        total += _field_sizes(field)
    return total


def _starts(sizes: Int64s, first: int) -> Int64s:
    ends = np.cumsum(sizes)
    return (ends - sizes + first).astype(np.int64)


def _binary_spans(column: pa.Array, name: str) -> tuple[Int64s, _Spans]:
    """A binary or string column as varint lengths (-1 for null) and its bytes, read from
    its offsets and data buffers without copying them per value."""
    kind = column.type
    if pa.types.is_binary_view(kind) or pa.types.is_string_view(kind):
        column = column.cast(pa.large_binary())
        kind = column.type
    if pa.types.is_binary(kind) or pa.types.is_string(kind):
        offset_type: type[np.integer] = np.int32
    elif pa.types.is_large_binary(kind) or pa.types.is_large_string(kind):
        offset_type = np.int64
    else:
        raise InvalidRecordError(f"column {name!r} is {kind}: a Kafka {name} is binary or string")
    lengths, data = _offsets_and_data(column, offset_type)
    valid = _validity(column)
    if valid is None:
        return lengths, _Spans(lengths, data)
    if lengths[~valid].any():
        # Arrow lets a null slot own bytes; a Kafka null has none: such slots are emptied
        # (a copy of the column, only then).
        emptied = pc.if_else(valid, column, pa.scalar(b"", column.type)).cast(column.type)
        lengths, data = _offsets_and_data(emptied, offset_type)
    return np.where(valid, lengths, -1), _Spans(lengths, data)


def _offsets_and_data(
    column: pa.Array,
    offset_type: type[np.integer],
) -> tuple[Int64s, Bytes]:
    """Each value's byte length and the values' bytes, straight from the column's offsets
    and data buffers (no copy but the offsets' widening)."""
    count = len(column)
    buffers = column.buffers()
    offsets = np.frombuffer(buffers[1], dtype=offset_type)[
        column.offset : column.offset + count + 1
    ].astype(np.int64)
    data_buffer = buffers[2]
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0] : offsets[-1]]
        if data_buffer is not None and count
        else np.zeros(0, dtype=np.uint8)
    )
    return np.diff(offsets), data


def _validity(column: pa.Array) -> npt.NDArray[np.bool_] | None:
    if column.null_count == 0:
        return None
    return np.asarray(pc.is_valid(column).to_numpy(zero_copy_only=False), dtype=np.bool_)


def is_kafka_shaped(schema: pa.Schema) -> bool:
    """Whether rows of ``schema`` are Kafka records as they are: a ``value`` column and no
    column but ``key``, ``value``, ``timestamp`` and ``headers``."""
    return "value" in schema.names and all(name in _COLUMNS for name in schema.names)


def record_timestamps(rows: pa.RecordBatch, default_ms: int) -> Int64s:
    """The timestamp (ms) each of ``rows`` has as a Kafka record: its ``timestamp``
    column's, ``default_ms`` where it has none (as :func:`encode_batches` writes them)."""
    count = rows.num_rows
    index = rows.schema.get_field_index("timestamp")
    column = rows.column(index) if index >= 0 else None
    return _timestamps_ms(column, count, np.full(count, default_ms, np.int64))


def _timestamps_ms(column: pa.Array | None, count: int, default: Int64s) -> Int64s:
    """Milliseconds per row; ``default`` (per row) where there is none."""
    if column is None:
        return default.copy()
    kind = column.type
    if pa.types.is_timestamp(kind) or pa.types.is_int64(kind):
        # int64 values either way, read from the data buffer (a null slot's are ignored)
        values = np.frombuffer(column.buffers()[1], dtype=np.int64)[
            column.offset : column.offset + count
        ]
        unit = kind.unit if pa.types.is_timestamp(kind) else "ms"
        times, per = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 1_000_000)}[unit]
        ms = values * times // per  # floor: a pre-1970 instant stays before its millisecond
    elif pa.types.is_integer(kind):
        ms = column.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    else:
        raise InvalidRecordError(
            f"column 'timestamp' is {kind}: a Kafka timestamp is a timestamp or int64 milliseconds"
        )
    valid = _validity(column)
    return ms if valid is None else np.where(valid, ms, default)


def _header_spans(column: pa.Array) -> tuple[Int64s, _Spans]:
    """Each row's header count and its headers' bytes, encoded over all header entries
    at once: the entries are items of their own, written back to back in row order, so
    row i's headers are one span of that buffer."""
    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_struct(
        kind.value_type
    ):
        raise InvalidRecordError(
            f"column 'headers' is {kind}: Kafka headers are "
            "list<struct<key: string, value: binary>>"
        )
    counts = (
        pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    )
    entries: pa.StructArray = column.flatten()
    names = [entries.type.field(i).name for i in range(entries.type.num_fields)]
    if sorted(names) != ["key", "value"]:
        raise InvalidRecordError(
            f"column 'headers' has fields {names}: a Kafka header is struct<key, value>"
        )
    keys, values = (entries.flatten()[names.index(n)] for n in ("key", "value"))
    if keys.null_count:
        raise InvalidRecordError("column 'headers' has a null header key: Kafka's are strings")
    key_lengths, key_spans = _binary_spans(keys, "header key")
    value_lengths, value_spans = _binary_spans(values, "header value")
    fields: list[_Field] = [
        _Varints.signed(key_lengths),
        key_spans,
        _Varints.signed(value_lengths),
        value_spans,
    ]
    entry_sizes = _items_size(fields, len(entries))
    encoded = np.empty(int(entry_sizes.sum()), dtype=np.uint8)
    _write_items(encoded, _starts(entry_sizes, 0), fields)
    ends = np.concatenate(([0], np.cumsum(entry_sizes)))
    row_ends = np.cumsum(counts)
    row_bytes = ends[row_ends] - ends[row_ends - counts]
    return counts, _Spans(row_bytes.astype(np.int64), encoded)


def _header(
    *,
    base_offset: int,
    total: int,
    partition_leader_epoch: int,
    attributes: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    count: int,
) -> tuple[object, ...]:
    return (
        base_offset,
        total - LENGTH_PREFIX_SIZE,
        partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )


def _seal(out: Bytes, header: tuple[object, ...], start: int = 0) -> None:
    """Packs the header of the batch at ``start`` in ``out``, then its CRC over
    [attributes, end) (the batch's size is in the header)."""
    view = memoryview(out)  # type: ignore[arg-type]
    _HEADER.pack_into(view, start, *header)
    end = start + LENGTH_PREFIX_SIZE + int(header[1])  # type: ignore[call-overload]
    struct.pack_into(">I", view, start + 17, crc32c.crc32c(view[start + CRC_START : end]))


@dataclass(frozen=True, slots=True)
class BatchToEncode:
    """One batch's rows (Kafka-shaped: see the module's docstring) and header fields: row N
    at offset ``base_offset + N``; rows without a timestamp (no column, or null) get
    ``default_timestamp`` (ms)."""

    rows: pa.RecordBatch
    base_offset: int
    partition_leader_epoch: int = 0
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    is_transactional: bool = False
    default_timestamp: int = NO_TIMESTAMP


def encode_batch(
    rows: pa.RecordBatch,
    *,
    base_offset: int,
    partition_leader_epoch: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    default_timestamp: int = NO_TIMESTAMP,
) -> bytes:
    """One v2 batch of ``rows``: see ``BatchToEncode``. CreateTime, no compression."""
    return encode_batches(
        [
            BatchToEncode(
                rows,
                base_offset,
                partition_leader_epoch,
                producer_id,
                producer_epoch,
                base_sequence,
                is_transactional,
                default_timestamp,
            )
        ]
    )


def encode_batches(batches: Sequence[BatchToEncode]) -> bytes:
    """The batches back to back, as a Fetch answer carries them, encoded in one column-wise
    pass over all their rows (so many small batches pay the per-call costs once). Their
    rows share one schema. CreateTime, no compression."""
    if not batches:
        return b""
    schema = batches[0].rows.schema
    unknown = [name for name in schema.names if name not in _COLUMNS]
    if unknown:
        raise InvalidRecordError(
            f"columns {unknown} are not Kafka-shaped: a Kafka record has {list(_COLUMNS)}"
        )
    if "value" not in schema.names:
        raise InvalidRecordError("no 'value' column: a Kafka-shaped batch needs one")
    differing = [i for i, b in enumerate(batches) if not b.rows.schema.equals(schema)]
    if differing:
        raise InvalidRecordError(
            f"batch {differing[0]}'s schema differs from the first's: batches encoded "
            "together share one"
        )
    rows = (
        batches[0].rows
        if len(batches) == 1
        else pa.RecordBatch.from_arrays(
            [pa.concat_arrays([b.rows.column(i) for b in batches]) for i in range(len(schema))],
            schema=schema,
        )
    )
    counts = np.array([b.rows.num_rows for b in batches], dtype=np.int64)
    firsts = np.cumsum(counts) - counts
    count = rows.num_rows

    def column(name: str) -> pa.Array | None:
        return rows.column(name) if name in schema.names else None

    key_column = column("key")
    if key_column is None:
        key_lengths, key_spans = (
            np.full(count, -1, np.int64),
            _Spans(np.zeros(count, np.int64), np.zeros(0, np.uint8)),
        )
    else:
        key_lengths, key_spans = _binary_spans(key_column, "key")
    value_lengths, value_spans = _binary_spans(rows.column("value"), "value")
    defaults = np.repeat(np.array([b.default_timestamp for b in batches], np.int64), counts)
    timestamps = _timestamps_ms(column("timestamp"), count, defaults)
    # Each batch's first and largest timestamp; an empty batch has none.
    filled = counts > 0
    base_timestamps = np.full(len(batches), NO_TIMESTAMP, np.int64)
    max_timestamps = np.full(len(batches), NO_TIMESTAMP, np.int64)
    if count:
        base_timestamps[filled] = timestamps[firsts[filled]]
        max_timestamps[filled] = np.maximum.reduceat(timestamps, firsts[filled])
    header_column = column("headers")
    header_fields: list[_Field]
    if header_column is None:
        header_fields = [_Varints.signed(np.zeros(count, np.int64))]
    else:
        header_counts, header_spans = _header_spans(header_column)
        header_fields = [_Varints.signed(header_counts), header_spans]

    body: list[_Field] = [
        _Varints(np.zeros(count, np.uint64), np.ones(count, np.int64)),  # attributes int8 0
        _Varints.signed(timestamps - np.repeat(base_timestamps, counts)),
        _Varints.signed(np.arange(count, dtype=np.int64) - np.repeat(firsts, counts)),
        _Varints.signed(key_lengths),
        key_spans,
        _Varints.signed(value_lengths),
        value_spans,
        *header_fields,
    ]
    body_sizes = _items_size(body, count)
    prefix = _Varints.signed(body_sizes)
    record_sizes = prefix.sizes + body_sizes
    # Batch b: its header, then its records; record starts skip the headers before them.
    records_bytes = np.add.reduceat(record_sizes, firsts[filled]) if count else record_sizes
    batch_sizes = np.full(len(batches), HEADER_SIZE, np.int64)
    batch_sizes[filled] += records_bytes
    batch_starts = np.cumsum(batch_sizes) - batch_sizes
    record_starts = _starts(record_sizes, 0) + HEADER_SIZE * (
        np.repeat(np.arange(len(batches)), counts) + 1
    )
    out = np.empty(int(batch_sizes.sum()), dtype=np.uint8)
    _write_items(out, record_starts, [prefix, *body])
    for b, batch in enumerate(batches):
        _seal(
            out,
            _header(
                base_offset=batch.base_offset,
                total=int(batch_sizes[b]),
                partition_leader_epoch=batch.partition_leader_epoch,
                attributes=TRANSACTIONAL_FLAG if batch.is_transactional else 0,
                last_offset_delta=int(counts[b]) - 1,
                base_timestamp=int(base_timestamps[b]),
                max_timestamp=int(max_timestamps[b]),
                producer_id=batch.producer_id,
                producer_epoch=batch.producer_epoch,
                base_sequence=batch.base_sequence,
                count=int(counts[b]),
            ),
            int(batch_starts[b]),
        )
    return out.tobytes()


def encode_control_batch(
    control_type: ControlType,
    *,
    base_offset: int,
    partition_leader_epoch: int,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp: int,
) -> bytes:
    """A transaction marker: a transactional control batch of one record, as Kafka's
    broker writes them (no sequence: markers are not the producer's)."""
    key = _CONTROL_KEY.pack(0, int(control_type))
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
    record = bytes([0, 0, 0, len(key) << 1]) + key + bytes([len(value) << 1]) + value + b"\0"
    body = bytes([len(record) << 1]) + record  # every length here fits one varint byte
    out = np.empty(HEADER_SIZE + len(body), dtype=np.uint8)
    out[HEADER_SIZE:] = np.frombuffer(body, dtype=np.uint8)
    header = _header(
        base_offset=base_offset,
        total=len(out),
        partition_leader_epoch=partition_leader_epoch,
        attributes=TRANSACTIONAL_FLAG | CONTROL_FLAG,
        last_offset_delta=0,
        base_timestamp=timestamp,
        max_timestamp=timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        count=1,
    )
    _seal(out, header)
    return out.tobytes()


# -- decoding ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Frame:
    """One batch's header, checked, and where the batch lies in the buffer."""

    base_offset: int
    partition_leader_epoch: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int
    position: int
    size: int
    where: str


def decode_batches(
    buffer: bytes | bytearray | memoryview, max_decompressed: int = MAX_DECOMPRESSED_BYTES
) -> list[KafkaBatch]:
    """Every batch in ``buffer``, back to back (a Produce request's records); the buffer
    must end on a batch's end. Checks magic, lengths, CRC and every record's framing.
    A compressed batch's records are decompressed first (MessageTooLargeError past
    ``max_decompressed`` bytes); its KafkaBatch keeps its own codec, CRC and size.

    The records of all the batches are decoded together, column-wise, into one Arrow
    batch that each KafkaBatch's rows are a slice of: a request of many small batches (a
    Java producer's default is 16 KiB) pays the per-call costs once, not per batch."""
    view = memoryview(buffer).cast("B")
    frames: list[_Frame] = []
    position = 0
    while position < len(view):
        frame = _frame(view, position)
        frames.append(frame)
        position += frame.size
    if not frames:
        return []
    if any(f.attributes & COMPRESSION_MASK for f in frames):
        plain = decode_batches(_decompressed(view, frames, max_decompressed))
        return [
            dataclasses.replace(
                b, compression=f.attributes & COMPRESSION_MASK, crc=f.crc, size=f.size
            )
            for b, f in zip(plain, frames, strict=True)
        ]
    rows = _decode_records(view, frames)
    batches = []
    first = 0
    for frame in frames:
        batch_rows = rows.slice(first, frame.count)
        first += frame.count
        is_control = bool(frame.attributes & CONTROL_FLAG)
        batches.append(
            KafkaBatch(
                base_offset=frame.base_offset,
                partition_leader_epoch=frame.partition_leader_epoch,
                crc=frame.crc,
                compression=frame.attributes & COMPRESSION_MASK,
                timestamp_type=_timestamp_type(frame),
                is_transactional=bool(frame.attributes & TRANSACTIONAL_FLAG),
                is_control=is_control,
                last_offset_delta=frame.last_offset_delta,
                base_timestamp=frame.base_timestamp,
                max_timestamp=frame.max_timestamp,
                producer_id=frame.producer_id,
                producer_epoch=frame.producer_epoch,
                base_sequence=frame.base_sequence,
                rows=batch_rows,
                control=_control(batch_rows, frame.where) if is_control else None,
                size=frame.size,
            )
        )
    return batches


def _decompressed(view: memoryview, frames: Sequence[_Frame], limit: int) -> bytes:
    """The batches of ``view`` with every compressed one replaced by its uncompressed
    copy: the same header with the codec bits cleared, its length and CRC made anew."""
    parts: list[bytes | memoryview] = []
    for f in frames:
        batch = view[f.position : f.position + f.size]
        bits = f.attributes & COMPRESSION_MASK
        if not bits:
            parts.append(batch)
            continue
        records = decompress(Codec(bits), batch[HEADER_SIZE:], limit, f.where)
        header = bytearray(batch[:HEADER_SIZE])
        struct.pack_into(">i", header, 8, HEADER_SIZE - LENGTH_PREFIX_SIZE + len(records))
        struct.pack_into(">h", header, CRC_START, f.attributes & ~COMPRESSION_MASK)
        crc = crc32c.crc32c(records, crc32c.crc32c(bytes(header[CRC_START:])))
        struct.pack_into(">I", header, 17, crc)
        parts += [bytes(header), records]
    return b"".join(parts)


def _timestamp_type(frame: _Frame) -> TimestampType:
    return TimestampType(1 if frame.attributes & TIMESTAMP_TYPE_FLAG else 0)


def _frame(view: memoryview, position: int) -> _Frame:
    where = f"batch at byte {position}"
    if len(view) - position < HEADER_SIZE:
        raise CorruptRecordError(
            f"{where}: {len(view) - position} bytes left, fewer than a header's {HEADER_SIZE}"
        )
    (
        base_offset,
        length,
        leader_epoch,
        magic,
        crc,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    ) = _HEADER.unpack_from(view, position)
    where = f"batch at offset {base_offset} (byte {position})"
    if magic != MAGIC:
        raise CorruptRecordError(f"{where}: magic {magic}, only {MAGIC} is read")
    size = LENGTH_PREFIX_SIZE + length
    if length < HEADER_SIZE - LENGTH_PREFIX_SIZE or position + size > len(view):
        raise CorruptRecordError(
            f"{where}: batchLength {length} does not fit the {len(view) - position} bytes left"
        )
    actual = crc32c.crc32c(view[position + CRC_START : position + size])
    if actual != crc:
        raise CorruptRecordError(f"{where}: CRC-32C is {actual:#010x}, the header says {crc:#010x}")
    codec_of(attributes & COMPRESSION_MASK, where)
    if count < 0 or last_offset_delta != count - 1:
        raise CorruptRecordError(
            f"{where}: {count} records but lastOffsetDelta {last_offset_delta}"
        )
    return _Frame(
        base_offset,
        leader_epoch,
        crc,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
        position,
        size,
        where,
    )


def _control(rows: pa.RecordBatch, where: str) -> ControlRecord:
    key, value = rows.column("key"), rows.column("value")
    if rows.num_rows != 1 or key[0].as_py() is None or value[0].as_py() is None:
        raise CorruptRecordError(f"{where}: a control batch holds one record with key and value")
    key_bytes, value_bytes = key[0].as_py(), value[0].as_py()
    if len(key_bytes) < _CONTROL_KEY.size or len(value_bytes) < _CONTROL_VALUE.size:
        raise CorruptRecordError(f"{where}: control record key or value too short")
    _, control_type = _CONTROL_KEY.unpack_from(key_bytes)
    _, coordinator_epoch = _CONTROL_VALUE.unpack_from(value_bytes)
    if control_type not in (ControlType.ABORT, ControlType.COMMIT):
        raise CorruptRecordError(f"{where}: control type {control_type} is not ABORT or COMMIT")
    return ControlRecord(ControlType(control_type), coordinator_epoch)


def _record_starts(raw: bytes, frames: Sequence[_Frame]) -> tuple[Int64s, Int64s]:
    """Where each record's fields start in the buffer, and their length. Each record
    starts where the previous one ends, so the starts are found by a walk along the length
    prefixes (the one per-record Python step of decoding, kept to a byte read and an add
    for lengths under 64 bytes); the prefixes are then read again column-wise."""
    prefixes: list[int] = []
    mark = prefixes.append
    for frame in frames:
        at = frame.position + HEADER_SIZE
        limit = frame.position + frame.size
        past = f"{frame.where}: its {frame.count} records' lengths run past the batch's end"
        try:
            for _ in range(frame.count):
                mark(at)
                byte = raw[at]
                at += 1
                unsigned = byte & 0x7F
                shift = 7
                while byte >= 0x80:
                    if shift > 28:
                        raise CorruptRecordError(
                            f"{frame.where}: a record's length varint is too long"
                        )
                    byte = raw[at]
                    at += 1
                    unsigned |= (byte & 0x7F) << shift
                    shift += 7
                if unsigned & 1:
                    raise CorruptRecordError(f"{frame.where}: a record's length is negative")
                at += unsigned >> 1
        except IndexError:
            raise CorruptRecordError(past) from None
        if at > limit:
            raise CorruptRecordError(past)
        if at < limit:
            raise CorruptRecordError(
                f"{frame.where}: its {frame.count} records end {limit - at} bytes before it "
                f"does: {limit - at} bytes after the last record"
            )
    starts = np.array(prefixes, dtype=np.int64)
    lengths, taken = varint.read(
        np.frombuffer(raw, dtype=np.uint8), starts, varint.VARINT_MAX_BYTES, "a record batch"
    )
    return starts + taken, lengths


def _gather(
    records: Bytes, starts: Int64s, lengths: Int64s
) -> tuple[pa.Buffer | None, pa.Buffer, pa.Buffer, int]:
    """A binary column's buffers from spans of ``records`` (length -1: null)."""
    valid = lengths >= 0
    sizes = np.where(valid, lengths, 0)
    data = records[_mask(len(records), starts, sizes)] if sizes.any() else records[:0]
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int32)
    nulls = int(len(lengths) - valid.sum())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return bitmap, pa.py_buffer(offsets), pa.py_buffer(data), nulls


def _binary_array(records: Bytes, starts: Int64s, lengths: Int64s) -> pa.Array:
    bitmap, offsets, data, nulls = _gather(records, starts, lengths)
    return pa.Array.from_buffers(
        pa.binary(), len(lengths), [bitmap, offsets, data], null_count=nulls
    )


class _Blame:
    """Names record ``r`` (an index over all the buffer's records) by its batch."""

    def __init__(self, frames: Sequence[_Frame], counts: Int64s) -> None:
        self._frames = frames
        self._firsts = np.cumsum(counts) - counts
        self._batch_of = np.repeat(np.arange(len(frames)), counts)

    def __call__(self, record: int) -> str:
        batch = int(self._batch_of[record])
        return f"{self._frames[batch].where}: record {record - int(self._firsts[batch])}"

    def first_of(self, bad: npt.NDArray[np.bool_]) -> tuple[int, str] | None:
        if not bad.any():
            return None
        record = int(np.flatnonzero(bad)[0])
        return record, self(record)


def _decode_records(view: memoryview, frames: Sequence[_Frame]) -> pa.RecordBatch:
    raw = view.tobytes()
    whole = np.frombuffer(raw, dtype=np.uint8)
    counts = np.array([f.count for f in frames], dtype=np.int64)
    blame = _Blame(frames, counts)
    total = int(counts.sum())
    what = "a record batch"
    starts, lengths = _record_starts(raw, frames)
    ends = starts + lengths
    at = starts + 1  # the record's attributes byte, unused
    deltas, taken = varint.read(whole, at, varint.VARLONG_MAX_BYTES, what)
    at = at + taken
    offset_deltas, taken = varint.read(whole, at, varint.VARINT_MAX_BYTES, what)
    at = at + taken
    expected = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    wrong = blame.first_of(offset_deltas != expected)
    if wrong:
        record, name = wrong
        raise CorruptRecordError(
            f"{name} has offsetDelta {int(offset_deltas[record])}, not {int(expected[record])}"
        )
    spans: list[tuple[Int64s, Int64s]] = []
    for field in ("key", "value"):
        field_lengths, taken = varint.read(whole, at, varint.VARINT_MAX_BYTES, what)
        at = at + taken
        bad = blame.first_of((field_lengths < -1) | (at + np.maximum(field_lengths, 0) > ends))
        if bad:
            record, name = bad
            raise CorruptRecordError(
                f"{name}'s {field} length {int(field_lengths[record])} does not fit"
            )
        spans.append((at, field_lengths))
        at = at + np.maximum(field_lengths, 0)
    header_counts, taken = varint.read(whole, at, varint.VARINT_MAX_BYTES, what)
    at = at + taken
    bad = blame.first_of(header_counts < 0)
    if bad:
        record, name = bad
        raise CorruptRecordError(f"{name} has {int(header_counts[record])} headers")
    headers, at = _decode_headers(whole, raw, header_counts, at, ends, blame)
    bad = blame.first_of(at != ends)
    if bad:
        record, name = bad
        raise CorruptRecordError(
            f"{name}'s length says {int(lengths[record])} bytes, its fields take "
            f"{int(at[record] - starts[record])}"
        )
    append_time = np.array(
        [_timestamp_type(f) is TimestampType.LOG_APPEND_TIME for f in frames], dtype=np.bool_
    )
    base = np.array([f.base_timestamp for f in frames], dtype=np.int64)
    newest = np.array([f.max_timestamp for f in frames], dtype=np.int64)
    timestamps = np.where(
        np.repeat(append_time, counts), np.repeat(newest, counts), np.repeat(base, counts) + deltas
    )
    return pa.RecordBatch.from_arrays(
        [
            _binary_array(whole, *spans[0]),
            _binary_array(whole, *spans[1]),
            pa.array(timestamps, pa.timestamp("ms")),
            headers,
        ],
        schema=DECODED_SCHEMA,
    )


def _decode_headers(
    records: Bytes, raw: bytes, counts: Int64s, at: Int64s, ends: Int64s, blame: _Blame
) -> tuple[pa.Array, Int64s]:
    """The headers column and where each record's headers end. Entries are read one by
    one, and only for records that have any: their positions chain like the records'."""
    list_offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
    total = int(list_offsets[-1])
    if total == 0:  # most topics: every list empty, nothing to read
        return pa.ListArray.from_arrays(pa.array(list_offsets), _NO_HEADERS), at
    key_starts = np.zeros(total, np.int64)
    key_lengths = np.zeros(total, np.int64)
    value_starts = np.zeros(total, np.int64)
    value_lengths = np.zeros(total, np.int64)
    at = at.copy()
    entry = 0
    for record in np.flatnonzero(counts):
        position = int(at[record])
        end = int(ends[record])
        for _ in range(int(counts[record])):
            for starts_out, lengths_out, least in (
                (key_starts, key_lengths, 0),
                (value_starts, value_lengths, -1),
            ):
                size, position = varint.read_one(
                    raw, position, varint.VARINT_MAX_BYTES, blame(int(record))
                )
                if size < least or position + max(size, 0) > end:
                    raise CorruptRecordError(
                        f"{blame(int(record))} has a header with length {size}"
                    )
                starts_out[entry], lengths_out[entry] = position, size
                position += max(size, 0)
            entry += 1
        at[record] = position
    keys_binary = _binary_array(records, key_starts, key_lengths)
    try:
        keys = keys_binary.cast(pa.string())
    except pa.ArrowInvalid as e:
        raise CorruptRecordError(f"a record's header key is not UTF-8: {e}") from e
    entries = pa.StructArray.from_arrays(
        [keys, _binary_array(records, value_starts, value_lengths)],
        fields=list(HEADERS_TYPE.value_type),
    )
    return pa.ListArray.from_arrays(pa.array(list_offsets, pa.int32()), entries), at
