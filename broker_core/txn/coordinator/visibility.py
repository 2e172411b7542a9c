"""All-or-nothing visibility of sink batches for read_committed readers.

A sink batch is committed by COMMIT markers written partition by partition, and a
partition's last stable offset (LSO) can also stay behind a batch's rows there while
another writer's transaction is open. Either way a reader stopping at each partition's
LSO could hold part of a batch. :func:`consistent_cut` lowers those ends until every
batch the coordinator still tracks is wholly below them or wholly at or above them
(docs/design.md, "Readers see whole sink batches").

The coordinator tracks a batch from before its first marker until every one of its
ranges is below its partition's LSO (settled) *and* no cut can still pull an end into its
rows: a batch's range spans its transactions' rows, which interleave with other writers'
-- another sink's batch too -- so a still-unsettled batch can lower a partition's end
inside a settled one's range (:func:`still_reachable`). No lock spans the LSO reads and
the tracked batches: a reader asks for the tracked batches (and the recently dropped ones)
before and after reading the LSOs and cuts with the union, with one coordinator as with
several (``broker_core.protocol.stable_cut``, whose docstring proves no batch slips
between the reads).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from broker_core.errors import CoordinatorNotAvailableError
from broker_core.protocol.stable_cut import (
    EVERYTHING,
    Range,
    TrackedBatches,
    consistent_cut,
    cut_across,
)
from broker_core.txn.coordinator.markers import StableOffsets
from broker_core.txn.state_topic.records import SinkCommitRecord

log = logging.getLogger("idemlog.txn")

__all__ = ["Range", "VisibilityTracker", "consistent_cut", "still_reachable"]

K = TypeVar("K")
# Batches dropped that the ring keeps for readers' second question (docs/design.md §7,
# "Several coordinators"): O(this x a batch's partitions) in memory.
DROPPED_RING = 256


TopicPartition = tuple[str, int]
# (topic, partition, first offset, last offset): one batch's rows in one partition.
FullRange = tuple[str, int, int, int]


def still_reachable(
    unsettled: Iterable[Sequence[FullRange]], settled: Mapping[K, Sequence[FullRange]]
) -> set[K]:
    """The settled batches some reader's cut could still hold in part.

    A cut lowers an end only to the first offset of a batch it would cut otherwise
    (:func:`consistent_cut`), and a settled batch is below every LSO, so only an
    unsettled batch starts a lowering: at worst each pulls its partitions' ends to its
    first offsets, a settled batch with a row at or above such a floor is then cut and
    pulls its own partitions down to its firsts, and so on to a fixed point. The batches
    this never reaches stay wholly below every future cut: any batch with a row below a
    settled batch's last offset on a partition was decided (so tracked) before that
    partition's LSO passed it, so no batch tracked later can start a new chain to it.
    O(settled x unsettled ranges) per pass, at most one pass per settled batch.
    """
    floor: dict[TopicPartition, int] = {}

    def lower(ranges: Sequence[FullRange]) -> None:
        for topic, partition, first, _ in ranges:
            tp = (topic, partition)
            floor[tp] = min(first, floor.get(tp, first))

    for ranges in unsettled:
        lower(ranges)
    reached: set[K] = set()
    left = dict(settled)
    changed = bool(floor)
    while changed:
        changed = False
        for key, ranges in list(left.items()):
            if any(last >= floor.get((t, p), last + 1) for t, p, _, last in ranges):
                reached.add(key)
                del left[key]
                lower(ranges)
                changed = True
    return reached


class LsoSource(Protocol):
    """Each partition's last stable offset of a topic, as its leader has it now."""

    def last_stable_offsets(self, topic: str) -> dict[int, int]: ...


class _Tracked:
    """A committed sink batch readers may still see in part (see ``visibility``)."""

    __slots__ = ("pending", "ranges", "recorded")

    def __init__(self, ranges: list[tuple[str, int, int, int]], recorded: bool) -> None:
        self.ranges = ranges
        # Partitions whose LSO has not yet been reported past the batch's rows.
        self.pending = {(t, p) for t, p, _, _ in ranges}
        # A SinkBatchRecord of its own holds it durably (else its sink's record does).
        self.recorded = recorded


SinkBatchKey = tuple[str, int]  # (sink id, batch id)


class VisibilityTracker:
    """Committed sink batches readers may still see in part, and the cut that keeps them
    whole (``broker_core.txn.coordinator.visibility``); partitions' LSOs are read from ``source``.

    Bound: one entry per committed batch not yet reported settled -- the batches committed
    while some partition's LSO was held back (at most a transaction timeout's worth) --
    plus the settled ones an unsettled batch could still cut (:func:`still_reachable`):
    those have rows above the unsettled batch's first row on a shared partition, so they
    were committed while it stayed unsettled -- again at most
    ``transaction.max.timeout.ms`` behind a foreign transaction, or as long as its own
    markers fail. Each entry is O(its partitions). Plus the ring: the last DROPPED_RING
    dropped batches, and one offset per partition ever tracked. ``settled_by`` is
    O(tracked batches x their partitions) per call, as it was before retention (the
    fixed point usually ends after one pass: commit order follows offsets)."""

    def __init__(self, source: LsoSource | None, ring_size: int = DROPPED_RING) -> None:
        self._source = source
        # (sink id, batch id) -> a committed batch readers may still see in part.
        self._lock = threading.Lock()
        self._tracked: dict[SinkBatchKey, _Tracked] = {}
        # For readers' cuts across coordinators (protocol.stable_cut): this tracker's
        # name, how many batches it dropped, the last ``ring_size`` of them (generation,
        # ranges), and of those evicted from the ring the newest generation and the
        # highest last offset per partition (O(partitions ever tracked)).
        self._incarnation = uuid.uuid4().hex
        self._generation = 0
        self._ring: deque[tuple[int, list[FullRange]]] = deque()
        self._ring_size = ring_size
        self._evicted_through = 0
        self._evicted_high: dict[TopicPartition, int] = {}

    def track(
        self, key: SinkBatchKey, ranges: Sequence[tuple[str, int, int, int]], recorded: bool
    ) -> None:
        """Track a batch (once: a batch tracked already keeps its entry, and becomes
        recorded if ``recorded``)."""
        if not ranges:
            return
        with self._lock:
            tracked = self._tracked.get(key)
            if tracked is None:
                self._tracked[key] = _Tracked(list(ranges), recorded)
            elif recorded:
                tracked.recorded = True

    def track_record(self, record: SinkCommitRecord) -> None:
        """Track the batches a sink record names (its own; an old record's unsettled)."""
        for batch_id, ranges in record.batches():
            self.track((record.sink_id, batch_id), ranges, recorded=False)

    def settled_by(self, lsos: StableOffsets) -> list[SinkBatchKey]:
        """Forget the ranges that markers report below their partition's LSO; drop the
        batches wholly settled that no cut can reach any more (:func:`still_reachable`;
        the others stay tracked, and so keep their records); returns the dropped batches
        whose own SinkBatchRecord can go."""
        if not lsos:
            return []
        gone: list[SinkBatchKey] = []
        with self._lock:
            for tracked in self._tracked.values():
                for topic, partition, _first, last in tracked.ranges:
                    lso = lsos.get((topic, partition))
                    if lso is not None and lso > last:
                        tracked.pending.discard((topic, partition))
            settled = {k: t.ranges for k, t in self._tracked.items() if not t.pending}
            unsettled = [t.ranges for t in self._tracked.values() if t.pending]
            kept = still_reachable(unsettled, settled)
            for key in sorted(settled.keys() - kept):
                tracked = self._tracked.pop(key)
                self._dropped(tracked.ranges)
                if tracked.recorded:
                    gone.append(key)
        return gone

    def _dropped(self, ranges: list[FullRange]) -> None:
        """A batch stops being tracked: the next generation, kept in the ring (caller
        holds _lock)."""
        self._generation += 1
        self._ring.append((self._generation, ranges))
        while len(self._ring) > self._ring_size:
            generation, evicted = self._ring.popleft()
            self._evicted_through = generation
            for topic, partition, _, last in evicted:
                tp = (topic, partition)
                self._evicted_high[tp] = max(last, self._evicted_high.get(tp, last))

    def tracked_batches(self, topic: str, since: int = EVERYTHING) -> TrackedBatches:
        """The batches of ``topic`` a reader's cut must keep whole: every one tracked now,
        then those dropped after generation ``since`` that the ring still holds (all of
        them for EVERYTHING); see ``protocol.stable_cut`` for how a reader combines them.
        Never raises: a ``since`` the ring no longer covers shows in ``evicted_through``."""
        with self._lock:
            now = [t.ranges for t in self._tracked.values()]
            dropped = [ranges for generation, ranges in self._ring if generation > since]
            batches = [
                [(p, first, last) for t, p, first, last in ranges if t == topic]
                for ranges in (*now, *dropped)
            ]
            return TrackedBatches(
                self._incarnation,
                self._generation,
                self._evicted_through,
                {p: last for (t, p), last in self._evicted_high.items() if t == topic},
                [b for b in batches if b],
            )

    def count(self) -> int:
        with self._lock:
            return len(self._tracked)

    def unsettled_of(self, sink_id: str) -> list[tuple[int, list[tuple[str, int, int, int]]]]:
        """(batch id, ranges) of the sink's batches still tracked, by batch id."""
        with self._lock:
            return sorted(
                (batch_id, list(t.ranges))
                for (sid, batch_id), t in self._tracked.items()
                if sid == sink_id
            )

    def unrecorded_of(
        self, sink_id: str, keep: int
    ) -> list[tuple[int, list[tuple[str, int, int, int]]]]:
        """(batch id, ranges) of the sink's tracked batches, but ``keep``, that no record
        of their own holds yet, by batch id."""
        with self._lock:
            return sorted(
                (batch_id, list(t.ranges))
                for (sid, batch_id), t in self._tracked.items()
                if sid == sink_id and batch_id != keep and not t.recorded
            )

    def mark_recorded(self, key: SinkBatchKey) -> bool:
        """The batch's own record is stored: False if it settled meanwhile (the record
        then only over-tracks, and can go)."""
        with self._lock:
            tracked = self._tracked.get(key)
            if tracked is not None:
                tracked.recorded = True
            return tracked is not None

    def stable_ends(self, topic: str) -> dict[int, int]:
        """Per partition of ``topic``, where a read_committed reader may stop so that it
        holds every committed sink batch whole or not at all: ``protocol.stable_cut``'s
        cut with this one coordinator, the code path of a cut across several.

        Raises CoordinatorNotAvailableError without an LSO source, StaleTrackedBatchesError
        if more than the ring's size of batches dropped between the two questions of each
        of CUT_ATTEMPTS tries, and what the source raises."""
        source = self._source
        if source is None:
            raise CoordinatorNotAvailableError("this coordinator cannot read partition offsets")
        ends: dict[int, int] = {}

        def read_lsos() -> dict[int, int]:
            ends.clear()
            ends.update(source.last_stable_offsets(topic))
            return ends

        cut = cut_across(
            [self._incarnation], lambda _me, since: self.tracked_batches(topic, since), read_lsos
        )
        held = {p: ends[p] - cut[p] for p in ends if cut[p] < ends[p]}
        if held:
            log.debug("stable ends of %r held back to keep sink batches whole: %s", topic, held)
        return cut
