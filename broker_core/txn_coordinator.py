"""The transaction coordinator (DESIGN §5, §6): transactional ids, epochs, commits, sinks.

Every decision is made durable in the :class:`TxnStateStore` before anybody acts on it:

* ``end_txn``: ONGOING -> PREPARE_x (durable) -> markers to every partition -> COMPLETE_x.
  Once PREPARE_x is stored the outcome is fixed; a coordinator that dies afterwards is
  replaced by one whose :meth:`TransactionCoordinator.start` writes the markers again.
* ``init_producer_id`` on a known id bumps the epoch, which fences the older holder; an
  open transaction it left is aborted first, its ABORT markers carrying the bumped epoch
  so the partitions reject the older holder's appends from then on.
* ``commit_sink_batch``: a sink's :class:`SinkCommitRecord` (PREPARE, batch id, its
  transactions) is the durable commit decision for a whole Spark batch; the transactions
  are committed one by one after it, and a record left in PREPARE is finished on start.
  A transaction named in a pending record is never aborted: whoever touches it first
  finishes the commit.

Concurrency: one lock guards the in-memory maps; a request also *claims* the ids it
changes for its whole duration (durable writes, marker writes with their retries), and a
request finding an id claimed gets the retriable ``ConcurrentTransactionsError``, as
Kafka answers while a state transition is pending.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from broker_core.errors import (
    ConcurrentTransactionsError,
    IdemlogError,
    InvalidTxnStateError,
)
from broker_core.protocol import SinkTxnStatus
from broker_core.txn_core import Claims, CoordinatorStatus, ProducerIdSource, TxnCoordinatorCore
from broker_core.txn_inputs import (
    check_batch_id,
    check_partitions,
    check_producer,
    check_sink_id,
    check_timeout,
    check_transactional_id,
    check_transactions,
)
from broker_core.txn_markers import LocalMarkerWriter, MarkerWriter
from broker_core.txn_state import (
    MAX_CLIENT_EPOCH,
    NO_TXN_START,
    SinkCommitRecord,
    SinkCommitState,
    TransactionMetadata,
    TransactionState,
)

__all__ = [
    "CoordinatorStatus",
    "LocalMarkerWriter",
    "MarkerWriter",
    "ProducerIdSource",
    "TransactionCoordinator",
]

log = logging.getLogger("idemlog.txn")

_S = TransactionState
_TXN = "transactional id"


class TransactionCoordinator(TxnCoordinatorCore):
    """Transactional ids -> (producer id, epoch), transactions and sink commits.

    ``__init__(state_store, pids, markers, *, max_timeout_ms=900_000,
    default_timeout_ms=60_000, coordinator_epoch=0, clock=None, marker_retry_deadline_s=30.0,
    marker_retry_backoff_s=0.05)``; call :meth:`start` before any request.
    """

    def start(self) -> None:
        """Load the state and finish what a previous coordinator left half done.

        A failed load leaves the coordinator LOADING, so start() may be called again.
        """
        if self._status is not CoordinatorStatus.LOADING:
            raise InvalidTxnStateError(f"start() on a coordinator that is {self._status.name}")
        txns, sinks = self._store.load()
        with self._lock:
            self._txns = dict(txns)
            self._sinks = dict(sinks)
        self._set_status(CoordinatorStatus.RUNNING)
        pending_sinks = [r for r in sinks.values() if r.is_pending]
        prepared = [m.transactional_id for m in txns.values() if m.state.is_prepare]
        log.info(
            "transaction coordinator (epoch %d) loaded %d transactional ids and %d sinks; "
            "finishing %d prepared transactions and %d sink commits",
            self.coordinator_epoch,
            len(txns),
            len(sinks),
            len(prepared),
            len(pending_sinks),
        )
        # Sinks first: a pending sink record may hold transactions still ONGOING.
        for record in pending_sinks:
            self._recover_sink(record)
        for transactional_id in prepared:
            self._recover_txn(transactional_id)

    def close(self) -> None:
        """Refuse new requests (NOT_COORDINATOR) and cut marker retries short. Idempotent."""
        self._set_status(CoordinatorStatus.CLOSED, idempotent=True)
        self._closing.set()

    # -- producer ids ------------------------------------------------------------------
    def init_producer_id(
        self, transactional_id: str | None, transaction_timeout_ms: int | None = None
    ) -> tuple[int, int]:
        """(producer id, epoch) for a producer; with a transactional id, fence older holders."""
        self._check_running()
        if transactional_id is None:
            return self._pids.generate_producer_id(), 0  # idempotent-only producer
        tid = check_transactional_id(transactional_id)
        timeout = check_timeout(
            transaction_timeout_ms, self.default_timeout_ms, self.max_timeout_ms
        )
        with self._claims() as claims:
            claims.txn(tid)
            return self._init_locked(claims, tid, timeout)

    def init_sink_producer(
        self, transactional_id: str, transaction_timeout_ms: int | None, batch_id: int
    ) -> tuple[int, int, SinkTxnStatus]:
        """InitProducerId for one attempt of a Spark task writing ``batch_id`` (DESIGN §6).

        If the id's transaction already holds this batch's rows in full (an earlier attempt
        prepared it), it is kept: PREPARED (still open, the caller returns it for the
        driver to commit) or COMMITTED (the driver committed it already). Anything else
        is fenced and aborted as :meth:`init_producer_id` does (NEW).
        """
        self._check_running()
        tid = check_transactional_id(transactional_id)
        bid = check_batch_id(batch_id)
        timeout = check_timeout(
            transaction_timeout_ms, self.default_timeout_ms, self.max_timeout_ms
        )
        with self._claims() as claims:
            claims.txn(tid)
            meta = self._settle(claims, tid)
            if meta is not None and meta.sink_batch == bid:
                if meta.state in (_S.ONGOING, _S.EMPTY):
                    self._count("sink_attempts_reused")
                    return meta.producer_id, meta.producer_epoch, SinkTxnStatus.PREPARED
                if meta.state is _S.COMPLETE_COMMIT:
                    return meta.producer_id, meta.producer_epoch, SinkTxnStatus.COMMITTED
            pid, epoch = self._init_locked(claims, tid, timeout)
            return pid, epoch, SinkTxnStatus.NEW

    def _init_locked(self, claims: Claims, tid: str, timeout: int) -> tuple[int, int]:
        meta = self._settle(claims, tid)
        if meta is None:
            producer_id = self._pids.generate_producer_id()
            now = self._clock()
            self._persist(
                TransactionMetadata(
                    tid, producer_id, 0, timeout, _S.EMPTY, set(), NO_TXN_START, now
                )
            )
            log.info("%s %r: new producer id %d", _TXN, tid, producer_id)
            return producer_id, 0
        if meta.state is _S.ONGOING:
            # The bump itself fences: the ABORT markers carry it, so the partitions
            # reject the older holder's appends, and it becomes the new holder's epoch.
            meta = self._end(meta, commit=False, epoch=meta.producer_epoch + 1)
            self._count("transactions_fenced")
            epoch = meta.producer_epoch
        else:
            epoch = meta.producer_epoch + 1
        new = meta.copy()
        new.timeout_ms = timeout
        new.transition(_S.EMPTY, self._clock())
        if epoch > MAX_CLIENT_EPOCH:
            new.previous_producer_id = meta.producer_id
            new.producer_id = self._pids.generate_producer_id()
            new.producer_epoch = 0
            self._count("producer_id_rotations")
            log.info(
                "%s %r: epochs of producer id %d exhausted, new producer id %d",
                _TXN,
                tid,
                meta.producer_id,
                new.producer_id,
            )
        else:
            new.producer_epoch = epoch
        self._persist(new)
        return new.producer_id, new.producer_epoch

    # -- transactions --------------------------------------------------------------------
    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[tuple[str, int]],
    ) -> None:
        """Record the partitions of the producer's transaction (beginning it if needed)."""
        self._check_running()
        tid = check_transactional_id(transactional_id)
        check_producer(producer_id, producer_epoch)
        parts = check_partitions(partitions)
        with self._claims() as claims:
            claims.txn(tid)
            self._require(tid, producer_id, producer_epoch)
            meta = self._settled(claims, tid)
            if meta.state is _S.ONGOING and parts <= meta.partitions:
                return  # a retried request: already recorded
            new = meta.copy()
            new.transition(_S.ONGOING, self._clock())
            new.partitions |= parts
            self._persist(new)

    def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        """Commit or abort the producer's open transaction, all partitions or none."""
        self._check_running()
        tid = check_transactional_id(transactional_id)
        check_producer(producer_id, producer_epoch)
        decision = "commit" if commit else "abort"
        with self._claims() as claims:
            claims.txn(tid)
            meta = self._require(tid, producer_id, producer_epoch)
            if self._pending_sink_holding(meta) is not None:
                meta = self._settle(claims, tid) or meta
            wanted_prepare = _S.PREPARE_COMMIT if commit else _S.PREPARE_ABORT
            wanted_complete = _S.COMPLETE_COMMIT if commit else _S.COMPLETE_ABORT
            state = meta.state
            if state is _S.ONGOING:
                self._end(meta, commit)
            elif state is wanted_prepare:
                self._complete(meta)  # left half done by an earlier attempt
            elif state is wanted_complete:
                log.debug("%s %r: %s retried, already done", _TXN, tid, decision)
            elif state is _S.EMPTY:
                raise InvalidTxnStateError(
                    f"{_TXN} {tid!r}: cannot {decision}, no transaction is open (no "
                    "partitions were added since the last one ended)"
                )
            else:
                raise InvalidTxnStateError(
                    f"{_TXN} {tid!r}: cannot {decision}, the transaction is {state.name}"
                )

    def prepare_sink_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, batch_id: int
    ) -> None:
        """Mark the producer's transaction as holding all of a task's rows of ``batch_id``.

        Called by the task after its last batch was acknowledged; from then on another
        attempt of the task reuses the transaction (:meth:`init_sink_producer`).
        """
        self._check_running()
        tid = check_transactional_id(transactional_id)
        check_producer(producer_id, producer_epoch)
        bid = check_batch_id(batch_id)
        with self._claims() as claims:
            claims.txn(tid)
            self._require(tid, producer_id, producer_epoch)
            meta = self._settled(claims, tid)
            if meta.state not in (_S.ONGOING, _S.EMPTY):
                raise InvalidTxnStateError(
                    f"{_TXN} {tid!r}: cannot prepare batch {bid}, the transaction is "
                    f"{meta.state.name}"
                )
            if meta.sink_batch == bid:
                return  # a retried request
            new = meta.copy()
            new.sink_batch = bid
            new.last_update_ms = self._clock()
            self._persist(new)

    # -- sinks (DESIGN §6) ----------------------------------------------------------------
    def commit_sink_batch(
        self, sink_id: str, batch_id: int, transactions: Sequence[tuple[str, int, int]]
    ) -> bool:
        """Commit a Spark batch's transactions once; False if the batch was committed before."""
        self._check_running()
        sid = check_sink_id(sink_id)
        bid = check_batch_id(batch_id)
        txns = check_transactions(transactions)
        with self._claims() as claims:
            claims.sink(sid)
            for tid, _, _ in txns:
                claims.txn(tid)
            record = self._sink_record(sid)
            if record is not None and record.is_pending:
                self._finish_sink(claims, record)
            if record is not None and bid <= record.batch_id:
                log.info(
                    "sink %r: batch %d repeats committed batch %d; aborting its %d "
                    "transactions instead",
                    sid,
                    bid,
                    record.batch_id,
                    len(txns),
                )
                for txn in txns:
                    self._abort_if_open(claims, *txn)
                self._count("sink_batches_repeated")
                return False
            # Everything is checked before anything is recorded: nothing partial.
            for tid, pid, epoch in txns:
                self._require(tid, pid, epoch)
            for tid, _, _ in txns:
                meta = self._settled(claims, tid)
                if meta.state not in (_S.ONGOING, _S.EMPTY, _S.COMPLETE_COMMIT):
                    raise InvalidTxnStateError(
                        f"sink {sid!r} batch {bid}: {_TXN} {tid!r} is {meta.state.name} and "
                        "cannot be committed"
                    )
            prepared = SinkCommitRecord(sid, bid, SinkCommitState.PREPARE, list(txns))
            self._persist_sink(prepared)
            self._finish_sink(claims, prepared)
            self._count("sink_batches_committed")
            return True

    def abort_sink_batch(
        self, sink_id: str, batch_id: int, transactions: Sequence[tuple[str, int, int]]
    ) -> None:
        """Abort the batch's transactions still open (a batch already committed stays so)."""
        self._check_running()
        sid = check_sink_id(sink_id)
        check_batch_id(batch_id)
        txns = check_transactions(transactions)
        with self._claims() as claims:
            claims.sink(sid)
            for tid, _, _ in txns:
                claims.txn(tid)
            for txn in txns:
                self._abort_if_open(claims, *txn)

    def last_committed_batch(self, sink_id: str) -> int | None:
        """The sink's last committed batch id (a PREPARE record counts: it is decided)."""
        self._check_running()
        record = self._sink_record(check_sink_id(sink_id))
        return None if record is None else record.batch_id

    # -- timeouts --------------------------------------------------------------------------
    def abort_timed_out(self, now_ms: int | None = None) -> list[str]:
        """Abort (with an epoch bump, fencing the holder) transactions open past their timeout.

        Also retries leftovers whose marker writes failed earlier. Returns the aborted ids.
        """
        self._check_running()
        now = self._clock() if now_ms is None else now_ms
        with self._lock:
            expired = [
                m.transactional_id
                for m in self._txns.values()
                if m.state is _S.ONGOING and now - m.txn_start_ms > m.timeout_ms
            ]
            stuck_sinks = [r for r in self._sinks.values() if r.is_pending]
            stuck = [m.transactional_id for m in self._txns.values() if m.state.is_prepare]
        aborted = []
        for tid in expired:
            try:
                with self._claims() as claims:
                    claims.txn(tid)
                    if self._abort_expired(claims, tid, now):
                        aborted.append(tid)
            except ConcurrentTransactionsError:
                continue  # another request is on it right now
            except IdemlogError as exc:
                log.warning("could not abort timed-out %s %r yet: %s", _TXN, tid, exc)
        for record in stuck_sinks:
            self._recover_sink(record)
        for tid in stuck:
            self._recover_txn(tid)
        return aborted

    def _abort_expired(self, claims: Claims, tid: str, now: int) -> bool:
        meta = self._meta(tid)
        if (
            meta is None
            or meta.state is not _S.ONGOING
            or now - meta.txn_start_ms <= meta.timeout_ms
        ):
            return False  # changed since the scan
        if self._pending_sink_holding(meta) is not None:
            self._settle(claims, tid)  # its sink batch is committed: finish that instead
            return False
        log.info(
            "%s %r: transaction of producer id %d epoch %d open for %d ms, over its timeout "
            "of %d ms: aborting it",
            _TXN,
            tid,
            meta.producer_id,
            meta.producer_epoch,
            now - meta.txn_start_ms,
            meta.timeout_ms,
        )
        self._end(meta, commit=False, epoch=meta.producer_epoch + 1)
        self._count("transactions_timed_out")
        return True

    # -- metrics ---------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
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
                "sinks_pending": sum(1 for r in self._sinks.values() if r.is_pending),
                **self._counters,
            }
