"""The coordinator's lifecycle: its states, their transitions, and standing down when a
newer coordinator fences it; and the producer-id source a coordinator is given."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Protocol

from broker_core.errors import (
    CoordinatorNotAvailableError,
    InvalidTxnStateError,
    NotCoordinatorError,
)
from broker_core.txn.state_topic.store import CoordinatorEpochFencedError

log = logging.getLogger("idemlog.txn")


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


class CoordinatorLifecycle:
    """LOADING -> RUNNING -> CLOSED (:data:`STATUS_TRANSITIONS`) of the coordinator of
    ``coordinator_epoch``; ``on_close`` runs at every close (the marker sender's stop, so
    retries are cut short). A write refused for the epoch closes it (:meth:`fenced`)."""

    def __init__(self, coordinator_epoch: int, on_close: Callable[[], None]) -> None:
        self._coordinator_epoch = coordinator_epoch
        self._on_close = on_close
        self._lock = threading.Lock()
        self._status = CoordinatorStatus.LOADING

    @property
    def status(self) -> CoordinatorStatus:
        return self._status

    def check_loading(self) -> None:
        """Raises InvalidTxnStateError unless LOADING (a start of a started coordinator)."""
        if self._status is not CoordinatorStatus.LOADING:
            raise InvalidTxnStateError(f"start() on a coordinator that is {self._status.name}")

    def check_running(self) -> None:
        """Raises CoordinatorNotAvailableError while loading, NotCoordinatorError once closed."""
        status = self._status
        if status is CoordinatorStatus.LOADING:
            raise CoordinatorNotAvailableError(
                "the transaction coordinator is still loading its state"
            )
        if status is CoordinatorStatus.CLOSED:
            raise NotCoordinatorError("the transaction coordinator was closed")

    def running(self) -> None:
        """LOADING -> RUNNING, once the state is loaded."""
        self._move(CoordinatorStatus.RUNNING)

    def close(self) -> None:
        """CLOSED from now on (NOT_COORDINATOR) and ``on_close`` run. Idempotent."""
        self._move(CoordinatorStatus.CLOSED, idempotent=True)
        self._on_close()

    @contextlib.contextmanager
    def fenced(self) -> Iterator[None]:
        """A store or a partition refusing this coordinator's epoch means a newer
        coordinator took over: stop serving (NOT_COORDINATOR from now on, marker retries
        cut short), and raise on."""
        try:
            yield
        except CoordinatorEpochFencedError as exc:
            if self._status is not CoordinatorStatus.CLOSED:
                log.error(
                    "transaction coordinator of epoch %d was replaced by a newer one; it "
                    "stops serving: %s",
                    self._coordinator_epoch,
                    exc.message,
                )
            self.close()
            raise

    def _move(self, new: CoordinatorStatus, *, idempotent: bool = False) -> None:
        with self._lock:
            if idempotent and new is self._status:
                return
            if new not in STATUS_TRANSITIONS[self._status]:
                raise InvalidTxnStateError(
                    f"coordinator cannot go from {self._status.name} to {new.name}"
                )
            self._status = new
