"""All-or-nothing visibility of sink batches for read_committed readers.

A sink batch is committed by COMMIT markers written partition by partition, and a
partition's last stable offset (LSO) can also stay behind a batch's rows there while
another writer's transaction is open. Either way a reader stopping at each partition's
LSO could hold part of a batch. :func:`consistent_cut` lowers those ends until every
batch the coordinator still tracks is wholly below them or wholly at or above them
(docs/design.md, "Readers see whole sink batches").

The coordinator tracks a batch from before its first marker until every one of its
ranges is below its partition's LSO; the LSOs and the tracked batches are read under
one lock of the coordinator, so no batch can slip between the two reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

# (partition, first offset, last offset) of one batch's rows in one partition of a topic.
Range = tuple[int, int, int]


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
