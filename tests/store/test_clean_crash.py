"""A crash during a cleaning pass (a real child process SIGKILLed at each step of the
segment swap, tests/store/clean_crash_child.py) recovers to a consistent log: every
segment is either the old one or the cleaned one, no row changes offset or value, the
newest value of every key survives, and an idempotent retry is still a duplicate."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from broker_core.log.partition_log import PartitionLog
from broker_core.log.store import LogStore
from broker_core.log.swap import CLEANING_DIR, SWAP_SUFFIX
from broker_core.record.batch import ControlType
from tests.store.clean_crash_child import CONFIG, TOPIC

REPO = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([("kind", pa.string()), ("key", pa.int32()), ("value", pa.int64())])
NOW = 10**13  # far past every batch: no lag or retention holds anything back
PID = 4242

Row = tuple[str, int, int | None]
Retry = tuple[int, pa.RecordBatch, int, int]  # sequence, rows, first and last offset
Template = tuple[Path, Path, Retry]


def batch(rows: list[Row]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"kind": k, "key": key, "value": v} for k, key, v in rows], schema=SCHEMA
    )


def build(data_dir: Path) -> Retry:
    """A compacted log of several segments: overwritten keys, tombstones, a committed and
    an aborted transaction, an idempotent producer. Returns its last batch's retry."""
    store = LogStore(data_dir)
    store.create_topic(TOPIC, 1, schema=SCHEMA, config=CONFIG)
    log = store.partition(TOPIC, 0)
    seq = txn_seq = 0
    last: Retry | None = None
    for i in range(40):
        rows: list[Row] = [("a", (i * 3 + j) % 9, i * 10 + j) for j in range(4)]
        if i % 7 == 3:
            rows.append(("b", i % 4, None))  # a tombstone
        if i % 5 == 0:
            log.append(
                batch(rows),
                producer_id=900,
                producer_epoch=0,
                base_sequence=txn_seq,
                transactional=True,
            )
            txn_seq += len(rows)
            log.write_marker(900, 0, ControlType.ABORT if i % 10 == 0 else ControlType.COMMIT)
        else:
            b = batch(rows)
            r = log.append(b, producer_id=PID, producer_epoch=0, base_sequence=seq)
            last = (seq, b, r.base_offset, r.last_offset)
            seq += len(rows)
        log.append(batch([("b", i % 4, i)]))
    log.roll()
    log.append(batch([("c", 0, 0)]))
    store.close()
    assert last is not None
    return last


def rows_by_offset(log: PartitionLog) -> dict[int, Row]:
    out: dict[int, Row] = {}
    for seg in log.segments:
        for stored in seg.batches():
            if stored.header.is_control:
                continue
            result = log.read(stored.header.base_offset, isolation="read_uncommitted", max_bytes=1)
            for i, row in enumerate(result.batches[0].records.to_pylist()):
                out[stored.header.base_offset + i] = (row["kind"], row["key"], row["value"])
    return out


def segment_offsets(log: PartitionLog) -> dict[int, tuple[list[int], list[object]]]:
    """Per segment base offset: the offset of every batch in it (markers included) and
    its aborted-transaction index, which must match its log."""
    return {
        seg.base_offset: (
            [s.header.base_offset for s in seg.batches()],
            list(seg.txn_index.entries),
        )
        for seg in log.segments
    }


def committed_offsets(log: PartitionLog) -> set[int]:
    out: set[int] = set()
    offset = log.log_start_offset
    while True:
        result = log.read(offset, max_bytes=1 << 20)
        for b in result.batches:
            out.update(range(b.base_offset, b.base_offset + b.records.num_rows))
        if result.next_offset == offset:
            return out
        offset = result.next_offset


def view(log: PartitionLog) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    offset = log.log_start_offset
    while True:
        result = log.read(offset, max_bytes=1 << 20)
        for b in result.batches:
            for row in b.records.to_pylist():
                if row["value"] is None:
                    out.pop((row["kind"], row["key"]), None)
                else:
                    out[(row["kind"], row["key"])] = row["value"]
        if result.next_offset == offset:
            return out
        offset = result.next_offset


FAILPOINTS = [
    ("before-install", 0),
    ("after-snapshots", 0),
    *[("rename", n) for n in (1, 2, 3, 4, 5, 6, 8, 11)],
    ("fsync", 1),
    ("fsync", 2),
    ("fsync", 3),
    ("checkpoint", 0),
]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    """The log before cleaning, and a copy cleaned to completion in-process."""
    base = tmp_path_factory.mktemp("clean-crash")
    before = base / "before"
    retry = build(before)
    after = base / "after"
    shutil.copytree(before, after)
    store = LogStore(after)
    result = store.partition(TOPIC, 0).clean(NOW, force=True)
    assert result is not None and result.removed_rows > 0 and result.removed_markers > 0
    store.close()
    return before, after, retry


@pytest.mark.parametrize(("failpoint", "n"), FAILPOINTS, ids=lambda v: str(v))
def test_a_crash_during_cleaning_leaves_the_old_or_the_new_segment(
    tmp_path: Path,
    template: Template,
    failpoint: str,
    n: int,
) -> None:
    before, after, (seq, retry_batch, first, last) = template
    data_dir = tmp_path / "data"
    shutil.copytree(before, data_dir)
    with LogStore(before) as store:
        old_log = store.partition(TOPIC, 0)
        old_rows, old_segments, old_view = (
            rows_by_offset(old_log),
            segment_offsets(old_log),
            view(old_log),
        )
        old_committed = committed_offsets(old_log)
    with LogStore(after) as store:
        new_segments = segment_offsets(store.partition(TOPIC, 0))
        new_committed = committed_offsets(store.partition(TOPIC, 0))

    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.store.clean_crash_child",
            str(data_dir),
            str(NOW),
            failpoint,
            str(n),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # The fault fired: killed by its own SIGKILL after the pass began, never finished.
    assert child.returncode == -signal.SIGKILL, (child.returncode, child.stdout, child.stderr)
    assert "CLEANING" in child.stdout and "DONE" not in child.stdout

    store = LogStore(data_dir)
    log = store.partition(TOPIC, 0)
    part = data_dir / TOPIC / "0"
    assert not (part / CLEANING_DIR).exists()
    assert not list(part.glob(f"*{SWAP_SUFFIX}"))
    for base, offsets in segment_offsets(log).items():
        assert offsets in (old_segments.get(base), new_segments.get(base)), (
            f"segment {base} is neither the old nor the cleaned one"
        )
    for offset, row in rows_by_offset(log).items():
        assert old_rows[offset] == row, f"row at {offset} changed"
    assert view(log) == old_view, "the newest value of some key was lost"
    readable = committed_offsets(log)
    assert readable <= old_committed, "an aborted row became readable read_committed"
    assert new_committed <= readable, "a row the cleaner keeps is not readable"
    assert log.last_stable_offset == log.log_end_offset, "a transaction was left open"
    r = log.append(retry_batch, producer_id=PID, producer_epoch=0, base_sequence=seq)
    assert r.duplicate and (r.base_offset, r.last_offset) == (first, last)
    # And the next pass finishes the job.
    log.clean(NOW, force=True)
    assert segment_offsets(log) == new_segments
    assert view(log) == old_view
    store.close()
