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
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any

from broker_core.errors import (
    DuplicateSequenceError,
    IdemlogError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    UnknownProducerIdError,
)
from broker_core.record_batch import NO_PRODUCER_ID

METRICS_VERSION = 1


class AppendOutcome(Enum):
    """What became of one produced batch, as far as the metrics care."""

    APPENDED = "appended"
    DUPLICATE = "duplicate"  # in the cached window: answered with the original offsets
    DUPLICATE_BEYOND_WINDOW = "duplicate_beyond_window"  # DUPLICATE_SEQUENCE_NUMBER
    OUT_OF_ORDER = "out_of_order"
    FENCED = "fenced"  # INVALID_PRODUCER_EPOCH
    UNKNOWN_PRODUCER_ID = "unknown_producer_id"
    INVALID_TXN_STATE = "invalid_txn_state"
    REJECTED = "rejected"  # any other error (schema, size, closed log, ...)


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


@dataclass(slots=True)
class AppendCounters:
    batches_appended: int = 0
    records_appended: int = 0
    bytes_appended: int = 0
    duplicates_in_window: int = 0
    duplicates_beyond_window: int = 0
    out_of_order: int = 0
    fenced_appends: int = 0
    unknown_producer_ids: int = 0
    invalid_txn_state: int = 0
    rejected: int = 0
    expired_producers: int = 0

    def count(self, outcome: AppendOutcome, records: int, nbytes: int) -> None:
        if outcome is AppendOutcome.APPENDED:
            self.batches_appended += 1
            self.records_appended += records
            self.bytes_appended += nbytes
        elif outcome is AppendOutcome.DUPLICATE:
            self.duplicates_in_window += 1
        elif outcome is AppendOutcome.DUPLICATE_BEYOND_WINDOW:
            self.duplicates_beyond_window += 1
        elif outcome is AppendOutcome.OUT_OF_ORDER:
            self.out_of_order += 1
        elif outcome is AppendOutcome.FENCED:
            self.fenced_appends += 1
        elif outcome is AppendOutcome.UNKNOWN_PRODUCER_ID:
            self.unknown_producer_ids += 1
        elif outcome is AppendOutcome.INVALID_TXN_STATE:
            self.invalid_txn_state += 1
        else:
            self.rejected += 1

    def merge(self, other: Mapping[str, Any]) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + int(other.get(f.name, 0)))


COUNTER_NAMES = tuple(f.name for f in fields(AppendCounters))


@dataclass(frozen=True, slots=True)
class PartitionGauges:
    """Read from the partition's log when the document is built."""

    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int
    producers: int
    open_transactions: int


class Metrics:
    """Thread-safe counters per (topic, partition) and per producer id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partitions: dict[tuple[str, int], AppendCounters] = {}
        self._producers: dict[int, AppendCounters] = {}
        self._totals = AppendCounters()

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
        }


def merge_documents(docs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One cluster-wide document from each broker's: partitions are disjoint (one leader
    each), producer counters and totals add up, transactions come from the coordinator."""
    totals = AppendCounters()
    producers: dict[int, AppendCounters] = {}
    partitions: list[dict[str, Any]] = []
    transactions: dict[str, Any] | None = None
    brokers: list[int] = []
    for doc in docs:
        brokers.append(int(doc["broker_id"]))
        totals.merge(doc["totals"])
        partitions.extend(doc["partitions"])
        for row in doc["producers"]:
            producers.setdefault(int(row["producer_id"]), AppendCounters()).merge(row)
        if doc.get("transactions") is not None:
            transactions = dict(doc["transactions"])
    return {
        "version": METRICS_VERSION,
        "brokers": sorted(brokers),
        "totals": asdict(totals),
        "partitions": sorted(partitions, key=lambda r: (r["topic"], r["partition"])),
        "producers": [{"producer_id": pid, **asdict(producers[pid])} for pid in sorted(producers)],
        "transactions": transactions,
    }


_SHORT = {
    "batches_appended": "batches",
    "records_appended": "records",
    "bytes_appended": "bytes",
    "duplicates_in_window": "dup",
    "duplicates_beyond_window": "dup_old",
    "out_of_order": "oos",
    "fenced_appends": "fenced",
    "unknown_producer_ids": "unk_pid",
    "invalid_txn_state": "bad_txn",
    "rejected": "rejected",
    "expired_producers": "expired",
}


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    out = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    out.extend("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    return out


def render_table(doc: Mapping[str, Any]) -> str:
    """A per-broker or merged document as text tables (partitions, producers, txns)."""
    lines: list[str] = []
    part_headers = ["topic", "part", *(_SHORT[c] for c in COUNTER_NAMES), "leo", "lso", "lag"]
    part_rows = [
        [
            str(r["topic"]),
            str(r["partition"]),
            *(str(r.get(c, 0)) for c in COUNTER_NAMES),
            str(r.get("log_end_offset", "-")),
            str(r.get("last_stable_offset", "-")),
            str(r.get("lso_lag", "-")),
        ]
        for r in doc["partitions"]
    ]
    lines.append("partitions")
    lines.extend(_table(part_headers, part_rows) if part_rows else ["  (none)"])
    prod_rows = [
        [str(r["producer_id"]), *(str(r.get(c, 0)) for c in COUNTER_NAMES)]
        for r in doc["producers"]
    ]
    lines.append("")
    lines.append("producers")
    prod_headers = ["producer_id", *(_SHORT[c] for c in COUNTER_NAMES)]
    lines.extend(_table(prod_headers, prod_rows) if prod_rows else ["  (none)"])
    lines.append("")
    txns = doc.get("transactions")
    if txns:
        lines.append("transactions")
        lines.extend(f"  {k}: {v}" for k, v in sorted(txns.items()))
    else:
        lines.append("transactions: (no coordinator on this broker)")
    lines.append("")
    lines.append(
        "legend: dup = duplicate inside the cached window (original offsets returned), "
        "dup_old = DUPLICATE_SEQUENCE (beyond the window), oos = out-of-order rejections, "
        "fenced = INVALID_PRODUCER_EPOCH, unk_pid = UNKNOWN_PRODUCER_ID, bad_txn = "
        "INVALID_TXN_STATE, expired = producers expired, lag = log end - last stable offset"
    )
    return "\n".join(lines)
