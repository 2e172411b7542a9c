"""The idemlog wire protocol over Arrow Flight: what clients and brokers say to each other.

Rows always travel as Arrow record batches; everything else is small JSON or fixed
binary structs. ``spark_sink`` imports this module (and ``errors``); nothing else of the
broker.

Produce — ``DoPut``
    descriptor: ``FlightDescriptor.for_command(json {"op": "produce", "topic", "partition",
        "acks", "topic_id"?, "transactional_id"?})`` (``data_requests.ProduceDescriptor``)
    each batch: ``write_with_metadata(batch, ProduceRequestMeta.encode())`` carrying the
        batch header fields (producer id, epoch, base sequence, transactional flag) and a
        client correlation id. Many batches may be in flight on one stream (pipelined).
    answers: one ``ProduceResponse`` per batch on the stream's metadata channel, in the
        order the batches were sent: offsets, or an error code and message. An error
        fails that batch only; the stream goes on.

Fetch — ``DoGet``
    ticket: json ``{"op": "fetch", "topic", "partition", "offset", "max_bytes",
        "isolation", "max_offset"?, "topic_id"?}`` (``data_requests.FetchRequest``)
    stream: the topic's schema, data batches each with ``FetchBatchMeta`` (offsets and
        producer fields), then one empty batch whose metadata is a ``FetchTrailer``
        (next offset, high watermark, last stable offset, log start).

Everything else — ``DoAction`` with an ``Action`` type below and a JSON body; the one
result is a JSON document. Each body (and the produce descriptor and fetch ticket) is a
typed request of ``broker_core.protocol.*_requests``, encoded and checked there.

Errors — a request that fails as a whole raises ``FlightServerError`` whose message
starts with ``IDEMLOG_ERROR <code> <NAME>:``; ``raise_for_flight_error`` turns it back into
the typed ``IdemlogError``, so ``retriable`` survives the wire.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from broker_core.errors import (
    ErrorCode,
    IdemlogError,
    InvalidRequestError,
    error_for_code,
)

PROTOCOL_VERSION = 1
# How many of a producer's latest batches a partition caches per producer (the topic
# config producer.state.batch.window defaults to it): a producer keeps at most this many
# batches in flight per partition.
DEFAULT_BATCH_WINDOW = 5
# A fetch's default size bound (Kafka's fetch.max.bytes default).
DEFAULT_FETCH_MAX_BYTES = 50 * 1024 * 1024


class Action(StrEnum):
    """``DoAction`` types. Bodies and results are JSON objects (``protocol.*_requests``),
    except the binary answers of ``replica_fetch`` and ``replica_log_start``
    (``protocol.replica``); docs/protocol.md describes each."""

    CREATE_TOPIC = "create_topic"
    DELETE_TOPIC = "delete_topic"
    DESCRIBE_TOPICS = "describe_topics"
    LIST_OFFSETS = "list_offsets"
    METADATA = "metadata"
    FIND_COORDINATOR = "find_coordinator"
    INIT_PRODUCER_ID = "init_producer_id"
    ADD_PARTITIONS_TO_TXN = "add_partitions_to_txn"
    END_TXN = "end_txn"
    PREPARE_SINK_TXN = "prepare_sink_txn"
    WRITE_TXN_MARKERS = "write_txn_markers"  # broker to broker
    COMMIT_SINK_BATCH = "commit_sink_batch"
    ABORT_SINK_BATCH = "abort_sink_batch"
    ABORT_SINK_RUN = "abort_sink_run"
    SINK_HEARTBEAT = "sink_heartbeat"
    STABLE_ENDS = "stable_ends"
    TRACKED_BATCHES = "tracked_batches"
    LIST_TRANSACTIONS = "list_transactions"
    ABORT_TRANSACTION = "abort_transaction"
    # To a partition's leader (KIP-664's tools: transactions no coordinator knows).
    DESCRIBE_PRODUCERS = "describe_producers"
    ABORT_HANGING_TRANSACTION = "abort_hanging_transaction"
    METRICS = "metrics"
    PING = "ping"
    # Broker to broker (replication, protocol.replica).
    REPLICA_FETCH = "replica_fetch"
    OFFSETS_FOR_LEADER_EPOCH = "offsets_for_leader_epoch"
    REPLICA_LOG_START = "replica_log_start"
    ELECT_LEADERS = "elect_leaders"


class SinkTxnStatus(StrEnum):
    """What InitProducerId found for an attempt of a Spark task (``init_sink_producer``)."""

    NEW = "new"  # fresh epoch, nothing of this batch held: write the rows
    PREPARED = "prepared"  # an earlier attempt holds all rows, still open: reuse it
    COMMITTED = "committed"  # an earlier attempt's rows are committed already: write nothing


@dataclass(frozen=True, slots=True)
class SinkAttempt:
    """Which Spark write an attempt of a task belongs to (docs/design.md, the sink protocol).

    ``sink_id``: the streaming query id (stable across restarts) or a batch job's id;
    ``run_id``: one per planning of the query or job (a restart gets a new one), shared
    by every attempt of its tasks; ``batch_id``: the micro-batch (0 for a batch job).
    """

    sink_id: str
    run_id: str
    batch_id: int

    def to_doc(self) -> dict[str, Any]:
        return {"sink_id": self.sink_id, "run_id": self.run_id, "batch_id": self.batch_id}

    @classmethod
    def from_doc(cls, doc: dict[str, Any], what: str) -> SinkAttempt:
        return cls(
            field(doc, "sink_id", str, what),
            field(doc, "run_id", str, what),
            field(doc, "batch_id", int, what),
        )


# -- errors over Flight --------------------------------------------------------------------
_ERROR_PREFIX = "IDEMLOG_ERROR"
_ERROR_RE = re.compile(rf"{_ERROR_PREFIX} (-?\d+) [A-Z_]+: (.*)", re.DOTALL)


# gRPC sends a status message in a header, percent-encoded (up to 3 bytes a byte), and its
# peers refuse a header over 16 KiB: a longer error would arrive as RESOURCE_EXHAUSTED.
MAX_ERROR_MESSAGE_BYTES = 4096


def error_message(error: IdemlogError) -> str:
    message = error.message
    raw = message.encode()
    if len(raw) > MAX_ERROR_MESSAGE_BYTES:
        kept = raw[:MAX_ERROR_MESSAGE_BYTES].decode(errors="ignore")
        message = f"{kept}... ({len(raw) - len(kept.encode())} bytes cut)"
    return f"{_ERROR_PREFIX} {error.code} {error.error_code.name}: {message}"


def parse_error_message(text: str) -> IdemlogError | None:
    """The typed error inside a Flight error's message, if the broker sent one."""
    match = _ERROR_RE.search(text)
    if match is None:
        return None
    message = match.group(2)
    # Flight appends its own detail lines ("... Detail: ..."); keep the broker's text.
    message = message.split(". Detail:")[0].split("\nDetail:")[0].strip()
    return error_for_code(int(match.group(1)), message)


# -- JSON bodies ---------------------------------------------------------------------------
def encode_json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_json(data: bytes | memoryview, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(bytes(data))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequestError(f"{what}: body is not JSON ({exc})") from exc
    except RecursionError:
        # No request nests deeper than a few levels; a deeper body is hostile or broken.
        raise InvalidRequestError(f"{what}: body is nested too deeply") from None
    if not isinstance(doc, dict):
        raise InvalidRequestError(f"{what}: body must be a JSON object")
    return doc


def field(doc: dict[str, Any], name: str, kind: type, what: str, default: Any = ...) -> Any:
    """A typed field of a request body, or InvalidRequestError naming it."""
    if name not in doc or doc[name] is None:
        if default is ...:
            raise InvalidRequestError(f"{what}: missing field {name!r}")
        return default
    value = doc[name]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise InvalidRequestError(
            f"{what}: field {name!r} must be {kind.__name__}, got {type(value).__name__}"
        )
    return value


# -- produce -------------------------------------------------------------------------------
_PRODUCE_REQ = struct.Struct(">BqhiBq")  # version, pid, epoch, base seq, flags, correlation
PRODUCER_TOKEN_BYTES = 32  # security.producer_token's HMAC-SHA256, after the fixed part
_PRODUCE_RESP = struct.Struct(">Bqhqqqb")  # version, correlation, error, base, last, time, dup
FLAG_TRANSACTIONAL = 1


@dataclass(frozen=True, slots=True)
class ProduceRequestMeta:
    """One batch's metadata: the fixed part, then the producer token of an idempotent
    batch (``producer_token``, the 32 bytes InitProducerId answered; empty otherwise)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    correlation_id: int
    producer_token: bytes = b""

    def encode(self) -> bytes:
        return (
            _PRODUCE_REQ.pack(
                PROTOCOL_VERSION,
                self.producer_id,
                self.producer_epoch,
                self.base_sequence,
                FLAG_TRANSACTIONAL if self.transactional else 0,
                self.correlation_id,
            )
            + self.producer_token
        )

    @classmethod
    def decode(cls, data: bytes | memoryview | None) -> ProduceRequestMeta:
        size = 0 if data is None else len(data)
        with_token = _PRODUCE_REQ.size + PRODUCER_TOKEN_BYTES
        if data is None or size not in (_PRODUCE_REQ.size, with_token):
            raise InvalidRequestError(
                f"produce batch metadata must be {_PRODUCE_REQ.size} bytes, or "
                f"{with_token} with a producer token, got {size}"
            )
        raw = bytes(data)
        version, pid, epoch, seq, flags, corr = _PRODUCE_REQ.unpack_from(raw)
        if version != PROTOCOL_VERSION:
            raise InvalidRequestError(f"unsupported produce metadata version {version}")
        token = raw[_PRODUCE_REQ.size :]
        return cls(pid, epoch, seq, bool(flags & FLAG_TRANSACTIONAL), corr, token)


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    correlation_id: int
    error_code: int  # ErrorCode.NONE.code on success
    base_offset: int
    last_offset: int
    log_append_time: int
    duplicate: bool
    error_message: str = ""

    @property
    def ok(self) -> bool:
        return self.error_code == ErrorCode.NONE.code

    def error(self) -> IdemlogError | None:
        return None if self.ok else error_for_code(self.error_code, self.error_message)

    def encode(self) -> bytes:
        head = _PRODUCE_RESP.pack(
            PROTOCOL_VERSION,
            self.correlation_id,
            self.error_code,
            self.base_offset,
            self.last_offset,
            self.log_append_time,
            1 if self.duplicate else 0,
        )
        return head + self.error_message.encode()

    @classmethod
    def decode(cls, data: bytes | memoryview) -> ProduceResponse:
        raw = bytes(data)
        if len(raw) < _PRODUCE_RESP.size:
            raise InvalidRequestError(f"produce response of {len(raw)} bytes is truncated")
        version, corr, code, base, last, ts, dup = _PRODUCE_RESP.unpack_from(raw)
        if version != PROTOCOL_VERSION:
            raise InvalidRequestError(f"unsupported produce response version {version}")
        message = raw[_PRODUCE_RESP.size :].decode(errors="replace")
        return cls(corr, code, base, last, ts, bool(dup), message)

    @classmethod
    def failure(cls, correlation_id: int, error: IdemlogError) -> ProduceResponse:
        return cls(correlation_id, error.code, -1, -1, -1, False, error.message)


# -- fetch ---------------------------------------------------------------------------------
_FETCH_BATCH = struct.Struct(">BBqqhiBq")  # version, kind, base, pid, epoch, seq, flags, ts
_FETCH_TRAILER = struct.Struct(">BBqqqq")  # version, kind, next, hw, lso, log start
_KIND_BATCH = 0
_KIND_TRAILER = 1


@dataclass(frozen=True, slots=True)
class FetchBatchMeta:
    base_offset: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    timestamp: int

    def encode(self) -> bytes:
        return _FETCH_BATCH.pack(
            PROTOCOL_VERSION,
            _KIND_BATCH,
            self.base_offset,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            FLAG_TRANSACTIONAL if self.transactional else 0,
            self.timestamp,
        )


@dataclass(frozen=True, slots=True)
class FetchTrailer:
    next_offset: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int

    def encode(self) -> bytes:
        return _FETCH_TRAILER.pack(
            PROTOCOL_VERSION,
            _KIND_TRAILER,
            self.next_offset,
            self.high_watermark,
            self.last_stable_offset,
            self.log_start_offset,
        )


def decode_fetch_meta(data: bytes | memoryview) -> FetchBatchMeta | FetchTrailer:
    raw = bytes(data)
    if len(raw) < 2 or raw[0] != PROTOCOL_VERSION:
        raise InvalidRequestError(f"bad fetch metadata ({len(raw)} bytes)")
    if raw[1] == _KIND_TRAILER and len(raw) == _FETCH_TRAILER.size:
        _v, _k, nxt, hw, lso, start = _FETCH_TRAILER.unpack(raw)
        return FetchTrailer(nxt, hw, lso, start)
    if raw[1] == _KIND_BATCH and len(raw) == _FETCH_BATCH.size:
        _v, _k, base, pid, epoch, seq, flags, ts = _FETCH_BATCH.unpack(raw)
        return FetchBatchMeta(base, pid, epoch, seq, bool(flags & FLAG_TRANSACTIONAL), ts)
    raise InvalidRequestError(f"bad fetch metadata kind {raw[1]} ({len(raw)} bytes)")
