"""Broker metrics: what the validator did, per partition and per producer id, and the
produce and fetch requests' counts and latencies.

Counters are bumped by the produce path (one call per batch, under one lock: a few dict
updates next to a ~1 MB write) and by the producer-expiry task. Gauges that the log
already knows (log end, last stable offset) and the coordinator's transaction counts are
read when the document is built, so they are never stale. The document is JSON (the
METRICS action, ``idemlog metrics --json``), the Prometheus endpoint reads the same one
(``broker_core.server.observability.prometheus``), and ``render_table`` prints it for people.

Bounds (docs/operations.md): the per-producer counters are one entry per producer id the
partitions' state already keeps (an expired producer's go with it), plus its id in a
sorted list for paging; the ranking of producers by duplicates holds at most
``MAX_TOP`` ids. The default document is built from aggregates and that ranking, so its
size and cost do not depend on the number of producers; the detail is paged.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any

from broker_core.errors import (
    DuplicateSequenceError,
    ErrorCode,
    IdemlogError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    UnknownProducerIdError,
)
from broker_core.log.partition_log import PartitionLog
from broker_core.protocol.metrics import (
    DEFAULT_TOP,
    MAX_TOP,
    METRICS_VERSION,
    AppendCounters,
    AppendOutcome,
    PartitionGauges,
    ProducerPage,
    counters_row,
)
from broker_core.record.batch import NO_PRODUCER_ID
from broker_core.server.access.authorization import REFUSAL_CODES

_OUTCOME_BY_ERROR: dict[type[IdemlogError], AppendOutcome] = {
    DuplicateSequenceError: AppendOutcome.DUPLICATE_BEYOND_WINDOW,
    OutOfOrderSequenceError: AppendOutcome.OUT_OF_ORDER,
    InvalidProducerEpochError: AppendOutcome.FENCED,
    UnknownProducerIdError: AppendOutcome.UNKNOWN_PRODUCER_ID,
    InvalidTxnStateError: AppendOutcome.INVALID_TXN_STATE,
}


def outcome_of(error: IdemlogError) -> AppendOutcome:
    for cls, outcome in _OUTCOME_BY_ERROR.items():
        if isinstance(error, cls):
            return outcome
    return AppendOutcome.REJECTED


_DUPLICATES = (AppendOutcome.DUPLICATE, AppendOutcome.DUPLICATE_BEYOND_WINDOW)

# Upper bounds (seconds) of the request latency buckets: a fixed set, so a histogram is a
# constant 16 numbers per request kind (Prometheus' default buckets, finer below 5 ms).
LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
# The requests timed: one produced batch, one fetch, and each Kafka API the Kafka listener
# serves (each family in server/kafka/ declares its APIs' kinds: kafka_ and Kafka's name of
# the API, in snake case).
KAFKA_REQUEST_KINDS = (
    "kafka_api_versions",
    "kafka_metadata",
    "kafka_list_offsets",
    "kafka_offset_for_leader_epoch",
    "kafka_fetch",
    "kafka_produce",
    "kafka_init_producer_id",
    "kafka_sasl_handshake",
    "kafka_sasl_authenticate",
    # the consumer groups' (server/kafka/groups.py)
    "kafka_find_coordinator",
    "kafka_join_group",
    "kafka_sync_group",
    "kafka_heartbeat",
    "kafka_leave_group",
    "kafka_offset_commit",
    "kafka_offset_fetch",
    "kafka_describe_groups",
    "kafka_list_groups",
    "kafka_delete_groups",
    # the admin APIs' (server/kafka/admin.py)
    "kafka_create_topics",
    "kafka_delete_topics",
    "kafka_describe_configs",
    "kafka_describe_cluster",
)
REQUEST_KINDS = ("produce", "fetch", *KAFKA_REQUEST_KINDS)


class _RequestFigures:
    """One request kind's count, errors and latency histogram (cumulative at render)."""

    __slots__ = ("buckets", "count", "errors", "seconds")

    def __init__(self) -> None:
        self.count = 0
        self.errors = 0
        self.seconds = 0.0
        self.buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)  # the last one: above every bound

    def record(self, seconds: float, ok: bool) -> None:
        self.count += 1
        self.errors += 0 if ok else 1
        self.seconds += seconds
        self.buckets[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1

    def to_doc(self) -> dict[str, Any]:
        cumulative: dict[str, int] = {}
        running = 0
        for bound, n in zip((*LATENCY_BUCKETS_S, float("inf")), self.buckets, strict=True):
            running += n
            cumulative["+Inf" if bound == float("inf") else repr(bound)] = running
        return {
            "count": self.count,
            "errors": self.errors,
            "latency_seconds_sum": self.seconds,
            "latency_seconds_buckets": cumulative,
        }


class Metrics:
    """Thread-safe counters per (topic, partition) and per producer id, the ranking of
    producers by duplicates, and the timed requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # When these counters started from zero: a restart resets them, and the endpoint
        # says so with process_start_time_seconds and each counter's _created sample.
        self.started_at = time.time()
        self._partitions: dict[tuple[str, int], AppendCounters] = {}
        self._producers: dict[int, AppendCounters] = {}
        self._order: list[int] = []  # the keys of _producers, sorted: the pages' cursor
        # At most MAX_TOP producers with the most duplicates, exact while _top_stale is
        # False: counts only grow, so every producer outside has no more than its minimum.
        # Expiring a member breaks that; the next document ranks every producer again.
        self._top: dict[int, int] = {}
        self._top_stale = False
        self._totals = AppendCounters()
        self._requests = {kind: _RequestFigures() for kind in REQUEST_KINDS}
        # -- authorization: refusals by error code, each code from 0 (a scrape shows 0, not
        # nothing, before the first refusal: an alert can tell none from missing) --
        self._refusals: dict[str, int] = {code.name: 0 for code in REFUSAL_CODES}

    def record_append(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        outcome: AppendOutcome,
        records: int = 0,
        nbytes: int = 0,
    ) -> None:
        with self._lock:
            part = self._partitions.get((topic, partition))
            if part is None:
                part = self._partitions[(topic, partition)] = AppendCounters()
            part.count(outcome, records, nbytes)
            self._totals.count(outcome, records, nbytes)
            if producer_id != NO_PRODUCER_ID:
                prod = self._producers.get(producer_id)
                if prod is None:
                    prod = self._producers[producer_id] = AppendCounters()
                    if self._order and producer_id < self._order[-1]:
                        bisect.insort(self._order, producer_id)
                    else:
                        self._order.append(producer_id)  # ids grow: the usual case
                prod.count(outcome, records, nbytes)
                if outcome in _DUPLICATES:
                    self._rank(
                        producer_id, prod.duplicates_in_window + prod.duplicates_beyond_window
                    )

    def _rank(self, producer_id: int, duplicates: int) -> None:
        top = self._top
        if producer_id in top or len(top) < MAX_TOP:
            top[producer_id] = duplicates
            return
        lowest = min(top, key=lambda pid: (top[pid], -pid))
        if (duplicates, -producer_id) > (top[lowest], -lowest):
            del top[lowest]
            top[producer_id] = duplicates

    def record_request(self, kind: str, seconds: float, ok: bool) -> None:
        """One request of ``kind`` (one of :data:`REQUEST_KINDS`) answered in ``seconds``."""
        with self._lock:
            self._requests[kind].record(seconds, ok)

    def record_expired(self, topic: str, partition: int, producer_ids: Iterable[int]) -> None:
        """Producers dropped by expiry; their per-producer counters go with them."""
        with self._lock:
            expired = list(producer_ids)
            if not expired:
                return
            part = self._partitions.setdefault((topic, partition), AppendCounters())
            part.expired_producers += len(expired)
            self._totals.expired_producers += len(expired)
            for pid in expired:
                if self._producers.pop(pid, None) is not None:
                    i = bisect.bisect_left(self._order, pid)
                    del self._order[i]
                if self._top.pop(pid, None) is not None:
                    self._top_stale = True

    def record_refusal(self, code: ErrorCode) -> None:
        """One request refused by the ACLs (docs/security.md, Authorization)."""
        with self._lock:
            self._refusals[code.name] = self._refusals.get(code.name, 0) + 1

    def forget_topic(self, topic: str) -> None:
        with self._lock:
            for key in [k for k in self._partitions if k[0] == topic]:
                del self._partitions[key]

    def _top_rows(self, top: int) -> list[dict[str, Any]]:
        if self._top_stale:  # after an expiry took a ranked producer: rank all again
            self._top = {}
            for pid, counters in self._producers.items():
                dups = counters.duplicates_in_window + counters.duplicates_beyond_window
                if dups:
                    self._rank(pid, dups)
            self._top_stale = False
        ranked = sorted(self._top, key=lambda pid: (-self._top[pid], pid))[:top]
        return [counters_row(pid, self._producers[pid]) for pid in ranked]

    def document(
        self,
        broker_id: int,
        gauges: Mapping[tuple[str, int], PartitionGauges],
        transactions: Mapping[str, Any] | None,
        top: int = DEFAULT_TOP,
    ) -> dict[str, Any]:
        """The default metrics document: totals, requests, partitions (counters + gauges),
        the ``top`` producers by duplicates answered, transactions. Its size depends on
        the partitions and ``top`` (at most MAX_TOP), not on the number of producers."""
        with self._lock:
            counters = {k: asdict(v) for k, v in self._partitions.items()}
            producers = self._top_rows(min(top, MAX_TOP))
            totals = asdict(self._totals)
            tracked = len(self._producers)
            requests = {kind: f.to_doc() for kind, f in self._requests.items()}
            refusals = dict(sorted(self._refusals.items()))
        partitions = []
        for key in sorted(set(counters) | set(gauges)):
            row: dict[str, Any] = {"topic": key[0], "partition": key[1]}
            row.update(counters.get(key) or asdict(AppendCounters()))
            gauge = gauges.get(key)
            if gauge is not None:
                row.update(asdict(gauge))
                row["lso_lag"] = gauge.log_end_offset - gauge.last_stable_offset
            partitions.append(row)
        return {
            "version": METRICS_VERSION,
            "broker_id": broker_id,
            "started_at": self.started_at,
            "totals": totals,
            "producers_active": sum(g.producers for g in gauges.values()),
            "producers_tracked": tracked,
            "requests": requests,
            "partitions": partitions,
            "top": top,
            "producers": producers,
            "transactions": dict(transactions) if transactions is not None else None,
            # Counters by label, each {label value: count}; the Prometheus endpoint exports
            # every one (broker_core/server/observability/prometheus.py). Refusals by error name.
            "counters": {"authorization_refusals": refusals},
        }

    def producer_page(self, broker_id: int, after: int, size: int) -> ProducerPage:
        """Up to ``size`` producers with an id above ``after``, by id, and the cursor of
        the next page (None when none is left). Costs O(log n + size)."""
        with self._lock:
            start = bisect.bisect_right(self._order, after)
            ids = self._order[start : start + size]
            rows = tuple(counters_row(pid, self._producers[pid]) for pid in ids)
            more = start + size < len(self._order)
            tracked = len(self._producers)
        token = str(ids[-1]) if more and ids else None
        return ProducerPage(broker_id, rows, token, tracked)


def partition_gauges(
    logs: Iterable[tuple[str, int, PartitionLog]],
) -> dict[tuple[str, int], PartitionGauges]:
    """What each local partition's log knows now: offsets, producer entries, open
    transactions, the cleaner's figures, marker appends (O(partitions))."""
    gauges: dict[tuple[str, int], PartitionGauges] = {}
    for topic, partition, log_ in logs:
        stats = log_.cleaner.stats
        gauges[(topic, partition)] = PartitionGauges(
            log_start_offset=log_.log_start_offset,
            log_end_offset=log_.log_end_offset,
            last_stable_offset=log_.last_stable_offset,
            producers=len(log_.state),
            open_transactions=len(log_.state.ongoing_transactions()),
            cleaner_passes=stats.passes,
            cleaner_cleaned_bytes=stats.cleaned_bytes,
            cleaner_removed_rows=stats.removed_rows,
            cleaner_removed_markers=stats.removed_markers,
            cleaner_last_clean_ms=stats.last_clean_ms,
            marker_appends=log_.marker_appends,
        )
    return gauges
