"""A Flight DoPut sent as raw gRPC messages, for what pyarrow's writer never sends: IPC
messages that are garbage or cut short (a hostile or broken client's stream).

Each message is a FlightData protobuf (Flight.proto: flight_descriptor = 1, data_header =
2, app_metadata = 3, data_body = 1000), encoded here by hand: the test needs only these
four fields, and grpcio carries the bytes unchanged.
"""

from __future__ import annotations

import grpc
import pyarrow as pa

DO_PUT = "/arrow.flight.protocol.FlightService/DoPut"
_CMD = 2  # FlightDescriptor.DescriptorType.CMD


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def flight_data(
    *,
    command: bytes | None = None,
    header: bytes = b"",
    app_metadata: bytes = b"",
    body: bytes = b"",
) -> bytes:
    """One FlightData message; ``command``: a CMD descriptor (the stream's first message)."""
    out = b""
    if command is not None:
        descriptor = _varint(1 << 3) + _varint(_CMD) + _bytes_field(2, command)
        out += _bytes_field(1, descriptor)
    if header:
        out += _bytes_field(2, header)
    if app_metadata:
        out += _bytes_field(3, app_metadata)
    if body:
        out += _bytes_field(1000, body)
    return out


def ipc_parts(message: pa.Buffer) -> tuple[bytes, bytes]:
    """(flatbuffer header, body) of one encapsulated IPC message."""
    read = pa.ipc.read_message(pa.BufferReader(message))
    return read.metadata.to_pybytes(), read.body.to_pybytes() if read.body else b""


def schema_header(schema: pa.Schema) -> bytes:
    return ipc_parts(schema.serialize())[0]


def do_put(address: str, messages: list[bytes], timeout_s: float = 30.0) -> grpc.RpcError:
    """Send ``messages`` on one DoPut to ``address`` (plaintext) and return the error that
    ends the call; AssertionError if the call ends without one."""
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(
            DO_PUT, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        try:
            for _ in call(iter(messages), timeout=timeout_s):
                pass
        except grpc.RpcError as exc:
            return exc
    raise AssertionError("the DoPut ended without an error")
