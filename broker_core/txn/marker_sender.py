"""Writing one transaction's markers for the coordinator, retried under one policy.

The markers go through a :class:`~broker_core.txn.markers.MarkerWriter` (local, or
routed to each partition's leader); retriable failures are retried under a
:class:`~broker_core.retry.RetryPolicy` until it is spent or the coordinator closes.
"""

from __future__ import annotations

import logging
import threading

from broker_core.errors import IdemlogError, TransactionCoordinatorFencedError
from broker_core.retry import RetryPolicy
from broker_core.txn.markers import MarkerWriter, StableOffsets
from broker_core.txn.state import TransactionMetadata
from broker_core.txn.state_store import CoordinatorEpochFencedError

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
        """The COMMIT/ABORT markers of ``meta``'s partitions, durable when it returns;
        returns each partition's LSO after its marker.

        Raises CoordinatorEpochFencedError when a partition has seen a newer coordinator's
        marker; otherwise the last error once the policy is spent, a non-retriable one at
        once (logged; the transaction stays in its PREPARE state for a later retry)."""
        partitions = meta.sorted_partitions()
        if not partitions:
            return {}
        what = f"{'COMMIT' if commit else 'ABORT'} markers for {_TXN} {meta.transactional_id!r}"

        attempts = 0

        def write() -> StableOffsets:
            nonlocal attempts
            attempts += 1
            return self._markers.write_markers(
                meta.producer_id, meta.producer_epoch, commit, self._coordinator_epoch, partitions
            )

        def before_retry(exc: BaseException, tries: int) -> None:
            with self._lock:
                self._retries += 1
            log.warning("%s failed (%s), retrying (attempt %d)", what, exc, tries + 1)

        def failed(exc: BaseException, tries: int) -> None:
            log.error(
                "%s (producer id %d epoch %d) failed after %d attempts; it stays %s until "
                "retried: %s",
                what,
                meta.producer_id,
                meta.producer_epoch,
                tries,
                meta.state.name,
                exc,
            )

        try:
            return self._policy.call(write, before_retry=before_retry, stop=self._stop)
        except TransactionCoordinatorFencedError as exc:
            # A partition has seen a newer coordinator's marker: same as a newer
            # coordinator's state in the store (and the same error for the client).
            raise CoordinatorEpochFencedError(
                f"{_TXN} {meta.transactional_id!r}: the partitions refused the markers of "
                f"coordinator epoch {self._coordinator_epoch}: the transaction was changed "
                f"by another coordinator of a newer epoch; this coordinator was replaced "
                f"(fenced) ({exc.message})"
            ) from exc
        except IdemlogError as exc:
            # Not retriable, or retried until the policy was spent or the sender stopped:
            # the transaction stays in its PREPARE state for a later retry.
            failed(exc, attempts)
            raise
