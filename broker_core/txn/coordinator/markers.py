"""Writing transaction markers: the MarkerWriter seam, and the local implementation.

The coordinator decides (PREPARE_COMMIT / PREPARE_ABORT, durably) and then asks a
:class:`MarkerWriter` to append a COMMIT or ABORT marker for the producer to every
partition of the transaction. Writing the same marker twice is harmless, so a coordinator
that died half-way simply writes them all again.

A marker is durable (fsynced) when ``write_markers`` returns, whatever the topic's flush
policy: the coordinator stores COMPLETE next and never writes those markers again. The
markers of many producers (a sink batch's transactions) go in one call: each partition
gets all of its markers in one append and one fsync, partitions side by side.
``write_markers`` answers, per partition written, its last stable offset just after the
marker (:data:`StableOffsets`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

from broker_core.errors import UnknownTopicOrPartitionError
from broker_core.log.store import LogStore
from broker_core.record.batch import ControlType

log = logging.getLogger("idemlog.txn")

StableOffsets = dict[tuple[str, int], int]
"""(topic, partition) -> the partition's last stable offset right after the marker."""


@dataclass(frozen=True, slots=True)
class ProducerMarkers:
    """One producer's transaction to end: its (producer id, epoch) and its partitions."""

    producer_id: int
    producer_epoch: int
    partitions: tuple[tuple[str, int], ...]


def by_partition(
    producers: Sequence[ProducerMarkers],
) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """(topic, partition) -> the (producer id, epoch) of every marker it gets, in order."""
    found: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for marker in producers:
        for tp in marker.partitions:
            found.setdefault(tp, []).append((marker.producer_id, marker.producer_epoch))
    return found


def restricted(
    producers: Sequence[ProducerMarkers], partitions: Iterable[tuple[str, int]]
) -> list[ProducerMarkers]:
    """``producers`` limited to ``partitions`` (those left with none dropped)."""
    keep = set(partitions)
    limited = [
        ProducerMarkers(
            m.producer_id, m.producer_epoch, tuple(tp for tp in m.partitions if tp in keep)
        )
        for m in producers
    ]
    return [m for m in limited if m.partitions]


class MarkerWriter(Protocol):
    def write_markers(
        self,
        producers: Sequence[ProducerMarkers],
        commit: bool,
        coordinator_epoch: int,
    ) -> StableOffsets:
        """Append the markers of every producer to its partitions, durably: each partition
        gets all its markers in one append and one fsync. Raise IdemlogError (retriable
        ones are retried by the coordinator, which then writes every marker again: a
        marker written twice is harmless).

        Returns each written partition's last stable offset just after its markers;
        partitions skipped because they no longer exist are left out."""


# Partitions written at once by LocalMarkerWriter: their fsyncs overlap (the GIL is
# released in fsync), and more threads than this only queue at the disk. One pool per
# process, shared by every writer (a test process runs many brokers); its threads start
# on first use. Its tasks never wait for the pool, so sharing cannot deadlock.
LOCAL_MARKER_THREADS = 8
_POOL = ThreadPoolExecutor(LOCAL_MARKER_THREADS, thread_name_prefix="markers")


class LocalMarkerWriter:
    """Writes markers into the partitions of a local LogStore (the embedded broker),
    several partitions at once."""

    def __init__(self, store: LogStore, *, parallel: bool = True) -> None:
        self._store = store
        self._parallel = parallel

    def write_markers(
        self,
        producers: Sequence[ProducerMarkers],
        commit: bool,
        coordinator_epoch: int,
    ) -> StableOffsets:
        control = ControlType.COMMIT if commit else ControlType.ABORT
        targets = by_partition(producers)

        def write(tp: tuple[str, int]) -> tuple[tuple[str, int], int | None]:
            return tp, self._write_one(tp, targets[tp], control, coordinator_epoch)

        if len(targets) == 1 or not self._parallel:
            results = [write(tp) for tp in targets]
        else:
            # Every partition is written even if one fails; the first error is raised.
            futures = [_POOL.submit(write, tp) for tp in targets]
            wait(futures)
            results = [f.result() for f in futures]
        return {tp: lso for tp, lso in results if lso is not None}

    def _write_one(
        self,
        tp: tuple[str, int],
        producers: list[tuple[int, int]],
        control: ControlType,
        coordinator_epoch: int,
    ) -> int | None:
        topic, partition = tp
        try:
            target = self._store.partition(topic, partition)
        except UnknownTopicOrPartitionError as exc:
            # Appends go through this same store, so nothing can have been written to a
            # partition it does not have (or deleted with its topic): nothing to end.
            log.warning(
                "no %s markers for producer ids %s on %s-%d: %s",
                control.name,
                [pid for pid, _ in producers],
                topic,
                partition,
                exc.message,
            )
            return None
        return target.write_markers(producers, control, coordinator_epoch).last_stable_offset
