"""The coordinator's housekeeping: the timeout pass and the operators' listing.

:func:`abort_timed_out` is the background pass run every
``transaction.abort.timed.out.transaction.cleanup.interval.ms``; :func:`list_transactions`
answers ``idemlog transactions list`` (``--all``: every id). Both work on
:class:`~broker_core.txn.core.CoordinatorCore`'s steps and views; the caller checked that
the coordinator runs.
"""

from __future__ import annotations

import logging
from typing import Any

from broker_core.errors import ConcurrentTransactionsError, IdemlogError
from broker_core.txn.claims import Claims
from broker_core.txn.core import CoordinatorCore
from broker_core.txn.state import NO_SINK, TransactionState
from broker_core.txn.state_store import CoordinatorEpochFencedError

log = logging.getLogger("idemlog.txn")

_S = TransactionState
_TXN = "transactional id"


def abort_timed_out(core: CoordinatorCore, max_timeout_ms: int, now: int) -> list[str]:
    """Abort (with an epoch bump, fencing the holder) transactions open past their timeout.

    Also retries leftovers whose marker writes failed earlier. Returns the aborted ids.
    An abort refused for the coordinator's epoch (CoordinatorEpochFencedError: it was
    deposed, and stood down) ends the pass, logged, with nothing more tried.
    """
    core.forget_runs_older_than(now - max_timeout_ms)
    candidates = core.ongoing()
    expired = [m.transactional_id for m in candidates if now - core.alive_since(m) > m.timeout_ms]
    stuck_sinks, stuck = core.unfinished()
    aborted = []
    for tid in expired:
        try:
            with core.claims() as claims:
                claims.txn(tid)
                if _abort_expired(core, claims, tid, now):
                    aborted.append(tid)
        except CoordinatorEpochFencedError as exc:
            # Not a request racing this one (its base class's meaning below): a newer
            # coordinator took over and this one stood down, so the pass ends here rather
            # than try, and log, an abort of every other id it had found expired.
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
        core.recover_sink(record)
    for tid in stuck:
        core.recover_txn(tid)
    return aborted


def _abort_expired(core: CoordinatorCore, claims: Claims, tid: str, now: int) -> bool:
    meta = core.meta(tid)
    if (
        meta is None
        or meta.state is not _S.ONGOING
        or now - core.alive_since(meta) <= meta.timeout_ms
    ):
        return False  # changed since the scan
    if core.pending_sink_holding(meta) is not None:
        core.settle(claims, tid)  # its sink batch is committed: finish that instead
        return False
    idle = now - core.alive_since(meta)
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
    core.end(meta, commit=False, epoch=meta.producer_epoch + 1, reason=reason)
    core.count("transactions_timed_out")
    return True


def list_transactions(
    core: CoordinatorCore, min_age_ms: int = 0, *, every_id: bool = False
) -> list[dict[str, Any]]:
    """ONGOING transactions open at least ``min_age_ms``, oldest first, with their writer;
    ``every_id``: every transactional id kept, by id, with its state and last update."""

    now = core.now()
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
            for m in core.every_id()
        ]
    metas = core.ongoing()
    rows = []
    for m in sorted(metas, key=lambda m: m.txn_start_ms):
        age = now - m.txn_start_ms
        if age < min_age_ms:
            continue
        idle = now - core.alive_since(m)
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
