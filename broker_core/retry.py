"""The one retry policy of client-side calls: a deadline and/or an attempt cap,
exponential backoff with jitter, and retries of retriable errors only.

Which errors are worth another try is the error's own ``retriable`` flag (see
``broker_core.errors``), never a list kept at the call site: a caller that retries more
(a routing error after a metadata refresh) passes ``retriable=`` and does its refresh in
``before_retry``.

    policy = RetryPolicy(deadline_s=30.0, backoff_s=0.05, max_backoff_s=2.0)
    result = policy.call(lambda: client.end_txn(...))
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from broker_core.errors import IdemlogError, InvalidConfigError

T = TypeVar("T")


def is_retriable(error: BaseException) -> bool:
    """The error's own verdict: an ``IdemlogError`` whose ``retriable`` flag is set."""
    return isinstance(error, IdemlogError) and error.retriable


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When to try a call again and how long to wait first.

    ``deadline_s``: no new attempt starts later than this after the first one (``None``: no
    deadline); a wait never runs past it, so the last attempt is made at it. With
    ``from_first_failure`` it counts from the end of the first failed attempt instead: a
    caller whose single attempt may legitimately run long (a request with a generous
    timeout of its own) still gets its retries.
    ``max_attempts``: at most this many attempts in all (``None``: no cap). At least one of
    the two must be set. ``backoff_s`` doubles after each failure up to ``max_backoff_s``;
    each wait is drawn uniformly within ``±jitter`` of it so that many clients retrying
    one broker do not come back in step.
    """

    deadline_s: float | None = None
    max_attempts: int | None = None
    backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    jitter: float = 0.2
    from_first_failure: bool = False

    def __post_init__(self) -> None:
        if self.deadline_s is None and self.max_attempts is None:
            raise InvalidConfigError("a RetryPolicy needs deadline_s or max_attempts")
        if self.deadline_s is not None and self.deadline_s < 0:
            raise InvalidConfigError(f"RetryPolicy deadline_s={self.deadline_s} is negative")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise InvalidConfigError(f"RetryPolicy max_attempts={self.max_attempts} is below 1")
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise InvalidConfigError(
                f"RetryPolicy backoff_s={self.backoff_s} must be >= 0 and <= "
                f"max_backoff_s={self.max_backoff_s}"
            )
        if not 0 <= self.jitter < 1:
            raise InvalidConfigError(f"RetryPolicy jitter={self.jitter} must be in [0, 1)")

    def delay(self, failures: int, rng: Callable[[], float] = random.random) -> float:
        """The wait after the ``failures``-th failure (1-based), jitter included."""
        base: float = min(self.backoff_s * 2.0 ** (failures - 1), self.max_backoff_s)
        return base * (1 - self.jitter + 2 * self.jitter * rng())

    def call(
        self,
        fn: Callable[[], T],
        *,
        retriable: Callable[[BaseException], bool] = is_retriable,
        before_retry: Callable[[BaseException, int], None] | None = None,
        give_up: Callable[[BaseException, int], BaseException] | None = None,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> T:
        """``fn()``, tried again after a retriable failure until it returns or the policy
        is spent.

        Raises a non-retriable error at once, as it is. When the deadline or the attempt
        cap is reached (or ``stop`` is set), raises the last error as it is, or what
        ``give_up(error, attempts)`` returns, chained to it. ``before_retry(error,
        attempts)`` runs before each new attempt (e.g. to refresh metadata); an error it
        raises ends the retries.
        """
        deadline = None
        if self.deadline_s is not None and not self.from_first_failure:
            deadline = clock() + self.deadline_s
        attempts = 0
        while True:
            attempts += 1
            try:
                return fn()
            except BaseException as exc:
                if not retriable(exc):
                    raise
                if deadline is None and self.deadline_s is not None:
                    deadline = clock() + self.deadline_s  # from_first_failure
                remaining = None if deadline is None else deadline - clock()
                spent = (
                    (self.max_attempts is not None and attempts >= self.max_attempts)
                    or (remaining is not None and remaining <= 0)
                    or (stop is not None and stop.is_set())
                )
                if spent:
                    if give_up is None:
                        raise
                    raise give_up(exc, attempts) from exc
                wait = self.delay(attempts)
                if remaining is not None:
                    wait = min(wait, remaining)
                if stop is not None:
                    if stop.wait(wait):
                        if give_up is None:
                            raise
                        raise give_up(exc, attempts) from exc
                else:
                    sleep(wait)
                if before_retry is not None:
                    before_retry(exc, attempts)
