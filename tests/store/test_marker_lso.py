"""A marker writer answers each partition's last stable offset just after its marker."""

from __future__ import annotations

from pathlib import Path

from broker_core.log.store import LogStore
from broker_core.txn.coordinator.coordinator import LocalMarkerWriter
from broker_core.txn.coordinator.markers import ProducerMarkers
from tests.store.helpers import SCHEMA, read_ids, rows

A, B = 7, 8  # producer ids


def begin(store: LogStore, pid: int, partition: int, start: int, n: int = 2) -> None:
    store.partition("t", partition).append(
        rows(n, start), producer_id=pid, producer_epoch=0, base_sequence=0, transactional=True
    )


def test_local_writer_reports_the_lso_after_each_marker(tmp_path: Path) -> None:
    store = LogStore(tmp_path)
    store.create_topic("t", 2, schema=SCHEMA)
    begin(store, A, 0, 0)  # t-0: A at 0-1
    begin(store, B, 0, 10)  # t-0: B at 2-3
    begin(store, B, 1, 20)  # t-1: B at 0-1
    writer = LocalMarkerWriter(store)

    # B ends first: t-0 stays held at A's open transaction, t-1 is stable up to its end.
    b_parts = (("t", 0), ("t", 1), ("t", 5), ("gone", 0))
    stable = writer.write_markers([ProducerMarkers(B, 0, b_parts)], True, 0)
    assert stable == {("t", 0): 0, ("t", 1): 3}  # unknown topic / partition: left out
    assert stable[("t", 1)] == store.partition("t", 1).high_watermark
    assert store.partition("t", 0).log_end_offset == 5  # B's marker at 4

    # A ends: nothing is open any more, the LSO is the high watermark after A's marker.
    stable = writer.write_markers([ProducerMarkers(A, 0, (("t", 0),))], False, 0)
    t0 = store.partition("t", 0)
    assert stable == {("t", 0): 6} and t0.high_watermark == 6
    assert read_ids(t0) == [10, 11]

    # Writing the same marker again (a coordinator retrying) still answers the LSO.
    assert writer.write_markers([ProducerMarkers(A, 0, (("t", 0),))], False, 0) == {("t", 0): 7}
    assert writer.write_markers([ProducerMarkers(A, 0, ())], False, 0) == {}
    assert writer.write_markers([], False, 0) == {}
    store.close()


def test_local_writer_puts_every_producers_markers_of_a_partition_in_one_append(
    tmp_path: Path,
) -> None:
    store = LogStore(tmp_path)
    store.create_topic("t", 2, schema=SCHEMA)
    for pid in (A, B):
        for p in (0, 1):
            begin(store, pid, p, pid * 100 + p * 10)
    writer = LocalMarkerWriter(store)
    parts = (("t", 0), ("t", 1))
    stable = writer.write_markers(
        [ProducerMarkers(A, 0, parts), ProducerMarkers(B, 0, parts)], True, 0
    )
    for p in (0, 1):
        log = store.partition("t", p)
        assert log.marker_appends == 1  # A's and B's marker: one write, one fsync
        assert log.log_end_offset == 6 and stable[("t", p)] == 6  # markers at 4 and 5
        controls = [log.read_control(o) for o in (4, 5)]
        assert [c[0].producer_id for c in controls if c is not None] == [A, B]
        assert sorted(read_ids(log)) == sorted(
            [A * 100 + p * 10 + i for i in range(2)] + [B * 100 + p * 10 + i for i in range(2)]
        )
    store.close()
