"""The transaction coordinator (docs/design.md §5, §6): transactional ids, epochs, commits, sinks.

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
import time
from collections.abc import Callable, Sequence
from typing import Any

from broker_core.errors import (
    InvalidConfigError,
    InvalidProducerIdMappingError,
    InvalidTxnStateError,
)
from broker_core.protocol.stable_cut import TrackedBatches
from broker_core.protocol.txn_inputs import (
    check_batch_id,
    check_partitions,
    check_producer,
    check_run_id,
    check_sink_id,
    check_timeout,
    check_transactional_id,
)
from broker_core.protocol.wire import SinkAttempt, SinkTxnStatus
from broker_core.retry import RetryPolicy
from broker_core.txn.coordinator.claims import Claims
from broker_core.txn.coordinator.counters import Counters
from broker_core.txn.coordinator.expiry import NEVER, Expiry, ExpiryPolicy, ExpiryResult
from broker_core.txn.coordinator.housekeeping import Housekeeping
from broker_core.txn.coordinator.leftovers import SinkLeftovers
from broker_core.txn.coordinator.lifecycle import (
    CoordinatorLifecycle,
    CoordinatorStatus,
    ProducerIdSource,
)
from broker_core.txn.coordinator.load_recovery import BackgroundRecovery
from broker_core.txn.coordinator.marker_sender import MAX_MARKER_BACKOFF_S, MarkerSender
from broker_core.txn.coordinator.markers import LocalMarkerWriter, MarkerWriter
from broker_core.txn.coordinator.registry import TransactionRegistry
from broker_core.txn.coordinator.sink_batches import UnsettledBatches
from broker_core.txn.coordinator.sink_ops import EVERY_ID, SinkOperations
from broker_core.txn.coordinator.sink_runs import SinkRuns
from broker_core.txn.coordinator.steps import DurableSteps
from broker_core.txn.coordinator.visibility import LsoSource, VisibilityTracker
from broker_core.txn.state_topic.records import (
    NO_TXN_START,
    TransactionMetadata,
    TransactionState,
)
from broker_core.txn.state_topic.store import TxnStateStore

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


class TransactionCoordinator:
    """Transactional ids -> (producer id, epoch), transactions and sink commits.

    Decisions are stored in ``state_store`` before they take effect; ``coordinator_epoch``
    is its state partition's leader epoch, which the partition checks on every append (a
    deposed coordinator's write is refused) and the markers carry. Producer ids come from
    ``pids``; markers go through ``markers``, retriable failures retried with backoff from
    ``marker_retry_backoff_s`` (doubling up to 1 s) for ``marker_retry_deadline_s``;
    ``stable_offsets`` gives partitions' LSOs to :meth:`stable_ends`; ``clock()`` is the
    time in ms. Call :meth:`start` before any request.

    Every request raises CoordinatorNotAvailableError before :meth:`start` finished and
    NotCoordinatorError after :meth:`close` or once a newer coordinator took over (both
    retriable), ConcurrentTransactionsError (retriable) while another request changes the
    same id, InvalidRequestError for a malformed argument, and what the state store or
    the marker writer raise (the transaction then stays where it was durably).

    Raises InvalidConfigError for timeouts below 1 ms or a negative epoch.
    """

    def __init__(
        self,
        state_store: TxnStateStore,
        pids: ProducerIdSource,
        markers: MarkerWriter,
        *,
        max_timeout_ms: int = 900_000,
        default_timeout_ms: int = 60_000,
        coordinator_epoch: int = 0,
        clock: Callable[[], int] | None = None,
        marker_retry_deadline_s: float = 30.0,
        marker_retry_backoff_s: float = 0.05,
        stable_offsets: LsoSource | None = None,
        expiry: ExpiryPolicy | None = None,
    ) -> None:
        if max_timeout_ms < 1 or default_timeout_ms < 1:
            raise InvalidConfigError(
                f"transaction timeouts must be >= 1 ms: max_timeout_ms={max_timeout_ms}, "
                f"default_timeout_ms={default_timeout_ms}"
            )
        if coordinator_epoch < 0:
            raise InvalidConfigError(f"coordinator_epoch={coordinator_epoch} must be >= 0")
        self.expiry = expiry or ExpiryPolicy()
        if self.expiry.id_expiration_ms < 1 or self.expiry.stream_sink_expiration_ms < NEVER:
            raise InvalidConfigError(
                f"transactional.id.expiration.ms={self.expiry.id_expiration_ms} must be >= 1 "
                f"and sink.stream.expiration.ms={self.expiry.stream_sink_expiration_ms} >= -1"
            )
        self.max_timeout_ms = max_timeout_ms
        # A configured maximum below the default lowers the default with it, rather than
        # refusing every InitProducerId that asks for no timeout in particular.
        self.default_timeout_ms = min(default_timeout_ms, max_timeout_ms)
        self.coordinator_epoch = coordinator_epoch
        marker_policy = RetryPolicy(
            deadline_s=marker_retry_deadline_s,
            backoff_s=marker_retry_backoff_s,
            max_backoff_s=max(MAX_MARKER_BACKOFF_S, marker_retry_backoff_s),
            jitter=0.0,  # one coordinator retries: nothing to spread out
        )
        # The parts, each owning its state and given the collaborators it uses.
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._pids = pids
        self._sender = MarkerSender(markers, coordinator_epoch, marker_policy)
        self._lifecycle = CoordinatorLifecycle(coordinator_epoch, self._sender.stop)
        self._visibility = VisibilityTracker(stable_offsets)
        self._batches = UnsettledBatches(state_store, self._visibility, coordinator_epoch)
        self._counters = Counters()
        self._runs = SinkRuns(self._clock)
        self._registry = TransactionRegistry(
            state_store,
            self._lifecycle,
            self._clock,
            coordinator_epoch=coordinator_epoch,
            id_expiration_ms=self.expiry.id_expiration_ms,
        )
        self._steps = DurableSteps(
            self._registry,
            self._sender,
            self._visibility,
            self._batches,
            pids,
            self._lifecycle,
            self._counters,
            self._clock,
        )
        self._leftovers = SinkLeftovers(self._registry, self._steps, self._counters)
        self._sink_ops = SinkOperations(
            self._lifecycle,
            self._registry,
            self._runs,
            self._steps,
            self._leftovers,
            self._visibility,
            self._batches,
            self._counters,
            self._clock,
        )
        self._housekeeping = Housekeeping(
            self._registry, self._runs, self._steps, self._counters, self._clock
        )
        self._expiry = Expiry(
            self.expiry,
            self._registry,
            self._runs,
            self._visibility,
            self._lifecycle,
            self._counters,
        )
        self._recovery = BackgroundRecovery(self._steps)

    @property
    def status(self) -> CoordinatorStatus:
        """LOADING until :meth:`start`, RUNNING, then CLOSED for good."""
        return self._lifecycle.status

    def start(self, *, finish_in_background: bool = False) -> None:
        """Load the state and finish what a previous coordinator left half done: before
        returning, or with ``finish_in_background`` serving at once while each leftover
        is finished on a worker of its own (``txn.coordinator.load_recovery``).

        Raises InvalidTxnStateError unless it is LOADING, and what the state store's load
        raises: a failed load leaves the coordinator LOADING, so start() may be called
        again. What cannot be finished now (a marker's leader down) is logged and left
        for :meth:`abort_timed_out` or the next request touching it.
        """
        self._lifecycle.check_loading()
        sinks = self._registry.load()
        # Sink runs beat in memory only: every sink transaction gets a full timeout from
        # now, rather than being aborted for the time this coordinator was away.
        self._runs.loaded()
        for record in sinks:
            self._visibility.track_record(record)
        self._batches.load()
        self._lifecycle.running()
        pending_sinks, prepared = self._registry.unfinished()
        loaded = self._registry.counts()
        log.info(
            "transaction coordinator (epoch %d) loaded %d transactional ids and %d sinks; "
            "finishing %d prepared transactions and %d sink commits",
            self.coordinator_epoch,
            loaded.transactional_ids,
            loaded.sinks,
            len(prepared),
            len(pending_sinks),
        )
        self._recovery.finish(pending_sinks, prepared, finish_in_background)

    def close(self) -> None:
        """Refuse new requests (NOT_COORDINATOR) and cut marker retries short. Idempotent."""
        self._lifecycle.close()
        self._recovery.stop()

    def stable_ends(self, topic: str) -> dict[int, int]:
        """Per partition of ``topic``, where a read_committed reader may stop so that it
        holds every committed sink batch whole or not at all.

        Raises CoordinatorNotAvailableError when this coordinator has no LSO source, and
        what reading the partitions' LSOs raises."""
        self._lifecycle.check_running()
        return self._visibility.stable_ends(topic)

    def tracked_batches(self, topic: str, since: int) -> TrackedBatches:
        """This coordinator's part of a reader's cut across coordinators
        (``protocol.stable_cut``). Raises NotCoordinatorError / CoordinatorNotAvailableError
        unless RUNNING."""
        self._lifecycle.check_running()
        return self._visibility.tracked_batches(topic, since)

    # -- producer ids ------------------------------------------------------------------
    def init_producer_id(
        self, transactional_id: str | None, transaction_timeout_ms: int | None = None
    ) -> tuple[int, int]:
        """(producer id, epoch) for a producer; with a transactional id, fence older holders.

        With a transactional id the new epoch is durable before it is returned, and a
        transaction the older holder left open is aborted first (its markers carry the
        bumped epoch). Raises InvalidTransactionTimeoutError for a timeout above the
        maximum, and the producer-id source's errors (ProducerIdAllocationError).
        """
        self._lifecycle.check_running()
        if transactional_id is None:
            return self._pids.generate_producer_id(), 0  # idempotent-only producer
        tid = check_transactional_id(transactional_id)
        timeout = check_timeout(
            transaction_timeout_ms, self.default_timeout_ms, self.max_timeout_ms
        )
        with self._registry.claims() as claims:
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
        Raises InvalidTxnStateError when ``transactional_id`` is not ``<sink id>/...``.
        """
        self._lifecycle.check_running()
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
        with self._registry.claims() as claims:
            claims.txn(tid)
            self._runs.touch(sid, run, self._clock())
            record = self._registry.sink_record(sid)
            if record is not None and record.is_pending:
                self._steps.finish_sink(claims, record)
            if self._runs.current(sid) != run:
                self._leftovers.fence_sink(
                    claims,
                    sid,
                    keep=lambda m: m.sink_run == run,
                    why=f"run {run!r} of the sink started (a restart re-plans its batches)",
                )
                self._runs.set_current(sid, run)
            meta = self._steps.settle(claims, tid)
            if (
                meta is not None
                and meta.sink_prepared
                and (meta.sink_id, meta.sink_run, meta.sink_batch) == (sid, run, bid)
            ):
                if meta.state in (_S.ONGOING, _S.EMPTY):
                    self._counters.count("sink_attempts_reused")
                    return meta.producer_id, meta.producer_epoch, SinkTxnStatus.PREPARED
                if meta.state is _S.COMPLETE_COMMIT:
                    return meta.producer_id, meta.producer_epoch, SinkTxnStatus.COMMITTED
            committed = self._sink_ops.last_committed_batch(sid)
            pid, epoch = self._init_locked(claims, tid, timeout, attempt)
            if committed is not None and bid <= committed:
                return pid, epoch, SinkTxnStatus.COMMITTED
            return pid, epoch, SinkTxnStatus.NEW

    def _init_locked(
        self, claims: Claims, tid: str, timeout: int, attempt: SinkAttempt | None = None
    ) -> tuple[int, int]:
        meta = self._steps.settle(claims, tid)
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
                meta = self._steps.end(meta, commit=False, epoch=meta.producer_epoch + 1)
                self._counters.count("transactions_fenced")
                new = self._steps.bumped(meta, bump=False)
            else:
                new = self._steps.bumped(meta)
            new.timeout_ms = timeout
        if attempt is not None:
            new.sink_id, new.sink_run, new.sink_batch = (
                attempt.sink_id,
                attempt.run_id,
                attempt.batch_id,
            )
        self._registry.persist(new)
        return new.producer_id, new.producer_epoch

    # -- sinks: answered by the held SinkOperations (docs/design.md §6) -------------------
    def prepare_sink_txn(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        batch_id: int,
        ranges: Sequence[tuple[str, int, int, int]] = (),
    ) -> None:
        """:meth:`SinkOperations.prepare_sink_txn`."""
        self._sink_ops.prepare_sink_txn(
            transactional_id, producer_id, producer_epoch, batch_id, ranges
        )

    def sink_heartbeat(self, sink_id: str, run_id: str) -> None:
        """:meth:`SinkOperations.sink_heartbeat`."""
        self._sink_ops.sink_heartbeat(sink_id, run_id)

    def commit_sink_batch(
        self,
        sink_id: str,
        batch_id: int,
        transactions: Sequence[tuple[str, int, int]],
        run_id: str | None = None,
    ) -> bool:
        """:meth:`SinkOperations.commit_sink_batch`."""
        return self._sink_ops.commit_sink_batch(sink_id, batch_id, transactions, run_id)

    def abort_sink_run(
        self,
        run_id: str | None,
        batch_id: int,
        *,
        sink_id: str | None = None,
        allowed: Callable[[str], bool] = EVERY_ID,
    ) -> list[str]:
        """:meth:`SinkOperations.abort_sink_run`."""
        return self._sink_ops.abort_sink_run(run_id, batch_id, sink_id=sink_id, allowed=allowed)

    def abort_sink_batch(
        self, sink_id: str, batch_id: int, transactions: Sequence[tuple[str, int, int]]
    ) -> None:
        """:meth:`SinkOperations.abort_sink_batch`."""
        self._sink_ops.abort_sink_batch(sink_id, batch_id, transactions)

    def last_committed_batch(self, sink_id: str) -> int | None:
        """:meth:`SinkOperations.last_committed_batch`."""
        return self._sink_ops.last_committed_batch(sink_id)

    # -- transactions --------------------------------------------------------------------
    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[tuple[str, int]],
    ) -> None:
        """Record the partitions of the producer's transaction (beginning it if needed).

        Durable when it returns; a retried request is a no-op. Raises ProducerFencedError
        when (producer_id, producer_epoch) no longer holds the id, and
        InvalidProducerIdMappingError when the id is unknown or held by another producer id.
        """
        self._lifecycle.check_running()
        tid = check_transactional_id(transactional_id)
        check_producer(producer_id, producer_epoch)
        parts = check_partitions(partitions)
        with self._registry.claims() as claims:
            claims.txn(tid)
            self._registry.require(tid, producer_id, producer_epoch)
            meta = self._steps.settled(claims, tid)
            if meta.state is _S.ONGOING and parts <= meta.partitions:
                return  # a retried request: already recorded
            new = meta.copy()
            new.transition(_S.ONGOING, self._clock())
            new.partitions |= parts
            self._registry.persist(new)

    def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[tuple[str, int]],
    ) -> None:
        """A partition leader's check before a transactional append (KIP-890's verifyOnly):
        (producer_id, producer_epoch) holds the id, its transaction is ONGOING and holds
        every one of ``partitions``. Changes nothing. Raises the fencing errors of
        :meth:`add_partitions`, and InvalidTxnStateError otherwise."""
        self._lifecycle.check_running()
        tid = check_transactional_id(transactional_id)
        check_producer(producer_id, producer_epoch)
        parts = check_partitions(partitions)
        meta = self._registry.require(tid, producer_id, producer_epoch)
        if meta.state is not _S.ONGOING:
            raise InvalidTxnStateError(
                f"{_TXN} {tid!r}: producer id {producer_id} epoch {producer_epoch} has no "
                f"ongoing transaction (it is {meta.state.name})"
            )
        missing = parts - meta.partitions
        if missing:
            raise InvalidTxnStateError(
                f"{_TXN} {tid!r}: {', '.join(f'{t}-{p}' for t, p in sorted(missing))} "
                "not added to its ongoing transaction (AddPartitionsToTxn first)"
            )

    def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> tuple[int, int]:
        """Commit or abort the producer's open transaction, all partitions or none, and
        return the producer id and epoch of its next transaction.

        Each transaction ends at its own epoch (Kafka's transaction version 2, KIP-890):
        the decision and the markers carry ``producer_epoch + 1``, which the producer's next
        transaction uses (at the last epoch a new producer id with epoch 0). So a late or
        repeated EndTxn of an ended transaction can never end the one after it: a retry of
        the call that ended the last transaction is answered as that call was (finishing
        it if its markers were left unwritten), and one arriving after the next
        transaction began is refused with InvalidTxnStateError.

        When it returns, every partition has the marker and the outcome is durable; once
        it raised after the decision was stored (a marker's leader down), the outcome is
        fixed and a retry of the same call finishes it. Raises ProducerFencedError /
        InvalidProducerIdMappingError as :meth:`add_partitions`, and InvalidTxnStateError
        when no transaction is open or it ended the other way.
        """
        self._lifecycle.check_running()
        tid = check_transactional_id(transactional_id)
        check_producer(producer_id, producer_epoch)
        decision = "commit" if commit else "abort"
        wanted_prepare = _S.PREPARE_COMMIT if commit else _S.PREPARE_ABORT
        wanted_complete = _S.COMPLETE_COMMIT if commit else _S.COMPLETE_ABORT
        with self._registry.claims() as claims:
            claims.txn(tid)
            known = self._registry.meta(tid)
            if known is not None and (producer_id, producer_epoch) == (
                known.ended_producer_id,
                known.ended_producer_epoch,
            ):
                return self._end_retried(claims, known, decision, wanted_complete)
            meta = self._registry.require(tid, producer_id, producer_epoch)
            if self._registry.pending_sink_holding(meta) is not None:
                meta = self._steps.settle(claims, tid) or meta
            state = meta.state
            if state is _S.ONGOING:
                done = self._steps.end(
                    meta, commit, epoch=meta.producer_epoch + 1, ended=(producer_id, producer_epoch)
                )
                done = self._steps.renewed_if_exhausted(done)
            elif state is wanted_prepare:
                done = self._steps.complete(meta)  # a sink's decision, or from before KIP-890
            elif state is wanted_complete:
                log.debug("%s %r: %s retried, already done", _TXN, tid, decision)
                done = meta
            elif state is _S.EMPTY:
                raise InvalidTxnStateError(
                    f"{_TXN} {tid!r}: cannot {decision}, no transaction is open (no "
                    "partitions were added since the last one ended)"
                )
            else:
                raise InvalidTxnStateError(
                    f"{_TXN} {tid!r}: cannot {decision}, the transaction is {state.name}"
                )
            return done.producer_id, done.producer_epoch

    def _end_retried(
        self,
        claims: Claims,
        meta: TransactionMetadata,
        decision: str,
        wanted_complete: TransactionState,
    ) -> tuple[int, int]:
        """A repeated EndTxn of the transaction the last one ended: its answer again (its
        markers finished first if they were left unwritten), or a refusal when the
        producer has gone on since (a request held on a stalled link, let go late)."""
        tid = meta.transactional_id
        meta = self._steps.settled(claims, tid)  # PREPARE_x: the markers written now
        if meta.state is wanted_complete:
            log.info("%s %r: %s retried, already done", _TXN, tid, decision)
            # The first call may have raised before the producer id was renewed.
            done = self._steps.renewed_if_exhausted(meta)
            return done.producer_id, done.producer_epoch
        if meta.state in (_S.COMPLETE_COMMIT, _S.COMPLETE_ABORT):
            raise InvalidTxnStateError(
                f"{_TXN} {tid!r}: cannot {decision} the transaction of producer id "
                f"{meta.ended_producer_id} epoch {meta.ended_producer_epoch}, it ended "
                f"{meta.state.name}"
            )
        # The request KAFKA-17754 is about: held on a stalled link, let go after its
        # client went on. Said at warning level: an operator sees why a client's log has
        # an error for a transaction it was told ended.
        log.warning(
            "%s %r: refused a late %s of producer id %d epoch %d (the producer is at epoch %d, %s)",
            _TXN,
            tid,
            decision,
            meta.ended_producer_id,
            meta.ended_producer_epoch,
            meta.producer_epoch,
            meta.state.name,
        )
        raise InvalidTxnStateError(
            f"{_TXN} {tid!r}: a late {decision} of the transaction of producer id "
            f"{meta.ended_producer_id} epoch {meta.ended_producer_epoch}, which already "
            f"ended; the producer is at epoch {meta.producer_epoch} ({meta.state.name}) "
            "and this request cannot end what it began since"
        )

    def abort_transaction(self, transactional_id: str) -> bool:
        """An operator's abort (``idemlog transactions abort``): fence the id's holder and
        abort its open transaction. False if nothing was open. A transaction a decided
        sink commit holds is committed instead, never aborted. Raises
        InvalidProducerIdMappingError for an unknown id."""
        self._lifecycle.check_running()
        tid = check_transactional_id(transactional_id)
        with self._registry.claims() as claims:
            claims.txn(tid)
            meta = self._steps.settle(claims, tid)
            if meta is None:
                raise InvalidProducerIdMappingError(f"{_TXN} {tid!r} is unknown")
            if meta.state is not _S.ONGOING:
                return False
            self._steps.end(
                meta,
                commit=False,
                epoch=meta.producer_epoch + 1,
                reason="aborted by an operator (idemlog transactions abort)",
            )
            self._counters.count("transactions_aborted_by_operator")
            return True

    def list_transactions(
        self, min_age_ms: int = 0, *, every_id: bool = False
    ) -> list[dict[str, Any]]:
        """Open transactions (ONGOING) open at least ``min_age_ms``, oldest first, with
        their writer and what holds readers back (``idemlog transactions list``).
        ``every_id``: every transactional id the coordinator keeps, in any state, by id,
        with its state and last update (``--all``: expired ids disappear from it)."""
        self._lifecycle.check_running()
        return self._housekeeping.list_transactions(min_age_ms, every_id=every_id)

    # -- timeouts and expiry ----------------------------------------------------------------
    def abort_timed_out(self, now_ms: int | None = None) -> list[str]:
        """Abort (with an epoch bump, fencing the holder) transactions open past their timeout.

        Also retries leftovers whose marker writes failed earlier. Returns the aborted ids.
        """
        self._lifecycle.check_running()
        now = self._clock() if now_ms is None else now_ms
        return self._housekeeping.abort_timed_out(self.max_timeout_ms, now)

    def expire_idle(self, now_ms: int | None = None) -> ExpiryResult:
        """Remove the transactional ids and sink records idle past their expiry
        (``txn.coordinator.expiry``); returns what was removed. Failures are logged and retried on
        the next call."""
        self._lifecycle.check_running()
        return self._expiry.expire(self._clock() if now_ms is None else now_ms)

    # -- metrics ---------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """The coordinator's status, epoch, ids by state, sinks and counters (metrics)."""
        counts = self._registry.counts()
        return {
            "status": self._lifecycle.status.value,
            "coordinator_epoch": self.coordinator_epoch,
            "transactional_ids": counts.transactional_ids,
            "by_state": counts.by_state,
            "open_transactions": counts.by_state[_S.ONGOING.name],
            "sinks": counts.sinks,
            "sinks_pending": counts.sinks_pending,
            "sink_batches_tracked": self._visibility.count(),
            "sink_runs_alive": self._runs.alive(),
            "transactional_ids_dead": counts.transactional_ids_dead,
            **self._counters.snapshot(),
            "marker_retries": self._sender.retries,
        }
