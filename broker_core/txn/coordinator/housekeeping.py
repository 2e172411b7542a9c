"""The coordinator's housekeeping: the timeout pass and the operators' listing.

:meth:`Housekeeping.abort_timed_out` is the background pass run every
``transaction.abort.timed.out.transaction.cleanup.interval.ms``;
:meth:`Housekeeping.list_transactions` answers ``idemlog transactions list`` (``--all``:
every id). The caller checked that the coordinator runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from broker_core.errors import ConcurrentTransactionsError, IdemlogError
from broker_core.txn.coordinator.claims import Claims
from broker_core.txn.coordinator.counters import Counters
from broker_core.txn.coordinator.registry import TransactionRegistry
from broker_core.txn.coordinator.sink_runs import SinkRuns
from broker_core.txn.coordinator.steps import DurableSteps
from broker_core.txn.state_topic.records import NO_SINK, TransactionState
from broker_core.txn.state_topic.store import CoordinatorEpochFencedError

log = logging.getLogger("idemlog.txn")

_S = TransactionState
_TXN = "transactional id"


class Housekeeping:
    """Times transactions out by ``runs``' signs of life, aborting them through
    ``steps``; lists ``registry``'s transactions at ``clock()`` (ms)."""

    def __init__(
        self,
        registry: TransactionRegistry,
        runs: SinkRuns,
        steps: DurableSteps,
        counters: Counters,
        clock: Callable[[], int],
    ) -> None:
        self._registry = registry
        self._runs = runs
        self._steps = steps
        self._counters = counters
        self._clock = clock

    def abort_timed_out(self, max_timeout_ms: int, now: int) -> list[str]:
        """Abort (with an epoch bump, fencing the holder) transactions open past their timeout.

        Also retries leftovers whose marker writes failed earlier. Returns the aborted ids.
        An abort refused for the coordinator's epoch (CoordinatorEpochFencedError: it was
        deposed, and stood down) ends the pass, logged, with nothing more tried.
        """
        self._runs.forget_older_than(now - max_timeout_ms)
        candidates = self._registry.ongoing()
        expired = [
            m.transactional_id for m in candidates if now - self._runs.alive_since(m) > m.timeout_ms
        ]
        stuck_sinks, stuck = self._registry.unfinished()
        aborted = []
        for tid in expired:
            try:
                with self._registry.claims() as claims:
                    claims.txn(tid)
                    if self._abort_expired(claims, tid, now):
                        aborted.append(tid)
            except CoordinatorEpochFencedError as exc:
                # Not a request racing this one (its base class's meaning below): a newer
                # coordinator took over and this one stood down, so the pass ends here
                # rather than try, and log, an abort of every other id it found expired.
                log.warning(
                    "timeout pass stopped: the abort of timed-out %s %r was refused: %s",
                    _TXN,
                    tid,
                    exc.message,
                )
                return aborted
            except ConcurrentTransactionsError:
                continue  # another request is on it right now
            except IdemlogError as exc:
                log.warning("could not abort timed-out %s %r yet: %s", _TXN, tid, exc)
        for record in stuck_sinks:
            self._steps.recover_sink(record)
        for tid in stuck:
            self._steps.recover_txn(tid)
        return aborted

    def _abort_expired(self, claims: Claims, tid: str, now: int) -> bool:
        meta = self._registry.meta(tid)
        if (
            meta is None
            or meta.state is not _S.ONGOING
            or now - self._runs.alive_since(meta) <= meta.timeout_ms
        ):
            return False  # changed since the scan
        if self._registry.pending_sink_holding(meta) is not None:
            self._steps.settle(claims, tid)  # its sink batch is committed: finish that instead
            return False
        idle = now - self._runs.alive_since(meta)
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
        self._steps.end(meta, commit=False, epoch=meta.producer_epoch + 1, reason=reason)
        self._counters.count("transactions_timed_out")
        return True

    def list_transactions(
        self, min_age_ms: int = 0, *, every_id: bool = False
    ) -> list[dict[str, Any]]:
        """ONGOING transactions open at least ``min_age_ms``, oldest first, with their
        writer; ``every_id``: every transactional id kept, by id, with its state and last
        update."""
        now = self._clock()
        if every_id:
            return [
                {
                    "transactional_id": m.transactional_id,
                    "state": m.state.name,
                    "producer_id": m.producer_id,
                    "producer_epoch": m.producer_epoch,
                    "last_update_ms": m.last_update_ms,
                    "idle_ms": now - m.last_update_ms,
                    "sink_id": m.sink_id,
                }
                for m in self._registry.every_id()
            ]
        metas = self._registry.ongoing()
        rows = []
        for m in sorted(metas, key=lambda m: m.txn_start_ms):
            age = now - m.txn_start_ms
            if age < min_age_ms:
                continue
            idle = now - self._runs.alive_since(m)
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
