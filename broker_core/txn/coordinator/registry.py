"""The coordinator's transactional ids and sink records: the maps, their index, the
claims that serialise requests per id, and their durable writes.

Kafka's transaction state manager is the model: a change is written to the store at the
coordinator's epoch first and becomes the state in memory only once it is durable, never
the other way round; a store refusing the epoch closes the coordinator
(:meth:`~broker_core.txn.coordinator.lifecycle.CoordinatorLifecycle.fenced`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from broker_core.errors import (
    InvalidProducerIdMappingError,
    InvalidTxnStateError,
    ProducerFencedError,
)
from broker_core.txn.coordinator.claims import Claims
from broker_core.txn.coordinator.index import StateIndex
from broker_core.txn.coordinator.lifecycle import CoordinatorLifecycle
from broker_core.txn.state_topic.records import (
    SinkCommitRecord,
    TransactionMetadata,
    TransactionState,
)
from broker_core.txn.state_topic.store import TxnStateStore

_S = TransactionState
_TXN = "transactional id"


@dataclass(frozen=True)
class RegistryCounts:
    """What the registry holds, for the metrics."""

    by_state: dict[str, int]
    transactional_ids: int
    sinks: int
    sinks_pending: int
    transactional_ids_dead: int  # DEAD, their removal still to be done


class TransactionRegistry:
    """Every transactional id's state and every sink's record, stored in ``store`` at
    ``coordinator_epoch`` before they change here (a store refusing the epoch closes
    ``lifecycle``). ``clock()`` is the time in ms;
    ``id_expiration_ms`` is named to a producer whose id expired.

    One lock guards the maps, the index and the claims' set; callers of the writes hold
    the claims (:meth:`claims`) of the ids they change.
    """

    def __init__(
        self,
        store: TxnStateStore,
        lifecycle: CoordinatorLifecycle,
        clock: Callable[[], int],
        *,
        coordinator_epoch: int,
        id_expiration_ms: int,
    ) -> None:
        self._store = store
        self._lifecycle = lifecycle
        self._clock = clock
        self._epoch = coordinator_epoch
        self.id_expiration_ms = id_expiration_ms
        self._lock = threading.Lock()
        self._txns: dict[str, TransactionMetadata] = {}
        self._sinks: dict[str, SinkCommitRecord] = {}
        self._index = StateIndex()
        # Ids durably DEAD whose record's removal has not succeeded yet (retried by the
        # expiry pass; a new init of the id replaces it): at most the ids of failed passes.
        self._dead: dict[str, TransactionMetadata] = {}
        self._busy: set[tuple[str, str]] = set()

    def load(self) -> list[SinkCommitRecord]:
        """Replace the maps by the store's state; returns the sink records loaded."""
        txns, sinks = self._store.load()
        with self._lock:
            # A crash between an id's DEAD record and its removal: removed by the next
            # expiry pass, absent to requests meanwhile.
            self._dead = {t: m for t, m in txns.items() if m.state is _S.DEAD}
            self._txns = {t: m for t, m in txns.items() if m.state is not _S.DEAD}
            self._sinks = dict(sinks)
            self._index = StateIndex()
            for meta in self._txns.values():
                self._index.replace_txn(None, meta)
            for record in self._sinks.values():
                self._index.replace_sink(None, record)
        return list(sinks.values())

    @contextlib.contextmanager
    def claims(self) -> Iterator[Claims]:
        """The claims of one request, released when the block ends."""
        claims = Claims(self._lock, self._busy)
        try:
            yield claims
        finally:
            claims.release()

    # -- reading -----------------------------------------------------------------------
    def meta(self, tid: str) -> TransactionMetadata | None:
        with self._lock:
            return self._txns.get(tid)

    def sink_record(self, sid: str) -> SinkCommitRecord | None:
        with self._lock:
            return self._sinks.get(sid)

    def dead(self, tid: str) -> TransactionMetadata | None:
        """The id's DEAD state if its removal is still to be done."""
        with self._lock:
            return self._dead.get(tid)

    def ongoing(self) -> list[TransactionMetadata]:
        """Copies of the transactions ONGOING now."""
        with self._lock:
            return [self._txns[tid].copy() for tid in self._index.ongoing()]

    def every_id(self) -> list[TransactionMetadata]:
        """Copies of every transactional id's state, by id (an operator's full list)."""
        with self._lock:
            return [self._txns[tid].copy() for tid in sorted(self._txns)]

    def unfinished(self) -> tuple[list[SinkCommitRecord], list[str]]:
        """Pending sink records and the ids in a PREPARE state (left by failed markers)."""
        with self._lock:
            stuck_sinks = [self._sinks[sid] for sid in self._index.pending_sinks()]
            return stuck_sinks, self._index.prepared()

    def expiry_candidates(
        self, before_ms: int
    ) -> tuple[list[TransactionMetadata], list[SinkCommitRecord]]:
        """Ids last changed before ``before_ms`` in a state that may expire (EMPTY,
        COMPLETE_*) or left DEAD, and the complete sink records none of whose ids remain.
        O(all ids): run once per expiry pass, never per request."""
        idle = (_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT)
        with self._lock:
            metas = [m for m in self._txns.values() if m.state in idle]
            metas = [m for m in metas if m.last_update_ms < before_ms]
            metas.extend(self._dead.values())
            sinks = [r for r in self._sinks.values() if not r.is_pending]
            sinks = [r for r in sinks if not self._index.has_ids(r.sink_id)]
        return metas, sinks

    def held_by_pending_sink(self, tid: str) -> bool:
        with self._lock:
            return self._index.held(tid)

    def sink_has_ids(self, sid: str) -> bool:
        with self._lock:
            return self._index.has_ids(sid)

    def pending_sink_holding(self, meta: TransactionMetadata) -> SinkCommitRecord | None:
        """The pending sink record that names this transaction, if any: it must commit."""
        key = (meta.transactional_id, meta.producer_id, meta.producer_epoch)
        with self._lock:
            sink_id = self._index.holder(key)
            return None if sink_id is None else self._sinks[sink_id]

    def attempts(
        self,
        target: Callable[[TransactionMetadata], bool],
        *,
        sink_id: str | None = None,
        run_id: str | None = None,
    ) -> list[TransactionMetadata]:
        """Sink attempts still holding an id that ``target`` selects, by transactional id,
        among the ids of ``sink_id`` or those ``run_id`` holds (one of them is needed:
        the scan is O(those ids), not O(all ids))."""
        with self._lock:
            if sink_id is not None:
                tids = self._index.ids_of_sink(sink_id)
            elif run_id is not None:
                tids = self._index.ids_of_run(run_id)
            else:
                raise InvalidTxnStateError("attempts() needs a sink_id or a run_id")
            metas = [self._txns[tid] for tid in tids]
        return [m for m in metas if m.holds_attempt and target(m)]

    def require(self, tid: str, producer_id: int, epoch: int) -> TransactionMetadata:
        """The id's state if (producer_id, epoch) is its current holder, else the error."""
        meta = self.meta(tid)
        if meta is None:
            raise InvalidProducerIdMappingError(
                f"{_TXN} {tid!r} is unknown to the coordinator: it was never initialised, or "
                f"it expired after transactional.id.expiration.ms={self.id_expiration_ms} "
                "without use; producer id "
                f"{producer_id} is no longer valid: initialise the producer again "
                "(init_transactions) for a new producer id"
            )
        if producer_id != meta.producer_id:
            if producer_id == meta.previous_producer_id:
                raise ProducerFencedError(
                    f"{_TXN} {tid!r}: producer id {producer_id} was replaced by "
                    f"{meta.producer_id} when its epochs ran out (fenced)"
                )
            raise InvalidProducerIdMappingError(
                f"{_TXN} {tid!r} belongs to producer id {meta.producer_id}, not {producer_id}"
            )
        if epoch != meta.producer_epoch:
            relation = "older" if epoch < meta.producer_epoch else "newer"
            why = meta.fence_reason or "another producer holds this id"
            raise ProducerFencedError(
                f"{_TXN} {tid!r}: producer id {producer_id} epoch {epoch} is {relation} than "
                f"the current epoch {meta.producer_epoch}: {why}"
            )
        return meta

    def counts(self) -> RegistryCounts:
        with self._lock:
            by_state = dict.fromkeys((s.name for s in TransactionState), 0)
            for meta in self._txns.values():
                by_state[meta.state.name] += 1
            return RegistryCounts(
                by_state,
                len(self._txns),
                len(self._sinks),
                len(self._index.pending_sinks()),
                len(self._dead),
            )

    # -- durable writes (the caller holds the claims) ----------------------------------
    def persist(self, meta: TransactionMetadata) -> TransactionMetadata:
        """Store ``meta`` durably, then make it the current state (never the other way)."""
        with self._lifecycle.fenced():
            self._store.put_transaction(meta, coordinator_epoch=self._epoch)
        with self._lock:
            self._index.replace_txn(self._txns.get(meta.transactional_id), meta)
            self._txns[meta.transactional_id] = meta
            self._dead.pop(meta.transactional_id, None)
        return meta

    def persist_all(self, metas: list[TransactionMetadata]) -> None:
        """:meth:`persist` for many, in one write of the store where it can."""
        with self._lifecycle.fenced():
            self._store.put_transactions(metas, coordinator_epoch=self._epoch)
        with self._lock:
            for meta in metas:
                self._index.replace_txn(self._txns.get(meta.transactional_id), meta)
                self._txns[meta.transactional_id] = meta
                self._dead.pop(meta.transactional_id, None)

    def persist_sink(self, record: SinkCommitRecord) -> None:
        """Store the sink's record durably, then make it the sink's current one."""
        record.last_update_ms = self._clock()  # the sink's idleness, for its expiry
        with self._lifecycle.fenced():
            self._store.put_sink(record, coordinator_epoch=self._epoch)
        with self._lock:
            self._index.replace_sink(self._sinks.get(record.sink_id), record)
            self._sinks[record.sink_id] = record

    def bury(self, meta: TransactionMetadata) -> None:
        """The id goes DEAD durably, then out of the maps (absent to requests), awaiting
        :meth:`delete`."""
        tid = meta.transactional_id
        dead = meta.copy()
        dead.transition(_S.DEAD, self._clock())
        with self._lifecycle.fenced():
            self._store.put_transaction(dead, coordinator_epoch=self._epoch)
        with self._lock:
            self._index.replace_txn(self._txns.pop(tid, None), None)
            self._dead[tid] = dead

    def delete(self, tid: str) -> None:
        """A DEAD id's record is removed from the store, then forgotten. A failed delete
        leaves it DEAD, to be deleted again."""
        with self._lifecycle.fenced():
            self._store.delete_transaction(tid, coordinator_epoch=self._epoch)
        with self._lock:
            self._dead.pop(tid, None)

    def remove_sink(self, record: SinkCommitRecord) -> None:
        """The sink's record is removed from the store, then from memory."""
        with self._lifecycle.fenced():
            self._store.delete_sink(record.sink_id, coordinator_epoch=self._epoch)
        with self._lock:
            self._index.replace_sink(self._sinks.pop(record.sink_id, None), None)
