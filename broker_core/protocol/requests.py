"""What the typed requests and responses share: their shapes, field readers and wire constants.

There is one typed request and one typed response per ``DoAction`` (an action that answers
nothing but its success answers :class:`EmptyResponse`), grouped by family:
``protocol.data_requests`` (produce and fetch), ``protocol.admin_requests`` (topics,
metadata, operators' calls), ``protocol.txn_requests`` (producer ids, transactions, sinks,
markers) and ``protocol.replica`` (replication).

Each is a frozen dataclass with ``to_doc()`` (the JSON body the client sends, or the answer
the broker's dispatcher sends back) and ``from_doc(doc)`` (what the other side decodes).
``from_doc`` is the only place a body's shape is checked: a missing or mistyped field raises
``InvalidRequestError`` naming the action and the field (``"end_txn: field 'producer_id'
must be >= 0, got -4"``). Rules that need the broker's state or limits (id lengths,
timeouts, which transactions exist) stay with the coordinator (``protocol.txn_inputs``),
which in-process callers reach without a body.

The JSON field names are the wire contract of ``protocol.wire``. Each request class's
``WIRE`` (:class:`Wire`) shows its body and answer; docs/protocol.md's table of bodies is
generated from them (``protocol.action_table``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from broker_core.errors import InvalidRequestError
from broker_core.protocol.topics import validate_topic_id
from broker_core.protocol.wire import Action
from broker_core.protocol.wire import field as _field
from broker_core.record.batch import MAX_PRODUCER_EPOCH

Doc = dict[str, Any]
Partitions = tuple[tuple[str, int], ...]
TopicIds = dict[str, str]  # topic name -> the topic id the sender knows it by
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


def _topic_id(doc: Doc, what: str) -> str | None:
    """The optional ``topic_id`` of a request naming a partition: None when absent (a
    client that does not know ids), else validated (docs/protocol.md, "Topic ids")."""
    raw = _field(doc, "topic_id", str, what, None)
    return None if raw is None else validate_topic_id(raw, f"{what}: field 'topic_id'")


def _topic_ids(doc: Doc, what: str) -> TopicIds:
    """The optional ``topic_ids`` ({topic: id}) of a request naming partitions of
    several topics; {} when absent."""
    raw = _field(doc, "topic_ids", dict, what, {})
    for name, value in raw.items():
        validate_topic_id(value, f"{what}: field 'topic_ids[{name!r}]'")
    return dict(raw)


def _with_topic_id(doc: Doc, topic_id: str | None) -> Doc:
    """``doc`` with ``topic_id`` if there is one (absent otherwise: older brokers read it)."""
    if topic_id is not None:
        doc["topic_id"] = topic_id
    return doc


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


@dataclass(frozen=True, slots=True)
class Wire:
    """How docs/protocol.md shows a request: its JSON ``body`` and its ``answer``, in the
    table's notation (``{field, optional?, field: [shape, ..]}``), and a ``note``.

    Each request class holds its own (``WIRE``); ``protocol.action_table`` renders the
    page's tables from them (``tests/unit/test_protocol_table.py`` checks the page holds
    them and that each body, and each answer written as a document, names the fields
    its class's ``from_doc`` reads).
    """

    body: str
    answer: str
    note: str = ""


class Request(Protocol):
    """What every typed request offers: its action, its JSON body and how the protocol
    page shows it."""

    ACTION: ClassVar[Action]
    WIRE: ClassVar[Wire]

    def to_doc(self) -> Doc: ...


class Response(Protocol):
    """What every typed answer offers: its JSON document (``ActionHandlers.handle`` turns
    it into the wire answer)."""

    def to_doc(self) -> Doc: ...


@dataclass(frozen=True, slots=True)
class EmptyResponse:
    """The answer of an action that answers only its success: ``{}``."""

    def to_doc(self) -> Doc:
        return {}

    @classmethod
    def from_doc(cls, doc: Doc) -> EmptyResponse:
        return cls()
