"""The sink's heartbeats: while a task writes, its run is told alive to the coordinator.

docs/design.md, "Long batches": the coordinator times a sink's transactions out only
when no task of its run wrote, prepared or sent a heartbeat for
``transaction.timeout.ms``, so a task beats every quarter of it while it writes. Here one
daemon thread per process (:class:`Heartbeats`) beats for every task running in it,
instead of a thread and a client per task: a task registers its run when it starts
writing and leaves when it is done (:meth:`Heartbeats.beating`), which costs no thread
start and no connection. The beats go over the process's shared connections
(``spark_sink.connections``).

Guarantee: a run registered at time t is beaten at t + interval, t + 2 interval, ...
until it leaves (each beat as late as the beats before it in the same pass take; a
failed beat is logged, and the next one is tried on time). A forked child (a gRPC
channel and a thread do not cross a fork) starts a thread of its own at its first
registration.

Bound: one entry per task registered in the process (Spark runs one task at a time in a
Python worker; a process shared by threads holds one per running task), removed when the
task leaves; the thread itself is one per process.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from broker_core.errors import IdemlogError
from spark_sink.connections import sink_client
from spark_sink.options import IdemlogOptions

log = logging.getLogger("idemlog.sink")


def heartbeat_interval_s(options: IdemlogOptions) -> float:
    """How often a run is beaten: several beats per timeout, so one lost or late beat
    never lets it expire."""
    return max(options.transaction_timeout_ms / 4000, 0.1)


@dataclass
class _Entry:
    options: IdemlogOptions
    bootstrap: str
    sink_id: str
    run_id: str
    interval_s: float
    due: float  # time.monotonic() of the next beat


class Heartbeats:
    """The process's heartbeat thread and the runs it beats for (module docstring)."""

    def __init__(self) -> None:
        self._reset()
        # A lock held by another thread at a fork stays held in the child forever: the
        # child starts afresh (its parent's runs are the parent's to beat).
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._entries: dict[int, _Entry] = {}
        self._ids = itertools.count()
        self._owner: int | None = None  # the pid whose thread runs

    @contextlib.contextmanager
    def beating(
        self, options: IdemlogOptions, bootstrap: str, sink_id: str, run_id: str
    ) -> Iterator[None]:
        """Beat for (``sink_id``, ``run_id``) every ``heartbeat_interval_s(options)``
        while the block runs; never raises for a failed beat (logged)."""
        interval = heartbeat_interval_s(options)
        entry = _Entry(options, bootstrap, sink_id, run_id, interval, time.monotonic() + interval)
        with self._lock:
            key = next(self._ids)
            self._entries[key] = entry
            if self._owner != os.getpid():
                # First use in this process (or a forked child whose parent's thread did
                # not come along): start its thread.
                self._owner = os.getpid()
                threading.Thread(target=self._run, name="idemlog-heartbeat", daemon=True).start()
            self._changed.notify()
        try:
            yield
        finally:
            with self._lock:
                del self._entries[key]

    def registered(self) -> int:
        """How many runs are being beaten for now (tests, the bound)."""
        with self._lock:
            return len(self._entries)

    def _run(self) -> None:
        pid = os.getpid()
        while True:
            with self._lock:
                if self._owner != pid:
                    return  # a fork's copy of this object: its own thread serves it
                now = time.monotonic()
                due = [(k, e) for k, e in self._entries.items() if e.due <= now]
                if not due:
                    nearest = min((e.due for e in self._entries.values()), default=None)
                    self._changed.wait(None if nearest is None else nearest - now)
                    continue
                for _, e in due:
                    e.due = now + e.interval_s
            for _, e in due:
                self._beat(e)

    @staticmethod
    def _beat(e: _Entry) -> None:
        try:
            with sink_client(e.bootstrap, e.options.tls, sasl=e.options.sasl) as client:
                client.sink_heartbeat(e.sink_id, e.run_id)
        except IdemlogError as exc:
            # Not fatal by itself: if beats stay lost past the timeout, the
            # transactions are aborted and the driver's commit says so.
            log.warning("sink %s: heartbeat failed: %s", e.sink_id, exc)
        except Exception:
            # Not a broker's answer (a bug, a library's error): logged whole, and the
            # thread lives on, since every later task of the process relies on it.
            log.exception("sink %s: heartbeat failed", e.sink_id)


HEARTBEATS = Heartbeats()  # the process's
