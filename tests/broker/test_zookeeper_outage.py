"""Issue 23, test 3: ZooKeeper is off the commit path. Three real brokers, replicated
topics (``__transaction_state`` and the sink's), a real ZooKeeper server killed for
``OUTAGE_S`` (SIGKILL) while a sink commits batch after batch, then started again on its data:
the commits go on through the outage (no leadership change is needed), nothing is lost
or doubled, and every partition gets exactly one marker append per commit."""

from __future__ import annotations

import time
from typing import Any

from broker_core.protocol.wire import Action, SinkAttempt
from tests.broker.helpers import ids, prepared_attempt
from tests.harness.replicated import ReplicatedCluster

TOPIC = "zkout"
PARTITIONS = 3
OUTAGE_S = 60.0  # the figure
ROWS = 5


def _marker_appends(cluster: ReplicatedCluster) -> dict[int, int]:
    """Per partition of TOPIC, the marker appends of all its replicas (only a leader
    appends markers; followers copy them)."""
    total = dict.fromkeys(range(PARTITIONS), 0)
    for broker in cluster.brokers.values():
        doc: dict[str, Any] = cluster.client.action(broker.address, Action.METRICS, {})
        for row in doc["partitions"]:
            if row["topic"] == TOPIC:
                total[row["partition"]] += row["marker_appends"]
    return total


def test_sink_commits_go_on_while_zookeeper_is_down(
    replicated_cluster: ReplicatedCluster,
) -> None:
    cluster = replicated_cluster
    cluster.coordinator()  # __transaction_state exists and is led before the outage
    cluster.create_topic(TOPIC, PARTITIONS, replication_factor=3)
    for p in range(PARTITIONS):
        cluster.wait_in_sync(TOPIC, p)
    client = cluster.client
    written: list[int] = []

    def commit(batch: int) -> None:
        attempt = SinkAttempt("zk-sink", "run-1", batch)
        txns = []
        for p in range(PARTITIONS):
            start = batch * 1000 + p * 100
            spans = {p: [range(start, start + ROWS)]}
            txns.append(prepared_attempt(client, attempt, p, TOPIC, spans))
            written.extend(range(start, start + ROWS))
        assert client.commit_sink_batch("zk-sink", batch, txns, "run-1") is True

    commit(0)
    leaders = {p: cluster.state(TOPIC, p).leader for p in range(PARTITIONS)}
    assert cluster.zk.kill_server() == -9
    during = 0
    try:
        began = time.monotonic()
        while time.monotonic() - began < OUTAGE_S:
            during += 1
            commit(during)
    finally:
        cluster.zk.start_server()
    print(f"sink batches committed during a {OUTAGE_S:.0f} s ZooKeeper outage: {during}")
    assert during >= 3  # committed through the outage, not after it
    commit(during + 1)
    assert {p: cluster.state(TOPIC, p).leader for p in range(PARTITIONS)} == leaders
    for p in range(PARTITIONS):
        offsets = client.list_offsets(TOPIC, p)
        assert offsets["last_stable_offset"] == offsets["log_end_offset"]
    got = sorted(i for p in range(PARTITIONS) for i in ids(client, TOPIC, p))
    assert got == sorted(written)  # every row once
    commits = during + 2
    assert _marker_appends(cluster) == dict.fromkeys(range(PARTITIONS), commits)
