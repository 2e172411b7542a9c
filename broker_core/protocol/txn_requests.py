"""Producer, transaction and sink requests: producer ids, the partitions of a transaction,
its end, a sink's prepare, commit and abort of a batch, markers between brokers and the
stable ends (the shared field readers and the request shape: ``protocol.requests``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from broker_core.errors import InvalidRequestError
from broker_core.protocol.coordinator_keys import (
    ALL_LED,
    state_partition_field,
    with_state_partition,
)
from broker_core.protocol.requests import (
    STABLE_OFFSETS_FIELD,
    Doc,
    MarkerGroup,
    OffsetRanges,
    Partitions,
    StableOffsetsMap,
    TopicIds,
    Transactions,
    Wire,
    _partitions,
    _producer,
    _ranges,
    _sink_batch,
    _topic_ids,
    _transactions,
)
from broker_core.protocol.wire import (
    Action,
    SinkAttempt,
    SinkTxnStatus,
)
from broker_core.protocol.wire import field as _field


# -- producers and transactions ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class InitProducerIdRequest:
    """Without ``transactional_id``: an idempotent producer's id from any broker. With
    ``sink``: an attempt of a Spark task (docs/design.md, the sink protocol)."""

    ACTION: ClassVar[Action] = Action.INIT_PRODUCER_ID
    WIRE: ClassVar[Wire] = Wire(
        body=(
            "{transactional_id?, transaction_timeout_ms?, sink_batch_id?, sink_id?, sink_run_id?}"
        ),
        answer=(
            "{producer_id, producer_epoch, sink_status?: new|prepared|committed, producer_token?}"
        ),
        note=(
            "sink_*: an attempt of a Spark task, docs/design.md; producer_token, hex: "
            "without a transactional id, the id's token for the caller"
        ),
    )
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
    """``producer_token``: an idempotent producer's (no transactional id), which each of
    its batches carries (``wire.ProduceRequestMeta``; ``security.producer_token``); hex
    in the document."""

    producer_id: int
    producer_epoch: int
    sink_status: SinkTxnStatus | None = None  # set when the request named a sink attempt
    producer_token: bytes | None = None

    def to_doc(self) -> Doc:
        doc: Doc = {"producer_id": self.producer_id, "producer_epoch": self.producer_epoch}
        if self.sink_status is not None:
            doc["sink_status"] = str(self.sink_status)
        if self.producer_token is not None:
            doc["producer_token"] = self.producer_token.hex()
        return doc

    @classmethod
    def from_doc(cls, doc: Doc) -> InitProducerIdResponse:
        what = "init_producer_id answer"
        status = _field(doc, "sink_status", str, what, None)
        try:
            sink_status = None if status is None else SinkTxnStatus(status)
        except ValueError:
            raise InvalidRequestError(f"{what}: field 'sink_status' is {status!r}") from None
        token_hex = _field(doc, "producer_token", str, what, None)
        try:
            token = None if token_hex is None else bytes.fromhex(token_hex)
        except ValueError:
            raise InvalidRequestError(f"{what}: field 'producer_token' is not hex") from None
        return cls(
            _field(doc, "producer_id", int, what),
            _field(doc, "producer_epoch", int, what),
            sink_status,
            token,
        )


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnRequest:
    ACTION: ClassVar[Action] = Action.ADD_PARTITIONS_TO_TXN
    WIRE: ClassVar[Wire] = Wire(
        body=(
            "{transactional_id, producer_id, producer_epoch, partitions: [[topic, "
            "partition], ..], topic_ids?: {topic: id}, verify_only?}"
        ),
        answer="{}",
        note=(
            "verify_only: a leader's check before a transactional append, broker to "
            "broker, ClusterAction; adds nothing, INVALID_TXN_STATE if not all are in "
            "the producer's ongoing transaction"
        ),
    )
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: Partitions
    # {topic: id} the producer knows its topics by (docs/protocol.md, "Topic ids").
    topic_ids: TopicIds = field(default_factory=dict)
    # A partition leader's check before a transactional append (Kafka's VerifyOnly,
    # KIP-890): are the partitions in this producer's ongoing transaction? Adds nothing.
    verify_only: bool = False

    def to_doc(self) -> Doc:
        doc: Doc = {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "partitions": [[t, p] for t, p in self.partitions],
        }
        if self.topic_ids:
            doc["topic_ids"] = dict(self.topic_ids)
        if self.verify_only:
            doc["verify_only"] = True
        return doc

    @classmethod
    def from_doc(cls, doc: Doc) -> AddPartitionsToTxnRequest:
        what = cls.ACTION.value
        txn_id = _field(doc, "transactional_id", str, what)
        pid, epoch = _producer(doc, what)
        verify_only = _field(doc, "verify_only", bool, what, False)
        partitions = _partitions(doc, what)
        return cls(txn_id, pid, epoch, partitions, _topic_ids(doc, what), verify_only)


@dataclass(frozen=True, slots=True)
class EndTxnRequest:
    ACTION: ClassVar[Action] = Action.END_TXN
    WIRE: ClassVar[Wire] = Wire(
        body="{transactional_id, producer_id, producer_epoch, commit}",
        answer="{producer_id, producer_epoch}",
        note="the next transaction's: each transaction ends at its own epoch, KIP-890",
    )
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
class EndTxnResponse:
    """The producer id and epoch of the producer's next transaction: each transaction ends
    at its own epoch (KIP-890). A broker from before answered ``{}``: ``None`` here, and
    the caller keeps the ones it sent."""

    producer_id: int | None
    producer_epoch: int | None

    def to_doc(self) -> Doc:
        return {"producer_id": self.producer_id, "producer_epoch": self.producer_epoch}

    @classmethod
    def from_doc(cls, doc: Doc) -> EndTxnResponse:
        what = "end_txn answer"
        return cls(
            _field(doc, "producer_id", int, what, None),
            _field(doc, "producer_epoch", int, what, None),
        )


@dataclass(frozen=True, slots=True)
class PrepareSinkTxnRequest:
    ACTION: ClassVar[Action] = Action.PREPARE_SINK_TXN
    WIRE: ClassVar[Wire] = Wire(
        body=(
            "{transactional_id, producer_id, producer_epoch, batch_id, ranges?: "
            "[[topic, partition, first, last], ..], topic_ids?: {topic: id}}"
        ),
        answer="{}",
    )
    transactional_id: str
    producer_id: int
    producer_epoch: int
    batch_id: int
    ranges: OffsetRanges = ()  # (topic, partition, first offset, last offset)
    topic_ids: TopicIds = field(default_factory=dict)  # as AddPartitionsToTxnRequest's

    def to_doc(self) -> Doc:
        doc: Doc = {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "batch_id": self.batch_id,
            "ranges": [list(r) for r in self.ranges],
        }
        if self.topic_ids:
            doc["topic_ids"] = dict(self.topic_ids)
        return doc

    @classmethod
    def from_doc(cls, doc: Doc) -> PrepareSinkTxnRequest:
        what = cls.ACTION.value
        txn_id = _field(doc, "transactional_id", str, what)
        pid, epoch = _producer(doc, what)
        batch_id = _field(doc, "batch_id", int, what)
        return cls(txn_id, pid, epoch, batch_id, _ranges(doc, what), _topic_ids(doc, what))


@dataclass(frozen=True, slots=True)
class WriteTxnMarkersRequest:
    """Broker to broker: markers for partitions the receiver leads, for one producer or
    several (a sink batch's transactions: each partition gets its markers in one append).

    On the wire one producer keeps the single-producer fields (``producer_id``,
    ``producer_epoch``, ``partitions``); several go in ``producers``, a list of objects
    with those three fields."""

    ACTION: ClassVar[Action] = Action.WRITE_TXN_MARKERS
    WIRE: ClassVar[Wire] = Wire(
        body=(
            "{producer_id, producer_epoch, commit, coordinator_epoch?, partitions: "
            "[[topic, partition], ..]}, or for several producers (a sink commit) "
            "{commit, coordinator_epoch?, producers: [{producer_id, producer_epoch, "
            "partitions}, ..]}"
        ),
        answer="{last_stable_offsets: [{topic, partition, lso}, ..]}",
        note=(
            "broker to broker, one call per leader; each partition gets all its "
            "markers in one append, fsynced; lso: just after them"
        ),
    )
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
    WIRE: ClassVar[Wire] = Wire(
        body=(
            "{sink_id, batch_id, transactions: [[transactional_id, producer_id, "
            "producer_epoch], ..], run_id?}"
        ),
        answer="{committed, last_committed_batch}",
    )
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
    WIRE: ClassVar[Wire] = Wire(
        body=(
            "{sink_id, batch_id, transactions: [[transactional_id, producer_id, "
            "producer_epoch], ..]}"
        ),
        answer="{last_committed_batch}",
    )
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
    ``batch_id`` or before; by run alone it names no key, so it goes to every state
    partition (``state_partition``: one of them; ``ALL_LED``: every one the broker leads)."""

    ACTION: ClassVar[Action] = Action.ABORT_SINK_RUN
    WIRE: ClassVar[Wire] = Wire(
        body="{run_id? | sink_id?, batch_id, state_partition?}",
        answer="{aborted: [transactional_id, ..], state_partitions: [..]}",
        note=("by sink: its coordinator; by run alone: the named or every led state partition"),
    )
    batch_id: int
    run_id: str | None = None
    sink_id: str | None = None
    state_partition: int | None = ALL_LED

    def to_doc(self) -> Doc:
        doc: Doc = {"batch_id": self.batch_id}
        if self.run_id is not None:
            doc["run_id"] = self.run_id
        if self.sink_id is not None:
            doc["sink_id"] = self.sink_id
        return with_state_partition(doc, self.state_partition)

    @classmethod
    def from_doc(cls, doc: Doc) -> AbortSinkRunRequest:
        what = cls.ACTION.value
        return cls(
            _field(doc, "batch_id", int, what),
            _field(doc, "run_id", str, what, None),
            _field(doc, "sink_id", str, what, None),
            state_partition_field(doc, what),
        )


@dataclass(frozen=True, slots=True)
class AbortSinkRunResponse:
    """The transactional ids aborted, and the state partitions whose coordinators were asked."""

    aborted: tuple[str, ...]
    state_partitions: tuple[int, ...]

    def to_doc(self) -> Doc:
        return {"aborted": list(self.aborted), "state_partitions": list(self.state_partitions)}

    @classmethod
    def from_doc(cls, doc: Doc) -> AbortSinkRunResponse:
        what = "abort_sink_run answer"
        return cls(
            tuple(str(t) for t in _field(doc, "aborted", list, what)),
            tuple(int(p) for p in _field(doc, "state_partitions", list, what, [])),
        )


@dataclass(frozen=True, slots=True)
class SinkHeartbeatRequest:
    ACTION: ClassVar[Action] = Action.SINK_HEARTBEAT
    WIRE: ClassVar[Wire] = Wire(
        body="{sink_id, run_id}",
        answer="{}",
    )
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
    """The cut of ``topic`` by the coordinator of ``state_partition`` (``ALL_LED``: the
    broker's only one; refused when it leads several, whose cut is the reader's)."""

    ACTION: ClassVar[Action] = Action.STABLE_ENDS
    WIRE: ClassVar[Wire] = Wire(
        body="{topic, state_partition?}",
        answer="{ends: {partition: offset}}",
        note=(
            "read_committed ends that hold every sink batch whole or not at all; "
            "without state_partition only when __transaction_state has one partition: "
            "with several the reader combines tracked_batches"
        ),
    )
    topic: str
    state_partition: int | None = ALL_LED

    def to_doc(self) -> Doc:
        return with_state_partition({"topic": self.topic}, self.state_partition)

    @classmethod
    def from_doc(cls, doc: Doc) -> StableEndsRequest:
        what = cls.ACTION.value
        return cls(_field(doc, "topic", str, what), state_partition_field(doc, what))


@dataclass(frozen=True, slots=True)
class StableEndsResponse:
    ends: dict[int, int]  # partition -> offset (JSON keys are strings on the wire)

    def to_doc(self) -> Doc:
        return {"ends": {str(p): offset for p, offset in sorted(self.ends.items())}}

    @classmethod
    def from_doc(cls, doc: Doc) -> StableEndsResponse:
        raw = _field(doc, "ends", dict, "stable_ends answer")
        return cls({int(p): int(offset) for p, offset in raw.items()})
