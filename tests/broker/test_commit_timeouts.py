"""Sink commits while a follower is stalled (SIGSTOP) in the ISR (issue 24, test 4), with
real broker processes on a real ZooKeeper: the markers' acks=all wait lasts until the
leader drops the stalled follower from the ISR (``replica.lag.time.max.ms``), the remote
marker call outlasts that wait (docs/failure-model.md, "Timeouts on the commit path"), so
every commit succeeds and no marker is written twice.

``replica.lag.time.max.ms`` is 12 s here, longer than the 10 s the remote marker call
used to wait: that call timed out and was retried, appending every marker again."""

from __future__ import annotations

import time

from broker_core.client.broker_client import BrokerClient
from broker_core.log.replica import parse_fetched
from broker_core.protocol.wire import Action, SinkAttempt
from broker_core.record.batch import NO_LEADER_EPOCH, decode_header
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import ids, prepared_attempt
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.replicated import ReplicatedCluster
from tests.harness.schedule import paused

LAG_MS = 12_000
# The stalled follower keeps its ZooKeeper session: it leaves the ISR by lag, while it is
# still registered, as a stuck (not dead) broker does.
SESSION_MS = 20_000
SINK = "stalled-sink"
TASKS = 2
ROWS = 50
PARTITIONS = 1


def _control_batches(cluster: ReplicatedCluster, broker: BrokerProcess, topic: str, p: int) -> int:
    raw = cluster.replica_log(broker, topic, p)
    first = decode_header(memoryview(raw), 0).base_offset
    name = f"broker {broker.name} {topic}-{p}"
    return sum(b.header.is_control for b in parse_fetched(raw, first, NO_LEADER_EPOCH, name))


def _pick_topic(cluster: ReplicatedCluster, client: BrokerClient) -> tuple[str, int]:
    """A topic whose leader is not the coordinator (which then sends the markers over the
    wire), and the third broker, a follower: the one to stall."""
    coordinator = cluster.coordinator()
    for attempt in range(12):
        topic = f"stall{attempt}"
        cluster.create_topic(topic, PARTITIONS, replication_factor=3)
        leaders = {cluster.state(topic, p).leader for p in range(PARTITIONS)}
        if coordinator not in leaders:
            (stalled,) = set(cluster.brokers) - leaders - {coordinator}
            return topic, stalled
    raise AssertionError("every topic was led by the coordinator")


def _batch(client: BrokerClient, topic: str, batch_id: int) -> list[tuple[str, int, int]]:
    """One sink batch: TASKS transactions, each writing ROWS ids into every partition."""
    attempt = SinkAttempt(SINK, "run-1", batch_id)
    base = batch_id * 10_000
    return [
        prepared_attempt(
            client,
            attempt,
            task,
            topic,
            {
                p: [range(base + task * 1000 + p * 100, base + task * 1000 + p * 100 + ROWS)]
                for p in range(PARTITIONS)
            },
        )
        for task in range(TASKS)
    ]


def test_sink_commits_wait_for_a_stalled_follower_to_leave_the_isr_and_write_each_marker_once(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    cluster = ReplicatedCluster(
        zk_chroot,
        broker_factory,
        extra={"replica.lag.time.max.ms": LAG_MS, "zookeeper.session.timeout.ms": SESSION_MS},
    )
    try:
        topic, sid = _pick_topic(cluster, cluster.client)
        stalled = cluster.brokers[sid]
        others = [b for b in cluster.brokers.values() if b is not stalled]
        # A client that never asks the stalled broker anything.
        client = BrokerClient(",".join(b.address for b in others))
        assert client.commit_sink_batch(SINK, 0, _batch(client, topic, 0), "run-1") is True
        prepared = _batch(client, topic, 1)  # written and replicated before the stall
        for p in range(PARTITIONS):
            cluster.wait_in_sync(topic, p)

        with paused(stalled):
            began = time.monotonic()
            assert client.commit_sink_batch(SINK, 1, prepared, "run-1") is True
            stalled_commit_s = time.monotonic() - began
            # The commit returned once the markers were replicated: the stalled follower
            # was dropped from the ISR first (by lag: it is still registered).
            for p in range(PARTITIONS):
                leader = cluster.brokers[cluster.state(topic, p, via=others[0]).leader]
                assert sid not in cluster.state(topic, p, via=leader).isr
            brokers = client.action(others[0].address, Action.METADATA, {})["brokers"]
            assert sid in {b["broker_id"] for b in brokers}, "its session expired instead"
            began = time.monotonic()
            assert client.commit_sink_batch(SINK, 2, _batch(client, topic, 2), "run-1") is True
            after_drop_s = time.monotonic() - began
        print(f"stalled_commit_s={stalled_commit_s:.2f} commit_after_drop_s={after_drop_s:.2f}")
        assert stalled_commit_s > LAG_MS / 2000  # it waited for the drop, it did not fail

        for p in range(PARTITIONS):
            cluster.wait_in_sync(topic, p)  # back, the follower copies the markers too
        expected = 3 * TASKS  # one marker per transaction per partition, none twice
        for p in range(PARTITIONS):
            counts = {b.name: _control_batches(cluster, b, topic, p) for b in cluster.running()}
            assert set(counts.values()) == {expected}, (p, counts)
        committed = [i for p in range(PARTITIONS) for i in ids(client, topic, p)]
        assert len(committed) == 3 * TASKS * PARTITIONS * ROWS == len(set(committed))
        client.close()
    finally:
        cluster.close()
