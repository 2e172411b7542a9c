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
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTxnStateError,
)
from broker_core.protocol.txn_inputs import (
    check_batch_id,
    check_offset_ranges,
    check_partitions,
    check_producer,
    check_run_id,
    check_sink_id,
    check_timeout,
    check_transactional_id,
    check_transactions,
)
from broker_core.protocol.wire import SinkAttempt, SinkTxnStatus
from broker_core.txn.core import (
    Claims,
    CoordinatorStatus,
    LsoSource,
    ProducerIdSource,
    TxnCoordinatorCore,
)
from broker_core.txn.markers import LocalMarkerWriter, MarkerWriter
from broker_core.txn.state import (
    NO_SINK,
    NO_TXN_START,
    SinkCommitRecord,
    SinkCommitState,
    TransactionMetadata,
    TransactionState,
)

__all__ = [
    "CoordinatorStatus",
    "LocalMarkerWriter",
    "LsoSource",
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
            # Sink runs beat in memory only: every sink transaction gets a full timeout
            # from now, rather than being aborted for the time this coordinator was away.
            self._loaded_ms = self._clock()
        for record in sinks.values():
            self._track(record)
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
        self,
        transactional_id: str,
        transaction_timeout_ms: int | None,
        attempt: SinkAttempt,
    ) -> tuple[int, int, SinkTxnStatus]:
        """InitProducerId for one attempt of a Spark task (docs/design.md, the sink protocol).

        COMMITTED: the sink committed ``attempt.batch_id`` already (a re-run after a
        restart), the attempt writes nothing. PREPARED: an earlier attempt of this very
        task -- same sink, run and batch -- holds all its rows in a transaction still
        open; the caller reuses it. NEW otherwise: every earlier holder of the id is
        fenced and what it left open aborted. The first attempt seen of a new run fences
        every attempt the sink's other runs left (their plans may split rows otherwise).
        """
        self._check_running()
        tid = check_transactional_id(transactional_id)
        sid = check_sink_id(attempt.sink_id)
        run = check_run_id(attempt.run_id)
        bid = check_batch_id(attempt.batch_id)
        if not tid.startswith(sid + "/"):
            raise InvalidTxnStateError(
                f"{_TXN} {tid!r} does not belong to sink {sid!r} (expected '{sid}/<partition>')"
            )
        timeout = check_timeout(
            transaction_timeout_ms, self.default_timeout_ms, self.max_timeout_ms
        )
        with self._claims() as claims:
            claims.txn(tid)
            self._touch_run(sid, run, self._clock())
            record = self._sink_record(sid)
            if record is not None and record.is_pending:
                self._finish_sink(claims, record)
            if self._sink_runs.get(sid) != run:
                self._fence_sink_leftovers(
                    claims,
                    sid,
                    keep=lambda m: m.sink_run == run,
                    why=f"run {run!r} of the sink started (a restart re-plans its batches)",
                )
                with self._lock:
                    self._sink_runs[sid] = run
            meta = self._settle(claims, tid)
            if (
                meta is not None
                and meta.sink_prepared
                and (meta.sink_id, meta.sink_run, meta.sink_batch) == (sid, run, bid)
            ):
                if meta.state in (_S.ONGOING, _S.EMPTY):
                    self._count("sink_attempts_reused")
                    return meta.producer_id, meta.producer_epoch, SinkTxnStatus.PREPARED
                if meta.state is _S.COMPLETE_COMMIT:
                    return meta.producer_id, meta.producer_epoch, SinkTxnStatus.COMMITTED
            committed = self.last_committed_batch(sid)
            pid, epoch = self._init_locked(claims, tid, timeout, attempt)
            if committed is not None and bid <= committed:
                return pid, epoch, SinkTxnStatus.COMMITTED
            return pid, epoch, SinkTxnStatus.NEW

    def _init_locked(
        self, claims: Claims, tid: str, timeout: int, attempt: SinkAttempt | None = None
    ) -> tuple[int, int]:
        meta = self._settle(claims, tid)
        if meta is None:
            producer_id = self._pids.generate_producer_id()
            now = self._clock()
            new = TransactionMetadata(
                tid, producer_id, 0, timeout, _S.EMPTY, set(), NO_TXN_START, now
            )
            log.info("%s %r: new producer id %d", _TXN, tid, producer_id)
        else:
            if meta.state is _S.ONGOING:
                # The bump itself fences: the ABORT markers carry it, so the partitions
                # reject the older holder's appends; the next bump is the new holder's.
                meta = self._end(meta, commit=False, epoch=meta.producer_epoch + 1)
                self._count("transactions_fenced")
                new = self._bumped(meta, bump=False)
            else:
                new = self._bumped(meta)
            new.timeout_ms = timeout
        if attempt is not None:
            new.sink_id, new.sink_run, new.sink_batch = (
                attempt.sink_id,
                attempt.run_id,
                attempt.batch_id,
            )
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
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        batch_id: int,
        ranges: Sequence[tuple[str, int, int, int]] = (),
    ) -> None:
        """Mark the producer's transaction as holding all of a task's rows of ``batch_id``,
        at ``ranges`` ((topic, partition, first offset, last offset) per partition).

        Called by the task after its last batch was acknowledged; from then on another
        attempt of the same task of the same run reuses the transaction
        (:meth:`init_sink_producer`).
        """
        self._check_running()
        tid = check_transactional_id(transactional_id)
        check_producer(producer_id, producer_epoch)
        bid = check_batch_id(batch_id)
        spans = check_offset_ranges(ranges)
        with self._claims() as claims:
            claims.txn(tid)
            self._require(tid, producer_id, producer_epoch)
            meta = self._settled(claims, tid)
            if meta.state not in (_S.ONGOING, _S.EMPTY):
                raise InvalidTxnStateError(
                    f"{_TXN} {tid!r}: cannot prepare batch {bid}, the transaction is "
                    f"{meta.state.name}"
                )
            if meta.sink_id == NO_SINK or meta.sink_batch != bid:
                raise InvalidTxnStateError(
                    f"{_TXN} {tid!r}: cannot prepare batch {bid}: its producer was "
                    f"initialised for batch {meta.sink_batch} of sink {meta.sink_id!r}"
                )
            unadded = {(t, p) for t, p, _, _ in spans} - meta.partitions
            if unadded:
                raise InvalidTxnStateError(
                    f"{_TXN} {tid!r}: cannot prepare batch {bid}: rows at {sorted(unadded)} "
                    "are not in its transaction"
                )
            self._touch_run(meta.sink_id, meta.sink_run, self._clock())
            if meta.sink_prepared:
                return  # a retried request
            new = meta.copy()
            new.sink_prepared = True
            new.sink_ranges = spans
            new.last_update_ms = self._clock()
            self._persist(new)

    def sink_heartbeat(self, sink_id: str, run_id: str) -> None:
        """A task of this run is alive: its run's transactions are not timed out."""
        self._check_running()
        self._touch_run(check_sink_id(sink_id), check_run_id(run_id), self._clock())

    # -- sinks (DESIGN §6) ----------------------------------------------------------------
    def commit_sink_batch(
        self,
        sink_id: str,
        batch_id: int,
        transactions: Sequence[tuple[str, int, int]],
        run_id: str | None = None,
    ) -> bool:
        """Commit a Spark batch's transactions once; False if the batch was committed before.

        Every named transaction must be a prepared attempt of this sink's ``batch_id``
        (and of ``run_id`` when given), else nothing is recorded and the error says which.
        Afterwards every other attempt of the sink at this batch or an earlier one is
        fenced and aborted: a re-planned run's unused transactions never hold readers back.
        """
        self._check_running()
        sid = check_sink_id(sink_id)
        bid = check_batch_id(batch_id)
        txns = check_transactions(transactions)
        run = None if run_id is None else check_run_id(run_id)
        named = {tid for tid, _, _ in txns}

        def leftover_kept(m: TransactionMetadata) -> bool:
            return m.transactional_id in named or m.sink_batch > bid

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
                self._fence_sink_leftovers(
                    claims, sid, leftover_kept, f"batch {bid} was committed before"
                )
                self._count("sink_batches_repeated")
                return False
            # Everything is checked before anything is recorded: nothing partial.
            for tid, pid, epoch in txns:
                self._require(tid, pid, epoch)
            ranges: list[tuple[str, int, int, int]] = []
            for tid, _, _ in txns:
                meta = self._settled(claims, tid)
                self._check_committable(meta, sid, bid, run)
                ranges.extend(meta.sink_ranges)
            unsettled = self._unsettled_of(sid)
            if ranges:
                unsettled.append((bid, sorted(ranges)))
            prepared = SinkCommitRecord(sid, bid, SinkCommitState.PREPARE, list(txns), unsettled)
            self._persist_sink(prepared)
            self._finish_sink(claims, prepared)
            self._count("sink_batches_committed")
            self._fence_sink_leftovers(
                claims, sid, leftover_kept, f"batch {bid} of the sink was committed without it"
            )
            return True

    @staticmethod
    def _check_committable(meta: TransactionMetadata, sid: str, bid: int, run: str | None) -> None:
        tid = meta.transactional_id
        where = f"sink {sid!r} batch {bid}: {_TXN} {tid!r}"
        if meta.state not in (_S.ONGOING, _S.EMPTY):
            raise InvalidTxnStateError(f"{where} is {meta.state.name} and cannot be committed")
        if (meta.sink_id, meta.sink_batch) != (sid, bid) or not meta.sink_prepared:
            held = (
                f"a prepared attempt of batch {meta.sink_batch} of sink {meta.sink_id!r}"
                if meta.sink_prepared
                else f"an unprepared attempt of batch {meta.sink_batch} of sink {meta.sink_id!r}"
            )
            raise InvalidTxnStateError(
                f"{where} holds {held}, not this batch's rows: the commit message belongs "
                "to another batch or attempt"
            )
        if run is not None and meta.sink_run != run:
            raise InvalidTxnStateError(
                f"{where} was written by run {meta.sink_run!r}, not by run {run!r} that commits it"
            )

    def abort_sink_run(
        self, run_id: str | None, batch_id: int, *, sink_id: str | None = None
    ) -> list[str]:
        """Fence every attempt of ``run_id`` -- or, without one, of any run of ``sink_id``
        -- at ``batch_id`` or earlier that still holds an id (the driver aborts the
        batch); returns their transactional ids.

        Needs no message from any task: a batch whose tasks all failed is aborted too.
        """
        self._check_running()
        run = None if run_id is None else check_run_id(run_id)
        sid = None if sink_id is None else check_sink_id(sink_id)
        if run is None and sid is None:
            raise InvalidRequestError("abort_sink_run needs a run_id or a sink_id")
        bid = check_batch_id(batch_id)

        def target(m: TransactionMetadata) -> bool:
            owner = m.sink_run == run if run is not None else m.sink_id == sid
            return owner and m.sink_batch <= bid

        who = f"run {run!r}" if run is not None else f"sink {sid!r}"
        reason = f"batch {bid} of {who} was aborted by the Spark driver"
        aborted = []
        for meta in self._attempts(target):
            with self._claims() as claims:
                if self._fence(claims, meta.transactional_id, target, reason):
                    aborted.append(meta.transactional_id)
        return aborted

    def abort_transaction(self, transactional_id: str) -> bool:
        """An operator's abort (``idemlog transactions abort``): fence the id's holder and
        abort its open transaction. False if nothing was open. A transaction a decided
        sink commit holds is committed instead, never aborted."""
        self._check_running()
        tid = check_transactional_id(transactional_id)
        with self._claims() as claims:
            claims.txn(tid)
            meta = self._settle(claims, tid)
            if meta is None:
                raise InvalidProducerIdMappingError(f"{_TXN} {tid!r} is unknown")
            if meta.state is not _S.ONGOING:
                return False
            self._end(
                meta,
                commit=False,
                epoch=meta.producer_epoch + 1,
                reason="aborted by an operator (idemlog transactions abort)",
            )
            self._count("transactions_aborted_by_operator")
            return True

    def list_transactions(self, min_age_ms: int = 0) -> list[dict[str, Any]]:
        """Open transactions (ONGOING) open at least ``min_age_ms``, oldest first, with
        their writer and what holds readers back (``idemlog transactions list``)."""
        self._check_running()
        now = self._clock()
        with self._lock:
            metas = [m.copy() for m in self._txns.values() if m.state is _S.ONGOING]
        rows = []
        for m in sorted(metas, key=lambda m: m.txn_start_ms):
            age = now - m.txn_start_ms
            if age < min_age_ms:
                continue
            idle = now - self._alive_since(m)
            rows.append(
                {
                    "transactional_id": m.transactional_id,
                    "producer_id": m.producer_id,
                    "producer_epoch": m.producer_epoch,
                    "age_ms": age,
                    "idle_ms": idle,
                    "timeout_ms": m.timeout_ms,
                    "partitions": [[t, p] for t, p in m.sorted_partitions()],
                    "sink_id": m.sink_id,
                    "sink_run": m.sink_run,
                    "sink_batch": m.sink_batch,
                    "sink_prepared": m.sink_prepared,
                }
            )
        return rows

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
        self._forget_runs_older_than(now - self.max_timeout_ms)
        with self._lock:
            candidates = [m for m in self._txns.values() if m.state is _S.ONGOING]
        expired = [
            m.transactional_id for m in candidates if now - self._alive_since(m) > m.timeout_ms
        ]
        with self._lock:
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
            or now - self._alive_since(meta) <= meta.timeout_ms
        ):
            return False  # changed since the scan
        if self._pending_sink_holding(meta) is not None:
            self._settle(claims, tid)  # its sink batch is committed: finish that instead
            return False
        idle = now - self._alive_since(meta)
        if meta.sink_id != NO_SINK:
            reason = (
                f"aborted by the coordinator: no task of sink {meta.sink_id!r} run "
                f"{meta.sink_run!r} wrote or sent a heartbeat for {idle} ms, over "
                f"transaction.timeout.ms={meta.timeout_ms} (a driver or executors lost, or "
                "a commit later than that: raise the sink option transaction.timeout.ms)"
            )
        else:
            reason = (
                f"aborted by the coordinator: open {idle} ms, over its "
                f"transaction.timeout.ms={meta.timeout_ms}"
            )
        log.info(
            "%s %r: transaction of producer id %d epoch %d %s",
            _TXN,
            tid,
            meta.producer_id,
            meta.producer_epoch,
            reason,
        )
        self._end(meta, commit=False, epoch=meta.producer_epoch + 1, reason=reason)
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
                "sink_batches_tracked": self._tracked_count(),
                "sink_runs_alive": len(self._run_alive_ms),
                **self._counters,
            }
