"""The Spark sink with coordination spread over the brokers: three broker processes on a
real ZooKeeper with six ``__transaction_state`` partitions, a real Spark driver streaming
into a replicated topic, and the broker leading the **sink's** state partition (its
coordinator, found from the sink's own ids) SIGKILLed mid-stream. The sink's coordinator
moves to another broker at a higher leader epoch and the query runs to its end: every row
once, in per-key order."""

from __future__ import annotations

import signal
from pathlib import Path

from broker_core.errors import IdemlogError
from broker_core.protocol.wire import Action
from testkit.zookeeper import ZooKeeperHarness
from tests.harness.broker import BrokerFactory
from tests.harness.client_calls import answering_address
from tests.harness.replicated import ReplicatedCluster
from tests.harness.waiting import wait_until
from tests.spark.helpers import (
    DriverLauncher,
    assert_one_copy,
    assert_succeeded,
    make_input,
    stream_spec,
)

STATE_PARTITIONS = 6
TOPIC = "spread_sink"


def _coordinator_of(cluster: ReplicatedCluster, state_partition: int) -> tuple[int, int]:
    """(the broker leading ``state_partition``, the partition count) per FIND_COORDINATOR."""
    doc = cluster.client.action(
        answering_address(cluster.client),
        Action.FIND_COORDINATOR,
        {"state_partition": state_partition},
    )
    return int(doc["broker_id"]), int(doc["state_partitions"])


def _sink_partition(cluster: ReplicatedCluster) -> int | None:
    """The state partition of the streaming sink's ids, once it has any."""
    try:
        rows = cluster.client.list_transactions(every_id=True)
    except IdemlogError:
        return None
    found = {r.state_partition for r in rows if r.sink_id}
    assert len(found) <= 1, f"one sink's ids in several state partitions: {rows}"
    return found.pop() if found else None


def test_the_sinks_own_coordinator_sigkilled_mid_stream(
    tmp_path: Path,
    zk_chroot: ZooKeeperHarness,
    broker_factory: BrokerFactory,
    launcher: DriverLauncher,
) -> None:
    cluster = ReplicatedCluster(
        zk_chroot, broker_factory, extra={"transaction.state.log.num.partitions": STATE_PARTITIONS}
    )
    try:
        cluster.create_topic(TOPIC, 4, replication_factor=3)
        files = 12
        ids = make_input(tmp_path / "src", files, 2_000)
        spec = stream_spec(
            tmp_path / "src",
            "",
            TOPIC,
            tmp_path / "ck",
            files,
            trigger="processingTime",
            sink_options={"brokers": cluster.bootstrap},
        )
        run = launcher.start(spec)
        run.wait_for_line("PROGRESS", lambda line: line.startswith("PROGRESS batch=2 "))
        # A one-element list: state partition 0 is an answer too (wait_until wants truthy).
        (home,) = wait_until(
            lambda: [p for p in [_sink_partition(cluster)] if p is not None],
            "the sink's ids listed",
            timeout=60,
        )
        victim_id, count = _coordinator_of(cluster, home)
        assert count == STATE_PARTITIONS
        leaders = {_coordinator_of(cluster, p)[0] for p in range(STATE_PARTITIONS)}
        assert len(leaders) > 1, "coordination not spread"
        cluster.brokers[victim_id].kill(signal.SIGKILL)
        moved = wait_until(
            lambda: _moved(cluster, home, victim_id), "the sink's coordinator moved", timeout=60
        )
        assert moved != victim_id
        assert run.wait() == 0, run.describe()
        assert_succeeded(run)
        after = [b for b in run.progress_batches() if b > 2]
        assert after, "the query ended before the kill: nothing was proven"
        assert_one_copy("", TOPIC, ids, brokers=cluster.bootstrap)
    finally:
        cluster.close()


def _moved(cluster: ReplicatedCluster, state_partition: int, old: int) -> int | None:
    try:
        leader, _ = _coordinator_of(cluster, state_partition)
    except IdemlogError:
        return None
    return leader if leader != old else None
