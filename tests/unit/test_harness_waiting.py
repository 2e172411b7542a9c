"""The shared waits of tests/harness/waiting.py: they return what they waited for, and a
timeout names what was awaited and the last thing seen."""

from __future__ import annotations

import threading

import pytest

from tests.harness.waiting import Recorder, WaitTimeout, wait_until


def test_wait_until_returns_the_first_truthy_value() -> None:
    answers = iter([0, None, "", [3]])
    assert wait_until(lambda: next(answers), "a list", interval=0) == [3]


def test_wait_until_names_what_and_the_last_value_on_timeout() -> None:
    with pytest.raises(WaitTimeout, match=r"waiting for the answer; last value seen: ''$"):
        wait_until(lambda: "", "the answer", timeout=0)
    seen: list[int] = []

    def condition() -> bool:
        seen.append(len(seen))
        return False

    with pytest.raises(WaitTimeout, match=r"waiting for 1 polls \(seen \[0\]\)"):
        wait_until(condition, lambda: f"{len(seen)} polls (seen {seen})", timeout=0)


def test_wait_until_lets_the_condition_abort_the_wait() -> None:
    def condition() -> bool:
        raise RuntimeError("the child died")

    with pytest.raises(RuntimeError, match="the child died"):
        wait_until(condition, "never", timeout=60)


def test_recorder_wakes_a_waiter_on_a_record_from_another_thread() -> None:
    recorder = Recorder(timeout=30)
    threads = [threading.Thread(target=recorder, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    values = recorder.wait_for_count(3, "three callbacks")
    for t in threads:
        t.join()
    assert sorted(values) == [0, 1, 2]  # type: ignore[type-var]
    recorder()  # a callback without arguments records None
    assert recorder.values[-1] is None and len(recorder) == 4


def test_recorder_timeout_names_what_and_everything_recorded() -> None:
    recorder = Recorder(timeout=0)
    recorder(True)
    with pytest.raises(WaitTimeout, match=r"waiting for the loss; recorded so far: \[True\]"):
        recorder.wait(lambda v: v == [True, False], "the loss")
