"""Topic, metadata and operators' requests: create, delete, describe, offsets, metadata,
find-coordinator, the transaction listing and abort, a partition's producers and the abort
of a transaction no coordinator knows (hanging), metrics and ping (the shared field
readers and the request shape: ``protocol.requests``)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from broker_core.errors import InvalidRequestError
from broker_core.protocol.coordinator_keys import (
    ALL_LED,
    state_partition_field,
    with_state_partition,
)

# The METRICS request lives with its answers (protocol.metrics); named here with its family.
from broker_core.protocol.metrics import MetricsRequest as MetricsRequest
from broker_core.protocol.requests import (
    Doc,
    _names,
    _topic_id,
    _with_topic_id,
)
from broker_core.protocol.wire import (
    PROTOCOL_VERSION,
    Action,
)
from broker_core.protocol.wire import field as _field


# -- topics --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CreateTopicRequest:
    ACTION: ClassVar[Action] = Action.CREATE_TOPIC
    name: str
    partitions: int
    schema: bytes | None = None  # Arrow IPC
    config: Mapping[str, Any] = field(default_factory=dict)

    def to_doc(self) -> Doc:
        doc: Doc = {"name": self.name, "partitions": self.partitions, "config": dict(self.config)}
        if self.schema is not None:
            doc["schema"] = base64.b64encode(self.schema).decode()
        return doc

    @classmethod
    def from_doc(cls, doc: Doc) -> CreateTopicRequest:
        what = cls.ACTION.value
        name = _field(doc, "name", str, what)
        partitions = _field(doc, "partitions", int, what)
        config = _field(doc, "config", dict, what, {})
        raw_schema = _field(doc, "schema", str, what, None)
        schema: bytes | None = None
        if raw_schema is not None:
            try:
                schema = base64.b64decode(raw_schema, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise InvalidRequestError(f"{what}: field 'schema' is not base64 ({exc})") from exc
        return cls(name, partitions, schema, config)


@dataclass(frozen=True, slots=True)
class DeleteTopicRequest:
    ACTION: ClassVar[Action] = Action.DELETE_TOPIC
    name: str

    def to_doc(self) -> Doc:
        return {"name": self.name}

    @classmethod
    def from_doc(cls, doc: Doc) -> DeleteTopicRequest:
        return cls(_field(doc, "name", str, cls.ACTION.value))


@dataclass(frozen=True, slots=True)
class DescribeTopicsRequest:
    ACTION: ClassVar[Action] = Action.DESCRIBE_TOPICS
    names: tuple[str, ...] | None = None  # None: every topic

    def to_doc(self) -> Doc:
        return {} if self.names is None else {"names": list(self.names)}

    @classmethod
    def from_doc(cls, doc: Doc) -> DescribeTopicsRequest:
        return cls(_names(doc, "names", cls.ACTION.value))


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest:
    ACTION: ClassVar[Action] = Action.LIST_OFFSETS
    topic: str
    partition: int
    topic_id: str | None = None

    def to_doc(self) -> Doc:
        return _with_topic_id({"topic": self.topic, "partition": self.partition}, self.topic_id)

    @classmethod
    def from_doc(cls, doc: Doc) -> ListOffsetsRequest:
        what = cls.ACTION.value
        topic, partition = _field(doc, "topic", str, what), _field(doc, "partition", int, what)
        return cls(topic, partition, _topic_id(doc, what))


@dataclass(frozen=True, slots=True)
class MetadataRequest:
    ACTION: ClassVar[Action] = Action.METADATA
    topics: tuple[str, ...] | None = None  # None: every topic

    def to_doc(self) -> Doc:
        return {} if self.topics is None else {"topics": list(self.topics)}

    @classmethod
    def from_doc(cls, doc: Doc) -> MetadataRequest:
        return cls(_names(doc, "topics", cls.ACTION.value))


@dataclass(frozen=True, slots=True)
class FindCoordinatorRequest:
    """The coordinator of ``transactional_id`` (a transactional or sink id), or of state
    partition ``state_partition`` (a client fanning a key-less call out); neither: the
    coordinator of the empty key."""

    ACTION: ClassVar[Action] = Action.FIND_COORDINATOR
    transactional_id: str | None = None
    state_partition: int | None = None

    def to_doc(self) -> Doc:
        doc: Doc = (
            {} if self.transactional_id is None else {"transactional_id": self.transactional_id}
        )
        return with_state_partition(doc, self.state_partition)

    @classmethod
    def from_doc(cls, doc: Doc) -> FindCoordinatorRequest:
        what = cls.ACTION.value
        request = cls(
            _field(doc, "transactional_id", str, what, None), state_partition_field(doc, what)
        )
        if request.transactional_id is not None and request.state_partition is not None:
            raise InvalidRequestError(
                f"{what}: give 'transactional_id' or 'state_partition', not both"
            )
        return request


# -- operations ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ListTransactionsRequest:
    """Open transactions (or every id) of state partition ``state_partition``, or of
    every state partition the broker leads (``ALL_LED``)."""

    ACTION: ClassVar[Action] = Action.LIST_TRANSACTIONS
    min_age_ms: int = 0
    every_id: bool = False  # every transactional id with its state, not the open ones
    state_partition: int | None = ALL_LED

    def to_doc(self) -> Doc:
        doc: Doc = {"min_age_ms": self.min_age_ms, "all": self.every_id}
        return with_state_partition(doc, self.state_partition)

    @classmethod
    def from_doc(cls, doc: Doc) -> ListTransactionsRequest:
        what = cls.ACTION.value
        return cls(
            _field(doc, "min_age_ms", int, what, 0),
            _field(doc, "all", bool, what, False),
            state_partition_field(doc, what),
        )


def merge_listings(
    by_partition: Mapping[int, list[dict[str, Any]]], every_id: bool
) -> list[dict[str, Any]]:
    """Several coordinators' ``list_transactions`` rows as one listing, each row naming
    its ``state_partition``: by id with ``every_id``, else oldest first (as one
    coordinator orders them)."""
    rows = [{**row, "state_partition": p} for p, part in by_partition.items() for row in part]
    if every_id:
        return sorted(rows, key=lambda r: str(r["transactional_id"]))
    return sorted(rows, key=lambda r: (-int(r["age_ms"]), str(r["transactional_id"])))


@dataclass(frozen=True, slots=True)
class AbortTransactionRequest:
    ACTION: ClassVar[Action] = Action.ABORT_TRANSACTION
    transactional_id: str

    def to_doc(self) -> Doc:
        return {"transactional_id": self.transactional_id}

    @classmethod
    def from_doc(cls, doc: Doc) -> AbortTransactionRequest:
        return cls(_field(doc, "transactional_id", str, cls.ACTION.value))


NO_OFFSET = -1  # a producer without an open transaction (its ``txn_start_offset``)


@dataclass(frozen=True, slots=True)
class DescribeProducersRequest:
    """The producers a partition's leader keeps state for (Kafka's DescribeProducers)."""

    ACTION: ClassVar[Action] = Action.DESCRIBE_PRODUCERS
    topic: str
    partition: int

    def to_doc(self) -> Doc:
        return {"topic": self.topic, "partition": self.partition}

    @classmethod
    def from_doc(cls, doc: Doc) -> DescribeProducersRequest:
        what = cls.ACTION.value
        return cls(_field(doc, "topic", str, what), _field(doc, "partition", int, what))


@dataclass(frozen=True, slots=True)
class ProducerDescription:
    """One producer of a partition as its leader sees it. ``txn_start_offset``: the first
    offset of its open transaction (``NO_OFFSET``: none open); ``last_timestamp``: its
    last write or marker (ms since the epoch); ``coordinator_epoch``: of its last marker
    (-1: none yet)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    txn_start_offset: int

    @property
    def has_open_transaction(self) -> bool:
        return self.txn_start_offset != NO_OFFSET

    def to_doc(self) -> Doc:
        return {
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "last_sequence": self.last_sequence,
            "last_timestamp": self.last_timestamp,
            "coordinator_epoch": self.coordinator_epoch,
            "txn_start_offset": self.txn_start_offset,
        }

    @classmethod
    def from_doc(cls, doc: Doc, what: str) -> ProducerDescription:
        return cls(
            _field(doc, "producer_id", int, what),
            _field(doc, "producer_epoch", int, what),
            _field(doc, "last_sequence", int, what),
            _field(doc, "last_timestamp", int, what),
            _field(doc, "coordinator_epoch", int, what),
            _field(doc, "txn_start_offset", int, what),
        )


@dataclass(frozen=True, slots=True)
class DescribeProducersResponse:
    """A partition's producers, by producer id, with its offsets at the time."""

    topic: str
    partition: int
    producers: tuple[ProducerDescription, ...]
    log_end_offset: int
    last_stable_offset: int

    def to_doc(self) -> Doc:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "producers": [p.to_doc() for p in self.producers],
            "log_end_offset": self.log_end_offset,
            "last_stable_offset": self.last_stable_offset,
        }

    @classmethod
    def from_doc(cls, doc: Doc) -> DescribeProducersResponse:
        what = "describe_producers answer"
        raw = _field(doc, "producers", list, what)
        producers = []
        for i, item in enumerate(raw):
            where = f"{what}: producers[{i}]"
            if not isinstance(item, dict):
                raise InvalidRequestError(f"{where} must be an object, got {item!r}")
            producers.append(ProducerDescription.from_doc(item, where))
        return cls(
            _field(doc, "topic", str, what),
            _field(doc, "partition", int, what),
            tuple(producers),
            _field(doc, "log_end_offset", int, what),
            _field(doc, "last_stable_offset", int, what),
        )


@dataclass(frozen=True, slots=True)
class AbortHangingTransactionRequest:
    """Abort the open transaction of one producer on one partition, at its leader: named
    by ``producer_id`` (with ``producer_epoch``: only if the producer is still at it) or
    by ``start_offset``, the transaction's first offset. docs/operations.md, "Hanging
    transactions"."""

    ACTION: ClassVar[Action] = Action.ABORT_HANGING_TRANSACTION
    topic: str
    partition: int
    producer_id: int | None = None
    producer_epoch: int | None = None
    start_offset: int | None = None

    def to_doc(self) -> Doc:
        doc: Doc = {"topic": self.topic, "partition": self.partition}
        for name in ("producer_id", "producer_epoch", "start_offset"):
            value = getattr(self, name)
            if value is not None:
                doc[name] = value
        return doc

    @classmethod
    def from_doc(cls, doc: Doc) -> AbortHangingTransactionRequest:
        what = cls.ACTION.value
        request = cls(
            _field(doc, "topic", str, what),
            _field(doc, "partition", int, what),
            _field(doc, "producer_id", int, what, None),
            _field(doc, "producer_epoch", int, what, None),
            _field(doc, "start_offset", int, what, None),
        )
        by_pid = request.producer_id is not None
        if by_pid == (request.start_offset is not None):
            raise InvalidRequestError(
                f"{what}: give 'producer_id' or 'start_offset' (exactly one of them)"
            )
        if request.producer_epoch is not None and not by_pid:
            raise InvalidRequestError(f"{what}: field 'producer_epoch' needs a 'producer_id'")
        for name in ("producer_id", "producer_epoch", "start_offset"):
            value = getattr(request, name)
            if value is not None and value < 0:
                raise InvalidRequestError(f"{what}: field {name!r} must be >= 0, got {value}")
        return request


@dataclass(frozen=True, slots=True)
class AbortHangingTransactionResponse:
    """The transaction aborted: its producer, its first offset, the marker's offset and
    producer epoch (one above the producer's: it is fenced on this partition), and the
    partition's last stable offset just after the marker."""

    topic: str
    partition: int
    producer_id: int
    txn_start_offset: int
    marker_offset: int
    marker_epoch: int
    last_stable_offset: int

    def to_doc(self) -> Doc:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "producer_id": self.producer_id,
            "txn_start_offset": self.txn_start_offset,
            "marker_offset": self.marker_offset,
            "marker_epoch": self.marker_epoch,
            "last_stable_offset": self.last_stable_offset,
        }

    @classmethod
    def from_doc(cls, doc: Doc) -> AbortHangingTransactionResponse:
        what = "abort_hanging_transaction answer"
        return cls(
            *(
                _field(doc, name, kind, what)
                for name, kind in (
                    ("topic", str),
                    ("partition", int),
                    ("producer_id", int),
                    ("txn_start_offset", int),
                    ("marker_offset", int),
                    ("marker_epoch", int),
                    ("last_stable_offset", int),
                )
            )
        )


@dataclass(frozen=True, slots=True)
class PingRequest:
    """No fields (extra ones are ignored, as for every action)."""

    ACTION: ClassVar[Action] = Action.PING

    def to_doc(self) -> Doc:
        return {}


@dataclass(frozen=True, slots=True)
class PingResponse:
    broker_id: int
    version: int = PROTOCOL_VERSION

    def to_doc(self) -> Doc:
        return {"broker_id": self.broker_id, "version": self.version}
