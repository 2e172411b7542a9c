"""Readers see a sink batch whole when its offsets interleave with another tracked batch
(docs/design.md §7, "Interleaved batches"), against the real coordinator and LogStore.

Sink B's transaction has rows on P0 before and after sink X's; both write P1 too. A
foreign transaction holds P1's LSO between B's rows and X's there, so once both commit, B
is settled (below every LSO) while X is not (its P1 rows are above P1's LSO): the cut
lowers P0's end to X's first row, which lies inside B's P0 range.
"""

from __future__ import annotations

from pathlib import Path

from broker_core.txn.coordinator.visibility import Range, consistent_cut
from tests.store.test_txn_coordinator import P0, P1, Broker, Producer, start_broker


def payments_ranges(producer: Producer) -> list[Range]:
    return [(p, first, last) for (t, p), (first, last) in producer.offsets.items()]


def whole_or_absent(ends: dict[int, int], ranges: list[Range]) -> bool:
    below = all(last < ends[p] for p, _, last in ranges)
    above = all(first >= ends[p] for p, first, _ in ranges)
    return below or above


def interleave(b: Broker, batch: int, base: int) -> tuple[Producer, Producer, Producer]:
    """B's rows on P0 around X's, a foreign transaction on P1 between B's rows and X's.
    Both sinks committed; returns (B, X, foreign), foreign still open."""
    sink_b = Producer(b, "b/0").init_sink(batch)
    sink_x = Producer(b, "x/0").init_sink(batch)
    sink_b.send(P0, range(base, base + 5))
    sink_x.send(P0, range(base + 5, base + 10))
    sink_b.append(P0, range(base + 10, base + 15))
    sink_b.send(P1, range(base + 20, base + 25))
    foreign = Producer(b, f"foreign-{batch}").init()
    foreign.send(P1, range(base + 25, base + 26))
    sink_x.send(P1, range(base + 30, base + 35))
    sink_b.prepare()
    sink_x.prepare()
    assert b.coordinator.commit_sink_batch("b", batch, [sink_b.txn]) is True
    assert b.coordinator.commit_sink_batch("x", batch, [sink_x.txn]) is True
    return sink_b, sink_x, foreign


def test_a_settled_batch_interleaved_with_an_unsettled_one_is_seen_whole(
    tmp_path: Path,
) -> None:
    b = start_broker(tmp_path)
    sink_b, sink_x, foreign = interleave(b, 0, 0)
    lso = {p: b.store.partition("payments", p).last_stable_offset for p in (0, 1)}
    rb, rx = payments_ranges(sink_b), payments_ranges(sink_x)
    # The bad moment happened: B is below every LSO (settled), X is not.
    assert all(last < lso[p] for p, _, last in rb)
    assert not all(last < lso[p] for p, _, last in rx)
    # B stays tracked (retained), not only in the ring of dropped batches.
    assert b.coordinator.describe()["sink_batches_tracked"] == 2
    ends = b.coordinator.stable_ends("payments")
    assert ends[0] <= sink_x.offsets[P0][0]  # X pulls P0 below its rows there...
    assert whole_or_absent(ends, rx)
    assert whole_or_absent(ends, rb), (ends, rb)  # ...and B goes with it: whole or not at all

    # The durable side: a restart rebuilds B's tracking too (it over-tracks until the
    # markers report the LSOs again, which changes no cut: B is below every end).
    b.crash()
    b = start_broker(tmp_path, coordinator_epoch=1)
    foreign.broker = b
    ends = b.coordinator.stable_ends("payments")
    assert whole_or_absent(ends, rx) and whole_or_absent(ends, rb), (ends, rb, rx)

    foreign.abort()  # P1's LSO passes X: nothing left to hold B
    ends = b.coordinator.stable_ends("payments")
    assert ends == {p: b.store.partition("payments", p).log_end_offset for p in (0, 1)}
    # The loaded batches wait for markers on their partitions to report the LSOs: the
    # next batch's markers on P0 and P1 let both go.
    later = Producer(b, "b/0").init_sink(1)
    later.send(P0, range(100, 105))
    later.send(P1, range(200, 205))
    later.prepare()
    assert b.coordinator.commit_sink_batch("b", 1, [later.txn]) is True
    assert b.coordinator.describe()["sink_batches_tracked"] == 0
    assert b.state.load_sink_batches() == []


def test_batches_retained_behind_a_long_hold_stay_bounded(tmp_path: Path) -> None:
    """X stays unsettled while a foreign transaction holds P1; 40 later batches of sink B
    on P0 alone settle at once but lie above X's first row on P0, so each stays tracked
    (retained) -- with a record of its own, rebuilt by a restart -- and every read keeps
    every batch whole. The retained set is exactly the batches committed during the
    hold, and it empties with the next markers once the hold ends."""
    b = start_broker(tmp_path)
    _, sink_x, hold = interleave(b, 0, 0)
    rx = payments_ranges(sink_x)
    later: list[list[Range]] = []
    for batch in range(1, 41):
        if batch == 21:  # a restart half-way: the in-memory retention is rebuilt
            tracked = b.coordinator.describe()["sink_batches_tracked"]
            b.crash()
            b = start_broker(tmp_path, coordinator_epoch=1)
            hold.broker = b
            assert b.coordinator.describe()["sink_batches_tracked"] == tracked
        task = Producer(b, "b/0").init_sink(batch)
        task.send(P0, range(batch * 100, batch * 100 + 5))
        task.prepare()
        assert b.coordinator.commit_sink_batch("b", batch, [task.txn]) is True
        later.append(payments_ranges(task))
        assert all(last < b.store.partition(*P0).last_stable_offset for _, _, last in later[-1])
        ends = b.coordinator.stable_ends("payments")
        assert ends[0] <= sink_x.offsets[P0][0]  # X still pulls P0 down
        for ranges in [rx, *later]:
            assert whole_or_absent(ends, ranges), (batch, ends, ranges)
        # Bounded by what committed during the hold: X, B's first batch, and these.
        assert b.coordinator.describe()["sink_batches_tracked"] == 2 + batch
    # Durable: every retained batch of sink b but its last has a record of its own.
    assert len([r for r in b.state.load_sink_batches() if r.sink_id == "b"]) == 40
    hold.abort()
    done = Producer(b, "b/0").init_sink(41)
    done.send(P0, range(9000, 9005))
    done.send(P1, range(9100, 9105))
    done.prepare()
    assert b.coordinator.commit_sink_batch("b", 41, [done.txn]) is True
    assert b.coordinator.describe()["sink_batches_tracked"] == 0
    assert b.state.load_sink_batches() == []
    ends = b.coordinator.stable_ends("payments")
    assert ends == {p: b.store.partition("payments", p).log_end_offset for p in (0, 1)}
    assert consistent_cut(ends, [rx, *later]) == ends
