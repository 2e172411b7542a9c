"""The readers' cut across coordinators (docs/design.md §7, "Several coordinators").

Each coordinator tracks only its own sinks' batches and there is no lock across
coordinators, so a reader combines their answers with the partitions' LSOs itself:

1. it asks every coordinator for its :class:`TrackedBatches` of the topic (``since`` =
   :data:`EVERYTHING`): the batches it tracks now, the ones it stopped tracking that its
   ring of recently dropped batches still holds, and its generation ``g`` (the count of
   batches it ever dropped);
2. it reads each partition's LSO once;
3. it asks every coordinator again, ``since=g``: the batches it tracks now and those it
   dropped after ``g``; an answer from another incarnation (a restart or a failover) or
   one whose ring lost a batch dropped after ``g`` makes the reader start over;
4. it cuts the LSOs with the union of every answer (:func:`consistent_cut`).

Why no batch slips through. A coordinator tracks a batch before its first marker is
written, and stops only once the batch is settled (below every LSO) and no cut of its own
batches can reach it (``txn.coordinator.visibility.still_reachable``). Take a batch Z and the LSO
reads of step 2. If no marker of Z was written before the last of them, each of Z's
partitions had Z's transaction open at its read, so its LSO was at or below Z's rows
there: Z is wholly above the LSOs, and a cut only lowers ends. Otherwise Z was tracked
before step 3's answer. If it was still tracked at step 1's answer, step 1 holds it; if it
was tracked only after step 1, it is still tracked at step 3 (step 3 holds it) or was
dropped after ``g`` (step 3 holds it, or the reader starts over). If it was dropped before
step 1, step 1's ring holds it, or it was evicted from the ring: then it is settled, so
wholly below the LSOs, and only a lowering into it could cut it. One coordinator never
lowers into its own dropped batches (that is what ``still_reachable`` decides); another
coordinator's unsettled batch can, when their transactions interleave. The answer names,
per partition, the highest last offset of every batch evicted from the ring
(``evicted_high``), and :func:`combine` refuses (``StaleTrackedBatchesError``, retriable)
a cut at or below it: whole-or-nothing is kept, at the price of a reader retrying while
more than the ring's size of batches dropped since another coordinator's unsettled
batch began. Every batch left is in the union, and :func:`consistent_cut` keeps each
whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from broker_core.errors import InvalidRequestError, StaleTrackedBatchesError
from broker_core.protocol.coordinator_keys import (
    ALL_LED,
    state_partition_field,
    with_state_partition,
)
from broker_core.protocol.requests import Wire
from broker_core.protocol.wire import Action
from broker_core.protocol.wire import field as _field

# (partition, first offset, last offset) of one batch's rows in one partition of a topic.
Range = tuple[int, int, int]

# How often a cut starts over on StaleTrackedBatchesError before it raises it.
CUT_ATTEMPTS = 3
EVERYTHING = -1  # ``since``: every batch the ring still holds, not only the newer ones


def consistent_cut(ends: Mapping[int, int], batches: Iterable[Sequence[Range]]) -> dict[int, int]:
    """The largest ends ``<=`` ``ends`` that cut no batch in two.

    A batch is whole below the cut when each of its ranges ends below its partition's
    end, and whole above when each starts at or above it; any other batch pulls every
    one of its partitions' ends down to where its rows start there. Ends only go down,
    so this stops after at most one pass per batch.
    """
    cut = dict(ends)
    pending = [list(b) for b in batches if b]
    changed = True
    while changed:
        changed = False
        for ranges in pending:
            inside = [p in cut for p, _, _ in ranges]
            if not all(inside):
                continue  # a partition the reader does not read: nothing to cut there
            below = all(last < cut[p] for p, _, last in ranges)
            above = all(first >= cut[p] for p, first, _ in ranges)
            if below or above:
                continue
            for p, first, _ in ranges:
                if first < cut[p]:
                    cut[p] = first
                    changed = True
    return cut


@dataclass(frozen=True, slots=True)
class TrackedBatchesRequest:
    """A coordinator's batches of ``topic`` readers may have to keep whole, ``since`` a
    generation it answered before (or :data:`EVERYTHING`); the coordinator of
    ``state_partition`` (``ALL_LED``: the broker's only one)."""

    ACTION: ClassVar[Action] = Action.TRACKED_BATCHES
    WIRE: ClassVar[Wire] = Wire(
        body="{topic, since, state_partition?}",
        answer=(
            "{incarnation, generation, evicted_through, evicted_high: {partition: "
            "offset}, batches: [[[partition, first, last], ..], ..]}"
        ),
        note=(
            "one coordinator's part of a readers' cut across coordinators: its "
            "tracked batches, and the dropped ones its ring holds after generation "
            "since, all of them for since = -1; docs/design.md §7, "
            "broker_core/protocol/stable_cut.py"
        ),
    )
    topic: str
    since: int = EVERYTHING
    state_partition: int | None = ALL_LED

    def to_doc(self) -> dict[str, Any]:
        doc = {"topic": self.topic, "since": self.since}
        return with_state_partition(doc, self.state_partition)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> TrackedBatchesRequest:
        what = cls.ACTION.value
        since: int = _field(doc, "since", int, what)
        if since < EVERYTHING:
            raise InvalidRequestError(f"{what}: field 'since' must be >= -1, got {since}")
        return cls(_field(doc, "topic", str, what), since, state_partition_field(doc, what))


@dataclass(frozen=True, slots=True)
class TrackedBatches:
    """One coordinator's answer for one topic.

    ``incarnation`` names the tracker (a new one after every restart or failover);
    ``generation`` counts the batches it dropped so far; ``evicted_through`` is the
    generation of the newest batch its ring no longer holds; ``evicted_high`` the highest
    last offset, per partition, of the batches evicted from the ring; ``batches`` each
    batch's ranges in the topic (tracked now, then the ring's asked for)."""

    incarnation: str
    generation: int
    evicted_through: int
    evicted_high: dict[int, int] = field(default_factory=dict)
    batches: list[list[Range]] = field(default_factory=list)

    def to_doc(self) -> dict[str, Any]:
        return {
            "incarnation": self.incarnation,
            "generation": self.generation,
            "evicted_through": self.evicted_through,
            "evicted_high": {str(p): o for p, o in sorted(self.evicted_high.items())},
            "batches": [[list(r) for r in ranges] for ranges in self.batches],
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> TrackedBatches:
        what = "tracked_batches answer"
        raw_high = _field(doc, "evicted_high", dict, what)
        raw_batches = _field(doc, "batches", list, what)
        try:
            batches = [[(int(p), int(f), int(t)) for p, f, t in b] for b in raw_batches]
            high = {int(p): int(o) for p, o in raw_high.items()}
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"{what}: malformed 'batches' or 'evicted_high'") from exc
        return cls(
            _field(doc, "incarnation", str, what),
            _field(doc, "generation", int, what),
            _field(doc, "evicted_through", int, what),
            high,
            batches,
        )


def combine(
    lsos: Mapping[int, int],
    first: Sequence[TrackedBatches],
    again: Sequence[TrackedBatches],
) -> dict[int, int]:
    """The cut of ``lsos`` (read after every answer of ``first`` and before every answer
    of ``again``, coordinator by coordinator in the same order) that keeps every batch of
    every coordinator whole or out (the module's proof).

    Raises StaleTrackedBatchesError (retriable: ask from step 1 again) when a coordinator
    changed incarnation between its answers, lost a batch dropped since its first answer
    from its ring, or when the cut reaches a batch evicted from a ring; InvalidRequestError
    when the two lists differ in length."""
    if len(first) != len(again):
        raise InvalidRequestError(f"{len(first)} first answers but {len(again)} second ones")
    for i, (one, two) in enumerate(zip(first, again, strict=True)):
        if two.incarnation != one.incarnation:
            raise StaleTrackedBatchesError(
                f"coordinator {i} changed incarnation between the reader's two questions"
            )
        if two.evicted_through > one.generation:
            raise StaleTrackedBatchesError(
                f"coordinator {i} dropped more batches since generation {one.generation} "
                f"than its ring holds (evicted through {two.evicted_through})"
            )
    batches = [b for answer in (*first, *again) for b in answer.batches]
    cut = consistent_cut(lsos, batches)
    for i, one in enumerate(first):
        reached = {p: o for p, o in one.evicted_high.items() if p in cut and cut[p] <= o}
        if reached:
            raise StaleTrackedBatchesError(
                f"the cut reaches batches coordinator {i} no longer holds (partition: "
                f"highest last offset {reached}, cut {cut})"
            )
    return cut


def cut_across(
    coordinators: Sequence[str],
    ask: Callable[[str, int], TrackedBatches],
    read_lsos: Callable[[], Mapping[int, int]],
    attempts: int = CUT_ATTEMPTS,
) -> dict[int, int]:
    """Steps 1 to 4 of the module docstring: ``ask(coordinator, since)`` is one
    coordinator's answer, ``read_lsos()`` each partition's LSO now. The one code path of
    every reader's cut, with one coordinator (``VisibilityTracker.stable_ends``) or many
    (``BrokerClient.stable_ends_across``).

    Raises InvalidRequestError for no coordinators or ``attempts`` < 1,
    StaleTrackedBatchesError when each of ``attempts`` tries had to start over, and what
    ``ask`` and ``read_lsos`` raise."""
    if not coordinators:
        raise InvalidRequestError("a reader's cut needs at least one coordinator")
    if attempts < 1:
        raise InvalidRequestError(f"attempts={attempts} must be >= 1")
    for attempt in range(attempts):
        first = [ask(c, EVERYTHING) for c in coordinators]
        lsos = read_lsos()
        again = [ask(c, one.generation) for c, one in zip(coordinators, first, strict=True)]
        try:
            return combine(lsos, first, again)
        except StaleTrackedBatchesError:
            if attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")
