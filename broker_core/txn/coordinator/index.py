"""Indexes over the coordinator's in-memory state, so a request scans only what it names.

Without them every sink commit walked every transactional id and sink the coordinator
ever knew (``attempts``, ``pending_sink_holding``): with 100,000 idle ids a commit took
about 20 ms of CPU more (benchmarks/bench_coordinator_scan.py, docs/design.md §6). With
them a commit costs O(the sink's own ids). Each index is derived from the maps it covers,
updated in the same critical section as they are (the caller holds the registry's
lock, ``txn.coordinator.registry``), and holds one entry per id or per transaction a pending
sink record names: bounded by the maps.
"""

from __future__ import annotations

from broker_core.txn.state_topic.records import (
    NO_SINK,
    SinkCommitRecord,
    TransactionMetadata,
    TransactionState,
)

_S = TransactionState


def sink_of(transactional_id: str) -> str:
    """The sink a sink task's id ``<sink id>/<partition>`` belongs to ("" for other ids)."""
    sink, slash, _ = transactional_id.rpartition("/")
    return sink if slash else ""


class StateIndex:
    """Transactional ids by sink (the id's ``<sink id>/`` prefix) and by the run holding
    them, the ids ONGOING and in a PREPARE state, and the transactions pending sink
    records name. Not thread-safe: the registry's lock guards it with the maps."""

    def __init__(self) -> None:
        self._by_sink: dict[str, set[str]] = {}
        self._by_run: dict[str, set[str]] = {}
        self._ongoing: set[str] = set()
        self._prepare: set[str] = set()
        # (transactional id, producer id, epoch) -> the pending sink record naming it
        self._holders: dict[tuple[str, int, int], str] = {}
        # transactional id -> how many pending records name it (at any producer id/epoch)
        self._held: dict[str, int] = {}
        self._pending_sinks: set[str] = set()

    # -- updates ---------------------------------------------------------------------------
    def replace_txn(self, old: TransactionMetadata | None, new: TransactionMetadata | None) -> None:
        """``old`` (the id's previous state, if any) is replaced by ``new`` (None: removed)."""
        if old is not None:
            tid = old.transactional_id
            _discard(self._by_sink, sink_of(tid), tid)
            if old.sink_run != NO_SINK:
                _discard(self._by_run, old.sink_run, tid)
            self._ongoing.discard(tid)
            self._prepare.discard(tid)
        if new is not None:
            tid = new.transactional_id
            self._by_sink.setdefault(sink_of(tid), set()).add(tid)
            if new.sink_run != NO_SINK:
                self._by_run.setdefault(new.sink_run, set()).add(tid)
            if new.state is _S.ONGOING:
                self._ongoing.add(tid)
            elif new.state.is_prepare:
                self._prepare.add(tid)

    def replace_sink(self, old: SinkCommitRecord | None, new: SinkCommitRecord | None) -> None:
        """``old`` (the sink's previous record, if any) is replaced by ``new`` (None: removed)."""
        if old is not None and old.is_pending:
            self._pending_sinks.discard(old.sink_id)
            for txn in old.transactions:
                if self._holders.get(txn) == old.sink_id:
                    del self._holders[txn]
                count = self._held.get(txn[0], 0) - 1
                if count > 0:
                    self._held[txn[0]] = count
                else:
                    self._held.pop(txn[0], None)
        if new is not None and new.is_pending:
            self._pending_sinks.add(new.sink_id)
            for txn in new.transactions:
                self._holders[txn] = new.sink_id
                self._held[txn[0]] = self._held.get(txn[0], 0) + 1

    # -- queries ---------------------------------------------------------------------------
    def ids_of_sink(self, sink_id: str) -> list[str]:
        return sorted(self._by_sink.get(sink_id, ()))

    def has_ids(self, sink_id: str) -> bool:
        return bool(self._by_sink.get(sink_id))

    def ids_of_run(self, run_id: str) -> list[str]:
        return sorted(self._by_run.get(run_id, ()))

    def ongoing(self) -> list[str]:
        return sorted(self._ongoing)

    def prepared(self) -> list[str]:
        return sorted(self._prepare)

    def pending_sinks(self) -> list[str]:
        return sorted(self._pending_sinks)

    def holder(self, txn: tuple[str, int, int]) -> str | None:
        """The sink whose pending record names this (id, producer id, epoch), if any."""
        return self._holders.get(txn)

    def held(self, transactional_id: str) -> bool:
        """A pending sink record names the id (at any producer id and epoch)."""
        return transactional_id in self._held


def _discard(index: dict[str, set[str]], key: str, tid: str) -> None:
    ids = index.get(key)
    if ids is not None:
        ids.discard(tid)
        if not ids:
            del index[key]
