"""The idle shutdown (``idle.shutdown.ms``): a broker that has had no call in flight for
that long, and no transaction open, stops as it does on SIGTERM (snapshots, the clean
marker). Off (0) for brokers an operator runs; the embedded broker, which nobody stops by
hand, is started with it (``spark_sink.embedded``), and the next job starts it again.

A connection with no call on it is no client at work (gRPC keeps idle channels open for
as long as the client process lives), so "connected" is measured by calls: one in flight,
or one ended less than ``idle.shutdown.ms`` ago, keeps the broker up.

The decision is fenced by the call gate itself, not checked before it: :class:`IdleWatch`
is the listener's middleware, and its ``start_call`` and :meth:`IdleWatch.close_if_idle`
take one lock. Once the broker decided to stop, every new call is refused with
UNAVAILABLE (a client starts the broker again, as after a SIGTERM), so no call starts after
the decision and none was running at it. Transactions open only through calls, so the
count read under that lock stays true until the broker is stopped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow.flight as flight

from broker_core.server.config.broker_config import IDLE_SHUTDOWN_KEY


class _Call(flight.ServerMiddleware):  # type: ignore[misc]
    def __init__(self, watch: IdleWatch) -> None:
        super().__init__()
        self._watch = watch

    def call_completed(self, exception: BaseException | None) -> None:
        self._watch.ended()


class IdleWatch(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Counts the calls in flight and when the last one ended (``clock``, seconds); says
    when the broker has been idle for ``idle_ms`` and from then refuses every call."""

    def __init__(self, idle_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.idle_s = idle_ms / 1000.0
        self._clock = clock
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last_ended = clock()
        self._closed = False

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> _Call:
        with self._lock:
            if self._closed:
                raise flight.FlightUnavailableError(
                    f"the broker is stopping: it was idle for {IDLE_SHUTDOWN_KEY}="
                    f"{self.idle_s * 1000:.0f} (no call, no open transaction)"
                )
            self._in_flight += 1
        return _Call(self)

    def ended(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._last_ended = self._clock()

    def close_if_idle(self, open_transactions: Callable[[], int]) -> bool:
        """Whether the broker is to stop now: no call in flight, none ended within
        ``idle_ms``, and ``open_transactions()`` (called under the gate's lock) is 0. When
        True, every later call is refused."""
        with self._lock:
            if self._closed:
                return True
            if self._in_flight or self._clock() - self._last_ended < self.idle_s:
                return False
            if open_transactions():
                return False
            self._closed = True
            return True
