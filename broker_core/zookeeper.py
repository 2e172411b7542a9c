"""One ZooKeeper session helper: connection watch, "unavailable" detection, bounded retry.

What counts as "ZooKeeper cannot be reached right now" is decided here, once: the kazoo
errors in ``ZK_UNAVAILABLE`` mean the request may or may not have been applied and that
retrying after the client reconnects is the right move; every other KazooException is an
answer (a conflict, a missing node, an authorisation failure) and is handled by the caller.

:class:`ZkSession` wraps a started kazoo client that stays the caller's. Every request is
sent asynchronously and waited for at most ``request_timeout_s``; one that cannot be
answered because ZooKeeper is away raises :class:`ZkUnavailable` instead of queueing in
kazoo until it reconnects (which would hold the caller for as long as the outage lasts).
:meth:`ZkSession.retrying` retries such failures with kazoo's own ``KazooRetry``
(exponential backoff, jitter, a cap on the wait) until a deadline, and ends a wait early
when a *new* connection comes up.

Base layer: this module imports no layer package of ``broker_core``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.protocol.states import KazooState
from kazoo.retry import ForceRetryError, KazooRetry

T = TypeVar("T")

ZK_UNAVAILABLE: tuple[type[Exception], ...] = (
    ConnectionLoss,
    SessionExpiredError,
    ConnectionClosedError,
    OperationTimeoutError,
)

_STATE_TEXT = {
    KazooState.SUSPENDED: "connection lost, reconnecting",
    KazooState.LOST: "session expired or closed",
    "not started": "client not connected yet",
}


class ZkUnavailable(Exception):
    """ZooKeeper cannot answer right now (not connected, connection lost, no reply in time).

    A request that raised it may or may not have been applied.
    """


_RETRIED: tuple[type[Exception], ...] = (ZkUnavailable, *ZK_UNAVAILABLE)


class _DeadlinePassed(Exception):
    """Internal: ends a KazooRetry loop (not one of the errors it retries)."""


class ZkSession:
    """Bounded requests on ``client`` (a started kazoo client, which stays the caller's).

    The connection state is mirrored from kazoo's state listener, so that a request is
    never queued into a disconnected client, and so that a retry wait ends as soon as a
    new connection is up. :meth:`close` detaches the listener; the client stays open.
    """

    def __init__(self, client: Any, *, request_timeout_s: float) -> None:
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s={request_timeout_s} must be positive")
        self.client = client
        self.request_timeout_s = request_timeout_s
        self._state = threading.Condition()
        self._connected = False
        self._generation = 0  # counts connections, so a wait ends on a *new* one only
        self._last_state: str = "not started"
        self._listeners: list[Callable[[str], object]] = []
        client.add_listener(self._on_state)
        if client.connected:
            self._on_state(KazooState.CONNECTED)

    def close(self) -> None:
        """Detach from the client (which belongs to the caller and stays open)."""
        self.client.remove_listener(self._on_state)

    def add_listener(self, listener: Callable[[str], object]) -> None:
        """Call ``listener(state)`` on every kazoo state change, on kazoo's connection
        thread (it must not block), after this session has recorded the new state: a
        listener reacting to CONNECTED can send requests at once."""
        with self._state:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[str], object]) -> None:
        with self._state:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: must not block (the lock is held for a moment).
        with self._state:
            self._last_state = state
            self._connected = state == KazooState.CONNECTED
            if self._connected:
                self._generation += 1
                self._state.notify_all()
            listeners = list(self._listeners)
        for listener in listeners:
            listener(state)

    @property
    def connected(self) -> bool:
        with self._state:
            return self._connected

    @property
    def generation(self) -> int:
        """How many times a connection came up (a new value means a new connection)."""
        with self._state:
            return self._generation

    def wait_for_new_connection(self, generation: int, timeout: float) -> bool:
        """Wait up to ``timeout`` for a connection newer than ``generation``; True if one is up.

        Only a new connection ends the wait early: the one a request failed on may still
        look up for a moment (kazoo reports the loss a little later), and retrying on it
        at once would spin.
        """
        with self._state:
            return self._state.wait_for(
                lambda: self._connected and self._generation != generation, timeout
            )

    def wait_connected(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the client to be connected; True if it is."""
        with self._state:
            return self._state.wait_for(lambda: self._connected, timeout)

    def call(self, request: Callable[[], Any], *, deadline: float | None = None) -> Any:
        """Send one async kazoo request (``request()`` returns its async result) and wait.

        Waits at most ``request_timeout_s``, and not past ``deadline`` (a
        ``time.monotonic()`` value). Raises :class:`ZkUnavailable` when not connected
        (nothing is sent), on a connection error, or when no reply came in time; any other
        KazooException (a conflict, a missing node, NoAuth) propagates as it is.
        """
        with self._state:
            connected, state = self._connected, self._last_state
        if not connected:
            raise ZkUnavailable(_STATE_TEXT.get(state, f"client {state}"))
        timeout = self.request_timeout_s
        if deadline is not None:
            timeout = max(0.0, min(timeout, deadline - time.monotonic()))
        return self.wait(request(), timeout)

    def wait(self, result: Any, timeout: float | None = None) -> Any:
        """The value of an async request already sent, waited for at most ``timeout``
        (default ``request_timeout_s``); errors as for :meth:`call`."""
        timeout = self.request_timeout_s if timeout is None else timeout
        try:
            return result.get(timeout=timeout)
        except ZK_UNAVAILABLE as exc:
            raise ZkUnavailable(type(exc).__name__) from exc
        except Exception as exc:
            # The handler's timeout type depends on the kazoo handler in use. The request
            # stays queued in kazoo and may still run: callers treat it as ambiguous.
            if isinstance(exc, self.client.handler.timeout_exception):
                raise ZkUnavailable(f"no reply within {timeout:.1f}s") from exc
            raise

    def retrying(
        self,
        attempt: Callable[[float], T],
        *,
        deadline: float,
        give_up: Callable[[ZkUnavailable, int], BaseException],
        backoff_s: float = 0.05,
        max_backoff_s: float = 1.0,
        jitter: float = 0.2,
        on_retry: Callable[[ZkUnavailable, int, float], None] | None = None,
    ) -> T:
        """``attempt(deadline)``, tried again while it raises :class:`ZkUnavailable`.

        ``deadline`` is a ``time.monotonic()`` value: no attempt starts after it, and the
        waits (kazoo's ``KazooRetry`` backoff: doubling from ``backoff_s`` up to
        ``max_backoff_s``, ``±jitter``) never run past it; a wait ends early when a new
        connection comes up. When an attempt fails at or after the deadline, raises
        ``give_up(last_error, attempts)`` chained to the last error. Every other error of
        ``attempt`` propagates at once. ``on_retry(error, attempts, wait_s)`` runs before
        each wait; an error it raises ends the retries.
        """
        generation = self.generation
        last: ZkUnavailable | None = None
        attempts = 0

        def once() -> T:
            nonlocal generation, last, attempts
            generation = self.generation
            try:
                return attempt(deadline)
            except _RETRIED as exc:
                # A raw kazoo connection error counts too: KazooRetry would otherwise
                # retry it on its own, without the deadline.
                error = exc if isinstance(exc, ZkUnavailable) else ZkUnavailable(type(exc).__name__)
                last, attempts = error, attempts + 1
                if deadline - time.monotonic() <= 0:
                    raise _DeadlinePassed from exc
                raise ForceRetryError(str(error)) from exc

        def pause(delay: float) -> None:
            assert last is not None  # only called after a failed attempt
            delay = min(delay, max(0.0, deadline - time.monotonic()))
            if on_retry is not None:
                on_retry(last, attempts, delay)
            self.wait_for_new_connection(generation, delay)

        retry = KazooRetry(
            max_tries=-1,  # bounded by the deadline, checked in once()
            delay=backoff_s,
            backoff=2,
            max_jitter=jitter,
            max_delay=max_backoff_s,
            ignore_expire=False,
            sleep_func=pause,
        )
        try:
            result: T = retry(once)
        except _DeadlinePassed:
            assert last is not None
            raise give_up(last, attempts) from last
        return result
