"""A read task whose fetch stream breaks mid-fetch: three real brokers on ZooKeeper, the
partition's leader SIGKILLed while the task's one fetch (48 MB) is still being sent.

The Spark source's batch reader is driven as an executor drives it (``read`` on the
planned range, no JVM). Undisturbed, the range is read in one fetch. Then the task takes
one batch (its receiver thread reads ahead at most 16 MiB, so most of the fetch is
unsent) and the leader is killed: the stream breaks, and the reader fetches again from
the first offset it had not yielded, trying again while the election runs
(``FETCH_FAILOVER_S``), from the new leader; every row arrives exactly once, in offset
order.
"""

from __future__ import annotations

import signal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import spark_sink.reader as reader_module
from broker_core.client.broker_client import BrokerClient
from spark_sink.options import OFFSET_COLUMN, Scope, parse_options
from spark_sink.read_prefetch import PREFETCH_MAX_BYTES
from spark_sink.reader import IdemlogBatchReader
from spark_sink.topics import require
from testkit.zookeeper import ZooKeeperHarness
from tests.harness.broker import BrokerFactory
from tests.harness.replicated import ReplicatedCluster

SCHEMA = pa.schema([("id", pa.int64()), ("pad", pa.string())])
ROWS_PER_BATCH = 200
PAD = "x" * 1000  # about 200 kB a batch (the test brokers' max.request.bytes is 256 kB)
BATCHES = 240  # about 48 MB: one fetch (50 MB at most), three times the read-ahead bound


def test_a_fetch_broken_by_a_leader_kill_is_read_on_from_the_new_leader(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = ReplicatedCluster(zk_chroot, broker_factory)
    cluster.create_topic("big", 1, replication_factor=3)
    with cluster.client.produce_stream("big", 0, SCHEMA) as stream:  # acks=all
        sent = []
        for b in range(BATCHES):
            ids = np.arange(b * ROWS_PER_BATCH, (b + 1) * ROWS_PER_BATCH, dtype=np.int64)
            rows = pa.RecordBatch.from_arrays(
                [pa.array(ids), pa.array([PAD] * len(ids))], schema=SCHEMA
            )
            sent.append(stream.send(rows))
        for answer in sent:
            answer.offsets(30)
    total = BATCHES * ROWS_PER_BATCH
    assert total * len(PAD) > 2 * PREFETCH_MAX_BYTES
    cluster.wait_in_sync("big", 0)

    opened: list[int] = []  # the offset of every fetch the reader opened
    fetch = reader_module._fetch

    def spy(client: BrokerClient, *args: Any) -> Any:
        opened.append(args[-1])
        return fetch(client, *args)

    monkeypatch.setattr(reader_module, "_fetch", spy)
    opts = parse_options(
        {"topic": "big", "brokers": cluster.bootstrap, "includeMetadata": "true"}, Scope.READ
    )
    reader = IdemlogBatchReader(opts, require(cluster.client, opts))
    (part,) = reader.partitions()
    assert (part.start, part.end) == (0, total)

    # Undisturbed, the range is one fetch: any later fetch is the fault's doing.
    assert sum(b.num_rows for b in reader.read(part)) == total
    assert opened == [0]
    opened.clear()

    batches = reader.read(part)
    first = next(batches)
    old = cluster.state("big", 0).leader
    cluster.brokers[old].kill(signal.SIGKILL)
    cluster.wait_leader_change("big", 0, old)
    offsets = first.column(OFFSET_COLUMN).to_pylist()
    ids = first.column("id").to_pylist()
    for batch in batches:
        offsets += batch.column(OFFSET_COLUMN).to_pylist()
        ids += batch.column("id").to_pylist()

    assert offsets == list(range(total)), "a row missing, read twice or out of order"
    assert ids == list(range(total))
    # The fault fired: the first fetch broke part-way and the reader fetched again from
    # inside its range (the first offset it had not yielded), not from its start.
    assert opened[0] == 0 and len(opened) >= 2, opened
    assert 0 < opened[1] < total, opened
