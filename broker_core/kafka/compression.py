"""Kafka's compression codecs, as a record batch v2 uses them: the records section (all
the bytes after the 61-byte header) compressed whole, the codec in the attributes' low
three bits. Decompression only: idemlog stores rows as Arrow, so a compressed Kafka batch
is read into rows like any other, and Fetch answers uncompressed batches.

gzip is the standard library's (bounded as it inflates); snappy, lz4 and zstd are
cramjam's (one wheel, no system library). Kafka's framings: snappy in xerial's stream
framing (what the Java client writes: a magic header, then blocks each prefixed by its
big-endian length) or raw (librdkafka's); lz4 the LZ4 frame format (magic 2 fixed the
header checksum, KIP-57); zstd a zstd frame (KIP-110).
"""

from __future__ import annotations

import struct
import zlib
from enum import IntEnum

import cramjam

from broker_core.errors import CorruptRecordError, InvalidRecordError, MessageTooLargeError


class UnsupportedCompressionError(InvalidRecordError):
    """A batch's compression bits name no codec of Kafka's (Kafka's listener answers
    UNSUPPORTED_COMPRESSION_TYPE)."""


class Codec(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16  # the magic, then a version and a compatible version, int32 each
_BLOCK_LENGTH = struct.Struct(">i")
_GZIP_WINDOW = 16 + zlib.MAX_WBITS  # a gzip header and trailer


def codec_of(bits: int, where: str) -> Codec:
    """The codec of a batch's compression bits; UnsupportedCompressionError for one
    Kafka does not define (5-7)."""
    try:
        return Codec(bits)
    except ValueError:
        raise UnsupportedCompressionError(
            f"{where}: compression type {bits} is none of Kafka's (0 none, 1 gzip, 2 snappy, "
            "3 lz4, 4 zstd)"
        ) from None


def decompress(codec: Codec, data: bytes | memoryview, limit: int, where: str) -> bytes:
    """The records section ``data`` compressed with ``codec``, decompressed.
    CorruptRecordError when it does not decompress; MessageTooLargeError when it holds
    more than ``limit`` bytes (gzip stops inflating there; the others are checked once
    decompressed)."""
    try:
        if codec is Codec.GZIP:
            inflater = zlib.decompressobj(_GZIP_WINDOW)
            out = inflater.decompress(data, limit + 1)
            if not inflater.eof and len(out) <= limit:
                raise CorruptRecordError(f"{where}: its gzip stream ends early")
        elif codec is Codec.SNAPPY:
            out = _snappy(bytes(data))
        elif codec is Codec.LZ4:
            out = bytes(cramjam.lz4.decompress(data))
        elif codec is Codec.ZSTD:
            out = bytes(cramjam.zstd.decompress(data))
        else:
            return bytes(data)
    except (zlib.error, cramjam.DecompressionError, ValueError) as exc:
        raise CorruptRecordError(
            f"{where}: its records do not decompress with {codec.name.lower()}: {exc}"
        ) from None
    if len(out) > limit:
        raise MessageTooLargeError(
            f"{where}: its records decompress ({codec.name.lower()}) to more than {limit} bytes"
        )
    return out


def _snappy(data: bytes) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    blocks = []
    at = _XERIAL_HEADER
    while at < len(data):
        if at + _BLOCK_LENGTH.size > len(data):
            raise ValueError("a snappy block's length is cut short")
        (length,) = _BLOCK_LENGTH.unpack_from(data, at)
        at += _BLOCK_LENGTH.size
        if length < 0 or at + length > len(data):
            raise ValueError(f"a snappy block of {length} bytes does not fit")
        blocks.append(bytes(cramjam.snappy.decompress_raw(data[at : at + length])))
        at += length
    return b"".join(blocks)
