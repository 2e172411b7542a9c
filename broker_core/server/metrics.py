"""Broker metrics: what the validator did, per partition and per producer id.

Counters are bumped by the produce path (one call per batch, under one lock: a few dict
updates next to a ~1 MB write) and by the producer-expiry task. Gauges that the log
already knows (log end, last stable offset) and the coordinator's transaction counts are
read when the document is built, so they are never stale. The document is JSON (the
METRICS action, ``idemlog metrics --json``); :func:`render_table` prints it for people.
"""

from __future__ import annotations

import threading
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
from broker_core.protocol.metrics import (
    METRICS_VERSION,
    AppendCounters,
    AppendOutcome,
    PartitionGauges,
)
from broker_core.record.batch import NO_PRODUCER_ID

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


class Metrics:
    """Thread-safe counters per (topic, partition) and per producer id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partitions: dict[tuple[str, int], AppendCounters] = {}
        self._producers: dict[int, AppendCounters] = {}
        self._totals = AppendCounters()
        # -- authorization: refusals by error code (bounded by the three codes) --
        self._refusals: dict[str, int] = {}

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
                prod.count(outcome, records, nbytes)

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
                self._producers.pop(pid, None)

    def record_refusal(self, code: ErrorCode) -> None:
        """One request refused by the ACLs (docs/security.md, Authorization)."""
        with self._lock:
            self._refusals[code.name] = self._refusals.get(code.name, 0) + 1

    def forget_topic(self, topic: str) -> None:
        with self._lock:
            for key in [k for k in self._partitions if k[0] == topic]:
                del self._partitions[key]

    def document(
        self,
        broker_id: int,
        gauges: Mapping[tuple[str, int], PartitionGauges],
        transactions: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        """The metrics document: partitions (counters + gauges), producers, transactions."""
        with self._lock:
            counters = {k: asdict(v) for k, v in self._partitions.items()}
            producers = {pid: asdict(v) for pid, v in self._producers.items()}
            totals = asdict(self._totals)
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
            "totals": totals,
            "partitions": partitions,
            "producers": [{"producer_id": pid, **producers[pid]} for pid in sorted(producers)],
            "transactions": dict(transactions) if transactions is not None else None,
            # Added field (older readers ignore it): {error name: count}.
            "authorization_refusals": refusals,
        }
