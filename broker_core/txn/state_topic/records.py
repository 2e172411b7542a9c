"""Transaction coordinator state: one record per transactional id, per sink (docs/design.md §5, §6).

:class:`TransactionState` is Kafka's transaction state machine with its transition table
written out; :class:`TransactionMetadata` is what the coordinator keeps (and persists) per
transactional id; :class:`SinkCommitRecord` is a sink's last committed Spark batch. Both
records serialise to small JSON documents, the value the state store persists (and the
previous format's znodes held).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any

from broker_core.errors import CorruptRecordError, InvalidTxnStateError
from broker_core.protocol.txn_inputs import BATCH_JOB_SINK_PREFIX
from broker_core.record.batch import MAX_PRODUCER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID

RECORD_VERSION = 1
NO_TXN_START = -1  # txn_start_ms of a transactional id with no transaction begun yet
NO_SINK_BATCH = -1  # sink_batch of a transactional id no Spark task attempt holds
NO_SINK = ""  # sink_id / sink_run of a transactional id no Spark task attempt holds
# The highest epoch handed to a producer. One more bump (to MAX_PRODUCER_EPOCH) stays
# available so the coordinator can always fence the holder of the last epoch; past this a
# new producer id is issued instead (Kafka's rule).
MAX_CLIENT_EPOCH = MAX_PRODUCER_EPOCH - 1


class TransactionState(Enum):
    """Kafka's ``TransactionState``, without the internal PREPARE_EPOCH_FENCE step."""

    EMPTY = "EMPTY"  # producer id and epoch assigned, no transaction open
    ONGOING = "ONGOING"  # partitions added; data may be in the logs
    PREPARE_COMMIT = "PREPARE_COMMIT"  # commit decided and durable; markers being written
    PREPARE_ABORT = "PREPARE_ABORT"  # abort decided and durable; markers being written
    COMPLETE_COMMIT = "COMPLETE_COMMIT"  # every partition has its COMMIT marker
    COMPLETE_ABORT = "COMPLETE_ABORT"  # every partition has its ABORT marker
    DEAD = "DEAD"  # transactional id expired; the record may be removed

    def can_transition_to(self, new: TransactionState) -> bool:
        return new in _TRANSITIONS[self]

    @property
    def is_prepare(self) -> bool:
        return self in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT)

    @property
    def is_complete(self) -> bool:
        return self in (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)


_S = TransactionState
# Legal moves out of each state. EMPTY -> EMPTY and COMPLETE_* -> EMPTY are epoch bumps
# (InitProducerId); ONGOING -> ONGOING adds partitions to the open transaction.
_TRANSITIONS: dict[TransactionState, frozenset[TransactionState]] = {
    _S.EMPTY: frozenset({_S.EMPTY, _S.ONGOING, _S.DEAD}),
    _S.ONGOING: frozenset({_S.ONGOING, _S.PREPARE_COMMIT, _S.PREPARE_ABORT}),
    _S.PREPARE_COMMIT: frozenset({_S.COMPLETE_COMMIT}),
    _S.PREPARE_ABORT: frozenset({_S.COMPLETE_ABORT}),
    _S.COMPLETE_COMMIT: frozenset({_S.ONGOING, _S.EMPTY, _S.DEAD}),
    _S.COMPLETE_ABORT: frozenset({_S.ONGOING, _S.EMPTY, _S.DEAD}),
    _S.DEAD: frozenset(),
}
# States in which the transaction's partitions no longer matter: forgotten on entry.
_PARTITIONS_CLEARED = frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT, _S.DEAD})


@dataclass
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TransactionState
    partitions: set[tuple[str, int]]
    txn_start_ms: int
    last_update_ms: int
    # The producer id this transactional id had before its epochs ran out, so the holder
    # of the old id is told it is fenced rather than that the id is unknown.
    previous_producer_id: int = NO_PRODUCER_ID
    # The Spark task attempt holding this id (docs/design.md, "The sink protocol"): its
    # sink (query id or batch-job id), the run that planned it (one per query start or
    # job), and the batch. Set by init_sink_producer, kept until the next epoch.
    sink_id: str = NO_SINK
    sink_run: str = NO_SINK
    sink_batch: int = NO_SINK_BATCH
    # The attempt's transaction holds all of its task's rows (prepare_sink_txn): a later
    # attempt of the same task *of the same run* reuses it instead of fencing it, so a
    # speculative twin or a retry after a late failure never aborts a finished attempt.
    sink_prepared: bool = False
    # Where the prepared transaction's rows are: (topic, partition, first offset, last
    # offset), so the sink commit can tell readers which offsets belong to one batch.
    sink_ranges: list[tuple[str, int, int, int]] = dataclasses.field(default_factory=list)
    # Why the coordinator itself last bumped the epoch (a timeout, a superseded run, an
    # operator's abort): the fenced holder's error says so instead of "another producer".
    fence_reason: str = ""
    # The producer id and epoch of the transaction the last EndTxn ended (each ends at its
    # own epoch: the markers carry the next one, KIP-890): a retry of that request is
    # answered as it was, and a late one never reaches the transaction after it.
    ended_producer_id: int = NO_PRODUCER_ID
    ended_producer_epoch: int = NO_PRODUCER_EPOCH

    def transition(self, new: TransactionState, now_ms: int) -> None:
        """Move to ``new``, or raise :class:`InvalidTxnStateError` naming both states."""
        old = self.state
        if not old.can_transition_to(new):
            raise InvalidTxnStateError(
                f"transactional id {self.transactional_id!r} (producer id {self.producer_id}, "
                f"epoch {self.producer_epoch}) cannot go from {old.name} to {new.name}"
            )
        if new is _S.ONGOING and old is not _S.ONGOING:
            self.txn_start_ms = now_ms  # a new transaction begins
            self.partitions = set()
        if new in _PARTITIONS_CLEARED:
            self.partitions = set()
        if new is _S.EMPTY or (new is _S.ONGOING and old.is_complete):
            # A new epoch, or a new transaction after one ended: it holds no task's rows.
            self.sink_prepared = False
            self.sink_ranges = []
        self.state = new
        self.last_update_ms = now_ms

    def copy(self) -> TransactionMetadata:
        return dataclasses.replace(
            self, partitions=set(self.partitions), sink_ranges=list(self.sink_ranges)
        )

    @property
    def holds_attempt(self) -> bool:
        """A sink task attempt holds this id and has not ended its transaction."""
        return self.sink_id != NO_SINK and self.state in (_S.EMPTY, _S.ONGOING)

    def sorted_partitions(self) -> list[tuple[str, int]]:
        return sorted(self.partitions)

    def to_json(self) -> bytes:
        doc = {
            "version": RECORD_VERSION,
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "previous_producer_id": self.previous_producer_id,
            "timeout_ms": self.timeout_ms,
            "state": self.state.name,
            "partitions": [[t, p] for t, p in self.sorted_partitions()],
            "txn_start_ms": self.txn_start_ms,
            "last_update_ms": self.last_update_ms,
            "sink_id": self.sink_id,
            "sink_run": self.sink_run,
            "sink_batch": self.sink_batch,
            "sink_prepared": self.sink_prepared,
            "sink_ranges": [list(r) for r in self.sink_ranges],
            "fence_reason": self.fence_reason,
            "ended_producer_id": self.ended_producer_id,
            "ended_producer_epoch": self.ended_producer_epoch,
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> TransactionMetadata:
        doc = _decode(data, where)
        try:
            state = TransactionState[_get(doc, "state", str, where)]
        except KeyError:
            raise CorruptRecordError(f"{where}: unknown state {doc['state']!r}") from None
        return cls(
            transactional_id=_get(doc, "transactional_id", str, where),
            producer_id=_get(doc, "producer_id", int, where),
            producer_epoch=_get(doc, "producer_epoch", int, where),
            timeout_ms=_get(doc, "timeout_ms", int, where),
            state=state,
            partitions=_partitions(_get(doc, "partitions", list, where), where),
            txn_start_ms=_get(doc, "txn_start_ms", int, where),
            last_update_ms=_get(doc, "last_update_ms", int, where),
            previous_producer_id=_get(doc, "previous_producer_id", int, where),
            # Absent in records written before sinks prepared transactions.
            sink_id=_optional(doc, "sink_id", str, where, NO_SINK),
            sink_run=_optional(doc, "sink_run", str, where, NO_SINK),
            sink_batch=_optional(doc, "sink_batch", int, where, NO_SINK_BATCH),
            sink_prepared=_optional(doc, "sink_prepared", bool, where, False),
            sink_ranges=_ranges(_optional(doc, "sink_ranges", list, where, []), where),
            fence_reason=_optional(doc, "fence_reason", str, where, ""),
            # Absent in records written before each transaction had its own epoch.
            ended_producer_id=_optional(doc, "ended_producer_id", int, where, NO_PRODUCER_ID),
            ended_producer_epoch=_optional(
                doc, "ended_producer_epoch", int, where, NO_PRODUCER_EPOCH
            ),
        )


class SinkCommitState(StrEnum):
    PREPARE = "PREPARE"  # commit of this batch decided; its transactions may lack markers
    COMPLETE = "COMPLETE"  # every transaction of this batch is committed


_SINK_STATES = frozenset(s.value for s in SinkCommitState)
# Where a transaction of a decided sink commit may be: not yet, being or already committed
# (EMPTY: a task whose transaction wrote nothing).
_DECIDED_MEMBER_STATES = frozenset({_S.ONGOING, _S.PREPARE_COMMIT, _S.COMPLETE_COMMIT, _S.EMPTY})


@dataclass
class SinkCommitRecord:
    sink_id: str
    batch_id: int
    state: str  # a SinkCommitState value
    transactions: list[tuple[str, int, int]]  # (transactional_id, producer_id, producer_epoch)
    # Where this batch's rows are, one (topic, partition, first, last) per partition: the
    # readers' cut keeps the batch whole (docs/design.md §7). O(partitions): never the
    # other batches' (a batch still unsettled when a later one commits gets a
    # SinkBatchRecord of its own).
    ranges: list[tuple[str, int, int, int]] = dataclasses.field(default_factory=list)
    # Read from records written before SinkBatchRecords existed (every committed batch of
    # the sink readers might still see in part): tracked on load, never written again.
    unsettled: list[tuple[int, list[tuple[str, int, int, int]]]] = dataclasses.field(
        default_factory=list
    )
    # When the coordinator last wrote this record (0 in records written before it was
    # kept): the sink's idleness, for its expiry (docs/design.md, "Expiry").
    last_update_ms: int = 0
    # The sink is one df.write job (sink id ``batch-<run id>``, committed once by that
    # run), not a streaming query that a restart from its checkpoint commits again: its
    # record expires with its transactional ids (docs/failure-model.md, "Expiry").
    batch_job: bool = False

    def __post_init__(self) -> None:
        if self.state not in _SINK_STATES:
            raise ValueError(
                f"sink {self.sink_id!r}: state {self.state!r} is not one of "
                f"{', '.join(SinkCommitState)}"
            )

    @property
    def is_pending(self) -> bool:
        return self.state == SinkCommitState.PREPARE

    def to_json(self) -> bytes:
        doc = {
            "version": RECORD_VERSION,
            "sink_id": self.sink_id,
            "batch_id": self.batch_id,
            "state": str(self.state),
            "transactions": [list(t) for t in self.transactions],
            "ranges": [list(r) for r in self.ranges],
            "last_update_ms": self.last_update_ms,
            "batch_job": self.batch_job,
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> SinkCommitRecord:
        doc = _decode(data, where)
        state = _get(doc, "state", str, where)
        if state not in _SINK_STATES:
            raise CorruptRecordError(f"{where}: unknown sink state {state!r}")
        transactions: list[tuple[str, int, int]] = []
        for item in _get(doc, "transactions", list, where):
            if (
                not isinstance(item, list)
                or len(item) != 3
                or not isinstance(item[0], str)
                or not all(_is_int(v) for v in item[1:])
            ):
                raise CorruptRecordError(
                    f"{where}: transaction {item!r} is not [transactional_id, pid, epoch]"
                )
            transactions.append((item[0], item[1], item[2]))
        unsettled: list[tuple[int, list[tuple[str, int, int, int]]]] = []
        for item in _optional(doc, "unsettled", list, where, []):
            if (
                not isinstance(item, list)
                or len(item) != 2
                or not _is_int(item[0])
                or not isinstance(item[1], list)
            ):
                raise CorruptRecordError(f"{where}: unsettled {item!r} is not [batch, ranges]")
            unsettled.append((item[0], _ranges(item[1], where)))
        sink_id = _get(doc, "sink_id", str, where)
        return cls(
            sink_id=sink_id,
            batch_id=_get(doc, "batch_id", int, where),
            state=state,
            transactions=transactions,
            ranges=_ranges(_optional(doc, "ranges", list, where, []), where),
            unsettled=unsettled,
            # Absent in records written before sinks expired.
            last_update_ms=_optional(doc, "last_update_ms", int, where, 0),
            batch_job=_optional(
                doc, "batch_job", bool, where, sink_id.startswith(BATCH_JOB_SINK_PREFIX)
            ),
        )

    def decided_member(
        self, tid: str, pid: int, epoch: int, meta: TransactionMetadata | None
    ) -> TransactionMetadata:
        """``meta``, the state of transaction ``(tid, pid, epoch)`` this decided commit
        names, if still where the decision left it; else InvalidTxnStateError."""
        found = "unknown" if meta is None else None
        if meta is not None and (meta.producer_id, meta.producer_epoch) != (pid, epoch):
            found = f"at producer id {meta.producer_id} epoch {meta.producer_epoch}"
        elif meta is not None and meta.state not in _DECIDED_MEMBER_STATES:
            found = meta.state.name
        if meta is None or found is not None:
            # Cannot happen while the invariant holds (a transaction named in a decided
            # commit is never fenced): completing the record anyway would report rows
            # committed that are not, so the sink stops here, loudly.
            raise InvalidTxnStateError(
                f"sink {self.sink_id!r} batch {self.batch_id}: the commit is decided "
                f"but transactional id {tid!r} (producer id {pid} epoch {epoch}) is now "
                f"{found}; the commit cannot be completed and none of the batch's rows is "
                "committed. This is a bug: keep the broker's logs and data directory"
            )
        return meta

    def batches(self) -> list[tuple[int, list[tuple[str, int, int, int]]]]:
        """(batch id, ranges) of every batch this record names: its own, and those of an
        old record's ``unsettled``."""
        found = {b: ranges for b, ranges in self.unsettled}
        if self.ranges:
            found[self.batch_id] = self.ranges
        return sorted(found.items())


@dataclass(frozen=True)
class SinkBatchRecord:
    """A committed sink batch readers may still see in part, recorded on its own once a
    later batch of the sink commits (the sink's record then names only the later one).

    Removed once markers report every partition's LSO past its ranges. Bound: one per
    batch committed while some partition of the sink's topics had its LSO held back (by
    an open transaction: at most transaction.max.timeout.ms of batches)."""

    sink_id: str
    batch_id: int
    ranges: list[tuple[str, int, int, int]]

    @property
    def key(self) -> str:
        """The record's key in the log store: ``<batch id>/<sink id>`` (a sink id may hold
        any character; the batch id never holds '/')."""
        return f"{self.batch_id}/{self.sink_id}"

    def to_json(self) -> bytes:
        doc = {
            "version": RECORD_VERSION,
            "sink_id": self.sink_id,
            "batch_id": self.batch_id,
            "ranges": [list(r) for r in self.ranges],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> SinkBatchRecord:
        doc = _decode(data, where)
        return cls(
            _get(doc, "sink_id", str, where),
            _get(doc, "batch_id", int, where),
            _ranges(_get(doc, "ranges", list, where), where),
        )


def merge_ranges(ranges: Iterable[tuple[str, int, int, int]]) -> list[tuple[str, int, int, int]]:
    """One (topic, partition, first, last) per partition, spanning all of ``ranges`` there.

    Keeps a sink record O(partitions) whatever the number of tasks, and changes no cut: a
    batch is below an end iff every last offset is, above iff every first offset is."""
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    for topic, partition, first, last in ranges:
        old = spans.get((topic, partition))
        spans[(topic, partition)] = (
            (first, last) if old is None else (min(old[0], first), max(old[1], last))
        )
    return [(t, p, first, last) for (t, p), (first, last) in sorted(spans.items())]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _decode(data: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(bytes(data))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptRecordError(f"{where}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise CorruptRecordError(f"{where}: not a JSON object")
    if doc.get("version") != RECORD_VERSION:
        raise CorruptRecordError(f"{where}: unsupported version {doc.get('version')!r}")
    return doc


def _get(doc: dict[str, Any], name: str, kind: type, where: str) -> Any:
    value = doc.get(name)
    ok = _is_int(value) if kind is int else isinstance(value, kind)
    if not ok:
        raise CorruptRecordError(f"{where}: field {name!r} is missing or not {kind.__name__}")
    return value


def _optional(doc: dict[str, Any], name: str, kind: type, where: str, default: Any) -> Any:
    return _get(doc, name, kind, where) if name in doc else default


def _ranges(items: Iterable[object], where: str) -> list[tuple[str, int, int, int]]:
    result: list[tuple[str, int, int, int]] = []
    for item in items:
        if (
            not isinstance(item, list)
            or len(item) != 4
            or not isinstance(item[0], str)
            or not all(_is_int(v) for v in item[1:])
        ):
            raise CorruptRecordError(
                f"{where}: offset range {item!r} is not [topic, partition, first, last]"
            )
        result.append((item[0], item[1], item[2], item[3]))
    return result


def _partitions(items: Iterable[object], where: str) -> set[tuple[str, int]]:
    result: set[tuple[str, int]] = set()
    for item in items:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not _is_int(item[1])
        ):
            raise CorruptRecordError(f"{where}: partition {item!r} is not [topic, partition]")
        result.add((item[0], item[1]))
    return result
