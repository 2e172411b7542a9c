"""The metrics document: what the validator did, per partition and per producer id.

A broker builds it (``broker_core.server.observability.metrics``) and answers the METRICS
action with it as JSON; the client merges every broker's (:func:`merge_documents`) and
:func:`render_table` prints one for people (``idemlog metrics``).

The default document is bounded by what an operator reads, never by the number of
producers (docs/operations.md): aggregates per broker (``totals``, ``producers_active``,
``requests``) and per partition, and the ``top`` producers by duplicates answered. The
per-producer detail is a separate, paged answer (:class:`MetricsRequest` with
``detail="producers"``, answered by a :class:`ProducerPage`), ordered by producer id with
the last id of a page as the cursor of the next.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any, ClassVar

from broker_core.errors import InvalidRequestError
from broker_core.protocol.requests import Wire
from broker_core.protocol.wire import Action
from broker_core.protocol.wire import field as _field

# 2: the default document holds the top producers only; the detail is paged (issue 26).
METRICS_VERSION = 2

DETAIL_PRODUCERS = "producers"  # the one detail a METRICS request may ask for
DEFAULT_TOP = 10  # producers in the default document, by duplicates answered
MAX_TOP = 100  # the most a request may ask for (and what a broker ranks)
DEFAULT_PAGE_SIZE = 500
MAX_PAGE_SIZE = 1000  # a page's bound: ~280 bytes a producer, under 300 kB a page


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


def counters_row(producer_id: int, counters: AppendCounters) -> dict[str, Any]:
    """One producer's row: its id and counters (``asdict`` costs 10x more, per row)."""
    row: dict[str, Any] = {"producer_id": producer_id}
    for name in COUNTER_NAMES:
        row[name] = getattr(counters, name)
    return row


def duplicates_of(row: Mapping[str, Any]) -> int:
    """What producers are ranked by: duplicates answered, in and beyond the window."""
    return int(row.get("duplicates_in_window", 0)) + int(row.get("duplicates_beyond_window", 0))


def _bounded(doc: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value: int = _field(doc, name, int, Action.METRICS.value, default)
    if not low <= value <= high:
        raise InvalidRequestError(
            f"{Action.METRICS.value}: field {name!r} must be in {low}..{high}, got {value}"
        )
    return value


@dataclass(frozen=True, slots=True)
class MetricsRequest:
    """``{}``: the default, bounded document with the ``top`` producers by duplicates.
    ``{"detail": "producers", "page_token"?, "page_size"?}``: one page of every producer's
    counters, by producer id, after the page token (the previous page's last id)."""

    ACTION: ClassVar[Action] = Action.METRICS
    WIRE: ClassVar[Wire] = Wire(
        body='{top?}, or {detail: "producers", page_token?, page_size?}',
        answer=(
            "the bounded metrics document (broker_core.server.observability.metrics); with detail: "
            "one page of the per-producer counters "
            "(broker_core.protocol.metrics.ProducerPage; docs/operations.md)"
        ),
    )
    detail: str | None = None
    page_token: str | None = None
    page_size: int = DEFAULT_PAGE_SIZE
    top: int = DEFAULT_TOP

    def __post_init__(self) -> None:
        what = Action.METRICS.value
        if self.detail not in (None, DETAIL_PRODUCERS):
            raise InvalidRequestError(
                f"{what}: field 'detail' must be {DETAIL_PRODUCERS!r} or absent, got "
                f"{self.detail!r}"
            )
        if self.page_token is not None and self.detail is None:
            raise InvalidRequestError(f"{what}: field 'page_token' needs detail='producers'")
        self.after()  # the token's shape is checked here, once
        _bounded({"page_size": self.page_size}, "page_size", 0, 1, MAX_PAGE_SIZE)
        _bounded({"top": self.top}, "top", 0, 0, MAX_TOP)

    def after(self) -> int:
        """The producer id a page starts after (-1: from the first)."""
        if self.page_token is None:
            return -1
        token = self.page_token
        if not (token.isascii() and token.isdigit()) or len(token) > 20:
            raise InvalidRequestError(
                f"{Action.METRICS.value}: field 'page_token' must be a token from a previous "
                f"page (a producer id), got {token!r}"
            )
        return int(token)

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"top": self.top}
        if self.detail is not None:
            doc.update(detail=self.detail, page_size=self.page_size)
        if self.page_token is not None:
            doc["page_token"] = self.page_token
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> MetricsRequest:
        what = Action.METRICS.value
        return cls(
            detail=_field(doc, "detail", str, what, None),
            page_token=_field(doc, "page_token", str, what, None),
            page_size=_bounded(doc, "page_size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE),
            top=_bounded(doc, "top", DEFAULT_TOP, 0, MAX_TOP),
        )


@dataclass(frozen=True, slots=True)
class MetricsResponse:
    """A broker's METRICS answer: the bounded document (request counters, partitions,
    top producers, replication, transactions), or with ``detail`` one
    :class:`ProducerPage`'s document. Carried as the document its builder writes
    (``server.observability.metrics``): every reader (:func:`merge_documents`, the
    Prometheus exporter, ``idemlog metrics``) reads its sections by name."""

    document: dict[str, Any]

    def to_doc(self) -> dict[str, Any]:
        return self.document

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> MetricsResponse:
        return cls(doc)


@dataclass(frozen=True, slots=True)
class ProducerPage:
    """One page of the per-producer detail of one broker: at most ``page_size`` rows
    (``producer_id`` and the :class:`AppendCounters`), by producer id; ``next_page_token``
    is None on the last page. A producer seen first after the cursor passed its id is on
    no page of this walk (ids only grow, so that is a producer created during the walk);
    one expired during the walk is left out from then on."""

    broker_id: int
    producers: tuple[dict[str, Any], ...]
    next_page_token: str | None
    producers_tracked: int  # every producer this broker has counters for, now

    def to_doc(self) -> dict[str, Any]:
        return {
            "version": METRICS_VERSION,
            "broker_id": self.broker_id,
            "detail": DETAIL_PRODUCERS,
            "producers": list(self.producers),
            "next_page_token": self.next_page_token,
            "producers_tracked": self.producers_tracked,
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> ProducerPage:
        token = doc.get("next_page_token")
        return cls(
            broker_id=int(doc["broker_id"]),
            producers=tuple(dict(r) for r in doc["producers"]),
            next_page_token=None if token is None else str(token),
            producers_tracked=int(doc["producers_tracked"]),
        )


def top_producers(rows: Iterable[Mapping[str, Any]], top: int) -> list[dict[str, Any]]:
    """The ``top`` rows with duplicates, most first (ties: lower producer id first)."""
    ranked = sorted(
        (dict(r) for r in rows if duplicates_of(r) > 0),
        key=lambda r: (-duplicates_of(r), int(r["producer_id"])),
    )
    return ranked[:top]


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
    """One cluster-wide document from each broker's default one: partitions are disjoint
    (one leader each), totals, request counts and active producers add up, the top
    producers are merged by id and ranked again (a producer on no broker's top list is on
    none here: the merged top is each broker's top, not an exact cluster-wide ranking),
    replication, start times and consumer groups are kept by broker id, and the
    coordinators' transactions are merged (:func:`merge_transactions`: one per state
    partition, spread over the brokers)."""
    totals = AppendCounters()
    producers: dict[int, AppendCounters] = {}
    partitions: list[dict[str, Any]] = []
    transactions: dict[str, Any] | None = None
    requests: dict[str, Any] = {}
    replication: dict[str, Any] = {}  # by broker id: each leads its own partitions
    groups: dict[str, Any] = {}  # by broker id: each coordinates its own groups
    started_at: dict[str, Any] = {}
    brokers: list[int] = []
    counters: dict[str, dict[str, int]] = {}  # the labelled counters, added up by label
    active = tracked = 0
    top = 0
    for doc in docs:
        brokers.append(int(doc["broker_id"]))
        if doc.get("replication") is not None:
            replication[str(doc["broker_id"])] = doc["replication"]
        if doc.get("groups") is not None:
            groups[str(doc["broker_id"])] = doc["groups"]
        if doc.get("started_at") is not None:
            started_at[str(doc["broker_id"])] = doc["started_at"]
        totals.merge(doc["totals"])
        partitions.extend(doc["partitions"])
        active += int(doc.get("producers_active", 0))
        tracked += int(doc.get("producers_tracked", 0))
        top = max(top, int(doc.get("top", DEFAULT_TOP)))
        for row in doc["producers"]:
            producers.setdefault(int(row["producer_id"]), AppendCounters()).merge(row)
        for name, by_label in (doc.get("counters") or {}).items():
            mine = counters.setdefault(name, {})
            for label, n in by_label.items():
                mine[label] = mine.get(label, 0) + int(n)
        for name, figures in (doc.get("requests") or {}).items():
            requests[name] = _add_figures(requests.get(name), figures)
        if doc.get("transactions") is not None:
            transactions = _merge_two(transactions, dict(doc["transactions"]))
    rows = [{"producer_id": pid, **asdict(producers[pid])} for pid in sorted(producers)]
    merged = {
        "version": METRICS_VERSION,
        "brokers": sorted(brokers),
        "started_at": started_at,
        "totals": asdict(totals),
        "producers_active": active,
        "producers_tracked": tracked,
        "requests": requests,
        "counters": counters,
        "partitions": sorted(partitions, key=lambda r: (r["topic"], r["partition"])),
        "top": top,
        "producers": top_producers(rows, top),
        "transactions": transactions,
        "replication": replication,
    }
    if groups:  # brokers with a Kafka listener: their consumer groups, by broker id
        merged["groups"] = groups
    return merged


def merge_producer_pages(pages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every broker's producer rows (all their pages) as one row per producer id, by id:
    a producer writing to partitions led by several brokers has its counters added."""
    merged: dict[int, dict[str, Any]] = {}
    for page in pages:
        for row in page["producers"]:
            pid = int(row["producer_id"])
            mine = merged.get(pid)
            if mine is None:
                merged[pid] = dict(row)
            else:
                for name in COUNTER_NAMES:
                    mine[name] = int(mine.get(name, 0)) + int(row.get(name, 0))
    return [merged[pid] for pid in sorted(merged)]


def _add_figures(mine: Any, theirs: Any) -> Any:
    """Request figures added key by key (counts, sums, histogram buckets)."""
    if mine is None:
        return theirs
    if isinstance(theirs, dict):
        keys = sorted({*mine, *theirs})
        return {k: _add_figures(mine.get(k), theirs[k]) if k in theirs else mine[k] for k in keys}
    return mine + theirs if isinstance(theirs, int | float) else theirs


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


def _text(value: Any) -> str:
    """A value of the document as the table shows it: a mapping or a list as JSON (the
    document's own form, never Python's repr), anything else as its text."""
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value)
    return str(value)


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
        for r in doc.get("partitions", ())
    ]
    if doc.get("detail") != DETAIL_PRODUCERS:
        lines.append("partitions")
        lines.extend(_table(part_headers, part_rows) if part_rows else ["  (none)"])
        lines.append("")
    prod_rows = [
        [str(r["producer_id"]), *(str(r.get(c, 0)) for c in COUNTER_NAMES)]
        for r in doc["producers"]
    ]
    if doc.get("detail") == DETAIL_PRODUCERS:
        lines.append("producers")
    else:
        lines.append(
            f"top {doc.get('top', DEFAULT_TOP)} producers by duplicates answered (of "
            f"{doc.get('producers_active', '?')} active; every one: --producers)"
        )
    prod_headers = ["producer_id", *(_SHORT[c] for c in COUNTER_NAMES)]
    lines.extend(_table(prod_headers, prod_rows) if prod_rows else ["  (none)"])
    lines.append("")
    if doc.get("detail") == DETAIL_PRODUCERS:
        return "\n".join(lines)
    by_broker = doc.get("replication") or {}
    if "broker_id" in doc and by_broker:  # one broker's own document: its section alone
        by_broker = {str(doc["broker_id"]): by_broker}
    for broker, rep in sorted(by_broker.items()):
        lines.append(
            f"replication, broker {broker}: leads {rep['leader_partitions']}, follows "
            f"{rep['follower_partitions']}, under-replicated "
            f"{_text(rep['under_replicated_partitions'] or 'none')}, ISR shrinks "
            f"{rep['isr_shrinks']}, expands {rep['isr_expands']}"
        )
    txns = doc.get("transactions")
    if txns:
        lines.append("transactions")
        lines.extend(f"  {k}: {_text(v)}" for k, v in sorted(txns.items()))
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
