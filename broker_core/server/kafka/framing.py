"""Kafka's framing: a request is a 4-byte big-endian size, then a request header (v1, or
v2 for a flexible version) and the body; a response is a size, a response header (v0, or
v1 for a flexible version, but v0 always for ApiVersions) and the body. The messages are
kio's, generated from Kafka's own JSON schemas: nothing here encodes a field by hand but
the size and the two shorts every header starts with, read before the header's version
is known.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32
from kio.static.protocol import ResponsePayload

from broker_core.errors import InvalidRequestError, MessageTooLargeError
from broker_core.server.kafka.connection import KafkaConnection, plaintext_connection

_SIZE = struct.Struct(">i")
# api_key, api_version, correlation_id: the first fields of every request header version.
_HEADER_START = struct.Struct(">hhi")


@dataclass(frozen=True)
class KafkaRequest:
    """One decoded request: its header's fields, its body (a kio request payload) and the
    connection it came on (who sent it: ``connection.caller``, what the authorizer is
    asked about)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the kio request class of (api_key, api_version)
    # The listener always passes its own; the default serves requests built by hand.
    connection: KafkaConnection = field(default_factory=plaintext_connection)


class UnsupportedVersion(Exception):
    """A request for an API or a version this listener does not serve. Its header is not
    decoded (its version's layout may be unknown): the correlation id is at a fixed place."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(f"api key {api_key} version {api_version} is not served")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


def read_frame(stream: IO[bytes], max_bytes: int) -> bytes | None:
    """The next request's bytes, without the size; None when the client closed the
    connection between requests. MessageTooLargeError for a size above ``max_bytes``
    (nothing of the body is read: the connection cannot be used any more),
    InvalidRequestError for a negative size or a connection closed inside a frame."""
    prefix = stream.read(_SIZE.size)
    if not prefix:
        return None
    if len(prefix) < _SIZE.size:
        raise InvalidRequestError("the connection closed inside a request's size")
    (size,) = _SIZE.unpack(prefix)
    if size < _HEADER_START.size:
        raise InvalidRequestError(f"a request's size {size} is below a header's")
    if size > max_bytes:
        raise MessageTooLargeError(
            f"a request of {size} bytes is larger than max.request.bytes={max_bytes}"
        )
    frame = stream.read(size)
    if len(frame) < size:
        raise InvalidRequestError(f"the connection closed {size - len(frame)} bytes short")
    return frame


def parse_request(
    frame: bytes, served: Mapping[int, tuple[int, int]], connection: KafkaConnection
) -> KafkaRequest:
    """Decode ``frame`` (a request without its size) that came on ``connection``.
    ``served``: api key -> (min, max) version. UnsupportedVersion when the key or version
    is not served; InvalidRequestError when the bytes do not decode as the request they
    name."""
    api_key, api_version, correlation_id = _HEADER_START.unpack_from(frame)
    versions = served.get(api_key)
    if versions is None or not versions[0] <= api_version <= versions[1]:
        raise UnsupportedVersion(api_key, api_version, correlation_id)
    schema = load_request_schema(api_key, api_version)
    try:
        header, used = entity_reader(schema.__header_schema__)(frame, 0)
        body, _size = entity_reader(schema)(frame, used)
    except Exception as exc:  # kio's readers raise several types for bytes that do not fit
        raise InvalidRequestError(
            f"api key {api_key} version {api_version} (correlation id {correlation_id}) "
            f"does not decode: {exc}"
        ) from exc
    # Bytes after the body are ignored, as Kafka's own parser ignores them: librdkafka
    # 2.x sends three after a Metadata request for every topic.
    return KafkaRequest(api_key, api_version, correlation_id, header.client_id, body, connection)


def encode_response(correlation_id: int, response: ResponsePayload) -> bytes:
    """The size-prefixed response: the header version the response's schema names (v0
    for every ApiVersions response, flexible or not, as Kafka requires), then the body."""
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    header_schema = response.__header_schema__
    entity_writer(header_schema)(buffer, header_schema(correlation_id=i32(correlation_id)))
    entity_writer(type(response))(buffer, response)
    frame = buffer.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - _SIZE.size)
    return bytes(frame)
