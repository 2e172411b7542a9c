"""Claims: the ids one coordinator request holds exclusively (``txn.coordinator.registry``)."""

from __future__ import annotations

import threading

from broker_core.errors import ConcurrentTransactionsError

_TXN = "transactional id"
_SINK = "sink"


class Claims:
    """The ids one request holds exclusively; all released together when it ends."""

    def __init__(self, lock: threading.Lock, busy: set[tuple[str, str]]) -> None:
        self._lock = lock
        self._busy = busy
        self._held: set[tuple[str, str]] = set()

    def txn(self, transactional_id: str) -> None:
        self._take((_TXN, transactional_id))

    def sink(self, sink_id: str) -> None:
        self._take((_SINK, sink_id))

    def _take(self, key: tuple[str, str]) -> None:
        if key in self._held:
            return
        with self._lock:
            if key in self._busy:
                raise ConcurrentTransactionsError(
                    f"{key[0]} {key[1]!r} is being changed by another request (a state "
                    "change or marker write is in progress); retry"
                )
            self._busy.add(key)
        self._held.add(key)

    def release(self) -> None:
        with self._lock:
            self._busy.difference_update(self._held)
        self._held.clear()
