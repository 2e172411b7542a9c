"""The metrics document: what the validator did, per partition and per producer id.

A broker builds it (``broker_core.server.metrics``) and answers the METRICS action with it
as JSON; the client merges every broker's (:func:`merge_documents`) and
:func:`render_table` prints one for people (``idemlog metrics``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any

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
    # The log cleaner, since the log was opened (docs/storage.md, Compaction).
    cleaner_passes: int = 0
    cleaner_cleaned_bytes: int = 0  # bytes of the segments it rewrote, before cleaning
    cleaner_removed_rows: int = 0
    cleaner_removed_markers: int = 0
    cleaner_last_clean_ms: int = -1  # -1: no pass yet
    # Appends of transaction markers since the log was opened: one per partition per
    # sink commit, whatever its number of tasks (docs/design.md §10).
    marker_appends: int = 0


def merge_documents(docs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One cluster-wide document from each broker's: partitions are disjoint (one leader
    each), producer counters and totals add up, the coordinators' transactions are merged
    (:func:`merge_transactions`: one per state partition, spread over the brokers)."""
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
            transactions = _merge_two(transactions, dict(doc["transactions"]))
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


def merge_transactions(by_partition: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Several coordinators' descriptions (by state partition) as one: counts added,
    ``status`` kept when all agree (else ``mixed``), each ``coordinator_epoch`` under
    ``coordinator_epochs`` by partition (one coordinator: its ``coordinator_epoch`` too),
    and ``state_partitions``, the partitions covered."""
    merged: dict[str, Any] | None = None
    for partition in sorted(by_partition):
        doc = dict(by_partition[partition])
        doc["state_partitions"] = [partition]
        doc["coordinator_epochs"] = {str(partition): doc.get("coordinator_epoch")}
        merged = _merge_two(merged, doc)
    assert merged is not None, "merge_transactions needs at least one coordinator"
    return merged


def _merge_two(one: dict[str, Any] | None, two: dict[str, Any]) -> dict[str, Any]:
    if one is None:
        return two
    merged: dict[str, Any] = dict(one)
    for key, value in two.items():
        mine = merged.get(key)
        if key == "state_partitions":
            merged[key] = sorted({*(mine or []), *value})
        elif key == "coordinator_epochs":
            merged[key] = {**(mine or {}), **value}
        elif key == "coordinator_epoch":
            merged.pop(key, None)  # one per partition: coordinator_epochs
        elif key == "status":
            merged[key] = value if mine in (None, value) else "mixed"
        elif isinstance(value, dict) and isinstance(mine, dict):
            merged[key] = {k: mine.get(k, 0) + value.get(k, 0) for k in {*mine, *value}}
        elif isinstance(value, int) and isinstance(mine, int):
            merged[key] = mine + value
        else:
            merged[key] = value
    return merged
