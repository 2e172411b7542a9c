"""Kafka requests written and responses read with kio, as a Kafka client writes and reads
them: for the tests that ask the Kafka listener for what librdkafka's API does not show
(a leader epoch in Metadata, ListOffsets' fencing by ``current_leader_epoch``)."""

from __future__ import annotations

import io
import socket
import ssl
import struct
from typing import IO, Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32

from broker_core.server.kafka.framing import read_frame

MAX_RESPONSE_BYTES = 16 * 1024 * 1024


def request_bytes(correlation_id: int, body: Any, client_id: str | None = "test") -> bytes:
    """A size-prefixed request, header and body written by kio."""
    buffer = io.BytesIO()
    header_schema = body.__header_schema__
    header = header_schema(
        request_api_key=body.__api_key__,
        request_api_version=body.__version__,
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )
    entity_writer(header_schema)(buffer, header)
    entity_writer(type(body))(buffer, body)
    return struct.pack(">i", buffer.tell()) + buffer.getvalue()


def read_response(stream: IO[bytes], api_key: int, version: int) -> tuple[int, Any]:
    """(correlation id, body) of the next response on ``stream`` (one per connection: it
    reads ahead); asserts the body fills the frame exactly."""
    frame = read_frame(stream, MAX_RESPONSE_BYTES)
    assert frame is not None, "the listener closed the connection"
    schema = load_response_schema(api_key, version)
    header, used = entity_reader(schema.__header_schema__)(frame, 0)
    body, size = entity_reader(schema)(frame, used)
    assert used + size == len(frame)
    return int(header.correlation_id), body


def ask(address: str, body: Any) -> Any:
    """One request on a connection of its own to ``host:port``; the response's body."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request_bytes(1, body))
        correlation_id, answer = read_response(
            sock.makefile("rb"), body.__api_key__, body.__version__
        )
    assert correlation_id == 1
    return answer


def request(api_key: int, version: int, **fields: Any) -> Any:
    """The kio request of ``api_key`` at ``version`` with ``fields``."""
    return load_request_schema(api_key, version)(**fields)


class Connection:
    """One connection to a Kafka listener, over TLS when ``ca`` (a CA file) is given,
    asking one request at a time: as a Kafka client's own connection, for tests of what
    a listener answers on one connection (SASL's exchange, what comes before it)."""

    def __init__(self, address: str, ca: str | None = None) -> None:
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=10)
        if ca is not None:
            context = ssl.create_default_context(cafile=ca)
            sock = context.wrap_socket(sock, server_hostname=host)
        self.sock = sock
        self._stream = sock.makefile("rb")
        self._correlation = 0

    def ask(self, body: Any) -> Any:
        """The response's body; AssertionError when the listener closed the connection."""
        self._correlation += 1
        self.sock.sendall(request_bytes(self._correlation, body))
        correlation_id, answer = read_response(self._stream, body.__api_key__, body.__version__)
        assert correlation_id == self._correlation
        return answer

    def closed_by_peer(self) -> bool:
        """Whether the listener closed the connection (nothing more to read)."""
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True

    def close(self) -> None:
        self._stream.close()
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
