"""A marker writer answers each partition's last stable offset just after its marker."""

from __future__ import annotations

from pathlib import Path

from broker_core.log.store import LogStore
from broker_core.txn.coordinator import LocalMarkerWriter
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
    stable = writer.write_markers(B, 0, True, 0, [("t", 0), ("t", 1), ("t", 5), ("gone", 0)])
    assert stable == {("t", 0): 0, ("t", 1): 3}  # unknown topic / partition: left out
    assert stable[("t", 1)] == store.partition("t", 1).high_watermark
    assert store.partition("t", 0).log_end_offset == 5  # B's marker at 4

    # A ends: nothing is open any more, the LSO is the high watermark after A's marker.
    stable = writer.write_markers(A, 0, False, 0, [("t", 0)])
    t0 = store.partition("t", 0)
    assert stable == {("t", 0): 6} and t0.high_watermark == 6
    assert read_ids(t0) == [10, 11]

    # Writing the same marker again (a coordinator retrying) still answers the LSO.
    assert writer.write_markers(A, 0, False, 0, [("t", 0)]) == {("t", 0): 7}
    assert writer.write_markers(A, 0, False, 0, []) == {}
    store.close()
