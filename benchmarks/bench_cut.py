"""What a reader's cut costs with a full ring of dropped batches (docs/design.md §7).

    python -m benchmarks.bench_cut [--reads 200]

For each partition count and ring size a ``VisibilityTracker`` drops ring + 10 settled
batches (one range per partition each; the ring then holds ``ring`` of them) and tracks
5 unsettled ones; the table shows the JSON size of one ``tracked_batches`` answer (what
a coordinator sends a reader of ``stable_ends_across``) and the mean time of
``stable_ends`` (two questions, the LSOs, the combination; ms, this machine). A tracker
with nothing dropped is the baseline. A second table: the cost of one ``settled_by``
(every marker write calls it) with one unsettled batch and N retained ones.
"""

from __future__ import annotations

import argparse
import json
import time

from broker_core.txn.coordinator.visibility import DROPPED_RING, VisibilityTracker


class FarLsos:
    def __init__(self, partitions: int) -> None:
        self.partitions = partitions

    def last_stable_offsets(self, topic: str) -> dict[int, int]:
        return dict.fromkeys(range(self.partitions), 10**12)


def measure(partitions: int, ring: int, dropped: int, reads: int) -> tuple[int, int, float]:
    tracker = VisibilityTracker(FarLsos(partitions), ring)
    offset = 0
    for batch in range(dropped):
        ranges = [("t", p, offset + p, offset + p + 10) for p in range(partitions)]
        offset += 20
        tracker.track(("sink", batch), ranges, recorded=False)
        tracker.settled_by({("t", p): offset + 100 for p in range(partitions)})
    for batch in range(5):
        held = [("t", p, offset + p, offset + p) for p in range(partitions)]
        tracker.track(("held", batch), held, recorded=False)
    size = len(json.dumps(tracker.tracked_batches("t").to_doc()))
    start = time.perf_counter()
    for _ in range(reads):
        tracker.stable_ends("t")
    return size, tracker.count(), (time.perf_counter() - start) / reads * 1000


def settle_cost(partitions: int, retained: int, calls: int) -> tuple[int, float]:
    """One batch unsettled (its last partition held), ``retained`` settled batches above
    its first rows: ms per ``settled_by`` (what every marker write calls)."""
    tracker = VisibilityTracker(FarLsos(partitions))
    unsettled = [("t", p, 0, 5) for p in range(partitions)]
    tracker.track(("held", 0), unsettled, recorded=False)
    reached = {("t", p): 10 for p in range(partitions - 1)}  # not the last partition
    tracker.settled_by(reached)
    offset = 10
    for batch in range(retained):
        ranges = [("t", p, offset, offset + 5) for p in range(partitions - 1)]
        offset += 10
        tracker.track(("sink", batch), ranges, recorded=False)
    lsos = {("t", p): offset for p in range(partitions - 1)}
    start = time.perf_counter()
    for _ in range(calls):
        tracker.settled_by(lsos)
    return tracker.count(), (time.perf_counter() - start) / calls * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=200, help="stable_ends calls per row")
    args = parser.parse_args()
    print(f"DROPPED_RING={DROPPED_RING}")
    print(f"{'partitions':>10} {'ring':>5} {'dropped':>7} {'tracked':>7} {'answer_B':>9} {'ms':>6}")
    for partitions in (2, 16):
        for ring, dropped in ((DROPPED_RING, 0), (DROPPED_RING, DROPPED_RING + 10), (1024, 1034)):
            size, tracked, ms = measure(partitions, ring, dropped, args.reads)
            print(f"{partitions:>10} {ring:>5} {dropped:>7} {tracked:>7} {size:>9} {ms:>6.2f}")
    print()
    print(f"{'partitions':>10} {'retained':>8} {'tracked':>7} {'settled_by_ms':>13}")
    for partitions in (2, 16):
        for retained in (100, 1000, 10000):
            tracked, ms = settle_cost(partitions, retained, max(1, args.reads // 20))
            print(f"{partitions:>10} {retained:>8} {tracked:>7} {ms:>13.2f}")


if __name__ == "__main__":
    main()
