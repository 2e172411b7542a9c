"""Zigzag varints (Kafka's ``varint``/``varlong``, protobuf's encoding) over whole numpy
columns: sizes, writes at given positions and reads at given positions, one numpy pass per
byte of the longest varint rather than a Python step per value.

A signed value ``v`` is first zigzagged, ``(v << 1) ^ (v >> 63)``, so small negative
numbers stay short; the unsigned result is written seven bits at a time, least
significant group first, with the high bit set on every byte but the last.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from broker_core.errors import CorruptRecordError

Int64s = npt.NDArray[np.int64]
UInt64s = npt.NDArray[np.uint64]
Bytes = npt.NDArray[np.uint8]

VARINT_MAX_BYTES = 5  # a zigzagged int32
VARLONG_MAX_BYTES = 10  # a zigzagged int64


def zigzag(values: npt.ArrayLike) -> UInt64s:
    """The zigzag form of signed 64-bit values, as unsigned."""
    v = np.asarray(values, dtype=np.int64)
    return ((v << 1) ^ (v >> 63)).view(np.uint64)


def unzigzag(values: UInt64s) -> Int64s:
    u = values.astype(np.uint64, copy=False)
    return (u >> np.uint64(1)).view(np.int64) ^ -(u & np.uint64(1)).view(np.int64)


def sizes(unsigned: UInt64s) -> Int64s:
    """Bytes each (already zigzagged) value takes as a varint: 1 to 10."""
    out = np.ones(len(unsigned), dtype=np.int64)
    if len(unsigned) == 0:
        return out
    top = int(unsigned.max())
    shift = 7
    while shift < 64 and top >= 1 << shift:
        out += unsigned >= np.uint64(1 << shift)
        shift += 7
    return out


def write(out: Bytes, positions: Int64s, unsigned: UInt64s, value_sizes: Int64s) -> None:
    """Writes each value's varint at its position in ``out`` (``value_sizes`` from ``sizes``)."""
    if len(unsigned) == 0:
        return
    longest = int(value_sizes.max())
    if longest == 1:  # the common case (small lengths and deltas): the values are the bytes
        out[positions] = unsigned.astype(np.uint8)
        return
    at, vals, n = positions, unsigned, value_sizes
    for j in range(longest):
        if j:  # only the values still going have a byte j
            going = n > j
            at, vals, n = at[going], vals[going], n[going]
        group = ((vals >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
        out[at + j] = group | np.where(n > j + 1, np.uint8(0x80), np.uint8(0))


def read(buf: Bytes, positions: Int64s, max_bytes: int, what: str) -> tuple[Int64s, Int64s]:
    """The signed values of the varints starting at ``positions`` in ``buf`` and the bytes
    each took; a varint running past the buffer or longer than ``max_bytes`` is corrupt."""
    count = len(positions)
    if count and int(positions.max()) < len(buf):
        first = buf[positions]
        if int(first.max()) < 0x80:  # every varint one byte: the common case
            return unzigzag(first.astype(np.uint64)), np.ones(count, dtype=np.int64)
    values = np.zeros(count, dtype=np.uint64)
    taken = np.zeros(count, dtype=np.int64)
    pending = np.arange(count)
    limit = len(buf)
    for j in range(max_bytes):
        if len(pending) == 0:
            break
        at = positions[pending] + j
        if int(at.max()) >= limit:
            raise CorruptRecordError(f"{what}: a varint runs past the end of the batch")
        byte = buf[at].astype(np.uint64)
        values[pending] |= (byte & np.uint64(0x7F)) << np.uint64(7 * j)
        ended = byte < 0x80
        taken[pending[ended]] = j + 1
        pending = pending[~ended]
    if len(pending):
        raise CorruptRecordError(f"{what}: a varint longer than {max_bytes} bytes")
    return unzigzag(values), taken


def read_one(buf: bytes, at: int, max_bytes: int, what: str) -> tuple[int, int]:
    """One signed varint at ``at``: its value and the position after it."""
    unsigned = 0
    for j in range(max_bytes):
        if at + j >= len(buf):
            raise CorruptRecordError(f"{what}: a varint runs past the end of the batch")
        byte = buf[at + j]
        unsigned |= (byte & 0x7F) << (7 * j)
        if byte < 0x80:
            return (unsigned >> 1) ^ -(unsigned & 1), at + j + 1
    raise CorruptRecordError(f"{what}: a varint longer than {max_bytes} bytes")
