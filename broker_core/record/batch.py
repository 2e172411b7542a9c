"""The record-batch codec: the unit that is appended, stored, replicated and fetched.

Byte layout (big-endian, like Kafka's; the header is 64 bytes so that the Arrow payload
starts 8-byte aligned and can be read in place from a memory map without copying):

    offset size  field
    0      8     base_offset        int64   offset of the first row, assigned by the log
    8      4     batch_length       int32   bytes that follow this field (total - 12)
    12     1     magic              int8    format version, MAGIC = 1
    13     3     (reserved, zero)
    16     4     crc                uint32  CRC-32C of bytes [20, end): everything after it
    20     2     attributes         int16   bit 4: transactional, bit 5: control batch
    22     2     producer_epoch     int16   NO_PRODUCER_EPOCH (-1) when not idempotent
    24     4     last_offset_delta  int32   record_count - 1
    28     4     base_sequence      int32   NO_SEQUENCE (-1) when not idempotent
    32     8     first_timestamp    int64   ms since the epoch
    40     8     max_timestamp      int64   ms since the epoch
    48     8     producer_id        int64   NO_PRODUCER_ID (-1) when not idempotent
    56     4     record_count       int32   rows in the payload (1 for a control batch)
    60     4     leader_epoch       int32   epoch of the leader that wrote it (Kafka's
                                            partitionLeaderEpoch); >= 0
    64     ...   payload
                 data batch:    an Arrow IPC stream (schema message, one record batch
                                message, end-of-stream marker); its length is a multiple of 8
                 control batch: version int16, type int16 (0 ABORT, 1 COMMIT),
                                coordinator_epoch int32

The CRC does not cover base_offset/batch_length/magic, so the log can stamp the offset
on a batch without recomputing it (Kafka's choice too).

``leader_epoch`` sits in bytes 60-63, which were reserved (zero) before replication, and
unlike Kafka's partitionLeaderEpoch it is inside the CRC: the only free bytes outside it
are 13-15, too few for an int32, and moving fields would have needed a new magic. It costs
nothing here because the leader always encodes and checksums batches itself (clients send
Arrow rows, never encoded batches), and a follower copies them byte for byte. Segments
written before the field existed hold zeros there, which read as INITIAL_LEADER_EPOCH (0)
with their CRC unchanged, so MAGIC stays 1. The last sequence of a batch is
``base_sequence + record_count - 1`` modulo 2^31: sequences wrap at 2^31 - 1 to 0.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TypeAlias

import crc32c
import pyarrow as pa

from broker_core.errors import CorruptRecordError, InvalidRecordError

MAGIC = 1
HEADER_SIZE = 64
LENGTH_PREFIX_SIZE = 12  # base_offset + batch_length: the part batch_length does not count
CRC_START = 20

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1
MAX_SEQUENCE = 2**31 - 1
SEQUENCE_SPACE = 2**31
MAX_PRODUCER_EPOCH = 2**15 - 1
# The epoch of a partition's first leader, and what a batch written before leader epochs
# existed reads as (its bytes 60-63 are zero).
INITIAL_LEADER_EPOCH = 0
# Not a batch's epoch: "no epoch known" in answers about epochs (Kafka's UNDEFINED_EPOCH).
NO_LEADER_EPOCH = -1
MAX_LEADER_EPOCH = 2**31 - 1

TRANSACTIONAL_FLAG = 1 << 4
CONTROL_FLAG = 1 << 5

_HEADER = struct.Struct(">qiB3xIhhiiqqqii")
_LENGTH_PREFIX = struct.Struct(">qi")
_CONTROL = struct.Struct(">hhi")
_CONTROL_PAYLOAD_SIZE = 8  # _CONTROL.size is 8 already: keeps batches 8-byte aligned
assert _HEADER.size == HEADER_SIZE and _CONTROL.size == _CONTROL_PAYLOAD_SIZE


class ControlType(IntEnum):
    ABORT = 0
    COMMIT = 1


def increment_sequence(sequence: int, delta: int) -> int:
    """``sequence + delta`` in the wrapping sequence space [0, 2^31 - 1]."""
    return (sequence + delta) % SEQUENCE_SPACE


def sequence_distance(lower: int, upper: int) -> int:
    """How many steps forward ``upper`` lies from ``lower`` in the wrapping space."""
    return (upper - lower) % SEQUENCE_SPACE


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    magic: int
    crc: int
    attributes: int
    producer_epoch: int
    last_offset_delta: int
    base_sequence: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    record_count: int
    leader_epoch: int

    @property
    def size(self) -> int:
        return self.batch_length + LENGTH_PREFIX_SIZE

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return increment_sequence(self.base_sequence, self.last_offset_delta)


def decode_header(buf: bytes | memoryview, position: int = 0) -> BatchHeader:
    """Parse the fixed header at ``position``; checks framing, not the CRC."""
    if len(buf) - position < HEADER_SIZE:
        raise CorruptRecordError(
            f"truncated batch header at byte {position}: {len(buf) - position} of "
            f"{HEADER_SIZE} bytes present"
        )
    header = BatchHeader(*_HEADER.unpack_from(buf, position))
    if buf[position + 13 : position + 16] != b"\0\0\0":
        # Outside the CRC, so checked here: a flipped reserved byte must not pass unseen.
        raise CorruptRecordError(f"non-zero reserved header bytes at byte {position}")
    if header.leader_epoch < 0:
        raise CorruptRecordError(
            f"negative leader epoch {header.leader_epoch} in the batch at byte {position}"
        )
    if header.magic != MAGIC:
        raise CorruptRecordError(
            f"unknown batch format (magic {header.magic}, expected {MAGIC}) at byte {position}"
        )
    if header.batch_length < HEADER_SIZE - LENGTH_PREFIX_SIZE or header.batch_length % 8 != 4:
        raise CorruptRecordError(f"invalid batch length {header.batch_length} at byte {position}")
    if header.record_count <= 0 or header.last_offset_delta != header.record_count - 1:
        raise CorruptRecordError(
            f"invalid record count {header.record_count} (last offset delta "
            f"{header.last_offset_delta}) at byte {position}"
        )
    return header


def read_length_prefix(buf: bytes | memoryview, position: int = 0) -> tuple[int, int]:
    """(base_offset, batch_length) without parsing the rest of the header."""
    base_offset, batch_length = _LENGTH_PREFIX.unpack_from(buf, position)
    return int(base_offset), int(batch_length)


def compute_crc(batch: bytes | memoryview | pa.Buffer) -> int:
    view = memoryview(batch)
    return int(crc32c.crc32c(view[CRC_START:]))


def verify_crc(header: BatchHeader, batch: bytes | memoryview) -> None:
    actual = compute_crc(batch)
    if actual != header.crc:
        raise CorruptRecordError(
            f"CRC mismatch for batch at offset {header.base_offset}: stored {header.crc:#010x}, "
            f"computed {actual:#010x}"
        )


def set_base_offset(batch: bytearray | memoryview, base_offset: int) -> None:
    """Stamp the log's offset on an encoded batch (outside the CRC, so no re-checksum)."""
    struct.pack_into(">q", batch, 0, base_offset)


# bytes, bytearray, memoryview or pyarrow.Buffer: anything with the buffer protocol
# (pyarrow is untyped, so the alias cannot be spelled more precisely).
Piece: TypeAlias = Any


class _PieceSink:
    """File-like sink for pyarrow's IPC writer that keeps references instead of copying.

    pyarrow hands large pieces over as Buffers pointing at the batch's own memory, so the
    payload reaches the kernel in one ``writev`` without a user-space copy.
    """

    __slots__ = ("closed", "pieces", "size")

    def __init__(self) -> None:
        self.pieces: list[Piece] = []
        self.size = 0
        self.closed = False

    def write(self, data: Piece) -> int:
        self.pieces.append(data)
        n = len(data)
        self.size += n
        return n

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@dataclass(slots=True)
class EncodedBatch:
    """A batch as header bytes plus payload pieces, ready to be written with ``writev``."""

    header: bytearray
    pieces: list[Piece]
    size: int  # header + payload
    crc_done: bool = False

    def set_base_offset(self, base_offset: int) -> None:
        set_base_offset(self.header, base_offset)

    def decode_header(self) -> BatchHeader:
        return BatchHeader(*_HEADER.unpack_from(self.header, 0))

    def finish_crc(self) -> None:
        """Checksum the batch into its header, once; ``iovecs`` does it for the writer."""
        if self.crc_done:
            return
        crc = crc32c.crc32c(memoryview(self.header)[CRC_START:])
        for piece in self.pieces:
            crc = crc32c.crc32c(piece, crc)
        struct.pack_into(">I", self.header, 16, crc)
        self.crc_done = True

    def iovecs(self) -> list[Piece]:
        self.finish_crc()
        return [self.header, *self.pieces]

    def to_buffer(self) -> pa.Buffer:
        """The batch as one contiguous buffer (one copy)."""
        return pa.py_buffer(b"".join(memoryview(p) for p in self.iovecs()))


def _encode(
    payload: list[Piece],
    payload_size: int,
    *,
    base_offset: int,
    attributes: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    record_count: int,
    first_timestamp: int,
    max_timestamp: int,
    leader_epoch: int,
) -> EncodedBatch:
    if not INITIAL_LEADER_EPOCH <= leader_epoch <= MAX_LEADER_EPOCH:
        raise InvalidRecordError(
            f"leader_epoch={leader_epoch} is outside [{INITIAL_LEADER_EPOCH}, {MAX_LEADER_EPOCH}]"
        )
    total = HEADER_SIZE + payload_size
    header = bytearray(HEADER_SIZE)
    _HEADER.pack_into(
        header,
        0,
        base_offset,
        total - LENGTH_PREFIX_SIZE,
        MAGIC,
        0,
        attributes,
        producer_epoch,
        record_count - 1,
        base_sequence,
        first_timestamp,
        max_timestamp,
        producer_id,
        record_count,
        leader_epoch,
    )
    return EncodedBatch(header, payload, total)


def as_record_batch(records: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """``records`` as the one RecordBatch a data batch's payload holds (what
    :func:`encode_data` encodes): a Table's chunks combined. Raises InvalidRecordError
    for anything but a RecordBatch or a Table."""
    if isinstance(records, pa.RecordBatch):
        return records
    if isinstance(records, pa.Table):
        combined = records.combine_chunks()
        batches = combined.to_batches()
        if len(batches) == 1:
            return batches[0]
        return pa.RecordBatch.from_pylist([], schema=records.schema)  # no rows, no batch
    raise InvalidRecordError(
        f"records must be a pyarrow RecordBatch or Table, got {type(records).__name__}"
    )


# Passed explicitly: without options pyarrow reads two environment variables per stream.
_IPC_WRITE_OPTIONS = pa.ipc.IpcWriteOptions()


def _write_ipc_stream(sink: pa.NativeFile, batch: pa.RecordBatch) -> None:
    with pa.ipc.new_stream(sink, batch.schema, options=_IPC_WRITE_OPTIONS) as writer:
        writer.write_batch(batch)


def ipc_stream_size(batch: pa.RecordBatch) -> int:
    """Exact payload size, measured without copying any data."""
    counter = pa.MockOutputStream()
    _write_ipc_stream(counter, batch)
    return int(counter.size())


def ipc_pieces(batch: pa.RecordBatch) -> tuple[list[Piece], int]:
    """The Arrow IPC stream of ``batch`` as zero-copy pieces, and its total size."""
    sink = _PieceSink()
    _write_ipc_stream(pa.PythonFile(sink, mode="w"), batch)
    return sink.pieces, sink.size


def encode_data(
    batch: pa.RecordBatch,
    *,
    base_offset: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    first_timestamp: int = NO_TIMESTAMP,
    max_timestamp: int = NO_TIMESTAMP,
    pieces: tuple[list[Piece], int] | None = None,
    leader_epoch: int = INITIAL_LEADER_EPOCH,
) -> EncodedBatch:
    """Encode rows as one batch that references the rows' memory (nothing is copied).

    ``leader_epoch`` is the epoch of the leader writing it (checksummed with the rest).
    Raises InvalidRecordError for no rows or a leader epoch outside [0, 2^31 - 1].
    """
    if batch.num_rows == 0:
        raise InvalidRecordError("a record batch must hold at least one row")
    payload, size = ipc_pieces(batch) if pieces is None else pieces
    return _encode(
        payload,
        size,
        base_offset=base_offset,
        attributes=TRANSACTIONAL_FLAG if transactional else 0,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        record_count=batch.num_rows,
        first_timestamp=first_timestamp,
        max_timestamp=max_timestamp,
        leader_epoch=leader_epoch,
    )


def encode_control(
    control_type: ControlType,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int = 0,
    base_offset: int = 0,
    timestamp: int = NO_TIMESTAMP,
    leader_epoch: int = INITIAL_LEADER_EPOCH,
) -> EncodedBatch:
    """A COMMIT/ABORT marker: transactional and control, one (non-data) record.

    Raises InvalidRecordError for a leader epoch outside [0, 2^31 - 1].
    """
    return _encode(
        [_CONTROL.pack(0, int(control_type), coordinator_epoch)],
        _CONTROL_PAYLOAD_SIZE,
        base_offset=base_offset,
        attributes=TRANSACTIONAL_FLAG | CONTROL_FLAG,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        record_count=1,
        first_timestamp=timestamp,
        max_timestamp=timestamp,
        leader_epoch=leader_epoch,
    )


def encode_controls(
    control_type: ControlType,
    producers: Sequence[tuple[int, int]],
    coordinator_epoch: int,
    base_offset: int,
    timestamp: int,
    leader_epoch: int,
) -> list[EncodedBatch]:
    """One marker per (producer id, epoch) of ``producers``, at consecutive offsets from
    ``base_offset``: written back to back in one append (a sink commit's markers)."""
    return [
        encode_control(
            control_type,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            coordinator_epoch=coordinator_epoch,
            base_offset=base_offset + i,
            timestamp=timestamp,
            leader_epoch=leader_epoch,
        )
        for i, (producer_id, producer_epoch) in enumerate(producers)
    ]


@dataclass(frozen=True, slots=True)
class ControlRecord:
    control_type: ControlType
    coordinator_epoch: int


def decode_control(header: BatchHeader, batch: bytes | memoryview) -> ControlRecord:
    if not header.is_control:
        raise InvalidRecordError(f"batch at offset {header.base_offset} is not a control batch")
    version, control_type, coordinator_epoch = _CONTROL.unpack_from(batch, HEADER_SIZE)
    if version != 0 or control_type not in (ControlType.ABORT, ControlType.COMMIT):
        raise CorruptRecordError(
            f"unknown control record (version {version}, type {control_type}) at offset "
            f"{header.base_offset}"
        )
    return ControlRecord(ControlType(control_type), coordinator_epoch)


def validate_rows(rows: pa.RecordBatch, what: str) -> None:
    """Raise InvalidRecordError unless ``rows`` is whole Arrow data: every buffer as long as
    its type and length need, every offset inside its data, strings UTF-8 (Arrow's full
    validation). An IPC reader checks only the messages' structure, and one batch whose
    offsets point past its data would poison the partition for every reader."""
    try:
        rows.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise InvalidRecordError(f"{what}: invalid Arrow data: {exc}") from None


def decode_rows(header: BatchHeader, batch: memoryview | pa.Buffer) -> pa.RecordBatch:
    """The Arrow rows of a data batch, referencing ``batch``'s memory (no copy)."""
    if header.is_control:
        raise InvalidRecordError(f"batch at offset {header.base_offset} is a control batch")
    payload = pa.py_buffer(batch)[HEADER_SIZE : header.size]
    try:
        reader = pa.ipc.open_stream(payload)
        rows = reader.read_next_batch()
    except (pa.ArrowInvalid, StopIteration) as exc:
        raise CorruptRecordError(
            f"batch at offset {header.base_offset} has an unreadable Arrow payload: {exc}"
        ) from exc
    if rows.num_rows != header.record_count:
        raise CorruptRecordError(
            f"batch at offset {header.base_offset} declares {header.record_count} rows but its "
            f"payload holds {rows.num_rows}"
        )
    return rows
