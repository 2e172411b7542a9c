"""The durable steps every coordinator request is made of: a decision stored, the
markers written, and finishing what an earlier request (or a previous coordinator) left
half done.

``end``: ONGOING -> PREPARE_x (durable) -> markers -> COMPLETE_x; a sink's PREPARE record
is the decision for all its transactions (``finish_sink``); ``settle`` finishes what is
decided for an id before a request looks at it. The state they change is the
:class:`~broker_core.txn.coordinator.registry.TransactionRegistry`'s; the callers hold the claims.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker_core.errors import (
    ConcurrentTransactionsError,
    IdemlogError,
    InvalidProducerIdMappingError,
)
from broker_core.record.batch import NO_PRODUCER_EPOCH, NO_PRODUCER_ID
from broker_core.txn.coordinator.claims import Claims
from broker_core.txn.coordinator.counters import Counters
from broker_core.txn.coordinator.lifecycle import CoordinatorLifecycle, ProducerIdSource
from broker_core.txn.coordinator.marker_sender import MarkerSender
from broker_core.txn.coordinator.registry import TransactionRegistry
from broker_core.txn.coordinator.sink_batches import UnsettledBatches
from broker_core.txn.coordinator.visibility import VisibilityTracker
from broker_core.txn.state_topic.records import (
    MAX_CLIENT_EPOCH,
    NO_SINK,
    SinkCommitRecord,
    SinkCommitState,
    TransactionMetadata,
    TransactionState,
)

log = logging.getLogger("idemlog.txn")

_S = TransactionState
_TXN = "transactional id"


class DurableSteps:
    """Decisions go to ``registry`` (durable before they take effect); markers through
    ``sender`` (a refusal of the epoch closes ``lifecycle``); the LSOs they report settle
    sink batches in ``visibility`` and their records in ``batches``; producer ids come
    from ``pids``; ``clock()`` is the time in ms."""

    def __init__(
        self,
        registry: TransactionRegistry,
        sender: MarkerSender,
        visibility: VisibilityTracker,
        batches: UnsettledBatches,
        pids: ProducerIdSource,
        lifecycle: CoordinatorLifecycle,
        counters: Counters,
        clock: Callable[[], int],
    ) -> None:
        self._registry = registry
        self._sender = sender
        self._visibility = visibility
        self._batches = batches
        self._pids = pids
        self._lifecycle = lifecycle
        self._counters = counters
        self._clock = clock

    # -- epochs ------------------------------------------------------------------------
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

    def renewed_if_exhausted(self, meta: TransactionMetadata) -> TransactionMetadata:
        """``meta`` (ended at ``MAX_CLIENT_EPOCH + 1``) with a new producer id at epoch 0,
        its state kept, once its epochs ran out; else ``meta`` as it is."""
        if meta.producer_epoch <= MAX_CLIENT_EPOCH:
            return meta
        new = meta.copy()
        self._move_to_epoch(new, meta.producer_epoch)
        return self._registry.persist(new)

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
        self._counters.count("producer_id_rotations")
        log.info(
            "%s %r: epochs of producer id %d exhausted, new producer id %d",
            _TXN,
            new.transactional_id,
            old,
            new.producer_id,
        )

    # -- ending a transaction ------------------------------------------------------------
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
        return self.complete(self._registry.persist(new))

    def complete(self, meta: TransactionMetadata) -> TransactionMetadata:
        """PREPARE_x -> markers -> COMPLETE_x; on failure it stays PREPARE_x and raises."""
        commit = meta.state is _S.PREPARE_COMMIT
        self._send_markers([meta], commit)
        done = self._registry.persist(
            self._transitioned(meta, _S.COMPLETE_COMMIT if commit else _S.COMPLETE_ABORT)
        )
        self._counters.count("transactions_committed" if commit else "transactions_aborted")
        return done

    def _send_markers(self, metas: list[TransactionMetadata], commit: bool) -> None:
        with self._lifecycle.fenced():
            lsos = self._sender.send_all(metas, commit)
        # The LSO each partition reports after its markers: batches wholly below it no
        # longer need tracking for the readers' cut, nor their own records.
        self._batches.forget(self._visibility.settled_by(lsos))

    def abort_if_open(self, claims: Claims, tid: str, producer_id: int, epoch: int) -> None:
        """Abort the transaction if it is still open at exactly (producer_id, epoch)."""
        meta = self._registry.meta(tid)
        if meta is None or (meta.producer_id, meta.producer_epoch) != (producer_id, epoch):
            return  # unknown, or a newer holder fenced it (and aborted what was open)
        meta = self.settle(claims, tid)
        if meta is not None and meta.state is _S.ONGOING:
            self.end(meta, commit=False)

    # -- finishing what is decided -------------------------------------------------------
    def settle(self, claims: Claims, tid: str) -> TransactionMetadata | None:
        """Finish what earlier requests left half done for ``tid``, and return its state."""
        meta = self._registry.meta(tid)
        if meta is None:
            return None
        record = self._registry.pending_sink_holding(meta)
        if record is not None:
            self.finish_sink(claims, record)
            meta = self._registry.meta(tid) or meta  # held by a pending record: never expired
        if meta.state.is_prepare:
            meta = self.complete(meta)
        return meta

    def settled(self, claims: Claims, tid: str) -> TransactionMetadata:
        """:meth:`settle` for an id the caller knows exists (checked by
        :meth:`TransactionRegistry.require`)."""
        meta = self.settle(claims, tid)
        if meta is None:
            raise InvalidProducerIdMappingError(f"{_TXN} {tid!r} is unknown to the coordinator")
        return meta

    def finish_sink(self, claims: Claims, record: SinkCommitRecord) -> None:
        """Commit every transaction of a PREPARE sink record, then mark it COMPLETE."""
        claims.sink(record.sink_id)
        current = self._registry.sink_record(record.sink_id)
        if current is None or not current.is_pending or current.batch_id != record.batch_id:
            return  # finished (and maybe succeeded) by a request that held it meanwhile
        record = current
        for tid, _, _ in record.transactions:
            claims.txn(tid)
        # Every transaction is checked before any is committed: a broken one leaves the
        # whole batch uncommitted (and the record PREPARE), never part of it.
        metas = [
            record.decided_member(*txn, self._registry.meta(txn[0])) for txn in record.transactions
        ]
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
            self._registry.persist_all(done)
            self._counters.count("transactions_committed", len(done))
        self._registry.persist_sink(
            SinkCommitRecord(
                record.sink_id,
                record.batch_id,
                SinkCommitState.COMPLETE,
                record.transactions,
                record.ranges,
                batch_job=record.batch_job,
            )
        )

    def recover_sink(self, record: SinkCommitRecord) -> None:
        """Finish a pending sink commit; on failure it stays pending for a later call."""
        try:
            with self._registry.claims() as claims:
                self.finish_sink(claims, record)
        except ConcurrentTransactionsError:
            # Another request holds it, and finishes it; or (CoordinatorEpochFencedError)
            # this coordinator was deposed and stood down: its successor finishes it.
            pass
        except IdemlogError as exc:
            log.error("could not finish the commit of sink %r yet: %s", record.sink_id, exc)

    def recover_txn(self, transactional_id: str) -> None:
        """Finish a PREPARE_x transaction; on failure it stays so for a later call."""
        try:
            with self._registry.claims() as claims:
                claims.txn(transactional_id)
                self.settle(claims, transactional_id)
        except ConcurrentTransactionsError:
            # Another request holds it, and finishes it; or (CoordinatorEpochFencedError)
            # this coordinator was deposed and stood down: its successor finishes it.
            pass
        except IdemlogError as exc:
            log.error("could not finish %s %r yet: %s", _TXN, transactional_id, exc)
