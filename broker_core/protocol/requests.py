"""One typed request per ``DoAction`` (and a typed response where the answer has structure).

Each is a frozen dataclass with ``to_doc()`` (the JSON body the client sends) and
``from_doc(doc)`` (what the broker decodes). ``from_doc`` is the only place a body's shape is
checked: a missing or mistyped field raises ``InvalidRequestError`` naming the action and
the field (``"end_txn: field 'producer_id' must be >= 0, got -4"``). Rules that need the
broker's state or limits (id lengths, timeouts, which transactions exist) stay with the
coordinator (``protocol.txn_inputs``), which in-process callers reach without a body.

The JSON field names are the wire contract of ``protocol.wire``; the table of bodies is in
``broker_core.server.handlers``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from broker_core.errors import InvalidRequestError, InvalidRequiredAcksError
from broker_core.protocol.wire import (
    DEFAULT_FETCH_MAX_BYTES,
    PROTOCOL_VERSION,
    Action,
    SinkAttempt,
    SinkTxnStatus,
)
from broker_core.protocol.wire import field as _field
from broker_core.record.batch import MAX_PRODUCER_EPOCH

Doc = dict[str, Any]
Partitions = tuple[tuple[str, int], ...]
Transactions = tuple[tuple[str, int, int], ...]
OffsetRanges = tuple[tuple[str, int, int, int], ...]
MarkerGroup = tuple[int, int, Partitions]  # (producer id, producer epoch, partitions)
StableOffsetsMap = dict[tuple[str, int], int]

STABLE_OFFSETS_FIELD = "last_stable_offsets"


# -- shared field readers ------------------------------------------------------------------
ACKS_ALL = -1  # answered once every in-sync replica has the batch (the high watermark passed it)
ACKS_LEADER = 1  # answered once the leader has written it


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _producer(doc: Doc, what: str) -> tuple[int, int]:
    producer_id: int = _field(doc, "producer_id", int, what)
    producer_epoch: int = _field(doc, "producer_epoch", int, what)
    if producer_id < 0:
        raise InvalidRequestError(f"{what}: field 'producer_id' must be >= 0, got {producer_id}")
    if not 0 <= producer_epoch <= MAX_PRODUCER_EPOCH:
        raise InvalidRequestError(
            f"{what}: field 'producer_epoch' must be in 0..{MAX_PRODUCER_EPOCH}, "
            f"got {producer_epoch}"
        )
    return producer_id, producer_epoch


def _partitions(doc: Doc, what: str) -> Partitions:
    raw = _field(doc, "partitions", list, what)
    result: list[tuple[str, int]] = []
    for i, item in enumerate(raw):
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and _is_int(item[1])
        ):
            raise InvalidRequestError(
                f"{what}: field 'partitions[{i}]' must be [topic: str, partition: int], "
                f"got {item!r}"
            )
        result.append((item[0], item[1]))
    return tuple(result)


def _transactions(doc: Doc, what: str) -> Transactions:
    raw = _field(doc, "transactions", list, what)
    result: list[tuple[str, int, int]] = []
    for i, item in enumerate(raw):
        ok = (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], str)
            and all(_is_int(v) for v in item[1:])
        )
        if not ok:
            raise InvalidRequestError(
                f"{what}: field 'transactions[{i}]' must be [transactional_id: str, "
                f"producer_id: int, producer_epoch: int], got {item!r}"
            )
        result.append((item[0], item[1], item[2]))
    return tuple(result)


def _ranges(doc: Doc, what: str) -> OffsetRanges:
    raw = _field(doc, "ranges", list, what, [])
    result: list[tuple[str, int, int, int]] = []
    for i, item in enumerate(raw):
        ok = (
            isinstance(item, list)
            and len(item) == 4
            and isinstance(item[0], str)
            and all(_is_int(v) for v in item[1:])
        )
        if not ok:
            raise InvalidRequestError(
                f"{what}: field 'ranges[{i}]' must be [topic: str, partition: int, "
                f"first: int, last: int], got {item!r}"
            )
        result.append((item[0], item[1], item[2], item[3]))
    return tuple(result)


def _names(doc: Doc, name: str, what: str) -> tuple[str, ...] | None:
    raw = _field(doc, name, list, what, None)
    if raw is None:
        return None
    for i, n in enumerate(raw):
        if not isinstance(n, str):
            raise InvalidRequestError(
                f"{what}: field '{name}[{i}]' must be str, got {type(n).__name__}"
            )
    return tuple(raw)


def _sink_batch(doc: Doc, what: str) -> tuple[str, int]:
    sink_id: str = _field(doc, "sink_id", str, what)
    batch_id: int = _field(doc, "batch_id", int, what)
    if not sink_id:
        raise InvalidRequestError(f"{what}: field 'sink_id' must not be empty")
    if batch_id < 0:
        raise InvalidRequestError(f"{what}: field 'batch_id' must be >= 0, got {batch_id}")
    return sink_id, batch_id


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
    default) or 1 (once the leader has written it)."""

    topic: str
    partition: int
    acks: int = ACKS_ALL

    def to_doc(self) -> Doc:
        return {
            "op": "produce",
            "topic": self.topic,
            "partition": self.partition,
            "acks": self.acks,
        }

    @classmethod
    def from_doc(cls, doc: Doc) -> ProduceDescriptor:
        what = "produce descriptor"
        _op(doc, "produce", what)
        acks = _field(doc, "acks", int, what, ACKS_ALL)
        if acks not in (ACKS_ALL, ACKS_LEADER):
            raise InvalidRequiredAcksError(
                f"{what}: acks={acks} must be -1 (all in-sync replicas) or 1 (the leader)"
            )
        return cls(_field(doc, "topic", str, what), _field(doc, "partition", int, what), acks)


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """The DoGet ticket: batches of a partition from ``offset``, at most ``max_bytes``
    (the first batch always), below ``max_offset`` if set."""

    topic: str
    partition: int
    offset: int
    max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    isolation: str = "read_committed"
    max_offset: int | None = None

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
        return doc

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
        return cls(topic, partition, offset, max_bytes, isolation, max_offset)


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

    def to_doc(self) -> Doc:
        return {"topic": self.topic, "partition": self.partition}

    @classmethod
    def from_doc(cls, doc: Doc) -> ListOffsetsRequest:
        what = cls.ACTION.value
        return cls(_field(doc, "topic", str, what), _field(doc, "partition", int, what))


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
    ACTION: ClassVar[Action] = Action.FIND_COORDINATOR
    transactional_id: str | None = None

    def to_doc(self) -> Doc:
        return {} if self.transactional_id is None else {"transactional_id": self.transactional_id}

    @classmethod
    def from_doc(cls, doc: Doc) -> FindCoordinatorRequest:
        return cls(_field(doc, "transactional_id", str, cls.ACTION.value, None))


# -- producers and transactions ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class InitProducerIdRequest:
    """Without ``transactional_id``: an idempotent producer's id from any broker. With
    ``sink``: an attempt of a Spark task (docs/design.md, the sink protocol)."""

    ACTION: ClassVar[Action] = Action.INIT_PRODUCER_ID
    transactional_id: str | None = None
    transaction_timeout_ms: int | None = None
    sink: SinkAttempt | None = None

    def to_doc(self) -> Doc:
        doc: Doc = {}
        if self.transactional_id is not None:
            doc["transactional_id"] = self.transactional_id
        if self.sink is not None:
            doc["sink_batch_id"] = self.sink.batch_id
            doc["sink_id"] = self.sink.sink_id
            doc["sink_run_id"] = self.sink.run_id
        if self.transaction_timeout_ms is not None:
            doc["transaction_timeout_ms"] = self.transaction_timeout_ms
        return doc

    @classmethod
    def from_doc(cls, doc: Doc) -> InitProducerIdRequest:
        what = cls.ACTION.value
        txn_id = _field(doc, "transactional_id", str, what, None)
        timeout_ms = _field(doc, "transaction_timeout_ms", int, what, None)
        sink_batch_id = _field(doc, "sink_batch_id", int, what, None)
        if txn_id is None:
            if sink_batch_id is not None:
                raise InvalidRequestError(f"{what}: field 'sink_batch_id' needs a transactional_id")
            if timeout_ms is not None:
                raise InvalidRequestError(
                    f"{what}: field 'transaction_timeout_ms' needs a transactional_id"
                )
            return cls()
        if not txn_id:
            raise InvalidRequestError(f"{what}: field 'transactional_id' must not be empty")
        sink = None
        if sink_batch_id is not None:
            sink = SinkAttempt(
                _field(doc, "sink_id", str, what),
                _field(doc, "sink_run_id", str, what),
                sink_batch_id,
            )
        return cls(txn_id, timeout_ms, sink)


@dataclass(frozen=True, slots=True)
class InitProducerIdResponse:
    producer_id: int
    producer_epoch: int
    sink_status: SinkTxnStatus | None = None  # set when the request named a sink attempt

    def to_doc(self) -> Doc:
        doc: Doc = {"producer_id": self.producer_id, "producer_epoch": self.producer_epoch}
        if self.sink_status is not None:
            doc["sink_status"] = str(self.sink_status)
        return doc

    @classmethod
    def from_doc(cls, doc: Doc) -> InitProducerIdResponse:
        what = "init_producer_id answer"
        status = _field(doc, "sink_status", str, what, None)
        try:
            sink_status = None if status is None else SinkTxnStatus(status)
        except ValueError:
            raise InvalidRequestError(f"{what}: field 'sink_status' is {status!r}") from None
        return cls(
            _field(doc, "producer_id", int, what),
            _field(doc, "producer_epoch", int, what),
            sink_status,
        )


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnRequest:
    ACTION: ClassVar[Action] = Action.ADD_PARTITIONS_TO_TXN
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: Partitions

    def to_doc(self) -> Doc:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "partitions": [[t, p] for t, p in self.partitions],
        }

    @classmethod
    def from_doc(cls, doc: Doc) -> AddPartitionsToTxnRequest:
        what = cls.ACTION.value
        txn_id = _field(doc, "transactional_id", str, what)
        pid, epoch = _producer(doc, what)
        return cls(txn_id, pid, epoch, _partitions(doc, what))


@dataclass(frozen=True, slots=True)
class EndTxnRequest:
    ACTION: ClassVar[Action] = Action.END_TXN
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool

    def to_doc(self) -> Doc:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "commit": self.commit,
        }

    @classmethod
    def from_doc(cls, doc: Doc) -> EndTxnRequest:
        what = cls.ACTION.value
        txn_id = _field(doc, "transactional_id", str, what)
        pid, epoch = _producer(doc, what)
        return cls(txn_id, pid, epoch, _field(doc, "commit", bool, what))


@dataclass(frozen=True, slots=True)
class PrepareSinkTxnRequest:
    ACTION: ClassVar[Action] = Action.PREPARE_SINK_TXN
    transactional_id: str
    producer_id: int
    producer_epoch: int
    batch_id: int
    ranges: OffsetRanges = ()  # (topic, partition, first offset, last offset)

    def to_doc(self) -> Doc:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "batch_id": self.batch_id,
            "ranges": [list(r) for r in self.ranges],
        }

    @classmethod
    def from_doc(cls, doc: Doc) -> PrepareSinkTxnRequest:
        what = cls.ACTION.value
        txn_id = _field(doc, "transactional_id", str, what)
        pid, epoch = _producer(doc, what)
        batch_id = _field(doc, "batch_id", int, what)
        return cls(txn_id, pid, epoch, batch_id, _ranges(doc, what))


@dataclass(frozen=True, slots=True)
class WriteTxnMarkersRequest:
    """Broker to broker: markers for partitions the receiver leads, for one producer or
    several (a sink batch's transactions: each partition gets its markers in one append).

    On the wire one producer keeps the single-producer fields (``producer_id``,
    ``producer_epoch``, ``partitions``); several go in ``producers``, a list of objects
    with those three fields."""

    ACTION: ClassVar[Action] = Action.WRITE_TXN_MARKERS
    producers: tuple[MarkerGroup, ...]  # (producer id, epoch, its partitions)
    commit: bool
    coordinator_epoch: int

    def to_doc(self) -> Doc:
        doc: Doc = {"commit": self.commit, "coordinator_epoch": self.coordinator_epoch}
        groups = [
            {"producer_id": pid, "producer_epoch": epoch, "partitions": [[t, p] for t, p in tps]}
            for pid, epoch, tps in self.producers
        ]
        if len(groups) == 1:
            doc.update(groups[0])
        else:
            doc["producers"] = groups
        return doc

    @classmethod
    def from_doc(cls, doc: Doc) -> WriteTxnMarkersRequest:
        what = cls.ACTION.value
        commit = _field(doc, "commit", bool, what)
        coordinator_epoch = _field(doc, "coordinator_epoch", int, what, 0)
        raw = _field(doc, "producers", list, what, None)
        items: list[Doc] = [doc] if raw is None else raw
        if not items:
            raise InvalidRequestError(f"{what}: field 'producers' must not be empty")
        producers: list[MarkerGroup] = []
        for i, item in enumerate(items):
            where = what if raw is None else f"{what}: producers[{i}]"
            if not isinstance(item, dict):
                raise InvalidRequestError(f"{where} must be an object, got {item!r}")
            pid, epoch = _producer(item, where)
            producers.append((pid, epoch, _partitions(item, where)))
        return cls(tuple(producers), commit, coordinator_epoch)


@dataclass(frozen=True, slots=True)
class WriteTxnMarkersResponse:
    """The last stable offset of each partition a marker went to, just after the marker."""

    stable: StableOffsetsMap

    def to_doc(self) -> Doc:
        return {
            STABLE_OFFSETS_FIELD: [
                {"topic": topic, "partition": partition, "lso": lso}
                for (topic, partition), lso in sorted(self.stable.items())
            ]
        }

    @classmethod
    def from_doc(cls, doc: Doc, what: str) -> WriteTxnMarkersResponse:
        """Raises InvalidRequestError naming ``what`` and the bad field."""
        raw = _field(doc, STABLE_OFFSETS_FIELD, list, what)
        stable: StableOffsetsMap = {}
        for i, item in enumerate(raw):
            where = f"{what}: {STABLE_OFFSETS_FIELD}[{i}]"
            if not isinstance(item, dict):
                raise InvalidRequestError(f"{where} must be an object, got {item!r}")
            topic = _field(item, "topic", str, where)
            partition = _field(item, "partition", int, where)
            lso = _field(item, "lso", int, where)
            if lso < 0:
                raise InvalidRequestError(f"{where}: field 'lso' must be >= 0, got {lso}")
            stable[(topic, partition)] = lso
        return cls(stable)


# -- the sink protocol ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CommitSinkBatchRequest:
    ACTION: ClassVar[Action] = Action.COMMIT_SINK_BATCH
    sink_id: str
    batch_id: int
    transactions: Transactions  # (transactional_id, producer_id, producer_epoch)
    run_id: str | None = None

    def to_doc(self) -> Doc:
        doc: Doc = {
            "sink_id": self.sink_id,
            "batch_id": self.batch_id,
            "transactions": [list(t) for t in self.transactions],
        }
        if self.run_id is not None:
            doc["run_id"] = self.run_id
        return doc

    @classmethod
    def from_doc(cls, doc: Doc) -> CommitSinkBatchRequest:
        what = cls.ACTION.value
        sink_id, batch_id = _sink_batch(doc, what)
        transactions = _transactions(doc, what)
        return cls(sink_id, batch_id, transactions, _field(doc, "run_id", str, what, None))


@dataclass(frozen=True, slots=True)
class AbortSinkBatchRequest:
    ACTION: ClassVar[Action] = Action.ABORT_SINK_BATCH
    sink_id: str
    batch_id: int
    transactions: Transactions

    def to_doc(self) -> Doc:
        return {
            "sink_id": self.sink_id,
            "batch_id": self.batch_id,
            "transactions": [list(t) for t in self.transactions],
        }

    @classmethod
    def from_doc(cls, doc: Doc) -> AbortSinkBatchRequest:
        what = cls.ACTION.value
        sink_id, batch_id = _sink_batch(doc, what)
        return cls(sink_id, batch_id, _transactions(doc, what))


@dataclass(frozen=True, slots=True)
class SinkBatchResponse:
    """The answer to COMMIT_SINK_BATCH (``committed`` set) and ABORT_SINK_BATCH."""

    last_committed_batch: int | None
    committed: bool | None = None

    def to_doc(self) -> Doc:
        doc: Doc = {"last_committed_batch": self.last_committed_batch}
        if self.committed is not None:
            doc["committed"] = self.committed
        return doc

    @classmethod
    def from_doc(cls, doc: Doc) -> SinkBatchResponse:
        what = "sink batch answer"
        return cls(
            _field(doc, "last_committed_batch", int, what, None),
            _field(doc, "committed", bool, what, None),
        )


@dataclass(frozen=True, slots=True)
class AbortSinkRunRequest:
    """Every attempt of ``run_id`` (or, without one, of any run of ``sink_id``) at
    ``batch_id`` or before."""

    ACTION: ClassVar[Action] = Action.ABORT_SINK_RUN
    batch_id: int
    run_id: str | None = None
    sink_id: str | None = None

    def to_doc(self) -> Doc:
        doc: Doc = {"batch_id": self.batch_id}
        if self.run_id is not None:
            doc["run_id"] = self.run_id
        if self.sink_id is not None:
            doc["sink_id"] = self.sink_id
        return doc

    @classmethod
    def from_doc(cls, doc: Doc) -> AbortSinkRunRequest:
        what = cls.ACTION.value
        return cls(
            _field(doc, "batch_id", int, what),
            _field(doc, "run_id", str, what, None),
            _field(doc, "sink_id", str, what, None),
        )


@dataclass(frozen=True, slots=True)
class SinkHeartbeatRequest:
    ACTION: ClassVar[Action] = Action.SINK_HEARTBEAT
    sink_id: str
    run_id: str

    def to_doc(self) -> Doc:
        return {"sink_id": self.sink_id, "run_id": self.run_id}

    @classmethod
    def from_doc(cls, doc: Doc) -> SinkHeartbeatRequest:
        what = cls.ACTION.value
        return cls(_field(doc, "sink_id", str, what), _field(doc, "run_id", str, what))


@dataclass(frozen=True, slots=True)
class StableEndsRequest:
    ACTION: ClassVar[Action] = Action.STABLE_ENDS
    topic: str

    def to_doc(self) -> Doc:
        return {"topic": self.topic}

    @classmethod
    def from_doc(cls, doc: Doc) -> StableEndsRequest:
        return cls(_field(doc, "topic", str, cls.ACTION.value))


@dataclass(frozen=True, slots=True)
class StableEndsResponse:
    ends: dict[int, int]  # partition -> offset (JSON keys are strings on the wire)

    def to_doc(self) -> Doc:
        return {"ends": {str(p): offset for p, offset in sorted(self.ends.items())}}

    @classmethod
    def from_doc(cls, doc: Doc) -> StableEndsResponse:
        raw = _field(doc, "ends", dict, "stable_ends answer")
        return cls({int(p): int(offset) for p, offset in raw.items()})


# -- operations ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ListTransactionsRequest:
    ACTION: ClassVar[Action] = Action.LIST_TRANSACTIONS
    min_age_ms: int = 0
    every_id: bool = False  # every transactional id with its state, not the open ones

    def to_doc(self) -> Doc:
        return {"min_age_ms": self.min_age_ms, "all": self.every_id}

    @classmethod
    def from_doc(cls, doc: Doc) -> ListTransactionsRequest:
        what = cls.ACTION.value
        return cls(_field(doc, "min_age_ms", int, what, 0), _field(doc, "all", bool, what, False))


@dataclass(frozen=True, slots=True)
class AbortTransactionRequest:
    ACTION: ClassVar[Action] = Action.ABORT_TRANSACTION
    transactional_id: str

    def to_doc(self) -> Doc:
        return {"transactional_id": self.transactional_id}

    @classmethod
    def from_doc(cls, doc: Doc) -> AbortTransactionRequest:
        return cls(_field(doc, "transactional_id", str, cls.ACTION.value))


@dataclass(frozen=True, slots=True)
class MetricsRequest:
    """No fields (extra ones are ignored, as for every action)."""

    ACTION: ClassVar[Action] = Action.METRICS

    def to_doc(self) -> Doc:
        return {}


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


class Request(Protocol):
    """What every typed request offers: its action and its JSON body."""

    ACTION: ClassVar[Action]

    def to_doc(self) -> Doc: ...
