"""The readers' cut across several coordinators (docs/design.md §7, "Several
coordinators"; ``broker_core.protocol.stable_cut``), on a real LogStore.

Three VisibilityTrackers stand for three coordinators, each tracking its own sinks'
batches; transactions write rows into shared partitions in a seeded random interleaving
(sinks' batches of every coordinator and foreign transactions that hold partitions and
then abort), markers are written partition by partition and their LSOs reported to the
writing coordinator only, as markers do. Readers run ``cut_across`` with events happening
between each of its questions and LSO reads. Every read must see every batch whole or not
at all.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker_core.errors import StaleTrackedBatchesError
from broker_core.log.store import LogStore
from broker_core.protocol.stable_cut import TrackedBatches, combine, consistent_cut, cut_across
from broker_core.txn.coordinator.markers import LocalMarkerWriter, ProducerMarkers
from broker_core.txn.coordinator.visibility import VisibilityTracker
from tests.store.helpers import SCHEMA, rows

TOPIC = "t"
PARTITIONS = 3
COORDINATORS = ["c0", "c1", "c2"]


class Lsos:
    def __init__(self, store: LogStore) -> None:
        self.store = store

    def last_stable_offsets(self, topic: str) -> dict[int, int]:
        return {p: self.store.partition(topic, p).last_stable_offset for p in range(PARTITIONS)}


@dataclass
class Txn:
    pid: int
    coordinator: str
    partitions: list[int]
    sink: bool
    rows: dict[int, list[int]] = field(default_factory=dict)  # partition -> offsets
    decided: bool = False
    unmarked: list[int] = field(default_factory=list)

    def ranges(self) -> list[tuple[str, int, int, int]]:
        return [(TOPIC, p, min(o), max(o)) for p, o in sorted(self.rows.items())]


class World:
    """The partitions, the coordinators' trackers, and the transactions in flight."""

    def __init__(self, path: Path, rng: random.Random, ring_size: int) -> None:
        self.store = LogStore(path)
        self.store.create_topic(TOPIC, PARTITIONS, schema=SCHEMA)
        self.rng = rng
        self.markers = LocalMarkerWriter(self.store)
        self.trackers = {c: VisibilityTracker(Lsos(self.store), ring_size) for c in COORDINATORS}
        self.open: list[Txn] = []
        self.batches: list[Txn] = []  # every sink batch ever begun
        self.next_pid = 1000
        self.sequences: dict[tuple[int, int], int] = {}

    def begin(self) -> None:
        sink = self.rng.random() < 0.8
        k = self.rng.randint(2, PARTITIONS) if sink else 1
        txn = Txn(
            self.next_pid,
            self.rng.choice(COORDINATORS),
            self.rng.sample(range(PARTITIONS), k),
            sink,
        )
        self.next_pid += 1
        self.open.append(txn)
        if sink:
            self.batches.append(txn)

    def write(self, txn: Txn) -> None:
        p = self.rng.choice(txn.partitions)
        seq = self.sequences.get((txn.pid, p), 0)
        result = self.store.partition(TOPIC, p).append(
            rows(1, txn.pid * 1000 + seq),
            producer_id=txn.pid,
            producer_epoch=0,
            base_sequence=seq,
            transactional=True,
        )
        self.sequences[(txn.pid, p)] = seq + 1
        txn.rows.setdefault(p, []).append(result.base_offset)

    def mark(self, txn: Txn, p: int, commit: bool, reported_to: str) -> None:
        markers = [ProducerMarkers(txn.pid, 0, ((TOPIC, p),))]
        lsos = self.markers.write_markers(markers, commit, 0)
        self.trackers[reported_to].settled_by(lsos)

    def step(self) -> None:
        """One random event."""
        undecided = [t for t in self.open if not t.decided]
        deciding = [t for t in undecided if len(t.rows) == len(t.partitions)]
        marking = [t for t in self.open if t.decided]
        choice = self.rng.random()
        if (choice < 0.15 and len(undecided) < 6) or not self.open:
            self.begin()
        elif choice < 0.55 and undecided:
            self.write(self.rng.choice(undecided))
        elif choice < 0.7 and deciding:
            txn = self.rng.choice(deciding)
            txn.decided = True
            txn.unmarked = list(txn.rows)
            if txn.sink:  # tracked before its first marker, as the coordinator does
                key = (f"sink-{txn.pid}", 0)
                self.trackers[txn.coordinator].track(key, txn.ranges(), recorded=False)
        elif marking:
            txn = self.rng.choice(marking)
            p = txn.unmarked.pop(self.rng.randrange(len(txn.unmarked)))
            reported = txn.coordinator if txn.sink else self.rng.choice(COORDINATORS)
            self.mark(txn, p, commit=txn.sink, reported_to=reported)
            if not txn.unmarked:
                self.open.remove(txn)

    def settle_all(self) -> None:
        while self.open:
            txn = self.open[0]
            while len(txn.rows) < len(txn.partitions):
                self.write(txn)
            if not txn.decided:
                txn.decided = True
                txn.unmarked = list(txn.rows)
                if txn.sink:
                    key = (f"sink-{txn.pid}", 0)
                    self.trackers[txn.coordinator].track(key, txn.ranges(), recorded=False)
            for p in list(txn.unmarked):
                self.mark(txn, p, txn.sink, txn.coordinator)
            txn.unmarked.clear()
            self.open.remove(txn)


def read(world: World) -> tuple[dict[int, int], dict[int, int]]:
    """One reader's cut with events between every question and every LSO read; returns
    (cut, the LSOs it read)."""
    lsos: dict[int, int] = {}

    def ask(c: str, since: int) -> TrackedBatches:
        for _ in range(world.rng.randint(0, 3)):
            world.step()
        return world.trackers[c].tracked_batches(TOPIC, since)

    def read_lsos() -> dict[int, int]:
        lsos.clear()
        for p in world.rng.sample(range(PARTITIONS), PARTITIONS):
            for _ in range(world.rng.randint(0, 2)):
                world.step()
            lsos[p] = world.store.partition(TOPIC, p).last_stable_offset
        return dict(lsos)

    return cut_across(COORDINATORS, ask, read_lsos, attempts=1), dict(lsos)


def partial(cut: dict[int, int], batch: Txn) -> bool:
    seen = [o < cut[p] for p, offsets in batch.rows.items() for o in offsets]
    return any(seen) and not all(seen)


@pytest.mark.parametrize(
    ("seed", "ring_size"), [(1, 1024), (2, 1024), (3, 1024), (4, 2), (5, 2), (6, 1)]
)
def test_every_read_across_coordinators_sees_every_batch_whole(
    tmp_path: Path, seed: int, ring_size: int
) -> None:
    rng = random.Random(seed)
    world = World(tmp_path, rng, ring_size)
    reads: list[tuple[dict[int, int], dict[int, int]]] = []
    stale = 0
    for _ in range(300):
        for _ in range(rng.randint(0, 4)):
            world.step()
        try:
            reads.append(read(world))
        except StaleTrackedBatchesError:
            stale += 1  # the reader starts over: nothing partial was returned
    world.settle_all()
    # Judged once every batch's rows are known (rows written after a read lie above it).
    for cut, lsos in reads:
        assert all(cut[p] <= lsos[p] for p in cut)
        broken = [b.pid for b in world.batches if partial(cut, b)]
        assert not broken, (seed, cut, lsos, broken)
    # The scenario happened: batches of every coordinator, reads held below the LSOs,
    # and most reads answered.
    assert {b.coordinator for b in world.batches} == set(COORDINATORS)
    assert len(world.batches) > 50
    held = sum(1 for cut, lsos in reads if cut != lsos)
    assert held > 20, held
    assert stale + len(reads) == 300
    if ring_size > len(world.batches):
        assert stale == 0  # nothing evicted: every read answers at once
    else:
        # A tiny ring: batches dropped faster than it holds them; readers start over
        # rather than see a part, and still answer often.
        assert stale > 0 and len(reads) > 50, (stale, len(reads))
    # The LSOs alone would have shown part of a batch in some reads.
    assert any(any(partial(lsos, b) for b in world.batches) for _, lsos in reads)


def test_the_union_without_second_answers_would_miss_a_batch(tmp_path: Path) -> None:
    """Why the second question: a batch tracked after a coordinator's first answer and
    committed on one partition before the LSO reads is in no first answer."""
    world = World(tmp_path, random.Random(0), 1024)
    tracker = world.trackers["c0"]
    first = tracker.tracked_batches(TOPIC)
    txn = Txn(1, "c0", [0, 1], sink=True)
    world.write(txn)
    world.write(txn)
    while len(txn.rows) < 2:
        world.write(txn)
    tracker.track(("s", 0), txn.ranges(), recorded=False)
    world.mark(txn, 0, True, "c0")  # committed on partition 0 only
    lsos = Lsos(world.store).last_stable_offsets(TOPIC)
    assert partial(lsos, txn)
    cut = combine(lsos, [first], [tracker.tracked_batches(TOPIC, first.generation)])
    assert not partial(cut, txn)
    assert partial(consistent_cut(lsos, first.batches), txn)  # the first answers alone
