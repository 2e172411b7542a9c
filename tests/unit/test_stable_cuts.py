"""StableCuts: the cut a Kafka read_committed consumer reads to, kept per topic a moment."""

from __future__ import annotations

import pytest

from broker_core.errors import CoordinatorNotAvailableError
from broker_core.server.coordination.stable_cuts import StableCuts


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_cut_is_kept_its_refresh_then_computed_again() -> None:
    clock, asked = Clock(), []

    def compute(topic: str) -> dict[int, int]:
        asked.append(topic)
        return {0: len(asked)}

    cuts = StableCuts(compute, refresh_s=0.1, clock=clock)
    assert cuts.ends("t", "id1") == {0: 1}
    clock.now += 0.05
    assert cuts.ends("t", "id1") == {0: 1} and asked == ["t"]
    clock.now += 0.06
    assert cuts.ends("t", "id1") == {0: 2}


def test_a_failed_refresh_serves_the_last_cut_and_without_one_raises() -> None:
    clock, answers = Clock(), [{0: 5}]

    def compute(topic: str) -> dict[int, int]:
        if not answers:
            raise CoordinatorNotAvailableError("state partition 0 has no leader")
        return answers.pop()

    cuts = StableCuts(compute, refresh_s=0.1, clock=clock)
    assert cuts.ends("t", "a") == {0: 5}
    clock.now += 1
    assert cuts.ends("t", "a") == {0: 5}  # kept: a past cut stays true
    with pytest.raises(CoordinatorNotAvailableError):
        cuts.ends("u", "b")  # never had one


def test_a_topic_created_again_never_reads_at_the_old_ones_cut() -> None:
    clock = Clock()
    answers = iter([{0: 7}, {0: 0}])
    cuts = StableCuts(lambda topic: next(answers), refresh_s=10, clock=clock)
    assert cuts.ends("t", "old") == {0: 7}
    assert cuts.ends("t", "new") == {0: 0}  # within the refresh, but another topic


def test_cuts_of_topics_no_longer_read_are_dropped() -> None:
    clock = Clock()
    cuts = StableCuts(lambda topic: {0: 1}, refresh_s=0.1, expire_s=60, clock=clock)
    for name in ("a", "b", "c"):
        cuts.ends(name, name)
    assert len(cuts) == 3
    clock.now += 61
    cuts.ends("a", "a")
    assert len(cuts) == 1
