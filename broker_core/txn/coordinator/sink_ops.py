"""The sink-commit operations of the transaction coordinator (docs/design.md §6).

A sink's tasks prepare their transactions (``prepare_sink_txn``) and keep their run alive
(``sink_heartbeat``); the driver commits a whole Spark batch once (``commit_sink_batch``:
the :class:`SinkCommitRecord` in PREPARE is the durable decision, its transactions are
committed after it) or aborts it (``abort_sink_batch``, ``abort_sink_run``).
:class:`broker_core.txn.coordinator.coordinator.TransactionCoordinator` holds a
:class:`SinkOperations` and answers these requests through it; the plain transactions
and producer ids stay with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from broker_core.errors import InvalidRequestError, InvalidTxnStateError
from broker_core.protocol.txn_inputs import (
    check_batch_id,
    check_offset_ranges,
    check_producer,
    check_run_id,
    check_sink_id,
    check_transactional_id,
    check_transactions,
    is_batch_job,
)
from broker_core.txn.coordinator.counters import Counters
from broker_core.txn.coordinator.leftovers import SinkLeftovers
from broker_core.txn.coordinator.lifecycle import CoordinatorLifecycle
from broker_core.txn.coordinator.registry import TransactionRegistry
from broker_core.txn.coordinator.sink_batches import UnsettledBatches
from broker_core.txn.coordinator.sink_runs import SinkRuns
from broker_core.txn.coordinator.steps import DurableSteps
from broker_core.txn.coordinator.visibility import VisibilityTracker
from broker_core.txn.state_topic.records import (
    NO_SINK,
    SinkCommitRecord,
    SinkCommitState,
    TransactionMetadata,
    TransactionState,
    merge_ranges,
)

log = logging.getLogger("idemlog.txn")

_S = TransactionState
_TXN = "transactional id"


def EVERY_ID(transactional_id: str) -> bool:
    """``abort_sink_run``'s default: no ACLs asked, every id of the run is fenced."""
    return True


class SinkOperations:
    """A sink's prepare, heartbeat, batch commit and aborts, on the coordinator's state.

    Held by ``TransactionCoordinator``, which builds it with the parts it works on: the
    ids and records (``registry``), the runs' signs of life (``runs``), the durable steps
    (``steps``), the fencing of leftovers (``leftovers``), the batches tracked for the
    readers' cut (``visibility``) and the held-back batches' records (``batches``);
    ``clock()`` is the time in ms. Every call raises what the coordinator's
    requests raise (see its docstring).
    """

    def __init__(
        self,
        lifecycle: CoordinatorLifecycle,
        registry: TransactionRegistry,
        runs: SinkRuns,
        steps: DurableSteps,
        leftovers: SinkLeftovers,
        visibility: VisibilityTracker,
        batches: UnsettledBatches,
        counters: Counters,
        clock: Callable[[], int],
    ) -> None:
        self._lifecycle = lifecycle
        self._registry = registry
        self._runs = runs
        self._steps = steps
        self._leftovers = leftovers
        self._visibility = visibility
        self._batches = batches
        self._counters = counters
        self._clock = clock

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
        (:meth:`TransactionCoordinator.init_sink_producer`). Raises InvalidTxnStateError
        when the transaction is not open for ``batch_id`` or a range's partition was not
        added to it, and the fencing errors of :meth:`TransactionCoordinator.add_partitions`.
        """
        self._lifecycle.check_running()
        tid = check_transactional_id(transactional_id)
        check_producer(producer_id, producer_epoch)
        bid = check_batch_id(batch_id)
        spans = check_offset_ranges(ranges)
        with self._registry.claims() as claims:
            claims.txn(tid)
            self._registry.require(tid, producer_id, producer_epoch)
            meta = self._steps.settled(claims, tid)
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
            self._runs.touch(meta.sink_id, meta.sink_run, self._clock())
            if meta.sink_prepared:
                return  # a retried request
            new = meta.copy()
            new.sink_prepared = True
            new.sink_ranges = spans
            new.last_update_ms = self._clock()
            self._registry.persist(new)

    def sink_heartbeat(self, sink_id: str, run_id: str) -> None:
        """A task of this run is alive: its run's transactions are not timed out."""
        self._lifecycle.check_running()
        self._runs.touch(check_sink_id(sink_id), check_run_id(run_id), self._clock())

    # -- sinks (docs/design.md §6) --------------------------------------------------------
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

        When it returns True the batch is committed in every partition; once the commit
        record is stored (even if this call then raises) the commit is decided and is
        finished by whoever touches the sink or its transactions next. Raises
        InvalidTxnStateError naming the transaction that is not committable, and the
        fencing errors of :meth:`TransactionCoordinator.add_partitions`.
        """
        self._lifecycle.check_running()
        sid = check_sink_id(sink_id)
        bid = check_batch_id(batch_id)
        txns = check_transactions(transactions)
        run = None if run_id is None else check_run_id(run_id)
        named = {tid for tid, _, _ in txns}

        def leftover_kept(m: TransactionMetadata) -> bool:
            return m.transactional_id in named or m.sink_batch > bid

        with self._registry.claims() as claims:
            claims.sink(sid)
            for tid, _, _ in txns:
                claims.txn(tid)
            record = self._registry.sink_record(sid)
            if record is not None and record.is_pending:
                self._steps.finish_sink(claims, record)
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
                    self._steps.abort_if_open(claims, *txn)
                self._leftovers.fence_sink(
                    claims, sid, leftover_kept, f"batch {bid} was committed before"
                )
                self._counters.count("sink_batches_repeated")
                return False
            # Everything is checked before anything is recorded: nothing partial.
            for tid, pid, epoch in txns:
                self._registry.require(tid, pid, epoch)
            ranges: list[tuple[str, int, int, int]] = []
            for tid, _, _ in txns:
                meta = self._steps.settled(claims, tid)
                self._check_committable(meta, sid, bid, run)
                ranges.extend(meta.sink_ranges)
            # The sink's record names this batch only: a batch of the sink readers may still
            # see in part gets a record of its own first (docs/design.md §7).
            self._batches.keep(sid, bid)
            prepared = SinkCommitRecord(
                sid,
                bid,
                SinkCommitState.PREPARE,
                list(txns),
                merge_ranges(ranges),
                batch_job=is_batch_job(sid, run),
            )
            # Tracked before it is durable: a reader's cut must know a batch before any of
            # its markers can be written, and a record that failed to store is only extra.
            # (Only the PREPARE record: once COMPLETE its markers may have settled it.)
            self._visibility.track_record(prepared)
            self._registry.persist_sink(prepared)
            self._steps.finish_sink(claims, prepared)
            self._counters.count("sink_batches_committed")
            self._leftovers.fence_sink(
                claims,
                sid,
                leftover_kept,
                f"batch {bid} of the sink was committed without it",
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
        self,
        run_id: str | None,
        batch_id: int,
        *,
        sink_id: str | None = None,
        allowed: Callable[[str], bool] = EVERY_ID,
    ) -> list[str]:
        """Fence every attempt of ``run_id`` -- or, without one, of any run of ``sink_id``
        -- at ``batch_id`` or earlier that still holds an id (the driver aborts the
        batch); returns their transactional ids.

        Needs no message from any task: a batch whose tasks all failed is aborted too.
        ``allowed``: only the ids it accepts are fenced (the caller's ACLs: Write on the
        transactional id), decided before each is touched.
        Raises InvalidRequestError when neither ``run_id`` nor ``sink_id`` is given.
        """
        self._lifecycle.check_running()
        run = None if run_id is None else check_run_id(run_id)
        sid = None if sink_id is None else check_sink_id(sink_id)
        if run is None and sid is None:
            raise InvalidRequestError("abort_sink_run needs a run_id or a sink_id")
        bid = check_batch_id(batch_id)

        def target(m: TransactionMetadata) -> bool:
            owner = m.sink_run == run if run is not None else m.sink_id == sid
            return owner and m.sink_batch <= bid and allowed(m.transactional_id)

        who = f"run {run!r}" if run is not None else f"sink {sid!r}"
        reason = f"batch {bid} of {who} was aborted by the Spark driver"
        aborted = []
        for meta in self._registry.attempts(target, sink_id=sid, run_id=run):
            with self._registry.claims() as claims:
                if self._leftovers.fence(claims, meta.transactional_id, target, reason):
                    aborted.append(meta.transactional_id)
        return aborted

    def abort_sink_batch(
        self, sink_id: str, batch_id: int, transactions: Sequence[tuple[str, int, int]]
    ) -> None:
        """Abort the batch's transactions still open (a batch already committed stays so)."""
        self._lifecycle.check_running()
        sid = check_sink_id(sink_id)
        check_batch_id(batch_id)
        txns = check_transactions(transactions)
        with self._registry.claims() as claims:
            claims.sink(sid)
            for tid, _, _ in txns:
                claims.txn(tid)
            for txn in txns:
                self._steps.abort_if_open(claims, *txn)

    def last_committed_batch(self, sink_id: str) -> int | None:
        """The sink's last committed batch id (a PREPARE record counts: it is decided)."""
        self._lifecycle.check_running()
        record = self._registry.sink_record(check_sink_id(sink_id))
        return None if record is None else record.batch_id
