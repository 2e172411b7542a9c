"""The one retry policy: retriable errors only, a deadline, an attempt cap, backoff."""

from __future__ import annotations

import threading

import pytest

from broker_core.errors import (
    InvalidConfigError,
    NetworkError,
    NotCoordinatorError,
    OutOfOrderSequenceError,
)
from broker_core.retry import RetryPolicy, is_retriable


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def failing(errors: list[BaseException], result: str = "ok"):  # type: ignore[no-untyped-def]
    calls = []

    def fn() -> str:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return result

    fn.calls = calls  # type: ignore[attr-defined]
    return fn


def test_retriable_errors_are_retried_until_success() -> None:
    clock = FakeClock()
    fn = failing([NetworkError("a"), NotCoordinatorError("b")])
    policy = RetryPolicy(deadline_s=10, backoff_s=0.1, max_backoff_s=1, jitter=0)
    assert policy.call(fn, clock=clock, sleep=clock.sleep) == "ok"
    assert len(fn.calls) == 3
    assert clock.waits == [0.1, 0.2]


def test_a_non_retriable_error_is_raised_at_once() -> None:
    clock = FakeClock()
    fn = failing([OutOfOrderSequenceError("x")])
    with pytest.raises(OutOfOrderSequenceError):
        RetryPolicy(deadline_s=10).call(fn, clock=clock, sleep=clock.sleep)
    assert len(fn.calls) == 1
    assert clock.waits == []
    assert not is_retriable(ValueError("not ours"))


def test_the_deadline_bounds_the_waits_and_the_last_error_is_raised() -> None:
    clock = FakeClock()
    fn = failing([NetworkError(str(i)) for i in range(100)])
    policy = RetryPolicy(deadline_s=1.0, backoff_s=0.3, max_backoff_s=0.3, jitter=0)
    with pytest.raises(NetworkError) as info:
        policy.call(fn, clock=clock, sleep=clock.sleep)
    # 0.3 + 0.3 + 0.3 + 0.1 (cut at the deadline), then one last attempt at it.
    assert clock.waits == pytest.approx([0.3, 0.3, 0.3, 0.1])
    assert len(fn.calls) == 5
    assert info.value.message == "4"


def test_the_attempt_cap_and_give_up() -> None:
    clock = FakeClock()
    fn = failing([NetworkError("1"), NetworkError("2"), NetworkError("3")])
    policy = RetryPolicy(max_attempts=2, backoff_s=0.01, jitter=0)

    def give_up(error: BaseException, attempts: int) -> BaseException:
        return TimeoutError(f"gave up after {attempts}: {error}")

    with pytest.raises(TimeoutError, match="gave up after 2") as info:
        policy.call(fn, give_up=give_up, clock=clock, sleep=clock.sleep)
    assert isinstance(info.value.__cause__, NetworkError)
    assert len(fn.calls) == 2


def test_before_retry_runs_between_attempts_and_retriable_can_widen() -> None:
    clock = FakeClock()
    fn = failing([KeyError("routing"), KeyError("routing")])
    seen: list[int] = []
    policy = RetryPolicy(max_attempts=5, backoff_s=0.01, jitter=0)
    result = policy.call(
        fn,
        retriable=lambda e: isinstance(e, KeyError),
        before_retry=lambda e, n: seen.append(n),
        clock=clock,
        sleep=clock.sleep,
    )
    assert result == "ok"
    assert seen == [1, 2]


def test_a_set_stop_event_ends_the_retries() -> None:
    stop = threading.Event()
    stop.set()
    fn = failing([NetworkError("1"), NetworkError("2")])
    with pytest.raises(NetworkError):
        RetryPolicy(deadline_s=60).call(fn, stop=stop)
    assert len(fn.calls) == 1


def test_backoff_doubles_to_the_cap_with_jitter_inside_its_band() -> None:
    policy = RetryPolicy(deadline_s=1, backoff_s=0.1, max_backoff_s=0.5, jitter=0.2)
    assert policy.delay(1, rng=lambda: 0.5) == pytest.approx(0.1)
    assert policy.delay(3, rng=lambda: 0.5) == pytest.approx(0.4)
    assert policy.delay(9, rng=lambda: 0.5) == pytest.approx(0.5)
    assert policy.delay(2, rng=lambda: 0.0) == pytest.approx(0.16)
    assert policy.delay(2, rng=lambda: 1.0) == pytest.approx(0.24)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "deadline_s or max_attempts"),
        ({"deadline_s": -1}, "deadline_s=-1"),
        ({"max_attempts": 0}, "max_attempts=0"),
        ({"max_attempts": 1, "backoff_s": 2, "max_backoff_s": 1}, "backoff_s=2"),
        ({"max_attempts": 1, "jitter": 1.5}, "jitter=1.5"),
    ],
)
def test_bad_policies_are_refused_naming_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidConfigError, match=field):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_a_deadline_from_the_first_failure_gives_a_long_first_attempt_its_retries() -> None:
    clock = FakeClock()
    errors: list[BaseException] = [NetworkError("timed out"), NetworkError("again")]

    def slow_then_fast() -> str:
        if len(errors) == 2:
            clock.now += 50.0  # the first attempt ran past the deadline before failing
        if errors:
            raise errors.pop(0)
        return "ok"

    policy = RetryPolicy(deadline_s=5, backoff_s=1, max_backoff_s=1, jitter=0)
    with pytest.raises(NetworkError, match="timed out"):
        policy.call(slow_then_fast, clock=clock, sleep=clock.sleep)
    errors[:] = [NetworkError("timed out"), NetworkError("again")]
    clock.now, clock.waits = 0.0, []
    later = RetryPolicy(
        deadline_s=5, backoff_s=1, max_backoff_s=1, jitter=0, from_first_failure=True
    )
    assert later.call(slow_then_fast, clock=clock, sleep=clock.sleep) == "ok"
    assert clock.waits == [1.0, 1.0]
