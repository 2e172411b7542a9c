"""``minPartitions`` / ``maxRecordsPerPartition``: a log partition read by several Spark
tasks, through real Spark (``local[2]``) and a real embedded broker.

The topic holds, in each of its 2 partitions, batches of 10 rows from two transactional
producers whose transactions interleave: committed ones and an aborted one, each spanning
several batches, each closed by a marker. The split is forced small, so the sub-range
boundaries fall inside batches, inside the committed and the aborted transactions and on
markers, and some sub-ranges hold no readable row at all; each test first asserts that
the plan did that, from the broker's own view of the log (read_uncommitted), then that
every committed row was read exactly once, in offset order per log partition, and no
aborted row was.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from broker_core.client.broker_client import BrokerClient
from broker_core.producer import Producer
from spark_sink import local_session
from spark_sink.embedded import ensure_broker, stop_broker
from spark_sink.options import OFFSET_COLUMN, PARTITION_COLUMN, Scope, parse_options
from spark_sink.read_split import OffsetRangePartition
from spark_sink.reader import IdemlogBatchReader, IdemlogStreamReader
from spark_sink.schema import normalise
from spark_sink.topics import require

TOPIC = "split"
SCHEMA = normalise(pa.schema([("id", pa.int64()), ("name", pa.string())]))
FAST = {"linger.ms": 1, "retry.backoff.ms": 20}
ABORTED_IDS = range(10_000, 20_000)  # the aborted transaction's rows


@dataclass
class Layout:
    """One log partition as the broker holds it (read_uncommitted): its data batches
    ``(first offset, rows)``, its markers, the transactions' offset spans (first row to
    marker), and the offsets of committed rows."""

    batches: list[tuple[int, int]] = field(default_factory=list)
    markers: set[int] = field(default_factory=set)
    committed_spans: list[tuple[int, int]] = field(default_factory=list)
    aborted_spans: list[tuple[int, int]] = field(default_factory=list)
    committed_offsets: set[int] = field(default_factory=set)


@dataclass
class Written:
    committed_ids: set[int]
    layouts: dict[int, Layout]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = str(tmp_path_factory.mktemp("store"))
    yield path
    stop_broker(path)


@pytest.fixture(scope="module")
def spark(store: str) -> Iterator[SparkSession]:
    session = local_session("idemlog-read-split-tests", cores=2, max_failures=1, quiet=True)
    yield session
    session.stop()


def _rows(first: int) -> pa.Table:
    ids = np.arange(first, first + 10, dtype=np.int64)
    return pa.table({"id": ids, "name": [f"n{i}" for i in ids]}, schema=SCHEMA)


def _send(producer: Producer, first: int) -> None:
    """One batch of 10 rows (flushed alone, so batches are not merged); sends rotate over
    the partitions."""
    future = producer.send(TOPIC, _rows(first))
    producer.flush()
    future.result(10)


def _layout(client: BrokerClient, partition: int, committed_ids: set[int]) -> Layout:
    layout = Layout()
    end = client.list_offsets(TOPIC, partition)["log_end_offset"]
    covered: set[int] = set()
    spans: dict[str, list[int]] = {}
    for meta, batch in client.fetch(TOPIC, partition, 0, isolation="read_uncommitted"):
        layout.batches.append((meta.base_offset, batch.num_rows))
        offsets = range(meta.base_offset, meta.base_offset + batch.num_rows)
        covered.update(offsets)
        ids = batch.column("id").to_pylist()
        for offset, i in zip(offsets, ids, strict=True):
            if i in committed_ids:
                layout.committed_offsets.add(offset)
        kind = "aborted" if ids[0] in ABORTED_IDS else f"committed-{ids[0] // 1000}"
        spans.setdefault(kind, []).append(meta.base_offset)
    layout.markers = set(range(end)) - covered
    for kind, firsts in spans.items():
        # A transaction's span: its first row to the first marker after its last batch.
        marker = min(m for m in layout.markers if m > max(firsts))
        (layout.aborted_spans if kind == "aborted" else layout.committed_spans).append(
            (min(firsts), marker)
        )
    return layout


@pytest.fixture(scope="module")
def written(store: str) -> Written:
    """Two producers, their transactions interleaved in both partitions: A's first
    (committed) around B's (aborted), then A's second (committed)."""
    address = ensure_broker(store)
    committed: set[int] = set()
    with BrokerClient(address) as client:
        client.create_topic(TOPIC, 2, schema=SCHEMA)
        with (
            Producer(address, transactional_id="split-a", **FAST) as a,
            Producer(address, transactional_id="split-b", **FAST) as b,
        ):
            a.init_transactions()
            b.init_transactions()
            a.begin_transaction()
            b.begin_transaction()
            for i in range(4):
                _send(a, i * 10)
                _send(b, ABORTED_IDS.start + i * 10)
            for i in range(4, 8):
                _send(a, i * 10)
            a.commit_transaction()
            b.abort_transaction()
            committed.update(range(80))
            a.begin_transaction()
            for i in range(100, 106):
                _send(a, i * 10)
            a.commit_transaction()
            committed.update(range(1000, 1060))
        layouts = {p: _layout(client, p, committed) for p in (0, 1)}
    return Written(committed, layouts)


def _plan(store: str, **options: str) -> list[OffsetRangePartition]:
    opts = parse_options({"topic": TOPIC, "path": store, **options}, Scope.READ)
    with BrokerClient(ensure_broker(store)) as client:
        return IdemlogBatchReader(opts, require(client, opts)).partitions()


CUTS = ("inside a batch", "inside a committed txn", "inside the aborted txn")
ALL_CUTS = (*CUTS, "at a marker", "a sub-range without a committed row")


def _cuts(plan: list[OffsetRangePartition], w: Written) -> dict[str, int]:
    """Where the plan's sub-range boundaries fell in the log, counted (the scenario
    happened only if the cuts a test needs are there)."""
    found = dict.fromkeys(ALL_CUTS, 0)
    for p, layout in w.layouts.items():
        pieces = [r for r in plan if r.partition == p]
        assert len(pieces) > 1, f"partition {p} was not split"
        for r in pieces:
            found[ALL_CUTS[4]] += not any(
                o in layout.committed_offsets for o in range(r.start, r.end)
            )
        for cut in (r.start for r in pieces[1:]):
            found[ALL_CUTS[0]] += any(first < cut < first + n for first, n in layout.batches)
            found[ALL_CUTS[1]] += any(s < cut <= m for s, m in layout.committed_spans)
            found[ALL_CUTS[2]] += any(s < cut <= m for s, m in layout.aborted_spans)
            found[ALL_CUTS[3]] += cut in layout.markers
    return found


def _assert_read_once_in_order(table: pa.Table, w: Written) -> None:
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "a row read twice"
    assert set(ids) == w.committed_ids, "rows missing, or aborted rows read"
    assert table.column("name").to_pylist() == [f"n{i}" for i in ids]
    partitions = table.column(PARTITION_COLUMN).to_pylist()
    offsets = table.column(OFFSET_COLUMN).to_pylist()
    for p in (0, 1):
        mine = [o for q, o in zip(partitions, offsets, strict=True) if q == p]
        assert mine == sorted(mine), f"partition {p}'s rows out of offset order"
        assert set(mine) == w.layouts[p].committed_offsets


@pytest.mark.parametrize(
    ("options", "cuts"),
    [
        ({"maxRecordsPerPartition": "3"}, ALL_CUTS),
        ({"maxRecordsPerPartition": "7"}, (*CUTS, ALL_CUTS[4])),
        ({"minPartitions": "24"}, CUTS),
        ({"minPartitions": "9", "maxRecordsPerPartition": "40"}, CUTS),
    ],
    ids=["max3", "max7", "min24", "min9+max40"],
)
def test_a_split_read_returns_every_committed_row_once_in_order(
    spark: SparkSession,
    store: str,
    written: Written,
    options: dict[str, str],
    cuts: tuple[str, ...],
) -> None:
    plan = _plan(store, **options)
    assert len(plan) > 2  # more tasks than log partitions
    found = _cuts(plan, written)
    assert all(found[c] for c in cuts), found
    reader = spark.read.format("idemlog").option("topic", TOPIC).option("path", store)
    df = reader.option("includeMetadata", "true").options(**options).load()
    assert df.rdd.getNumPartitions() == len(plan)  # Spark runs one task per sub-range
    _assert_read_once_in_order(df.toArrow(), written)


def test_an_unsplit_read_is_one_task_per_log_partition(
    spark: SparkSession, store: str, written: Written
) -> None:
    plan = _plan(store)
    assert [(r.partition, r.start) for r in plan] == [(0, 0), (1, 0)]
    df = (
        spark.read.format("idemlog")
        .option("topic", TOPIC)
        .option("path", store)
        .option("includeMetadata", "true")
        .load()
    )
    assert df.rdd.getNumPartitions() == 2
    _assert_read_once_in_order(df.toArrow(), written)


def test_a_split_stream_reads_every_committed_row_once_in_order(
    spark: SparkSession, store: str, written: Written, tmp_path: Path
) -> None:
    options = {"minPartitions": "6", "maxOffsetsPerTrigger": "40"}
    # The micro-batches' plan, as Spark asks for it: each split below its end.
    opts = parse_options({"topic": TOPIC, "path": store, **options}, Scope.READ)
    with BrokerClient(ensure_broker(store)) as client:
        stream = IdemlogStreamReader(opts, require(client, opts))
        start, pieces = stream.initialOffset(), []
        while (end := stream.latestOffset(start, stream.getDefaultReadLimit())) != start:
            planned = stream.partitions(start, end)
            assert len(planned) > len([k for k in end if end[k] > start.get(k, 0)])
            for p, group in itertools.groupby(planned, key=lambda r: r.partition):
                ranges = list(group)
                assert ranges[0].start == start[str(p)] and ranges[-1].end == end[str(p)]
            pieces += planned
            start = end
    found = _cuts(pieces, written)
    assert all(found[c] for c in CUTS), found
    query = (
        spark.readStream.format("idemlog")
        .option("topic", TOPIC)
        .option("path", store)
        .option("includeMetadata", "true")
        .options(**options)
        .load()
        .writeStream.format("memory")
        .queryName("split_stream")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        query.processAllAvailable()
        batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    finally:
        query.stop()
    assert len(batches) >= 3  # maxOffsetsPerTrigger cut the log into micro-batches
    _assert_read_once_in_order(spark.table("split_stream").toArrow(), written)
