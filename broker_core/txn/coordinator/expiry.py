"""Transactional ids and sink records expire (docs/design.md §5, "Expiry").

One pass (:meth:`Expiry.expire`, run by the broker every
``transaction.remove.expired.transaction.cleanup.interval.ms``) removes:

* every transactional id idle longer than ``transactional.id.expiration.ms``: EMPTY or
  COMPLETE_COMMIT/COMPLETE_ABORT (never ONGOING or PREPARE_x), not named by a pending
  sink record, not changed since and, for a sink task's id, no task of its run wrote or
  beat since. Kafka's way: the id goes DEAD (durable), then its record is removed (a
  tombstone in ``__transaction_state``), then it is dropped from memory. A producer
  still using it is told so (INVALID_PRODUCER_ID_MAPPING, naming the setting); a new
  init gets a new producer id.
* a sink's record once none of its ids remains, it is complete, no committed batch of it
  is still tracked for the readers' cut, and it is idle longer than its expiry: a
  df.write job's (``batch_job``) after ``transactional.id.expiration.ms``, as nobody
  commits that sink again; a streaming query's after ``sink.stream.expiration.ms``
  (-1: never), since a restart from its checkpoint needs it (docs/failure-model.md).

Every removal happens under the claims of what it removes, with its condition checked
again once claimed, so it never races a request that revives the id or the sink.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from broker_core.errors import ConcurrentTransactionsError, IdemlogError
from broker_core.txn.coordinator.counters import Counters
from broker_core.txn.coordinator.lifecycle import CoordinatorLifecycle, CoordinatorStatus
from broker_core.txn.coordinator.registry import TransactionRegistry
from broker_core.txn.coordinator.sink_runs import SinkRuns
from broker_core.txn.coordinator.visibility import VisibilityTracker
from broker_core.txn.state_topic.records import (
    NO_SINK,
    SinkCommitRecord,
    TransactionMetadata,
    TransactionState,
)

log = logging.getLogger("idemlog.txn")

_S = TransactionState
_IDLE = frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT, _S.DEAD})
NEVER = -1  # sink.stream.expiration.ms: a stream's record never expires


@dataclass(frozen=True)
class ExpiryPolicy:
    """``id_expiration_ms``: transactional.id.expiration.ms (also a df.write job's record);
    ``stream_sink_expiration_ms``: sink.stream.expiration.ms, :data:`NEVER` or >= 1."""

    id_expiration_ms: int = 604_800_000
    stream_sink_expiration_ms: int = NEVER


@dataclass
class ExpiryResult:
    transactional_ids: list[str] = field(default_factory=list)
    sinks: list[str] = field(default_factory=list)


class Expiry:
    """Removes from ``registry`` what ``policy`` lets expire: an id idle by its own
    changes and its run's signs of life (``runs``), a sink once none of its batches is
    tracked in ``visibility``; a pass ends when ``lifecycle`` is no longer RUNNING."""

    def __init__(
        self,
        policy: ExpiryPolicy,
        registry: TransactionRegistry,
        runs: SinkRuns,
        visibility: VisibilityTracker,
        lifecycle: CoordinatorLifecycle,
        counters: Counters,
    ) -> None:
        self.policy = policy
        self._registry = registry
        self._runs = runs
        self._visibility = visibility
        self._lifecycle = lifecycle
        self._counters = counters

    def expire(self, now_ms: int) -> ExpiryResult:
        """One expiry pass at ``now_ms``; returns what it removed. A removal that fails
        (the store unavailable, a claim held by a request) is logged and left for the next
        pass."""
        result = ExpiryResult()
        metas, _ = self._registry.expiry_candidates(now_ms - self.policy.id_expiration_ms)
        for meta in sorted(metas, key=lambda m: m.transactional_id):
            if self._lifecycle.status is not CoordinatorStatus.RUNNING:
                return result  # closed or replaced meanwhile: the next coordinator's pass
            tid = meta.transactional_id
            if _attempt(partial(self._expire_id, tid, now_ms), f"transactional id {tid!r}"):
                result.transactional_ids.append(tid)
        # After the ids: a job's record goes in the same pass as its last id.
        _, sinks = self._registry.expiry_candidates(now_ms - self.policy.id_expiration_ms)
        for record in sorted(sinks, key=lambda r: r.sink_id):
            if self._lifecycle.status is not CoordinatorStatus.RUNNING:
                return result
            sid = record.sink_id
            if _attempt(partial(self._expire_sink, sid, now_ms), f"sink {sid!r}"):
                result.sinks.append(sid)
        if result.transactional_ids or result.sinks:
            log.info(
                "expired %d transactional ids and %d sink records idle past their expiry",
                len(result.transactional_ids),
                len(result.sinks),
            )
        return result

    def id_expires(self, meta: TransactionMetadata, now: int) -> bool:
        """Whether ``meta`` may expire at ``now`` (see the module's rules)."""
        if meta.state not in _IDLE or self._registry.held_by_pending_sink(meta.transactional_id):
            return False
        if meta.state is _S.DEAD:
            return True  # decided by an earlier pass; only its removal is left
        last = meta.last_update_ms
        if meta.sink_id != NO_SINK:
            last = max(last, self._runs.beat(meta))
        return now - last > self.policy.id_expiration_ms

    def _expire_id(self, tid: str, now: int) -> bool:
        with self._registry.claims() as claims:
            claims.txn(tid)
            meta = self._registry.meta(tid) or self._registry.dead(tid)
            if meta is None or not self.id_expires(meta, now):
                return False
            # Kafka's way: DEAD durably, then the record removed. A failed removal leaves
            # it DEAD: absent to requests, retried next pass.
            if meta.state is not _S.DEAD:
                self._registry.bury(meta)
                self._counters.count("transactional_ids_expired")
            self._registry.delete(tid)
            log.info(
                "transactional id %r (producer id %d) expired: idle since %d, over "
                "transactional.id.expiration.ms=%d",
                tid,
                meta.producer_id,
                meta.last_update_ms,
                self.policy.id_expiration_ms,
            )
            return True

    def sink_expires(self, record: SinkCommitRecord, now: int) -> bool:
        """Whether the sink's record may expire at ``now`` (see the module's rules)."""
        if (
            record.is_pending
            or self._registry.sink_has_ids(record.sink_id)
            # a committed batch of the sink still tracked for the readers' cut
            or self._visibility.unsettled_of(record.sink_id)
        ):
            return False
        policy = self.policy
        limit = policy.id_expiration_ms if record.batch_job else policy.stream_sink_expiration_ms
        return limit != NEVER and now - record.last_update_ms > limit

    def _expire_sink(self, sid: str, now: int) -> bool:
        with self._registry.claims() as claims:
            claims.sink(sid)
            record = self._registry.sink_record(sid)
            if record is None or not self.sink_expires(record, now):
                return False
            self._registry.remove_sink(record)
            self._runs.forget_sink(sid)
            self._counters.count("sinks_expired")
            log.info(
                "sink %r (%s, last batch %d) expired: idle since %d",
                sid,
                "df.write job" if record.batch_job else "streaming query",
                record.batch_id,
                record.last_update_ms,
            )
            return True


def _attempt(removal: Callable[[], bool], what: str) -> bool:
    try:
        return removal()
    except ConcurrentTransactionsError:
        # A request holds it right now: it is not idle. (A deposed coordinator's
        # CoordinatorEpochFencedError too: the pass then ends at its next status check.)
        return False
    except IdemlogError as exc:
        log.warning("could not expire %s yet: %s", what, exc)
        return False
