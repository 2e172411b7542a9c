"""Topic, metadata and operators' requests: create, delete, describe, offsets, metadata,
find-coordinator, the transaction listing and abort, a partition's producers and the abort
of a transaction no coordinator knows (hanging), metrics and ping, each with its answer
(the shared field readers and the request shape: ``protocol.requests``).

The answers an operator reads (:class:`TopicDescription`, :class:`PartitionInfo`,
:class:`PartitionOffsets`, :class:`TransactionListing`) also render ``idemlog --json``
(``to_json()``; docs/broker.md, "JSON answers"): the client returns them as parsed, adding
what it asked of other brokers (a partition's offsets), so the text views, ``--json`` and
the wire carry the same fields."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

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
    Wire,
    _is_int,
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
    WIRE: ClassVar[Wire] = Wire(
        body="{name, partitions, schema?: b64 Arrow IPC, config?: {key: value}}",
        answer="{name, partitions: [leader broker id per partition]}",
    )
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
class CreateTopicResponse:
    """The topic created: its name and the leader broker id of each partition."""

    name: str
    leaders: tuple[int, ...]

    def to_doc(self) -> Doc:
        return {"name": self.name, "partitions": list(self.leaders)}

    @classmethod
    def from_doc(cls, doc: Doc) -> CreateTopicResponse:
        what = "create_topic answer"
        return cls(_field(doc, "name", str, what), _int_list(doc, "partitions", what))


def _int_list(doc: Doc, name: str, what: str) -> tuple[int, ...]:
    raw = _field(doc, name, list, what)
    for i, value in enumerate(raw):
        if not _is_int(value):
            raise InvalidRequestError(f"{what}: field '{name}[{i}]' must be int, got {value!r}")
    return tuple(raw)


@dataclass(frozen=True, slots=True)
class DeleteTopicRequest:
    ACTION: ClassVar[Action] = Action.DELETE_TOPIC
    WIRE: ClassVar[Wire] = Wire(
        body="{name}",
        answer="{}",
    )
    name: str

    def to_doc(self) -> Doc:
        return {"name": self.name}

    @classmethod
    def from_doc(cls, doc: Doc) -> DeleteTopicRequest:
        return cls(_field(doc, "name", str, cls.ACTION.value))


@dataclass(frozen=True, slots=True)
class DescribeTopicsRequest:
    ACTION: ClassVar[Action] = Action.DESCRIBE_TOPICS
    WIRE: ClassVar[Wire] = Wire(
        body="{names?: [..]}",
        answer=(
            "{topics: [{name, topic_id, partitions: [{partition, leader, replicas: "
            "[id, ..], isr: [id, ..], leader_epoch}], schema: b64|null, config}]}"
        ),
        note=(
            "replicas, isr, leader_epoch: the partition's LeaderAndIsr state, "
            "docs/replication.md; a broker from before replica metadata sends "
            "neither: read as [leader], epoch 0"
        ),
    )
    names: tuple[str, ...] | None = None  # None: every topic

    def to_doc(self) -> Doc:
        return {} if self.names is None else {"names": list(self.names)}

    @classmethod
    def from_doc(cls, doc: Doc) -> DescribeTopicsRequest:
        return cls(_names(doc, "names", cls.ACTION.value))


def schema_fields(schema: pa.Schema | None) -> list[str] | None:
    """A schema in Arrow's text form, one ``"name: type"`` per field (None: no schema)."""
    return None if schema is None else [f"{f.name}: {f.type}" for f in schema]


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """A partition's offsets as its leader reported them (``list_offsets``)."""

    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    last_stable_offset: int

    @classmethod
    def from_doc(cls, doc: dict[str, int]) -> PartitionOffsets:
        return cls(
            int(doc["log_start_offset"]),
            int(doc["log_end_offset"]),
            int(doc["high_watermark"]),
            int(doc["last_stable_offset"]),
        )

    def to_doc(self) -> Doc:
        return {
            "log_start_offset": self.log_start_offset,
            "log_end_offset": self.log_end_offset,
            "high_watermark": self.high_watermark,
            "last_stable_offset": self.last_stable_offset,
        }

    def to_json(self) -> Doc:
        return self.to_doc()


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition of a topic: its leader, replicas, in-sync replicas and leader epoch;
    ``offsets`` when they were asked for and its leader answered, else ``offline`` says
    why not (None when offsets were not asked for). Those two are the client's, asked of
    the partition's leader: ``describe_topics`` does not carry them."""

    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_epoch: int
    offsets: PartitionOffsets | None = None
    offline: str | None = None

    def to_doc(self) -> Doc:
        """``partition`` and ``leader`` as ever, then the replica metadata (fields only
        added, so older clients read it unchanged)."""
        return {
            "partition": self.partition,
            "leader": self.leader,
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "leader_epoch": self.leader_epoch,
        }

    @classmethod
    def from_doc(cls, doc: Doc) -> PartitionInfo:
        leader = int(doc["leader"])
        return cls(
            partition=int(doc["partition"]),
            leader=leader,
            # A broker from before replica metadata sends neither: it serves alone.
            replicas=tuple(int(b) for b in doc.get("replicas", [leader])),
            isr=tuple(int(b) for b in doc.get("isr", [leader])),
            leader_epoch=int(doc.get("leader_epoch", 0)),
        )

    def to_json(self) -> Doc:
        return {
            **self.to_doc(),
            "offsets": None if self.offsets is None else self.offsets.to_json(),
            "offline": self.offline,
        }


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A topic: its name, Arrow schema (None: any), configuration overrides,
    partitions in partition order and id (chosen at creation; "" for a topic stored
    before ids, until its store writes one)."""

    name: str
    schema: pa.Schema | None
    config: dict[str, str]
    partitions: tuple[PartitionInfo, ...]
    topic_id: str = ""

    def to_doc(self) -> Doc:
        """The schema as base64 Arrow IPC."""
        schema = self.schema
        return {
            "name": self.name,
            "topic_id": self.topic_id,
            "partitions": [p.to_doc() for p in self.partitions],
            "schema": None
            if schema is None
            else base64.b64encode(schema.serialize().to_pybytes()).decode(),
            "config": dict(self.config),
        }

    @classmethod
    def from_doc(cls, doc: Doc) -> TopicDescription:
        schema = None
        if doc.get("schema"):
            raw = base64.b64decode(doc["schema"])
            schema = pa.ipc.read_schema(pa.py_buffer(raw))
        return cls(
            name=str(doc["name"]),
            schema=schema,
            config={str(k): str(v) for k, v in (doc.get("config") or {}).items()},
            partitions=tuple(PartitionInfo.from_doc(p) for p in doc["partitions"]),
            topic_id=str(doc.get("topic_id") or ""),
        )

    def to_json(self) -> Doc:
        return {
            "name": self.name,
            "topic_id": self.topic_id,
            "schema": schema_fields(self.schema),
            "config": dict(self.config),
            "partitions": [p.to_json() for p in self.partitions],
        }


@dataclass(frozen=True, slots=True)
class DescribeTopicsResponse:
    """The topics asked for, by name."""

    topics: tuple[TopicDescription, ...]

    def to_doc(self) -> Doc:
        return {"topics": [t.to_doc() for t in self.topics]}

    @classmethod
    def from_doc(cls, doc: Doc) -> DescribeTopicsResponse:
        return cls(tuple(TopicDescription.from_doc(t) for t in doc["topics"]))


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest:
    ACTION: ClassVar[Action] = Action.LIST_OFFSETS
    WIRE: ClassVar[Wire] = Wire(
        body="{topic, partition, topic_id?}",
        answer=(
            "{topic, partition, log_start_offset, log_end_offset, high_watermark, "
            "last_stable_offset}"
        ),
    )
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
class ListOffsetsResponse:
    """The partition's offsets as its leader has them now."""

    topic: str
    partition: int
    offsets: PartitionOffsets

    def to_doc(self) -> Doc:
        return {"topic": self.topic, "partition": self.partition, **self.offsets.to_doc()}

    @classmethod
    def from_doc(cls, doc: Doc) -> ListOffsetsResponse:
        return cls(str(doc["topic"]), int(doc["partition"]), PartitionOffsets.from_doc(doc))


@dataclass(frozen=True, slots=True)
class MetadataRequest:
    ACTION: ClassVar[Action] = Action.METADATA
    WIRE: ClassVar[Wire] = Wire(
        body="{topics?: [..]}",
        answer=(
            "{brokers: [{broker_id, host, port}], controller: id|null, topics: {name: "
            "[leader per partition]}, topic_ids: {name: id}}"
        ),
    )
    topics: tuple[str, ...] | None = None  # None: every topic

    def to_doc(self) -> Doc:
        return {} if self.topics is None else {"topics": list(self.topics)}

    @classmethod
    def from_doc(cls, doc: Doc) -> MetadataRequest:
        return cls(_names(doc, "topics", cls.ACTION.value))


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """A live broker as the metadata names it."""

    broker_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def to_doc(self) -> Doc:
        return {"broker_id": self.broker_id, "host": self.host, "port": self.port}

    @classmethod
    def from_doc(cls, doc: Doc) -> BrokerAddress:
        return cls(int(doc["broker_id"]), doc["host"], int(doc["port"]))


@dataclass(frozen=True, slots=True)
class MetadataResponse:
    """The live brokers by id, the controller (None: none elected), each topic's leader
    per partition and the ids of the topics that have one."""

    brokers: tuple[BrokerAddress, ...]
    controller: int | None
    topics: dict[str, tuple[int, ...]]
    topic_ids: dict[str, str]

    def to_doc(self) -> Doc:
        return {
            "brokers": [b.to_doc() for b in self.brokers],
            "controller": self.controller,
            "topics": {name: list(leaders) for name, leaders in self.topics.items()},
            "topic_ids": dict(self.topic_ids),
        }

    @classmethod
    def from_doc(cls, doc: Doc) -> MetadataResponse:
        return cls(
            tuple(BrokerAddress.from_doc(b) for b in doc["brokers"]),
            doc.get("controller"),
            {name: tuple(int(x) for x in leaders) for name, leaders in doc["topics"].items()},
            {str(n): str(i) for n, i in (doc.get("topic_ids") or {}).items()},
        )


@dataclass(frozen=True, slots=True)
class FindCoordinatorRequest:
    """The coordinator of ``transactional_id`` (a transactional or sink id), or of state
    partition ``state_partition`` (a client fanning a key-less call out); neither: the
    coordinator of the empty key."""

    ACTION: ClassVar[Action] = Action.FIND_COORDINATOR
    WIRE: ClassVar[Wire] = Wire(
        body="{transactional_id? | state_partition?}",
        answer="{broker_id, host, port, state_partition, state_partitions}",
        note=(
            "the leader of the key's, or of the named, __transaction_state partition, "
            "and the partition count"
        ),
    )
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
    WIRE: ClassVar[Wire] = Wire(
        body="{min_age_ms?, all?, state_partition?}",
        answer=(
            "{transactions: [{transactional_id, state_partition, ..}], state_partitions: [..]}"
        ),
        note=(
            "all: every id, its state and idle_ms; the named state partition's "
            "coordinator, or every one the broker leads"
        ),
    )
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
class ListTransactionsResponse:
    """The rows of every state partition asked (:func:`merge_listings`), each as its
    coordinator wrote it (an open transaction's fields, or with ``every_id`` an id's state
    and last update: :class:`TransactionListing` reads both), and which partitions answered."""

    transactions: tuple[Doc, ...]
    state_partitions: tuple[int, ...]

    def to_doc(self) -> Doc:
        return {
            "transactions": list(self.transactions),
            "state_partitions": list(self.state_partitions),
        }

    @classmethod
    def from_doc(cls, doc: Doc) -> ListTransactionsResponse:
        what = "list_transactions answer"
        return cls(
            tuple(_field(doc, "transactions", list, what)),
            tuple(_field(doc, "state_partitions", list, what, [])),
        )


@dataclass(frozen=True, slots=True)
class TransactionListing:
    """One row of ``list_transactions``: an open transaction (``state`` ``"ONGOING"``,
    its age, timeout, partitions and writer), or with ``every_id`` any id the coordinator
    keeps (its state and last update; the open transaction's fields then None)."""

    transactional_id: str
    state: str
    state_partition: int
    producer_id: int
    producer_epoch: int
    idle_ms: int
    last_update_ms: int | None = None
    age_ms: int | None = None
    timeout_ms: int | None = None
    partitions: tuple[tuple[str, int], ...] = ()
    sink_id: str | None = None
    sink_run: str | None = None
    sink_batch: int | None = None
    sink_prepared: bool = False

    @classmethod
    def from_doc(cls, doc: Doc) -> TransactionListing:
        def opt_int(key: str) -> int | None:
            value = doc.get(key)
            return None if value is None else int(value)

        return cls(
            transactional_id=str(doc["transactional_id"]),
            state=str(doc.get("state", "ONGOING")),
            state_partition=int(doc.get("state_partition", 0)),
            producer_id=int(doc["producer_id"]),
            producer_epoch=int(doc["producer_epoch"]),
            idle_ms=int(doc["idle_ms"]),
            last_update_ms=opt_int("last_update_ms"),
            age_ms=opt_int("age_ms"),
            timeout_ms=opt_int("timeout_ms"),
            partitions=tuple((str(t), int(p)) for t, p in doc.get("partitions", [])),
            sink_id=doc.get("sink_id") or None,
            sink_run=doc.get("sink_run") or None,
            sink_batch=opt_int("sink_batch"),
            sink_prepared=bool(doc.get("sink_prepared", False)),
        )

    def to_json(self) -> Doc:
        return {
            "transactional_id": self.transactional_id,
            "state": self.state,
            "state_partition": self.state_partition,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "idle_ms": self.idle_ms,
            "last_update_ms": self.last_update_ms,
            "age_ms": self.age_ms,
            "timeout_ms": self.timeout_ms,
            "partitions": [[t, p] for t, p in self.partitions],
            "sink_id": self.sink_id,
            "sink_run": self.sink_run,
            "sink_batch": self.sink_batch,
            "sink_prepared": self.sink_prepared,
        }


@dataclass(frozen=True, slots=True)
class AbortTransactionRequest:
    ACTION: ClassVar[Action] = Action.ABORT_TRANSACTION
    WIRE: ClassVar[Wire] = Wire(
        body="{transactional_id}",
        answer="{aborted}",
    )
    transactional_id: str

    def to_doc(self) -> Doc:
        return {"transactional_id": self.transactional_id}

    @classmethod
    def from_doc(cls, doc: Doc) -> AbortTransactionRequest:
        return cls(_field(doc, "transactional_id", str, cls.ACTION.value))


@dataclass(frozen=True, slots=True)
class AbortTransactionResponse:
    """Whether an open transaction was aborted (False: the id had none open)."""

    aborted: bool

    def to_doc(self) -> Doc:
        return {"aborted": self.aborted}

    @classmethod
    def from_doc(cls, doc: Doc) -> AbortTransactionResponse:
        return cls(_field(doc, "aborted", bool, "abort_transaction answer"))


NO_OFFSET = -1  # a producer without an open transaction (its ``txn_start_offset``)


@dataclass(frozen=True, slots=True)
class DescribeProducersRequest:
    """The producers a partition's leader keeps state for (Kafka's DescribeProducers)."""

    ACTION: ClassVar[Action] = Action.DESCRIBE_PRODUCERS
    WIRE: ClassVar[Wire] = Wire(
        body="{topic, partition}",
        answer=(
            "{topic, partition, producers: [{producer_id, producer_epoch, "
            "last_sequence, last_timestamp, coordinator_epoch, txn_start_offset}], "
            "log_end_offset, last_stable_offset}"
        ),
        note=(
            "the partition's leader; txn_start_offset -1: nothing open; Kafka's DescribeProducers"
        ),
    )
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
    WIRE: ClassVar[Wire] = Wire(
        body="{topic, partition, producer_id, producer_epoch? | start_offset}",
        answer=(
            "{topic, partition, producer_id, txn_start_offset, marker_offset, "
            "marker_epoch, last_stable_offset}"
        ),
        note=(
            "the partition's leader: an ABORT marker for that producer's open "
            "transaction, see below"
        ),
    )
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
    WIRE: ClassVar[Wire] = Wire(
        body="{}",
        answer="{broker_id, version}",
    )

    def to_doc(self) -> Doc:
        return {}


@dataclass(frozen=True, slots=True)
class PingResponse:
    broker_id: int
    version: int = PROTOCOL_VERSION

    def to_doc(self) -> Doc:
        return {"broker_id": self.broker_id, "version": self.version}

    @classmethod
    def from_doc(cls, doc: Doc) -> PingResponse:
        what = "ping answer"
        return cls(_field(doc, "broker_id", int, what), _field(doc, "version", int, what))
