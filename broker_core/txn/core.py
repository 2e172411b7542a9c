"""The transaction coordinator's state and the durable steps its requests are made of.

:class:`TransactionCoordinator` (``txn.coordinator``) is the public face and holds:

* :class:`~broker_core.txn.visibility.VisibilityTracker` -- the committed sink batches
  readers may still see in part, and the consistent cut a read_committed reader stops at;
* :class:`~broker_core.txn.marker_sender.MarkerSender` -- the marker writes of one
  transaction, retried under one :class:`~broker_core.retry.RetryPolicy`;
* :class:`CoordinatorCore` (here) -- the in-memory maps, the claims that serialise requests
  per id, the lifecycle, and the steps every request is made of: a durable transition, the
  markers, and finishing what an earlier request (or a previous coordinator) left half done.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from broker_core.errors import (
    ConcurrentTransactionsError,
    CoordinatorNotAvailableError,
    IdemlogError,
    InvalidProducerIdMappingError,
    InvalidTxnStateError,
    NotCoordinatorError,
    ProducerFencedError,
)
from broker_core.record.batch import NO_PRODUCER_EPOCH, NO_PRODUCER_ID
from broker_core.txn.claims import Claims
from broker_core.txn.index import StateIndex
from broker_core.txn.marker_sender import MarkerSender
from broker_core.txn.sink_batches import UnsettledBatches
from broker_core.txn.state import (
    MAX_CLIENT_EPOCH,
    NO_SINK,
    SinkCommitRecord,
    SinkCommitState,
    TransactionMetadata,
    TransactionState,
)
from broker_core.txn.state_store import CoordinatorEpochFencedError, TxnStateStore
from broker_core.txn.status import (
    COUNTERS,
    STATUS_TRANSITIONS,
    CoordinatorStatus,
    ProducerIdSource,
)
from broker_core.txn.visibility import VisibilityTracker

log = logging.getLogger("idemlog.txn")

_S = TransactionState


_TXN = "transactional id"


class CoordinatorCore:
    """The coordinator's state and the durable steps requests are made of.

    Decisions are stored in ``store`` at ``coordinator_epoch`` before they take effect;
    markers go through ``sender``; sink batches are tracked in ``visibility``; producer
    ids come from ``pids``; ``clock()`` is the time in ms. Callers of the steps hold the
    claims (:meth:`claims`) of the ids they change.
    """

    def __init__(
        self,
        store: TxnStateStore,
        pids: ProducerIdSource,
        sender: MarkerSender,
        visibility: VisibilityTracker,
        *,
        coordinator_epoch: int,
        clock: Callable[[], int] | None = None,
        id_expiration_ms: int = 604_800_000,
    ) -> None:
        self._store = store
        self._pids = pids
        self._sender = sender
        self._visibility = visibility
        self.coordinator_epoch = coordinator_epoch
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._lock = threading.Lock()
        self._status = CoordinatorStatus.LOADING
        self._txns: dict[str, TransactionMetadata] = {}
        self._sinks: dict[str, SinkCommitRecord] = {}
        self._index = StateIndex()
        # Ids durably DEAD whose record's removal has not succeeded yet (retried by the
        # expiry pass; a new init of the id replaces it): at most the ids of failed passes.
        self._dead: dict[str, TransactionMetadata] = {}
        self.id_expiration_ms = id_expiration_ms
        self._busy: set[tuple[str, str]] = set()
        self.batches = UnsettledBatches(store, visibility, coordinator_epoch)
        # Sink runs: the run each sink was last seen in (a new one retires the others'
        # leftovers), and when each (sink, run) last showed life; in memory only: after a
        # restart every sink transaction gets a full timeout from the load (_loaded_ms).
        self._sink_runs: dict[str, str] = {}
        self._run_alive_ms: dict[tuple[str, str], int] = {}
        self._loaded_ms = 0
        self._counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    # -- lifecycle ---------------------------------------------------------------------
    def _set_status(self, new: CoordinatorStatus, *, idempotent: bool = False) -> None:
        with self._lock:
            if idempotent and new is self._status:
                return
            if new not in STATUS_TRANSITIONS[self._status]:
                raise InvalidTxnStateError(
                    f"coordinator cannot go from {self._status.name} to {new.name}"
                )
            self._status = new

    @property
    def status(self) -> CoordinatorStatus:
        return self._status

    def load(self) -> tuple[list[SinkCommitRecord], list[str]]:
        """Load the stored state and start RUNNING; returns what is left half done: the
        pending sink records and the transactional ids in a PREPARE state.

        Raises InvalidTxnStateError unless LOADING; a failed load leaves it LOADING."""
        if self._status is not CoordinatorStatus.LOADING:
            raise InvalidTxnStateError(f"start() on a coordinator that is {self._status.name}")
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
            # Sink runs beat in memory only: every sink transaction gets a full timeout
            # from now, rather than being aborted for the time this coordinator was away.
            self._loaded_ms = self._clock()
        for record in sinks.values():
            self._visibility.track_record(record)
        self.batches.load()
        self._set_status(CoordinatorStatus.RUNNING)
        return self.unfinished()

    def close(self) -> None:
        """CLOSED from now on (NOT_COORDINATOR) and marker retries cut short. Idempotent."""
        self._set_status(CoordinatorStatus.CLOSED, idempotent=True)
        self._sender.stop()

    def check_running(self) -> None:
        """Raises CoordinatorNotAvailableError while loading, NotCoordinatorError once closed."""
        status = self._status
        if status is CoordinatorStatus.LOADING:
            raise CoordinatorNotAvailableError(
                "the transaction coordinator is still loading its state"
            )
        if status is CoordinatorStatus.CLOSED:
            raise NotCoordinatorError("the transaction coordinator was closed")

    def now(self) -> int:
        return self._clock()

    def new_producer_id(self) -> int:
        return self._pids.generate_producer_id()

    # -- reading the state -------------------------------------------------------------
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

    def current_run(self, sink_id: str) -> str | None:
        with self._lock:
            return self._sink_runs.get(sink_id)

    def set_run(self, sink_id: str, run_id: str) -> None:
        with self._lock:
            self._sink_runs[sink_id] = run_id

    def describe(self) -> dict[str, Any]:
        """Counts by state, sinks, tracked batches and the counters, for the metrics."""
        with self._lock:
            by_state = dict.fromkeys((s.name for s in TransactionState), 0)
            for meta in self._txns.values():
                by_state[meta.state.name] += 1
            return {
                "status": self._status.value,
                "coordinator_epoch": self.coordinator_epoch,
                "transactional_ids": len(self._txns),
                "by_state": by_state,
                "open_transactions": by_state[_S.ONGOING.name],
                "sinks": len(self._sinks),
                "sinks_pending": len(self._index.pending_sinks()),
                "sink_batches_tracked": self._visibility.count(),
                "sink_runs_alive": len(self._run_alive_ms),
                "transactional_ids_dead": len(self._dead),
                **self._counters,
                "marker_retries": self._sender.retries,
            }

    # -- building blocks (callers hold the claims of the ids they change) ------------------
    @contextlib.contextmanager
    def claims(self) -> Iterator[Claims]:
        """The claims of one request, released when the block ends."""
        claims = Claims(self._lock, self._busy)
        try:
            yield claims
        finally:
            claims.release()

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] += n

    def meta(self, tid: str) -> TransactionMetadata | None:
        with self._lock:
            return self._txns.get(tid)

    def sink_record(self, sid: str) -> SinkCommitRecord | None:
        with self._lock:
            return self._sinks.get(sid)

    def persist(self, meta: TransactionMetadata) -> TransactionMetadata:
        """Store ``meta`` durably, then make it the current state (never the other way)."""
        with self._fenced_closes():
            self._store.put_transaction(meta, coordinator_epoch=self.coordinator_epoch)
        with self._lock:
            self._index.replace_txn(self._txns.get(meta.transactional_id), meta)
            self._txns[meta.transactional_id] = meta
            self._dead.pop(meta.transactional_id, None)
        return meta

    def persist_all(self, metas: list[TransactionMetadata]) -> None:
        """:meth:`persist` for many, in one write of the store where it can."""
        with self._fenced_closes():
            self._store.put_transactions(metas, coordinator_epoch=self.coordinator_epoch)
        with self._lock:
            for meta in metas:
                self._index.replace_txn(self._txns.get(meta.transactional_id), meta)
                self._txns[meta.transactional_id] = meta
                self._dead.pop(meta.transactional_id, None)

    def persist_sink(self, record: SinkCommitRecord) -> None:
        # Tracked before it is durable: a reader's cut must know a batch before any of
        # its markers can be written, and a record that failed to store is only extra.
        # (Not again on COMPLETE: its markers may have settled it already.)
        if record.is_pending:
            self._visibility.track_record(record)
        record.last_update_ms = self._clock()  # the sink's idleness, for its expiry
        with self._fenced_closes():
            self._store.put_sink(record, coordinator_epoch=self.coordinator_epoch)
        with self._lock:
            self._index.replace_sink(self._sinks.get(record.sink_id), record)
            self._sinks[record.sink_id] = record

    # -- expiry (decided by txn.expiry; callers hold the claims) ---------------------------
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

    def sink_tracked(self, record: SinkCommitRecord) -> bool:
        """A committed batch of the sink is still tracked for the readers' cut."""
        return bool(self._visibility.unsettled_of(record.sink_id))

    def dead(self, tid: str) -> TransactionMetadata | None:
        """The id's DEAD state if its removal is still to be done."""
        with self._lock:
            return self._dead.get(tid)

    def remove(self, meta: TransactionMetadata) -> None:
        """The id goes DEAD (durably), then its record is removed from the store and from
        memory. A failed removal leaves it DEAD: absent to requests, retried next pass."""
        tid = meta.transactional_id
        if meta.state is not _S.DEAD:
            dead = self._transitioned(meta, _S.DEAD)
            with self._fenced_closes():
                self._store.put_transaction(dead, coordinator_epoch=self.coordinator_epoch)
            with self._lock:
                self._index.replace_txn(self._txns.pop(tid, None), None)
                self._dead[tid] = dead
                self._counters["transactional_ids_expired"] += 1
        with self._fenced_closes():
            self._store.delete_transaction(tid, coordinator_epoch=self.coordinator_epoch)
        with self._lock:
            self._dead.pop(tid, None)

    def remove_sink(self, record: SinkCommitRecord) -> None:
        """The sink's record is removed from the store, then from memory."""
        with self._fenced_closes():
            self._store.delete_sink(record.sink_id, coordinator_epoch=self.coordinator_epoch)
        with self._lock:
            self._index.replace_sink(self._sinks.pop(record.sink_id, None), None)
            self._sink_runs.pop(record.sink_id, None)
            self._counters["sinks_expired"] += 1

    def run_beat(self, meta: TransactionMetadata) -> int:
        """When a task of the run holding ``meta`` last wrote or beat (0: unknown)."""
        with self._lock:
            return self._run_alive_ms.get((meta.sink_id, meta.sink_run), 0)

    # -- sink runs -----------------------------------------------------------------------
    def touch_run(self, sink_id: str, run_id: str, now_ms: int) -> None:
        with self._lock:
            self._run_alive_ms[(sink_id, run_id)] = now_ms

    def forget_runs_older_than(self, oldest_ms: int) -> None:
        """Drop the liveness of runs silent since before ``oldest_ms`` (one per batch job
        and query start would pile up otherwise). Safe once that is longer ago than any
        timeout: their transactions count as expired with or without the entry."""
        with self._lock:
            gone = [key for key, beat in self._run_alive_ms.items() if beat < oldest_ms]
            for sink_id, run_id in gone:
                del self._run_alive_ms[(sink_id, run_id)]
                if self._sink_runs.get(sink_id) == run_id:
                    del self._sink_runs[sink_id]

    def alive_since(self, meta: TransactionMetadata) -> int:
        """When the transaction last showed life, for its timeout.

        A sink task's transaction lives as long as any task of its run writes or beats
        (docs/design.md, "Long batches"); any other transaction counts from its start.
        """
        if meta.sink_id == NO_SINK:
            return meta.txn_start_ms
        with self._lock:
            beat = self._run_alive_ms.get((meta.sink_id, meta.sink_run), 0)
        return max(meta.txn_start_ms, beat, self._loaded_ms)

    def bumped(
        self, meta: TransactionMetadata, reason: str = "", *, bump: bool = True
    ) -> TransactionMetadata:
        """``meta`` at the next epoch (``bump=False``: at its epoch, already bumped by an
        abort's markers), EMPTY, held by no sink attempt; a new producer id once the
        epochs run out."""
        new = meta.copy()
        new.transition(_S.EMPTY, self._clock())
        new.sink_id = new.sink_run = NO_SINK
        new.fence_reason = reason
        # A new holder: no EndTxn before this is a retry of one it may answer.
        new.ended_producer_id, new.ended_producer_epoch = NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        self._move_to_epoch(new, meta.producer_epoch + 1 if bump else meta.producer_epoch)
        return new

    def _move_to_epoch(self, new: TransactionMetadata, epoch: int) -> None:
        """Set ``new`` at ``epoch``, or at a new producer id with epoch 0 once the epochs
        run out."""
        if epoch <= MAX_CLIENT_EPOCH:
            new.producer_epoch = epoch
            return
        old = new.producer_id
        new.previous_producer_id = old
        new.producer_id = self._pids.generate_producer_id()
        new.producer_epoch = 0
        self.count("producer_id_rotations")
        log.info(
            "%s %r: epochs of producer id %d exhausted, new producer id %d",
            _TXN,
            new.transactional_id,
            old,
            new.producer_id,
        )

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

    @contextlib.contextmanager
    def _fenced_closes(self) -> Iterator[None]:
        """A store refusing this coordinator's epoch means a newer coordinator took over:
        stop serving (NOT_COORDINATOR from now on, marker retries cut short)."""
        try:
            yield
        except CoordinatorEpochFencedError as exc:
            self._stand_down(exc)
            raise

    def _stand_down(self, exc: CoordinatorEpochFencedError) -> None:
        if self._status is not CoordinatorStatus.CLOSED:
            log.error(
                "transaction coordinator of epoch %d was replaced by a newer one; it stops "
                "serving: %s",
                self.coordinator_epoch,
                exc.message,
            )
        self._set_status(CoordinatorStatus.CLOSED, idempotent=True)
        self._sender.stop()

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

    def _transitioned(
        self,
        meta: TransactionMetadata,
        state: TransactionState,
        epoch: int | None = None,
        reason: str | None = None,
    ) -> TransactionMetadata:
        new = meta.copy()
        new.transition(state, self._clock())
        if epoch is not None:
            new.producer_epoch = epoch
        if reason is not None:
            new.fence_reason = reason
        return new

    def end(
        self,
        meta: TransactionMetadata,
        commit: bool,
        epoch: int | None = None,
        reason: str | None = None,
        ended: tuple[int, int] | None = None,
    ) -> TransactionMetadata:
        """ONGOING -> PREPARE_x (durable, optionally at a bumped epoch) -> markers -> COMPLETE_x.
        ``ended``: the producer id and epoch of the EndTxn that ends it, recorded with the
        decision so that a retry of that request is known as one; without it (the
        coordinator's own abort) no earlier EndTxn is a retry of this end."""
        prepare = _S.PREPARE_COMMIT if commit else _S.PREPARE_ABORT
        new = self._transitioned(meta, prepare, epoch, reason)
        new.ended_producer_id, new.ended_producer_epoch = (
            ended if ended is not None else (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
        )
        return self.complete(self.persist(new))

    def renewed_if_exhausted(self, meta: TransactionMetadata) -> TransactionMetadata:
        """``meta`` (ended at ``MAX_CLIENT_EPOCH + 1``) with a new producer id at epoch 0,
        its state kept, once its epochs ran out; else ``meta`` as it is."""
        if meta.producer_epoch <= MAX_CLIENT_EPOCH:
            return meta
        new = meta.copy()
        self._move_to_epoch(new, meta.producer_epoch)
        return self.persist(new)

    def complete(self, meta: TransactionMetadata) -> TransactionMetadata:
        """PREPARE_x -> markers -> COMPLETE_x; on failure it stays PREPARE_x and raises."""
        commit = meta.state is _S.PREPARE_COMMIT
        self._send_markers([meta], commit)
        done = self.persist(
            self._transitioned(meta, _S.COMPLETE_COMMIT if commit else _S.COMPLETE_ABORT)
        )
        self.count("transactions_committed" if commit else "transactions_aborted")
        return done

    def _send_markers(self, metas: list[TransactionMetadata], commit: bool) -> None:
        with self._fenced_closes():
            lsos = self._sender.send_all(metas, commit)
        # The LSO each partition reports after its markers: batches wholly below it no
        # longer need tracking for the readers' cut, nor their own records.
        self.batches.forget(self._visibility.settled_by(lsos))

    def pending_sink_holding(self, meta: TransactionMetadata) -> SinkCommitRecord | None:
        """The pending sink record that names this transaction, if any: it must commit."""
        key = (meta.transactional_id, meta.producer_id, meta.producer_epoch)
        with self._lock:
            sink_id = self._index.holder(key)
            return None if sink_id is None else self._sinks[sink_id]

    def settle(self, claims: Claims, tid: str) -> TransactionMetadata | None:
        """Finish what earlier requests left half done for ``tid``, and return its state."""
        meta = self.meta(tid)
        if meta is None:
            return None
        record = self.pending_sink_holding(meta)
        if record is not None:
            self.finish_sink(claims, record)
            meta = self.meta(tid) or meta  # held by a pending record: never expired
        if meta.state.is_prepare:
            meta = self.complete(meta)
        return meta

    def settled(self, claims: Claims, tid: str) -> TransactionMetadata:
        """:meth:`_settle` for an id the caller knows exists (checked by :meth:`_require`)."""
        meta = self.settle(claims, tid)
        if meta is None:
            raise InvalidProducerIdMappingError(f"{_TXN} {tid!r} is unknown to the coordinator")
        return meta

    def finish_sink(self, claims: Claims, record: SinkCommitRecord) -> None:
        """Commit every transaction of a PREPARE sink record, then mark it COMPLETE."""
        claims.sink(record.sink_id)
        current = self.sink_record(record.sink_id)
        if current is None or not current.is_pending or current.batch_id != record.batch_id:
            return  # finished (and maybe succeeded) by a request that held it meanwhile
        record = current
        for tid, _, _ in record.transactions:
            claims.txn(tid)
        # Every transaction is checked before any is committed: a broken one leaves the
        # whole batch uncommitted (and the record PREPARE), never part of it.
        metas = [record.decided_member(*txn, self.meta(txn[0])) for txn in record.transactions]
        ending = [m for m in metas if m.state in (_S.ONGOING, _S.PREPARE_COMMIT)]
        if ending:
            # The sink record's PREPARE is the decision for all of them (no PREPARE_COMMIT
            # of their own): every partition gets all its markers in one append, then
            # every COMPLETE_COMMIT goes in one write of the store.
            self._send_markers(ending, commit=True)
            now = self._clock()
            done = [m.copy() for m in ending]
            for new in done:
                if new.state is _S.ONGOING:
                    new.transition(_S.PREPARE_COMMIT, now)
                new.transition(_S.COMPLETE_COMMIT, now)
            self.persist_all(done)
            self.count("transactions_committed", len(done))
        self.persist_sink(
            SinkCommitRecord(
                record.sink_id,
                record.batch_id,
                SinkCommitState.COMPLETE,
                record.transactions,
                record.ranges,
                batch_job=record.batch_job,
            )
        )

    def abort_if_open(self, claims: Claims, tid: str, producer_id: int, epoch: int) -> None:
        """Abort the transaction if it is still open at exactly (producer_id, epoch)."""
        meta = self.meta(tid)
        if meta is None or (meta.producer_id, meta.producer_epoch) != (producer_id, epoch):
            return  # unknown, or a newer holder fenced it (and aborted what was open)
        meta = self.settle(claims, tid)
        if meta is not None and meta.state is _S.ONGOING:
            self.end(meta, commit=False)

    def recover_sink(self, record: SinkCommitRecord) -> None:
        """Finish a pending sink commit; on failure it stays pending for a later call."""
        try:
            with self.claims() as claims:
                self.finish_sink(claims, record)
        except ConcurrentTransactionsError:
            pass  # another request holds it, and finishes it
        except IdemlogError as exc:
            log.error("could not finish the commit of sink %r yet: %s", record.sink_id, exc)

    def recover_txn(self, transactional_id: str) -> None:
        """Finish a PREPARE_x transaction; on failure it stays so for a later call."""
        try:
            with self.claims() as claims:
                claims.txn(transactional_id)
                self.settle(claims, transactional_id)
        except ConcurrentTransactionsError:
            pass  # another request holds it, and finishes it
        except IdemlogError as exc:
            log.error("could not finish %s %r yet: %s", _TXN, transactional_id, exc)
