"""Writing one transaction's markers for the coordinator, retried under one policy.

The markers go through a :class:`~broker_core.txn.coordinator.markers.MarkerWriter` (local, or
routed to each partition's leader); retriable failures are retried under a
:class:`~broker_core.retry.RetryPolicy` until it is spent or the coordinator closes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from broker_core.errors import IdemlogError, TransactionCoordinatorFencedError
from broker_core.retry import RetryPolicy
from broker_core.txn.coordinator.markers import MarkerWriter, ProducerMarkers, StableOffsets
from broker_core.txn.state_topic.records import TransactionMetadata
from broker_core.txn.state_topic.store import CoordinatorEpochFencedError

log = logging.getLogger("idemlog.txn")

MAX_MARKER_BACKOFF_S = 1.0
_TXN = "transactional id"


class MarkerSender:
    """Writes one transaction's markers through ``markers``, retrying retriable errors
    under ``policy`` until :meth:`stop` (the coordinator closed or was replaced)."""

    def __init__(self, markers: MarkerWriter, coordinator_epoch: int, policy: RetryPolicy) -> None:
        self._markers = markers
        self._coordinator_epoch = coordinator_epoch
        self._policy = policy
        self._stop = threading.Event()  # cuts a retry wait short
        self._lock = threading.Lock()  # several transactions may be retrying at once
        self._retries = 0

    @property
    def retries(self) -> int:
        """Marker writes retried so far (the ``marker_retries`` metric)."""
        return self._retries

    def stop(self) -> None:
        """Cut retries short: a waiting or failing send raises its last error now."""
        self._stop.set()

    def send(self, meta: TransactionMetadata, commit: bool) -> StableOffsets:
        """:meth:`send_all` for one transaction."""
        return self.send_all([meta], commit)

    def send_all(self, metas: Sequence[TransactionMetadata], commit: bool) -> StableOffsets:
        """The COMMIT/ABORT markers of every transaction of ``metas`` on its partitions,
        in one write per partition, durable when it returns; returns each partition's LSO
        after its markers.

        Raises CoordinatorEpochFencedError when a partition has seen a newer coordinator's
        marker; otherwise the last error once the policy is spent, a non-retriable one at
        once (logged; the transactions stay where they are durably for a later retry)."""
        producers = [
            ProducerMarkers(m.producer_id, m.producer_epoch, tuple(m.sorted_partitions()))
            for m in metas
            if m.partitions
        ]
        if not producers:
            return {}
        ids = ", ".join(repr(m.transactional_id) for m in metas[:3])
        more = f" and {len(metas) - 3} more" if len(metas) > 3 else ""
        what = f"{'COMMIT' if commit else 'ABORT'} markers for {_TXN} {ids}{more}"

        attempts = 0

        def write() -> StableOffsets:
            nonlocal attempts
            attempts += 1
            return self._markers.write_markers(producers, commit, self._coordinator_epoch)

        def before_retry(exc: BaseException, tries: int) -> None:
            with self._lock:
                self._retries += 1
            log.warning("%s failed (%s), retrying (attempt %d)", what, exc, tries + 1)

        try:
            return self._policy.call(write, before_retry=before_retry, stop=self._stop)
        except TransactionCoordinatorFencedError as exc:
            # A partition has seen a newer coordinator's marker: deposed, as when the
            # state partition refuses an append for its leader epoch (the same error).
            raise CoordinatorEpochFencedError(
                f"{what}: the partitions refused the markers of coordinator epoch "
                f"{self._coordinator_epoch}: the transaction was changed by another "
                f"coordinator of a newer epoch; this coordinator was replaced (fenced) "
                f"({exc.message})"
            ) from exc
        except IdemlogError as exc:
            # Not retriable, or retried until the policy was spent or the sender stopped:
            # the transactions stay where they are durably for a later retry.
            log.error(
                "%s failed after %d attempts; they stay %s until retried: %s",
                what,
                attempts,
                sorted({m.state.name for m in metas}),
                exc,
            )
            raise
