"""``IdleWatch`` (``idle.shutdown.ms``) alone, on a fake clock: when it says to stop, and
that from then on it refuses every call. The real broker stopping on it:
``tests/spark/test_embedded.py``."""

from __future__ import annotations

import pyarrow.flight as flight
import pytest

from broker_core.server.process.idle import IdleWatch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_idle_means_no_call_in_flight_none_recent_and_no_open_transaction() -> None:
    clock = Clock()
    watch = IdleWatch(2000, clock)
    none_open = lambda: 0  # noqa: E731
    assert not watch.close_if_idle(none_open)  # just started: not idle for 2 s yet
    clock.now += 2.5
    call = watch.start_call(None, {})
    clock.now += 10  # a call in flight for 10 s (a produce stream left open)
    assert not watch.close_if_idle(none_open)
    call.call_completed(None)
    clock.now += 1.9
    assert not watch.close_if_idle(none_open)  # 1.9 s since that call ended
    clock.now += 0.2
    assert not watch.close_if_idle(lambda: 1)  # idle, but a transaction is open
    assert watch.close_if_idle(none_open)
    assert watch.close_if_idle(none_open)  # decided once, for good


def test_once_decided_every_call_is_refused_as_unavailable() -> None:
    clock = Clock()
    watch = IdleWatch(1000, clock)
    clock.now += 1
    assert watch.close_if_idle(lambda: 0)
    with pytest.raises(flight.FlightUnavailableError, match=r"idle\.shutdown\.ms=1000"):
        watch.start_call(None, {})
