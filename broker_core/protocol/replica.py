"""Broker-to-broker replication requests (docs/replication.md, "Fetching").

A follower copies its leader's log with two ``DoAction`` calls:

* ``offsets_for_leader_epoch`` ({topic, partition, leader_epoch, epoch} -> {epoch,
  end_offset}): where ``epoch`` ended in the leader's log (KIP-101/KIP-279), asked before
  the first fetch from a new leader so the follower can cut a diverged tail;
* ``replica_fetch`` ({topic, partition, replica_id, fetch_offset, leader_epoch,
  max_bytes, max_wait_ms}): whole batches from ``fetch_offset`` exactly as the leader
  stores them. Its result is binary, not JSON: a 4-byte big-endian length, a JSON header
  ({high_watermark, log_start_offset, log_end_offset}), then the batches' bytes. The
  ``fetch_offset`` is also the follower's log end, which is how the leader learns how far
  each follower has copied (high watermark, in-sync replicas).

A follower whose log ends below the leader's log start (a wiped disk, or away longer than
retention) cannot fetch (``OFFSET_OUT_OF_RANGE``); it asks a third call:

* ``replica_log_start`` ({topic, partition, replica_id, leader_epoch}): binary like a
  fetch's answer; its JSON header is {log_start_offset, offset, epoch} and the bytes
  after it are the leader's producer-state snapshot at ``offset`` (normally its log
  start), in the snapshot file format (docs/storage.md), CRC-protected. The follower
  starts an empty log at ``offset`` with that state and ``epoch`` (the leader epoch of the
  batch there; -1: none) and fetches from there (docs/replication.md, "A follower below
  the leader's log start").

Each carries ``broker_epoch``, the asking broker's epoch (its registration's czxid): the
leader refuses one older than the epoch it knows for that broker with
``STALE_BROKER_EPOCH`` (77), so a replaced process of a broker (a paused one) is not
taken for it. ``leader_epoch`` is the epoch the follower believes current: the leader answers
``FENCED_LEADER_EPOCH`` for an older one and ``UNKNOWN_LEADER_EPOCH`` for a newer one
(KIP-320), so a fetch never crosses an election unnoticed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, ClassVar

from broker_core.errors import InvalidRequestError
from broker_core.protocol.requests import Wire, _topic_id, _with_topic_id
from broker_core.protocol.wire import Action, decode_json, encode_json
from broker_core.protocol.wire import field as _field

Doc = dict[str, Any]
NO_BROKER_EPOCH = -1  # a broker's epoch not known (not registered, or not sent)
_HEADER_LEN = struct.Struct(">I")


def _broker_epoch(doc: Doc, what: str) -> int:
    """The asking broker's epoch; absent (a broker before epochs): NO_BROKER_EPOCH."""
    value: int = _field(doc, "broker_epoch", int, what, NO_BROKER_EPOCH)
    if value < NO_BROKER_EPOCH:
        raise InvalidRequestError(f"{what}: field 'broker_epoch' must be >= -1, got {value}")
    return value


def _non_negative(doc: Doc, name: str, what: str) -> int:
    value: int = _field(doc, name, int, what)
    if value < 0:
        raise InvalidRequestError(f"{what}: field {name!r} must be >= 0, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class ReplicaFetchRequest:
    """A follower's fetch: batches of ``topic``-``partition`` from ``fetch_offset`` (its log
    end), at ``leader_epoch``; the leader waits up to ``max_wait_ms`` for new batches."""

    ACTION: ClassVar[Action] = Action.REPLICA_FETCH
    WIRE: ClassVar[Wire] = Wire(
        body=(
            "{topic, partition, replica_id, fetch_offset, leader_epoch, max_bytes, "
            "max_wait_ms, topic_id?, broker_epoch?}"
        ),
        answer=("binary: JSON header {high_watermark, log_start_offset, log_end_offset} + batches"),
    )
    topic: str
    partition: int
    replica_id: int
    fetch_offset: int
    leader_epoch: int
    max_bytes: int
    max_wait_ms: int
    topic_id: str | None = None  # the id of the topic the follower's log belongs to
    broker_epoch: int = NO_BROKER_EPOCH

    def to_doc(self) -> Doc:
        doc = {
            "broker_epoch": self.broker_epoch,
            "topic": self.topic,
            "partition": self.partition,
            "replica_id": self.replica_id,
            "fetch_offset": self.fetch_offset,
            "leader_epoch": self.leader_epoch,
            "max_bytes": self.max_bytes,
            "max_wait_ms": self.max_wait_ms,
        }
        return _with_topic_id(doc, self.topic_id)

    @classmethod
    def from_doc(cls, doc: Doc) -> ReplicaFetchRequest:
        what = "replica_fetch"
        request = cls(
            _field(doc, "topic", str, what),
            _non_negative(doc, "partition", what),
            _non_negative(doc, "replica_id", what),
            _non_negative(doc, "fetch_offset", what),
            _non_negative(doc, "leader_epoch", what),
            _non_negative(doc, "max_bytes", what),
            _non_negative(doc, "max_wait_ms", what),
            _topic_id(doc, what),
            _broker_epoch(doc, what),
        )
        if request.max_bytes == 0:
            raise InvalidRequestError(f"{what}: field 'max_bytes' must be positive")
        return request


@dataclass(frozen=True, slots=True)
class ReplicaFetchResponse:
    """The leader's answer: its offsets now, and the batches' bytes (maybe empty)."""

    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    records: bytes

    def encode(self) -> bytes:
        header = encode_json(
            {
                "high_watermark": self.high_watermark,
                "log_start_offset": self.log_start_offset,
                "log_end_offset": self.log_end_offset,
            }
        )
        return _HEADER_LEN.pack(len(header)) + header + self.records

    @classmethod
    def decode(cls, data: bytes) -> ReplicaFetchResponse:
        what = "replica_fetch answer"
        doc, records = _split_binary(data, what)
        return cls(
            _non_negative(doc, "high_watermark", what),
            _non_negative(doc, "log_start_offset", what),
            _non_negative(doc, "log_end_offset", what),
            records,
        )


def _split_binary(data: bytes, what: str) -> tuple[Doc, bytes]:
    """A binary answer's JSON header and the bytes after it."""
    if len(data) < _HEADER_LEN.size:
        raise InvalidRequestError(f"{what}: {len(data)} bytes, no header")
    (length,) = _HEADER_LEN.unpack_from(data)
    end = _HEADER_LEN.size + length
    if end > len(data):
        raise InvalidRequestError(f"{what}: header of {length} bytes, {len(data)} in all")
    return decode_json(data[_HEADER_LEN.size : end], what), data[end:]


@dataclass(frozen=True, slots=True)
class ReplicaLogStartRequest:
    """A follower below the leader's log start asks where to start its log instead, at
    ``leader_epoch`` (fenced like a fetch)."""

    ACTION: ClassVar[Action] = Action.REPLICA_LOG_START
    WIRE: ClassVar[Wire] = Wire(
        body="{topic, partition, replica_id, leader_epoch, topic_id?, broker_epoch?}",
        answer=(
            "binary: JSON header {log_start_offset, offset, epoch} + the "
            "producer-state snapshot there"
        ),
    )
    topic: str
    partition: int
    replica_id: int
    leader_epoch: int
    topic_id: str | None = None
    broker_epoch: int = NO_BROKER_EPOCH

    def to_doc(self) -> Doc:
        doc = {
            "broker_epoch": self.broker_epoch,
            "topic": self.topic,
            "partition": self.partition,
            "replica_id": self.replica_id,
            "leader_epoch": self.leader_epoch,
        }
        return _with_topic_id(doc, self.topic_id)

    @classmethod
    def from_doc(cls, doc: Doc) -> ReplicaLogStartRequest:
        what = "replica_log_start"
        return cls(
            _field(doc, "topic", str, what),
            _non_negative(doc, "partition", what),
            _non_negative(doc, "replica_id", what),
            _non_negative(doc, "leader_epoch", what),
            _topic_id(doc, what),
            _broker_epoch(doc, what),
        )


@dataclass(frozen=True, slots=True)
class ReplicaLogStartResponse:
    """The leader's log start, and where a follower below it starts instead: ``offset``
    (at or above the log start), the leader epoch of the batch there (-1: none) and the
    leader's producer-state snapshot there (snapshot file bytes, decoded by the log)."""

    log_start_offset: int
    offset: int
    epoch: int
    snapshot: bytes

    def encode(self) -> bytes:
        doc = {"log_start_offset": self.log_start_offset, "offset": self.offset}
        header = encode_json({**doc, "epoch": self.epoch})
        return _HEADER_LEN.pack(len(header)) + header + self.snapshot

    @classmethod
    def decode(cls, data: bytes) -> ReplicaLogStartResponse:
        what = "replica_log_start answer"
        doc, snapshot = _split_binary(data, what)
        answer = cls(
            _non_negative(doc, "log_start_offset", what),
            _non_negative(doc, "offset", what),
            _field(doc, "epoch", int, what),
            snapshot,
        )
        if answer.offset < answer.log_start_offset or answer.epoch < -1 or not snapshot:
            raise InvalidRequestError(f"{what}: inconsistent {doc} with {len(snapshot)} bytes")
        return answer


@dataclass(frozen=True, slots=True)
class OffsetsForLeaderEpochRequest:
    """Where ``epoch`` ended in the leader's log; ``leader_epoch`` is the asker's view of
    the current leader epoch (fenced like a fetch)."""

    ACTION: ClassVar[Action] = Action.OFFSETS_FOR_LEADER_EPOCH
    WIRE: ClassVar[Wire] = Wire(
        body=("{topic, partition, leader_epoch, epoch, topic_id?, replica_id?, broker_epoch?}"),
        answer="{epoch, end_offset}",
    )
    topic: str
    partition: int
    leader_epoch: int
    epoch: int
    topic_id: str | None = None
    replica_id: int = -1  # -1: not said (a follower before broker epochs)
    broker_epoch: int = NO_BROKER_EPOCH

    def to_doc(self) -> Doc:
        doc = {
            "replica_id": self.replica_id,
            "broker_epoch": self.broker_epoch,
            "topic": self.topic,
            "partition": self.partition,
            "leader_epoch": self.leader_epoch,
            "epoch": self.epoch,
        }
        return _with_topic_id(doc, self.topic_id)

    @classmethod
    def from_doc(cls, doc: Doc) -> OffsetsForLeaderEpochRequest:
        what = "offsets_for_leader_epoch"
        return cls(
            _field(doc, "topic", str, what),
            _non_negative(doc, "partition", what),
            _non_negative(doc, "leader_epoch", what),
            _non_negative(doc, "epoch", what),
            _topic_id(doc, what),
            _field(doc, "replica_id", int, what, -1),
            _broker_epoch(doc, what),
        )


@dataclass(frozen=True, slots=True)
class OffsetsForLeaderEpochResponse:
    """The largest epoch of the leader's log at or below the one asked, and the offset
    where it ended (``UNDEFINED_EPOCH_OFFSET``: the leader cannot place it)."""

    epoch: int
    end_offset: int

    def to_doc(self) -> Doc:
        return {"epoch": self.epoch, "end_offset": self.end_offset}

    @classmethod
    def from_doc(cls, doc: Doc) -> OffsetsForLeaderEpochResponse:
        return cls(int(doc["epoch"]), int(doc["end_offset"]))


@dataclass(frozen=True, slots=True)
class ElectLeadersRequest:
    """The preferred-leader rebalance, for ``topics`` (None: every topic)."""

    ACTION: ClassVar[Action] = Action.ELECT_LEADERS
    WIRE: ClassVar[Wire] = Wire(
        body="{topics?: [..]}",
        answer="{moved: {topic: {partition: leader}}}",
        note="the preferred-leader rebalance; on the controller",
    )
    topics: tuple[str, ...] | None = None

    def to_doc(self) -> Doc:
        return {} if self.topics is None else {"topics": list(self.topics)}

    @classmethod
    def from_doc(cls, doc: Doc) -> ElectLeadersRequest:
        what = "elect_leaders"
        raw = doc.get("topics")
        if raw is None:
            return cls(None)
        if not isinstance(raw, list) or not all(isinstance(t, str) for t in raw):
            raise InvalidRequestError(f"{what}: field 'topics' must be a list of names")
        return cls(tuple(raw))


@dataclass(frozen=True, slots=True)
class ElectLeadersResponse:
    """The partitions whose preferred replica became leader: {topic: {partition: broker}}
    (partitions are strings on the wire, as JSON keys are)."""

    moved: dict[str, dict[int, int]]

    def to_doc(self) -> Doc:
        return {"moved": {t: {str(p): b for p, b in m.items()} for t, m in self.moved.items()}}

    @classmethod
    def from_doc(cls, doc: Doc) -> ElectLeadersResponse:
        raw = doc["moved"]
        return cls({t: {int(p): int(b) for p, b in m.items()} for t, m in raw.items()})
