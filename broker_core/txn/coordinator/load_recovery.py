"""What a coordinator finds half done when it loads, finished in the background.

A new coordinator (a new leader of its state partition) serves as soon as its state is
loaded; the ``PREPARE_x`` transactions and pending sink commits it found are finished
here, each on its own worker, retried by the marker sender until its deadline (then left
for the timeout sweep, ``housekeeping``), so one partition stuck offline delays only the
transactions whose markers go there. Each recovery claims its ids (``claims``): a request
touching one meanwhile gets CONCURRENT_TRANSACTIONS (retriable), the others are served.

Bounded: at most ``MAX_WORKERS`` threads, the queue at most the ids found at the load.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from broker_core.txn.coordinator.steps import DurableSteps
from broker_core.txn.state_topic.records import SinkCommitRecord

log = logging.getLogger("idemlog.txn")

MAX_WORKERS = 16


class BackgroundRecovery:
    """Runs ``steps``' recoveries on up to MAX_WORKERS threads until :meth:`stop`."""

    def __init__(self, steps: DurableSteps) -> None:
        self._steps = steps
        self._pool: ThreadPoolExecutor | None = None

    def finish(
        self,
        pending_sinks: Sequence[SinkCommitRecord],
        prepared: Sequence[str],
        background: bool,
    ) -> None:
        """Finish the pending sink commits, then the PREPARE_x transactions: now, or with
        ``background`` on the workers (returning at once)."""
        # Sinks first: a pending sink record may hold transactions still ONGOING.
        recoveries = [functools.partial(self._steps.recover_sink, r) for r in pending_sinks]
        recoveries += [functools.partial(self._steps.recover_txn, t) for t in prepared]
        if background:
            self.run(recoveries)
        else:
            for recovery in recoveries:
                recovery()

    def run(self, recoveries: Sequence[Callable[[], None]]) -> None:
        """Start ``recoveries`` (in order, up to MAX_WORKERS at a time); returns at once.
        Each one logs its own failures (``DurableSteps.recover_*``)."""
        if not recoveries:
            return
        self._pool = ThreadPoolExecutor(
            min(MAX_WORKERS, len(recoveries)), thread_name_prefix="idemlog-txn-recovery"
        )
        for recovery in recoveries:
            self._pool.submit(_logged, recovery)

    def stop(self) -> None:
        """Drop the recoveries not started; the running ones end with the marker
        sender's stop (the coordinator's close)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _logged(recovery: Callable[[], None]) -> None:
    try:
        recovery()
    except Exception:
        log.exception("finishing a transaction found at the load failed")
