"""Issue 35 test 2: the broker leading the sink's ``__transaction_state`` partition is
SIGKILLed and restarted with its ``log.dir`` emptied, inside its ZooKeeper session, with
a sink batch prepared; the batch is then committed, and re-run after a driver crash.

Three real broker processes on a real ZooKeeper (6 s session), RF 3 everywhere. The
restarted process must not lead the state partition on its empty disk: leadership moves
to a replica that has the coordinator's state, at a higher leader epoch, so the commit
finds its batch, the re-run finds it committed, every batch is read once and whole, and
every partition's last stable offset reaches its log end. The restart at once and after
about 1.5 s; the test asserts the old registration was still alive when the new process
started (inside the session) and that the leadership moved.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from broker_core.client.broker_client import BrokerClient
from broker_core.cluster.records import PartitionState, TopicAssignment
from broker_core.protocol.wire import SinkAttempt, SinkTxnStatus
from broker_core.retry import RetryPolicy
from broker_core.server.config.broker_config import ZK_ROOT
from broker_core.txn.state_topic.schema import TXN_STATE_TOPIC
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import ids, sink_task_attempt
from tests.harness.broker import BrokerFactory
from tests.harness.replicated import ReplicatedCluster
from tests.harness.waiting import wait_until

TOPIC = "bounced"
PARTITIONS = 3
TASKS = 2
SINK = "q"
SESSION_MS = 6000
COMMIT_RETRY = RetryPolicy(deadline_s=90.0, backoff_s=0.1, max_backoff_s=1.0, jitter=0.0)
EXTRA = {"zookeeper.session.timeout.ms": SESSION_MS}


def batch_rows(batch: int, task: int) -> dict[int, list[range]]:
    """Task ``task`` of ``batch`` writes 10 ids into every partition, unique per batch."""
    return {p: [range(batch * 1000 + task * 100 + p * 10, batch * 1000 + task * 100 + p * 10 + 10)]
            for p in range(PARTITIONS)}  # fmt: skip


def expected(batch: int) -> set[int]:
    return {i for t in range(TASKS) for spans in batch_rows(batch, t).values() for s in spans
            for i in s}  # fmt: skip


def state_partition(
    zk: KazooClient, check: Callable[[PartitionState], bool]
) -> PartitionState | None:
    """``__transaction_state-0``'s state as the controller wrote it (its topic node), if
    it passes ``check``."""
    doc, _ = zk.get(f"{ZK_ROOT}/topics/{TXN_STATE_TOPIC}")
    state = TopicAssignment.from_doc(TXN_STATE_TOPIC, json.loads(doc), "state topic").state(0)
    return state if check(state) else None


def prepare(client: BrokerClient, run: str, batch: int) -> list[tuple[str, int, int]]:
    """Every task of ``batch`` in ``run`` as the Spark writer makes it; their transactions."""
    txns = []
    for task in range(TASKS):
        txn, status = sink_task_attempt(
            client, SinkAttempt(SINK, run, batch), task, TOPIC, batch_rows(batch, task)
        )
        assert status is SinkTxnStatus.NEW, status
        txns.append(txn)
    return txns


def committed(client: BrokerClient, run: str, batch: int, txns: list[tuple[str, int, int]]) -> bool:
    """The driver's commit, retried while the coordinator moves (as ``spark_sink.commit``)."""
    return COMMIT_RETRY.call(lambda: client.commit_sink_batch(SINK, batch, txns, run))


@pytest.mark.parametrize("down_s", [0.0, 1.5], ids=["at-once", "after-1.5s"])
def test_the_state_leader_bounced_on_an_empty_disk_keeps_every_batch(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, down_s: float
) -> None:
    cluster = ReplicatedCluster(zk_chroot, broker_factory, extra=EXTRA)
    victim_id = cluster.coordinator()
    cluster.create_topic(TOPIC, PARTITIONS, replication_factor=3, min_insync_replicas=2)
    client = BrokerClient(cluster.bootstrap, retries=10)

    # Batch 0 committed before the fault; batch 1 prepared, its commit not yet sent.
    assert committed(client, "run-1", 0, prepare(client, "run-1", 0)) is True
    txns = prepare(client, "run-1", 1)
    for p in range(PARTITIONS):
        cluster.wait_in_sync(TOPIC, p)
    # Every state append was acknowledged by the whole ISR (acks=all): all three replicas.
    zk = zk_chroot.client()
    before = wait_until(
        lambda: state_partition(zk, lambda s: len(s.isr) == 3), "every state replica in sync"
    )
    assert before.leader == victim_id

    registration = f"{ZK_ROOT}/brokers/ids/{victim_id}"
    owner = zk.exists(registration).ephemeralOwner  # type: ignore[union-attr]
    victim = cluster.brokers[victim_id]
    killed = time.monotonic()
    assert victim.kill() != 0
    shutil.rmtree(victim.log_dir)
    victim.log_dir.mkdir()
    time.sleep(down_s)  # the fault's timing, not a wait for an event
    still = zk.exists(registration)
    assert still is not None and still.ephemeralOwner == owner, "the old session ended"
    restart_at = time.monotonic()
    victim.restart()
    restarted = time.monotonic()
    assert restart_at - killed < SESSION_MS / 1000, "not restarted inside the session"

    after = wait_until(
        lambda: state_partition(
            zk, lambda s: s.leader_epoch > before.leader_epoch and s.leader != victim_id
        ),
        "leadership moved to a replica with the state",
        timeout=60,
        interval=0.05,
    )  # fmt: skip
    moved = time.monotonic()
    zk.stop()
    assert committed(client, "run-1", 1, txns) is True
    commit_done = time.monotonic()

    # The driver dies after its commit; the restarted query re-runs batch 1 as a new run:
    # every task finds it committed, and writes nothing.
    for task in range(TASKS):
        _, status = sink_task_attempt(
            client, SinkAttempt(SINK, "run-2", 1), task, TOPIC, batch_rows(1, task)
        )
        assert status is SinkTxnStatus.COMMITTED, status
    assert committed(client, "run-2", 1, []) is False
    assert committed(client, "run-2", 2, prepare(client, "run-2", 2)) is True

    read = [i for p in range(PARTITIONS) for i in ids(client, TOPIC, p)]
    assert len(read) == len(set(read)), "a row read twice"
    assert set(read) == expected(0) | expected(1) | expected(2)
    for p in range(PARTITIONS):
        offsets = client.list_offsets(TOPIC, p)
        assert offsets["last_stable_offset"] == offsets["log_end_offset"], (p, offsets)
    print(
        f"down {down_s:.1f} s: the new process started {restart_at - killed:.2f} s after the "
        f"kill (the old {SESSION_MS / 1000:.0f} s session still alive), serving at "
        f"{restarted - killed:.2f} s; {TXN_STATE_TOPIC}-0 moved from broker {victim_id} to "
        f"{after.leader} (leader epoch {before.leader_epoch} -> {after.leader_epoch}) at "
        f"{moved - killed:.2f} s; batch 1 committed at {commit_done - killed:.2f} s; "
        f"{len(read)} rows read of {len(expected(0) | expected(1) | expected(2))} committed"
    )
