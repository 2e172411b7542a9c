"""Fencing the attempts a sink no longer wants (docs/design.md, "The sink protocol").

A new run of a sink, a commit, or the driver's abort takes the ids of earlier attempts
away from them: their open transactions are aborted and their epochs bumped, so their
next append or request is refused as fenced with the reason. The caller holds the claims.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker_core.txn.coordinator.claims import Claims
from broker_core.txn.coordinator.counters import Counters
from broker_core.txn.coordinator.registry import TransactionRegistry
from broker_core.txn.coordinator.steps import DurableSteps
from broker_core.txn.state_topic.records import TransactionMetadata, TransactionState

log = logging.getLogger("idemlog.txn")

_S = TransactionState
_TXN = "transactional id"


class SinkLeftovers:
    """Finds a sink's attempts in ``registry`` and fences them through ``steps``."""

    def __init__(
        self, registry: TransactionRegistry, steps: DurableSteps, counters: Counters
    ) -> None:
        self._registry = registry
        self._steps = steps
        self._counters = counters

    def fence(
        self,
        claims: Claims,
        tid: str,
        target: Callable[[TransactionMetadata], bool],
        reason: str,
    ) -> bool:
        """Take an attempt's id away from it: abort what it has open and bump the epoch,
        so its next append or request is refused as fenced, naming ``reason``.

        ``target`` is checked again once the id is claimed and settled: between the scan
        that chose it and now, a newer attempt (of the run that is meant to survive) may
        have taken the id, or a decided commit may have committed it; both are kept.
        """
        claims.txn(tid)
        meta = self._steps.settle(claims, tid)
        if meta is None or not meta.holds_attempt or not target(meta):
            return False
        if meta.state is _S.ONGOING:
            self._steps.end(meta, commit=False, epoch=meta.producer_epoch + 1, reason=reason)
        else:
            self._registry.persist(self._steps.bumped(meta, reason))
        self._counters.count("sink_leftovers_aborted")
        log.info("%s %r: %s", _TXN, tid, reason)
        return True

    def fence_sink(
        self,
        claims: Claims,
        sink_id: str,
        keep: Callable[[TransactionMetadata], bool],
        why: str,
    ) -> int:
        """Fence every attempt of ``sink_id`` holding an id, except those ``keep`` keeps."""

        def target(m: TransactionMetadata) -> bool:
            return m.sink_id == sink_id and not keep(m)

        fenced = 0
        for meta in self._registry.attempts(target, sink_id=sink_id):
            what = f"attempt of sink {sink_id!r} run {meta.sink_run!r} batch {meta.sink_batch}"
            fenced += self.fence(
                claims, meta.transactional_id, target, f"{what} fenced and aborted: {why}"
            )
        return fenced
