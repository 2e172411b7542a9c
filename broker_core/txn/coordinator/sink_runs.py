"""Sink runs: which run of each sink the coordinator last saw, and when each run last
showed life (docs/design.md, "Long batches").

A sink task's transaction lives as long as any task of its run writes or beats; a new
run of a sink retires the attempts the sink's other runs left. In memory only: after a
load every sink transaction gets a full timeout from the load, rather than being aborted
for the time the coordinator was away.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from broker_core.txn.state_topic.records import NO_SINK, TransactionMetadata


class SinkRuns:
    """The current run of each sink and each (sink, run)'s last sign of life, in ms of
    ``clock()``."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._current: dict[str, str] = {}
        self._alive_ms: dict[tuple[str, str], int] = {}
        self._loaded_ms = 0

    def loaded(self) -> None:
        """The coordinator loaded its state now: no sink transaction is older than that."""
        with self._lock:
            self._loaded_ms = self._clock()

    def current(self, sink_id: str) -> str | None:
        with self._lock:
            return self._current.get(sink_id)

    def set_current(self, sink_id: str, run_id: str) -> None:
        with self._lock:
            self._current[sink_id] = run_id

    def touch(self, sink_id: str, run_id: str, now_ms: int) -> None:
        with self._lock:
            self._alive_ms[(sink_id, run_id)] = now_ms

    def beat(self, meta: TransactionMetadata) -> int:
        """When a task of the run holding ``meta`` last wrote or beat (0: unknown)."""
        with self._lock:
            return self._alive_ms.get((meta.sink_id, meta.sink_run), 0)

    def alive_since(self, meta: TransactionMetadata) -> int:
        """When the transaction last showed life, for its timeout: a sink task's when any
        task of its run last wrote or beat (at the earliest the load), any other
        transaction's its start."""
        if meta.sink_id == NO_SINK:
            return meta.txn_start_ms
        with self._lock:
            beat = self._alive_ms.get((meta.sink_id, meta.sink_run), 0)
        return max(meta.txn_start_ms, beat, self._loaded_ms)

    def forget_older_than(self, oldest_ms: int) -> None:
        """Drop the liveness of runs silent since before ``oldest_ms`` (one per batch job
        and query start would pile up otherwise). Safe once that is longer ago than any
        timeout: their transactions count as expired with or without the entry."""
        with self._lock:
            gone = [key for key, beat in self._alive_ms.items() if beat < oldest_ms]
            for sink_id, run_id in gone:
                del self._alive_ms[(sink_id, run_id)]
                if self._current.get(sink_id) == run_id:
                    del self._current[sink_id]

    def forget_sink(self, sink_id: str) -> None:
        """The sink's record expired: its current run is forgotten with it."""
        with self._lock:
            self._current.pop(sink_id, None)

    def alive(self) -> int:
        """How many (sink, run) liveness entries are kept, for the metrics."""
        with self._lock:
            return len(self._alive_ms)
