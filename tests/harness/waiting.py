"""Waiting in tests: one deadline-bounded poll (``wait_until``) and one event-driven
``Recorder`` of callbacks, shared by every tier instead of a copy per module.

Prefer an event when the code under test offers one (a callback into a :class:`Recorder`,
a ``threading.Event``, a pidfd); poll with :func:`wait_until` only for state held by another
process or thread that signals nothing (a file, a broker's answer, a counter).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 15.0
# Short enough not to slow a test down, long enough not to busy-spin a shared 2-core machine.
DEFAULT_INTERVAL_S = 0.02


class WaitTimeout(AssertionError):
    """A wait's deadline passed; the message names what was awaited and the last value seen.

    An ``AssertionError``, so pytest reports it as the test's failure (not as an error).
    """


def wait_until(
    condition: Callable[[], T],
    what: str | Callable[[], str],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = DEFAULT_INTERVAL_S,
) -> T:
    """Poll ``condition()`` until it returns a truthy value, and return that value.

    ``condition`` may raise to abort the wait early (e.g. "the child process died"): the
    exception propagates unchanged. Raises :class:`WaitTimeout` after ``timeout`` seconds,
    naming ``what`` and the last value ``condition`` returned. ``what`` may be a callable,
    evaluated only on timeout, to describe state the condition gathered while polling.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            awaited = what() if callable(what) else what
            raise WaitTimeout(
                f"timed out after {timeout:g}s waiting for {awaited}; last value seen: {value!r}"
            )
        time.sleep(interval)  # the poll interval: the awaited state signals nothing


class Recorder:
    """A thread-safe callback that records what it is called with, and lets a test wait
    (on a condition variable, not by polling) until the recording matches.

    Called with arguments, it records the first one (callbacks such as
    ``on_controller_change(is_controller)``); called with none, it records ``None``.
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout = timeout
        self._values: list[object] = []
        self._changed = threading.Condition()

    def __call__(self, *args: object) -> None:
        self.record(args[0] if args else None)

    def record(self, value: object) -> None:
        """Append ``value`` and wake every waiter."""
        with self._changed:
            self._values.append(value)
            self._changed.notify_all()

    @property
    def values(self) -> list[object]:
        """A copy of everything recorded so far, oldest first."""
        with self._changed:
            return list(self._values)

    def __len__(self) -> int:
        with self._changed:
            return len(self._values)

    def wait(
        self,
        predicate: Callable[[list[object]], object],
        what: str,
        timeout: float | None = None,
    ) -> list[object]:
        """Block until ``predicate(values)`` is truthy; return a copy of the values then.

        Raises :class:`WaitTimeout` naming ``what`` and everything recorded so far.
        """
        limit = self.timeout if timeout is None else timeout
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self._values), limit):
                raise WaitTimeout(
                    f"timed out after {limit:g}s waiting for {what}; recorded so far: "
                    f"{self._values!r}"
                )
            return list(self._values)

    def wait_for_count(self, count: int, what: str, timeout: float | None = None) -> list[object]:
        """Block until at least ``count`` values are recorded (see :meth:`wait`)."""
        return self.wait(lambda values: len(values) >= count, what, timeout)
