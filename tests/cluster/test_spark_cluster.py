"""idemlog on a Spark standalone cluster and a three-broker cluster, each part on a host
of its own (``tests/cluster/conftest.py``): the stream, the batch write and both readers
work the same way as on one machine, every row exactly once in per-key order, read back by
a reader independent of Spark (the broker client) as well as by the sink's own source."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from jobs.verify import verify_exactly_once
from tests.cluster.conftest import Stack
from tests.harness.cluster import read_back, spark_events
from tests.spark.helpers import (
    DriverLauncher,
    assert_succeeded,
    batch_spec,
    make_input,
    stream_spec,
)

FILES, ROWS = 4, 5000


def task_hosts(events: Path) -> set[str]:
    """The hosts Spark's event logs say tasks ran on."""
    return {e["Task Info"]["Host"] for e in spark_events(events, "SparkListenerTaskEnd")}  # type: ignore[index]


def assert_exactly_once(stack: Stack, topic: str, ids: list[int]) -> None:
    with stack.brokers.client() as client:
        table = read_back(client, topic)
    verdict = verify_exactly_once(table, id_column="id", key_column="account", expected_ids=ids)
    assert verdict.ok, verdict.line()
    assert verdict.order_violations == 0


def test_stream_batch_and_both_readers_on_the_cluster(
    stack: Stack, drivers: DriverLauncher, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    ids = make_input(src, FILES, ROWS)
    events = tmp_path / "events"
    stream = stream_spec(src, "", "cl_stream", tmp_path / "ck", FILES)
    run = stack.start(drivers, stack.spec(events, **stream, sink_options={"partitions": "6"}))
    run.wait()
    assert_succeeded(run)
    assert sorted(run.progress_batches()) == list(range(FILES))
    workers = {h.address for h in stack.spark.worker_hosts}
    assert task_hosts(events) == workers, "the stream's tasks ran on both worker hosts"
    assert_exactly_once(stack, "cl_stream", ids)

    batch = batch_spec(src, "", "cl_batch")
    run = stack.start(drivers, stack.spec(tmp_path / "events-batch", **batch))
    run.wait()
    assert_succeeded(run)
    assert_exactly_once(stack, "cl_batch", ids)

    for mode in ("read", "read_stream"):
        out = tmp_path / f"{mode}.out"
        spec = {
            "mode": mode,
            "topic": "cl_stream",
            "out": str(out),
            "checkpoint": str(tmp_path / f"ck-{mode}"),
        }
        run = stack.start(drivers, stack.spec(tmp_path / f"events-{mode}", **spec))
        run.wait()
        assert_succeeded(run)
        table = pq.read_table(out)
        verdict = verify_exactly_once(table, id_column="id", key_column="account", expected_ids=ids)
        assert verdict.ok, f"{mode}: {verdict.line()}"
