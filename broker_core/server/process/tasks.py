"""The broker's background tasks: retention, the log cleaner, producer expiry, flush.ms,
transaction timeouts.

Each runs on its own daemon thread and waits on an ``Event`` between runs, so ``stop()``
ends it at once instead of after a sleep. A failing run is logged with its traceback and
the task carries on: one bad partition must not end retention for all the others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("idemlog.broker")


class PeriodicTask:
    """Runs ``action`` every ``interval_ms`` until stopped (first run after one interval)."""

    def __init__(self, name: str, interval_ms: int, action: Callable[[], object]) -> None:
        if interval_ms <= 0:
            raise ValueError(f"{name}: interval_ms={interval_ms} must be positive")
        self.name = name
        self.interval_s = interval_ms / 1000.0
        self._action = action
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"idemlog-{name}", daemon=True)
        self.runs = 0
        self.failures = 0

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._action()
            except Exception:
                self.failures += 1
                log.exception(
                    "background task %s failed; it runs again in %.3gs", self.name, self.interval_s
                )
            self.runs += 1

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("background task %s did not stop within %.0fs", self.name, timeout_s)


class TaskGroup:
    """The broker's tasks, started and stopped together."""

    def __init__(self) -> None:
        self._tasks: list[PeriodicTask] = []

    def add(self, name: str, interval_ms: int, action: Callable[[], object]) -> PeriodicTask:
        task = PeriodicTask(name, interval_ms, action)
        self._tasks.append(task)
        return task

    def start(self) -> None:
        for task in self._tasks:
            task.start()

    def stop(self) -> None:
        for task in self._tasks:
            task.request_stop()  # all at once: none waits for another's run to end
        for task in self._tasks:
            task.stop()

    @property
    def tasks(self) -> list[PeriodicTask]:
        return list(self._tasks)
