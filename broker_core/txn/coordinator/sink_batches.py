"""The durable side of the readers' cut (docs/design.md §7): sink batches' own records.

A sink's record names only its last batch. A batch readers may still see in part when a
later batch of the sink commits -- another writer's open transaction holds a partition's
LSO below it -- gets a :class:`~broker_core.txn.state_topic.records.SinkBatchRecord` of its own
before the sink's record is overwritten, and loses it once markers report every partition's LSO
past it. A coordinator that loads the state tracks every recorded batch again, so the cut
survives a restart or a failover. Each commit writes O(one batch): in steady state the
previous batch's record at most, and nothing at all while no LSO is held back.

Bound: one record per batch committed while an LSO was held back (a transaction's
timeout at most), plus the few whose delete failed and waits for the next markers.
"""

from __future__ import annotations

import logging
import threading

from broker_core.errors import IdemlogError
from broker_core.txn.coordinator.visibility import SinkBatchKey, VisibilityTracker
from broker_core.txn.state_topic.records import SinkBatchRecord
from broker_core.txn.state_topic.store import TxnStateStore

log = logging.getLogger("idemlog.txn")


class UnsettledBatches:
    """Keeps ``tracker``'s unsettled sink batches durable in ``store`` (written at
    ``coordinator_epoch``)."""

    def __init__(
        self, store: TxnStateStore, tracker: VisibilityTracker, coordinator_epoch: int
    ) -> None:
        self._store = store
        self._tracker = tracker
        self._coordinator_epoch = coordinator_epoch
        self._lock = threading.Lock()
        # Settled batches whose record's delete failed: retried after the next markers.
        self._unforgotten: set[SinkBatchKey] = set()

    def load(self) -> None:
        """Track every recorded batch until an LSO shows it settled: over-tracking a
        batch already below every end changes no cut."""
        for batch in self._store.load_sink_batches():
            self._tracker.track((batch.sink_id, batch.batch_id), batch.ranges, recorded=True)

    def keep(self, sink_id: str, batch_id: int) -> None:
        """Give every batch of the sink still tracked, but ``batch_id``, a record of its
        own: called before the sink's record is overwritten by ``batch_id``'s."""
        for other, ranges in self._tracker.unrecorded_of(sink_id, keep=batch_id):
            self._store.put_sink_batch(
                SinkBatchRecord(sink_id, other, ranges), coordinator_epoch=self._coordinator_epoch
            )
            if not self._tracker.mark_recorded((sink_id, other)):
                self.forget([(sink_id, other)])  # settled meanwhile

    def forget(self, keys: list[SinkBatchKey]) -> None:
        """Delete the records of settled batches. A failed delete only over-tracks (the
        batch is below every end): logged, and retried with the next call."""
        with self._lock:
            todo = sorted(set(keys) | self._unforgotten)
            self._unforgotten.clear()
        for i, (sink_id, batch_id) in enumerate(todo):
            try:
                self._store.delete_sink_batch(
                    sink_id, batch_id, coordinator_epoch=self._coordinator_epoch
                )
            except IdemlogError as exc:
                log.warning(
                    "sink %r: the record of settled batch %d stays for now: %s",
                    sink_id,
                    batch_id,
                    exc,
                )
                with self._lock:
                    self._unforgotten.update(todo[i:])
                return
