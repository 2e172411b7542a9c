"""Writing transaction markers: the MarkerWriter seam, and the local implementation.

The coordinator decides (PREPARE_COMMIT / PREPARE_ABORT, durably) and then asks a
:class:`MarkerWriter` to append a COMMIT or ABORT marker for the producer to every
partition of the transaction. Writing the same marker twice is harmless, so a coordinator
that died half-way simply writes them all again.

A marker is durable (fsynced) when ``write_markers`` returns, whatever the topic's flush
policy: the coordinator stores COMPLETE next and never writes those markers again.
``write_markers`` answers, per partition written, its last stable offset just after the
marker (:data:`StableOffsets`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from broker_core.errors import UnknownTopicOrPartitionError
from broker_core.log.store import LogStore
from broker_core.record.batch import ControlType

log = logging.getLogger("idemlog.txn")

StableOffsets = dict[tuple[str, int], int]
"""(topic, partition) -> the partition's last stable offset right after the marker."""


class MarkerWriter(Protocol):
    def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Sequence[tuple[str, int]],
    ) -> StableOffsets:
        """Append the marker to every partition, durably; raise IdemlogError (retriable
        ones are retried by the coordinator, which then writes to every partition again).

        Returns each written partition's last stable offset just after its marker;
        partitions skipped because they no longer exist are left out."""


class LocalMarkerWriter:
    """Writes markers into the partitions of a local LogStore (the embedded broker)."""

    def __init__(self, store: LogStore) -> None:
        self._store = store

    def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Sequence[tuple[str, int]],
    ) -> StableOffsets:
        control = ControlType.COMMIT if commit else ControlType.ABORT
        stable: StableOffsets = {}
        for topic, partition in partitions:
            try:
                target = self._store.partition(topic, partition)
            except UnknownTopicOrPartitionError as exc:
                # Appends go through this same store, so nothing can have been written to a
                # partition it does not have (or deleted with its topic): nothing to end.
                log.warning(
                    "no %s marker for producer id %d epoch %d on %s-%d: %s",
                    control.name,
                    producer_id,
                    producer_epoch,
                    topic,
                    partition,
                    exc.message,
                )
                continue
            written = target.write_marker(producer_id, producer_epoch, control, coordinator_epoch)
            stable[(topic, partition)] = written.last_stable_offset
        return stable
