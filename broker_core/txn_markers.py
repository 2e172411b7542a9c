"""Writing transaction markers: the MarkerWriter seam, and the local implementation.

The coordinator decides (PREPARE_COMMIT / PREPARE_ABORT, durably) and then asks a
:class:`MarkerWriter` to append a COMMIT or ABORT marker for the producer to every
partition of the transaction. Writing the same marker twice is harmless, so a coordinator
that died half-way simply writes them all again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from broker_core.errors import UnknownTopicOrPartitionError
from broker_core.record_batch import ControlType
from broker_core.store import LogStore

log = logging.getLogger("idemlog.txn")


class MarkerWriter(Protocol):
    def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Sequence[tuple[str, int]],
    ) -> None:
        """Append the marker to every partition; raise IdemlogError (retriable ones are
        retried by the coordinator, which then writes to every partition again)."""


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
    ) -> None:
        control = ControlType.COMMIT if commit else ControlType.ABORT
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
            target.write_marker(producer_id, producer_epoch, control, coordinator_epoch)
