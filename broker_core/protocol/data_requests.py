"""Produce and fetch requests: the DoPut descriptor of a produce stream and the DoGet
ticket of a fetch (the shared field readers and the request shape: ``protocol.requests``)."""

from __future__ import annotations

from dataclasses import dataclass

from broker_core.errors import InvalidRequestError, InvalidRequiredAcksError
from broker_core.protocol.requests import (
    ACKS_ALL,
    ACKS_LEADER,
    Doc,
    _topic_id,
    _with_topic_id,
)
from broker_core.protocol.wire import (
    DEFAULT_FETCH_MAX_BYTES,
)
from broker_core.protocol.wire import field as _field

# -- produce and fetch (DoPut descriptor, DoGet ticket) -----------------------------------
FETCH_ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
MAX_FETCH_BYTES = 2**31 - 1


def _op(doc: Doc, op: str, what: str) -> None:
    got = _field(doc, "op", str, what)
    if got != op:
        raise InvalidRequestError(f"{what}: field 'op' must be {op!r}, got {got!r}")


@dataclass(frozen=True, slots=True)
class ProduceDescriptor:
    """The DoPut command of a produce stream: the partition every batch goes to, and when
    each batch is answered: ``acks`` -1 (all: once every in-sync replica has it, the
    default) or 1 (once the leader has written it). ``topic_id``: the id the producer
    knows the topic by (None: any); another topic's is refused (UNKNOWN_TOPIC_ID).
    ``transactional_id``: the transactional producer's id, as Kafka's Produce carries it;
    a stream without one is refused its transactional batches (INVALID_REQUEST), and one
    with it needs Write on that TransactionalId (docs/security.md)."""

    topic: str
    partition: int
    acks: int = ACKS_ALL
    topic_id: str | None = None
    transactional_id: str | None = None

    def to_doc(self) -> Doc:
        doc: Doc = {"op": "produce", "topic": self.topic, "partition": self.partition}
        if self.transactional_id is not None:
            doc["transactional_id"] = self.transactional_id
        return _with_topic_id({**doc, "acks": self.acks}, self.topic_id)

    @classmethod
    def from_doc(cls, doc: Doc) -> ProduceDescriptor:
        what = "produce descriptor"
        _op(doc, "produce", what)
        acks = _field(doc, "acks", int, what, ACKS_ALL)
        if acks not in (ACKS_ALL, ACKS_LEADER):
            raise InvalidRequiredAcksError(
                f"{what}: acks={acks} must be -1 (all in-sync replicas) or 1 (the leader)"
            )
        topic = _field(doc, "topic", str, what)
        txn_id = _field(doc, "transactional_id", str, what, None)
        if txn_id is not None and not txn_id:
            raise InvalidRequestError(f"{what}: field 'transactional_id' must not be empty")
        partition = _field(doc, "partition", int, what)
        return cls(topic, partition, acks, _topic_id(doc, what), txn_id)


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """The DoGet ticket: batches of a partition from ``offset``, at most ``max_bytes``
    (the first batch always), below ``max_offset`` if set; ``topic_id`` as
    :class:`ProduceDescriptor`'s."""

    topic: str
    partition: int
    offset: int
    max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    isolation: str = "read_committed"
    max_offset: int | None = None
    topic_id: str | None = None

    def to_doc(self) -> Doc:
        doc: Doc = {
            "op": "fetch",
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "max_bytes": self.max_bytes,
            "isolation": self.isolation,
        }
        if self.max_offset is not None:
            doc["max_offset"] = self.max_offset
        return _with_topic_id(doc, self.topic_id)

    @classmethod
    def from_doc(cls, doc: Doc) -> FetchRequest:
        what = "fetch ticket"
        _op(doc, "fetch", what)
        topic = _field(doc, "topic", str, what)
        partition = _field(doc, "partition", int, what)
        offset = _field(doc, "offset", int, what)
        max_bytes = _field(doc, "max_bytes", int, what, DEFAULT_FETCH_MAX_BYTES)
        isolation = _field(doc, "isolation", str, what, "read_committed")
        if isolation not in FETCH_ISOLATION_LEVELS:
            raise InvalidRequestError(
                f"{what}: field 'isolation' must be one of {', '.join(FETCH_ISOLATION_LEVELS)}, "
                f"got {isolation!r}"
            )
        max_offset = _field(doc, "max_offset", int, what, None)
        if not 1 <= max_bytes <= MAX_FETCH_BYTES:
            raise InvalidRequestError(
                f"{what}: field 'max_bytes' must be in 1..{MAX_FETCH_BYTES}, got {max_bytes}"
            )
        topic_id = _topic_id(doc, what)
        return cls(topic, partition, offset, max_bytes, isolation, max_offset, topic_id)
