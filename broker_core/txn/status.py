"""The coordinator's lifecycle states and the producer-id source it is given (``txn.core``)."""

from __future__ import annotations

from enum import Enum
from typing import Protocol


class ProducerIdSource(Protocol):
    def generate_producer_id(self) -> int: ...


class CoordinatorStatus(Enum):
    LOADING = "loading"  # constructed; start() has not loaded the state yet
    RUNNING = "running"
    CLOSED = "closed"


STATUS_TRANSITIONS = {
    CoordinatorStatus.LOADING: frozenset({CoordinatorStatus.RUNNING, CoordinatorStatus.CLOSED}),
    CoordinatorStatus.RUNNING: frozenset({CoordinatorStatus.CLOSED}),
    CoordinatorStatus.CLOSED: frozenset(),
}

# The coordinator's counters, in the metrics document's "transactions" section.
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
