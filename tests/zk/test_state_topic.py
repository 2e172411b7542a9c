"""``__transaction_state`` as a replicated internal topic (``server.coordination.txn_state_topic``),
created in real ZooKeeper when the cluster first needs it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from broker_core.cluster.records import TopicAssignment
from broker_core.errors import (
    CoordinatorNotAvailableError,
    InvalidConfigError,
    InvalidReplicationFactorError,
)
from broker_core.server.config.broker_config import BrokerConfig
from broker_core.server.coordination.txn_state_topic import ensure_state_topic
from broker_core.txn.state_topic.schema import TXN_STATE_SCHEMA, TXN_STATE_TOPIC, state_partition_of
from testkit.zookeeper import ZooKeeperHarness
from tests.harness.waiting import wait_until
from tests.zk.test_cluster import ROOT, SimBroker

CONFIG = BrokerConfig.from_mapping({"transaction.state.log.segment.bytes": 2 * 1024 * 1024})


@pytest.fixture
def brokers(zk_chroot: ZooKeeperHarness) -> Iterator[Callable[..., SimBroker]]:
    made: list[SimBroker] = []

    def make(broker_id: int | None) -> SimBroker:
        made.append(SimBroker(zk_chroot, broker_id))
        return made[-1]

    yield make
    for broker in made:
        broker.cluster.close()


def test_created_once_replicated_and_compacted(brokers: Callable[..., SimBroker]) -> None:
    group = [brokers(i) for i in (1, 2, 3, 4)]
    wait_until(lambda: all(len(b.cluster.brokers()) == 4 for b in group), "4 brokers registered")
    made: list[TopicAssignment] = []
    start = threading.Barrier(len(group))

    def ensure(member: SimBroker) -> None:
        start.wait(15)
        # A racer whose view lags the winner's create is told to retry (retriable).
        made.append(
            wait_until(lambda: _ensure_or_none(member), "the state topic visible", interval=0.05)
        )

    threads = [threading.Thread(target=ensure, args=(m,)) for m in group]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(made) == 4  # every racer got the one topic
    assert all(a == made[0] for a in made)
    topic = made[0]
    assert list(topic.partitions) == list(range(8))  # transaction.state.log.num.partitions default
    state = topic.states[0]
    assert len(state.replicas) == 3 and state.leader in state.replicas  # min(3, brokers)
    assert topic.config["min.insync.replicas"] == "2"
    assert topic.config["cleanup.policy"] == "compact"
    assert topic.config["compaction.key.columns"] == "kind,key"
    assert topic.config["segment.bytes"] == str(2 * 1024 * 1024)
    assert topic.schema == TXN_STATE_SCHEMA.serialize().to_pybytes()
    assert group[0].client.get_children(f"{ROOT}/topics") == [TXN_STATE_TOPIC]


def _ensure_or_none(member: SimBroker, config: BrokerConfig = CONFIG) -> TopicAssignment | None:
    try:
        return ensure_state_topic(member.cluster, config)
    except CoordinatorNotAvailableError:
        return None


def test_one_broker_gets_one_replica_and_min_isr_one(brokers: Callable[..., SimBroker]) -> None:
    only = brokers(1)
    topic = ensure_state_topic(only.cluster, CONFIG)
    assert topic.states[0].replicas == (1,)
    assert topic.config["min.insync.replicas"] == "1"


def test_a_replication_factor_above_the_live_brokers_is_refused(
    brokers: Callable[..., SimBroker],
) -> None:
    only = brokers(1)
    config = BrokerConfig.from_mapping({"transaction.state.log.replication.factor": 3})
    with pytest.raises(InvalidReplicationFactorError):
        ensure_state_topic(only.cluster, config)
    assert only.client.get_children(f"{ROOT}/topics") == []  # nothing partial


def test_an_existing_state_topic_keeps_its_partition_count(
    brokers: Callable[..., SimBroker],
) -> None:
    # Fixed at creation, like Kafka's: a broker started later with another setting finds
    # the topic and keeps its count, so no id moves to another coordinator.
    group = [brokers(i) for i in (1, 2, 3)]
    wait_until(lambda: all(len(b.cluster.brokers()) == 3 for b in group), "3 brokers registered")
    four = BrokerConfig.from_mapping({"transaction.state.log.num.partitions": 4})
    created = ensure_state_topic(group[0].cluster, four)
    assert len(created.partitions) == 4
    for setting in (1, 8, 50):
        other = BrokerConfig.from_mapping({"transaction.state.log.num.partitions": setting})
        again = wait_until(lambda c=other: _ensure_or_none(group[2], c), "the state topic visible")
        assert len(again.partitions) == 4
        assert all(
            state_partition_of(k, len(again.partitions)) == state_partition_of(k, 4)
            for k in ("orders", "s-1/3", "app-7")
        )
    with pytest.raises(InvalidConfigError, match=r"transaction\.state\.log\.num\.partitions"):
        BrokerConfig.from_mapping({"transaction.state.log.num.partitions": 1001})


def test_a_sink_tasks_id_maps_to_its_sinks_partition() -> None:
    for partitions in (1, 7, 50):
        for sink in ("orders", "s-1", "a/b"):
            base = state_partition_of(sink, partitions)
            assert 0 <= base < partitions
            assert state_partition_of(f"{sink}/3", partitions) == state_partition_of(
                sink.split("/", 1)[0], partitions
            )
    # Spread: 1,000 ids over 50 partitions use most of them.
    assert len({state_partition_of(f"app-{i}", 50) for i in range(1000)}) > 40
