"""The coordinator's counters, in the metrics document's "transactions" section."""

from __future__ import annotations

import threading

COUNTERS = (
    "transactions_committed",
    "transactions_aborted",
    "transactions_fenced",
    "transactions_timed_out",
    "producer_id_rotations",
    "sink_batches_committed",
    "sink_batches_repeated",
    "sink_attempts_reused",
    "sink_leftovers_aborted",
    "transactions_aborted_by_operator",
    "transactional_ids_expired",
    "sinks_expired",
)


class Counters:
    """One count per name of :data:`COUNTERS`, each only ever going up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
