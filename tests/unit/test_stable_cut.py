"""The readers' cut across coordinators, step 4 (``broker_core.protocol.stable_cut``):
what ``combine`` refuses so that no batch it cannot see is cut, and ``cut_across``'s
starting over."""

from __future__ import annotations

import pytest

from broker_core.errors import InvalidRequestError, StaleTrackedBatchesError
from broker_core.protocol.stable_cut import EVERYTHING, TrackedBatches, combine, cut_across

LSOS = {0: 20, 1: 20}
STRADDLING = [(0, 10, 12), (1, 25, 26)]  # committed on 0, not yet on 1


def answer(generation: int = 0, *, incarnation: str = "a", evicted_through: int = 0,
           evicted_high: dict[int, int] | None = None,
           batches: list[list[tuple[int, int, int]]] | None = None) -> TrackedBatches:  # fmt: skip
    return TrackedBatches(
        incarnation, generation, evicted_through, evicted_high or {}, batches or []
    )


def test_the_union_of_both_answers_of_every_coordinator_cuts() -> None:
    first = [answer(), answer(incarnation="b")]
    again = [answer(), answer(incarnation="b", batches=[STRADDLING])]
    assert combine(LSOS, first, again) == {0: 10, 1: 20}


def test_a_coordinator_restarted_between_the_questions_is_refused() -> None:
    with pytest.raises(StaleTrackedBatchesError, match="coordinator 0 changed incarnation"):
        combine(LSOS, [answer()], [answer(incarnation="b")])


def test_a_ring_that_lost_a_batch_dropped_since_the_first_answer_is_refused() -> None:
    # Dropped through generation 5 is gone from the ring; the first answer was at 4.
    with pytest.raises(StaleTrackedBatchesError, match="dropped more batches since generation 4"):
        combine(LSOS, [answer(4)], [answer(9, evicted_through=5)])
    assert combine(LSOS, [answer(5)], [answer(9, evicted_through=5)]) == LSOS


def test_a_cut_reaching_a_batch_evicted_from_a_ring_is_refused() -> None:
    # Coordinator a evicted a batch ending at 14 on partition 0; b's straddling batch
    # pulls partition 0 down to 10: a's evicted batch could be cut there.
    first = [answer(3, evicted_through=3, evicted_high={0: 14}), answer(incarnation="b")]
    again = [answer(3, evicted_through=3), answer(incarnation="b", batches=[STRADDLING])]
    with pytest.raises(StaleTrackedBatchesError, match=r"coordinator 0 no longer holds"):
        combine(LSOS, first, again)
    # Below every evicted batch's last offset: nothing evicted can be cut.
    first[0] = answer(3, evicted_through=3, evicted_high={0: 9})
    assert combine(LSOS, first, again) == {0: 10, 1: 20}


def test_cut_across_starts_over_and_gives_up_after_its_attempts() -> None:
    incarnations = iter("abcdef")
    asked: list[int] = []

    def ask(_c: str, since: int) -> TrackedBatches:
        asked.append(since)
        return answer(incarnation=next(incarnations))  # a new one each time: never agrees

    with pytest.raises(StaleTrackedBatchesError):
        cut_across(["c"], ask, lambda: LSOS, attempts=3)
    assert asked == [EVERYTHING, 0] * 3
    with pytest.raises(InvalidRequestError, match="at least one coordinator"):
        cut_across([], ask, lambda: LSOS)
    with pytest.raises(InvalidRequestError, match="attempts=0 must be >= 1"):
        cut_across(["c"], ask, lambda: LSOS, attempts=0)
