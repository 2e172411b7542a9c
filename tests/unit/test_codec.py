"""The record-batch codec: byte layout, round trips, CRC coverage and sequence arithmetic."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_core.errors import CorruptRecordError, InvalidRecordError
from broker_core.log.config import LogConfig
from broker_core.log.partition_log import PartitionLog
from broker_core.log.validator import in_sequence
from broker_core.record.batch import (
    CONTROL_FLAG,
    CRC_START,
    HEADER_SIZE,
    INITIAL_LEADER_EPOCH,
    LENGTH_PREFIX_SIZE,
    MAGIC,
    MAX_LEADER_EPOCH,
    MAX_SEQUENCE,
    NO_LEADER_EPOCH,
    NO_SEQUENCE,
    SEQUENCE_SPACE,
    TRANSACTIONAL_FLAG,
    ControlType,
    compute_crc,
    decode_control,
    decode_header,
    decode_rows,
    encode_control,
    encode_data,
    increment_sequence,
    ipc_stream_size,
    read_length_prefix,
    sequence_distance,
    set_base_offset,
    verify_crc,
)


def sample(n: int = 5, width: int = 3) -> pa.RecordBatch:
    """Rows with nulls, strings of varying width and a nested column."""
    return pa.record_batch(
        {
            "id": pa.array(range(n), pa.int64()),
            "name": pa.array([None if i % 3 == 0 else "v" * (i % width + 1) for i in range(n)]),
            "tags": pa.array([[i, i + 1] for i in range(n)], pa.list_(pa.int16())),
        }
    )


ENCODED = bytes(
    encode_data(
        sample(),
        base_offset=77,
        producer_id=2**40,
        producer_epoch=9,
        base_sequence=123,
        transactional=True,
        first_timestamp=1_700_000_000_000,
        max_timestamp=1_700_000_000_500,
    ).to_buffer()
)


def test_header_is_64_bytes_and_the_layout_is_as_documented() -> None:
    assert HEADER_SIZE == 64 and CRC_START == 20 and LENGTH_PREFIX_SIZE == 12
    fields = struct.unpack_from(">qiB3xIhhiiqqqii", ENCODED)
    assert fields == (
        77,
        len(ENCODED) - 12,
        MAGIC,
        fields[3],  # the CRC, checked below
        TRANSACTIONAL_FLAG,
        9,
        4,
        123,
        1_700_000_000_000,
        1_700_000_000_500,
        2**40,
        5,
        INITIAL_LEADER_EPOCH,
    )
    assert fields[3] == crc32c.crc32c(ENCODED[CRC_START:])
    assert ENCODED[13:16] == b"\0\0\0" and ENCODED[60:64] == b"\0\0\0\0"
    assert read_length_prefix(ENCODED) == (77, len(ENCODED) - 12)


def test_data_batch_round_trip() -> None:
    batch = sample()
    header = decode_header(ENCODED)
    assert header.base_offset == 77
    assert header.size == len(ENCODED)
    assert header.producer_id == 2**40
    assert header.producer_epoch == 9
    assert header.base_sequence == 123 and header.last_sequence == 127
    assert header.record_count == 5 and header.last_offset == 81 and header.next_offset == 82
    assert (header.first_timestamp, header.max_timestamp) == (1_700_000_000_000, 1_700_000_000_500)
    assert header.is_transactional and not header.is_control and header.has_producer_id
    verify_crc(header, ENCODED)
    decoded = decode_rows(header, memoryview(ENCODED))
    assert decoded.equals(batch)
    assert decoded.schema.equals(batch.schema)
    with pytest.raises(InvalidRecordError):
        decode_control(header, ENCODED)


def test_non_idempotent_batch_defaults() -> None:
    encoded = encode_data(sample(1)).to_buffer()
    header = decode_header(memoryview(encoded))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (-1, -1, -1)
    assert header.last_sequence == NO_SEQUENCE and not header.has_producer_id
    assert header.attributes == 0 and header.base_offset == 0
    assert decode_rows(header, encoded).equals(sample(1))


@pytest.mark.parametrize("kind", [ControlType.ABORT, ControlType.COMMIT])
def test_control_batch_round_trip(kind: ControlType) -> None:
    encoded = encode_control(
        kind, producer_id=55, producer_epoch=3, coordinator_epoch=17, base_offset=9, timestamp=42
    ).to_buffer()
    assert len(encoded) == HEADER_SIZE + 8
    header = decode_header(memoryview(encoded))
    assert header.is_control and header.is_transactional
    assert header.attributes == TRANSACTIONAL_FLAG | CONTROL_FLAG
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (55, 3, -1)
    assert (header.base_offset, header.record_count, header.max_timestamp) == (9, 1, 42)
    verify_crc(header, memoryview(encoded))
    record = decode_control(header, memoryview(encoded))
    assert (record.control_type, record.coordinator_epoch) == (kind, 17)
    with pytest.raises(InvalidRecordError):
        decode_rows(header, encoded)


def test_unknown_control_type_is_corrupt() -> None:
    encoded = bytearray(
        encode_control(ControlType.ABORT, producer_id=1, producer_epoch=0).to_buffer()
    )
    struct.pack_into(">h", encoded, HEADER_SIZE + 2, 7)
    with pytest.raises(CorruptRecordError, match="type 7"):
        decode_control(decode_header(memoryview(encoded)), memoryview(encoded))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_flipped_bit_after_byte_20_fails_the_crc(data: st.DataObject) -> None:
    position = data.draw(st.integers(CRC_START, len(ENCODED) - 1), label="position")
    bit = data.draw(st.integers(0, 7), label="bit")
    flipped = bytearray(ENCODED)
    flipped[position] ^= 1 << bit
    header = decode_header(ENCODED)  # what the writer stored, including its CRC
    assert compute_crc(flipped) != header.crc
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        verify_crc(header, memoryview(flipped))


@settings(max_examples=100, deadline=None)
@given(offset=st.integers(0, 2**63 - 1))
def test_stamping_the_base_offset_keeps_the_crc_valid(offset: int) -> None:
    stamped = bytearray(ENCODED)
    set_base_offset(stamped, offset)
    header = decode_header(memoryview(stamped))
    assert header.base_offset == offset
    assert header.last_offset == offset + 4
    assert stamped[8:] == ENCODED[8:]  # only the offset changed, the CRC was not rewritten
    verify_crc(header, memoryview(stamped))
    assert decode_rows(header, memoryview(bytes(stamped))).equals(sample())


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), width=st.integers(1, 17))
def test_batches_are_8_byte_multiples_and_payload_is_aligned(n: int, width: int) -> None:
    batch = sample(n, width)
    encoded = encode_data(batch).to_buffer()
    assert len(encoded) == HEADER_SIZE + ipc_stream_size(batch)
    assert len(encoded) % 8 == 0
    header = decode_header(memoryview(encoded))
    assert header.batch_length % 8 == 4 and header.size == len(encoded)
    assert encoded.address % 8 == 0
    decoded = decode_rows(header, encoded)
    # Zero-copy decoding needs every Arrow buffer 8-byte aligned inside the batch.
    for column in decoded.columns:
        for buffer in column.buffers():
            if buffer is not None:
                assert buffer.address % 8 == 0
                assert encoded.address + HEADER_SIZE <= buffer.address
                assert buffer.address + buffer.size <= encoded.address + len(encoded)


def test_batches_in_a_segment_start_8_byte_aligned(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig.from_mapping({}))
    for n in (1, 2, 3, 7, 11):
        log.append(sample(n, n))
    log.write_marker(5, 0, ControlType.ABORT)
    log.append(sample(4))
    positions = [b.position for b in log.active.batches()]
    assert len(positions) == 7
    assert all(p % 8 == 0 for p in positions)
    assert log.active.size % 8 == 0
    log.close()


def test_malformed_headers_are_corrupt() -> None:
    with pytest.raises(CorruptRecordError, match="truncated batch header"):
        decode_header(ENCODED[: HEADER_SIZE - 1])
    bad_magic = bytearray(ENCODED)
    bad_magic[12] = 2
    with pytest.raises(CorruptRecordError, match="magic 2"):
        decode_header(memoryview(bad_magic))
    bad_length = bytearray(ENCODED)
    struct.pack_into(">i", bad_length, 8, 1001)  # not 4 modulo 8
    with pytest.raises(CorruptRecordError, match="invalid batch length 1001"):
        decode_header(memoryview(bad_length))
    bad_count = bytearray(ENCODED)
    struct.pack_into(">i", bad_count, 56, 6)  # disagrees with last_offset_delta 4
    with pytest.raises(CorruptRecordError, match="record count 6"):
        decode_header(memoryview(bad_count))


def test_empty_batch_cannot_be_encoded() -> None:
    with pytest.raises(InvalidRecordError, match="at least one row"):
        encode_data(sample(0)).to_buffer()


def test_payload_row_count_must_match_header() -> None:
    lying = bytearray(ENCODED)
    struct.pack_into(">ii", lying, 24, 3, 123)  # last_offset_delta 3
    struct.pack_into(">i", lying, 56, 4)  # record_count 4, payload has 5
    with pytest.raises(CorruptRecordError, match="declares 4 rows"):
        decode_rows(decode_header(memoryview(lying)), memoryview(bytes(lying)))


def test_sequence_wrap_helpers() -> None:
    assert MAX_SEQUENCE == 2**31 - 1 and SEQUENCE_SPACE == 2**31
    assert increment_sequence(MAX_SEQUENCE, 1) == 0
    assert increment_sequence(2**31 - 11, 20) == 9
    assert increment_sequence(5, 0) == 5
    assert sequence_distance(MAX_SEQUENCE, 0) == 1
    assert sequence_distance(0, MAX_SEQUENCE) == MAX_SEQUENCE
    assert sequence_distance(2**31 - 11, 9) == 20
    assert in_sequence(MAX_SEQUENCE, 0)
    assert in_sequence(41, 42)
    assert in_sequence(NO_SEQUENCE, 0)  # nothing written yet at this epoch
    assert not in_sequence(41, 43)
    assert not in_sequence(41, 41)
    assert not in_sequence(MAX_SEQUENCE, 1)

    wrapped = encode_data(
        sample(21), producer_id=1, producer_epoch=0, base_sequence=2**31 - 11
    ).to_buffer()
    header = decode_header(memoryview(wrapped))
    assert (header.base_sequence, header.last_sequence) == (2**31 - 11, 9)


@given(start=st.integers(0, MAX_SEQUENCE), delta=st.integers(0, MAX_SEQUENCE))
def test_distance_inverts_increment(start: int, delta: int) -> None:
    end = increment_sequence(start, delta)
    assert 0 <= end <= MAX_SEQUENCE
    assert sequence_distance(start, end) == delta
    assert in_sequence(end, increment_sequence(end, 1))


# -- the leader epoch (bytes 60-63, inside the CRC) -------------------------------------


@pytest.mark.parametrize("epoch", [0, 1, 7, MAX_LEADER_EPOCH])
def test_leader_epoch_round_trips_in_data_and_control_batches(epoch: int) -> None:
    data = encode_data(sample(2), producer_id=5, leader_epoch=epoch).to_buffer()
    marker = encode_control(
        ControlType.COMMIT, producer_id=5, producer_epoch=0, leader_epoch=epoch
    ).to_buffer()
    for encoded in (data, marker):
        header = decode_header(memoryview(encoded))
        assert header.leader_epoch == epoch
        assert struct.unpack_from(">i", encoded, 60) == (epoch,)
        verify_crc(header, memoryview(encoded))


def test_leader_epoch_defaults_to_the_initial_epoch() -> None:
    assert INITIAL_LEADER_EPOCH == 0 and NO_LEADER_EPOCH == -1
    assert decode_header(ENCODED).leader_epoch == INITIAL_LEADER_EPOCH


def test_a_batch_written_before_leader_epochs_reads_as_the_initial_epoch() -> None:
    """Bytes of the pre-epoch format (``4x`` at 60-63, packed by hand, CRC over them)."""
    payload = bytes(memoryview(encode_data(sample(3)).to_buffer())[HEADER_SIZE:])
    old_header = struct.pack(
        ">qiB3xIhhiiqqqi4x",
        12,
        HEADER_SIZE + len(payload) - LENGTH_PREFIX_SIZE,
        1,
        0,
        0,
        -1,
        2,
        -1,
        5,
        6,
        -1,
        3,
    )
    old = bytearray(old_header + payload)
    struct.pack_into(">I", old, 16, crc32c.crc32c(old[CRC_START:]))
    header = decode_header(bytes(old))
    assert header.magic == MAGIC == 1
    assert header.leader_epoch == INITIAL_LEADER_EPOCH
    verify_crc(header, bytes(old))
    assert decode_rows(header, memoryview(bytes(old))).equals(sample(3))


def test_the_leader_epoch_is_covered_by_the_crc() -> None:
    encoded = bytearray(ENCODED)
    struct.pack_into(">i", encoded, 60, 3)
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        verify_crc(decode_header(bytes(encoded)), bytes(encoded))


def test_negative_or_oversized_leader_epochs_are_refused() -> None:
    with pytest.raises(InvalidRecordError, match="leader_epoch"):
        encode_data(sample(1), leader_epoch=NO_LEADER_EPOCH)
    with pytest.raises(InvalidRecordError, match="leader_epoch"):
        encode_control(ControlType.ABORT, producer_id=1, producer_epoch=0, leader_epoch=2**31)
    corrupt = bytearray(ENCODED)
    struct.pack_into(">i", corrupt, 60, -1)
    with pytest.raises(CorruptRecordError, match="negative leader epoch"):
        decode_header(bytes(corrupt))


def test_the_log_stamps_the_initial_epoch_by_default(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", LogConfig.from_mapping({}))
    log.append(sample(2))
    (_, stored) = next(log.batches_from(0))
    assert stored.header.leader_epoch == INITIAL_LEADER_EPOCH
    log.close()
