"""Topic ids in ZooKeeper (docs/operations.md, "Upgrading to topic ids"): a topic node
written before ids gets one from the controller, by a conditional write, derived from the
node's creation zxid; an older broker's rewrite that drops the field gets the same id
back; a node recreated under the name gets another."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from broker_core.cluster.records import BrokerInfo, PartitionState, TopicAssignment
from broker_core.cluster.zk import ZkCluster
from testkit.zookeeper import ZooKeeperHarness
from tests.harness.waiting import wait_until

ROOT = "/idemlog"
PATH = f"{ROOT}/topics/legacy"


def _id_less_doc() -> bytes:
    """A topic node as a broker from before ids writes it (no topic_id)."""
    topic = TopicAssignment.of("legacy", {0: PartitionState((1, 2), 1, 0, (1, 2))}, None, {})
    doc = topic.to_doc()
    assert "topic_id" not in doc
    return json.dumps(doc).encode()


@pytest.fixture
def clusters(zk_chroot: ZooKeeperHarness) -> Iterator[list[ZkCluster]]:
    client = zk_chroot.client()
    client.ensure_path(f"{ROOT}/topics")
    client.create(PATH, _id_less_doc())
    made = []
    for broker_id in (1, 2):
        cluster = ZkCluster(zk_chroot.client(), ROOT)
        cluster.register(BrokerInfo(broker_id, "10.0.0.1", 9000 + broker_id))
        made.append(cluster)
    made[0].checker = client  # type: ignore[attr-defined]
    yield made
    for cluster in made:
        cluster.close()


def _stored_id(clusters: list[ZkCluster]) -> str:
    data, _stat = clusters[0].checker.get(PATH)  # type: ignore[attr-defined]
    return str(json.loads(data).get("topic_id", ""))


def test_a_topic_from_before_ids_gets_one_id_that_survives_an_older_brokers_rewrite(
    clusters: list[ZkCluster],
) -> None:
    client = clusters[0].checker  # type: ignore[attr-defined]
    czxid = client.get(PATH)[1].czxid
    derived = f"{czxid:032x}"
    wait_until(lambda: _stored_id(clusters) == derived, "the controller's upgrade write")
    for cluster in clusters:
        wait_until(lambda c=cluster: c.topic("legacy").topic_id == derived, "every cache")
        assert cluster.read_topic("legacy").topic_id == derived

    # An older broker rewrites the node (an ISR change) without the field: the caches keep
    # the node's id, and the controller writes the same one back.
    _data, stat = client.get(PATH)
    client.set(PATH, _id_less_doc(), version=stat.version)
    wait_until(lambda: client.get(PATH)[1].version > stat.version + 1, "the id written back")
    assert _stored_id(clusters) == derived
    assert all(c.topic("legacy").topic_id == derived for c in clusters)

    # Deleted and created again (by an older broker, without an id): another id.
    client.delete(PATH)
    client.create(PATH, _id_less_doc())
    again = f"{client.get(PATH)[1].czxid:032x}"
    assert again != derived
    wait_until(lambda: _stored_id(clusters) == again, "the recreated node's own id")
    for cluster in clusters:
        wait_until(lambda c=cluster: c.topic("legacy").topic_id == again, "every cache")


def test_an_isr_change_for_another_incarnation_of_the_topic_writes_nothing(
    clusters: list[ZkCluster],
) -> None:
    """A replica of the deleted topic (same name, leader, epoch 0 as the new one's) asks
    to shrink the ISR: refused on the state read for the conditional write."""
    client = clusters[0].checker  # type: ignore[attr-defined]
    derived = f"{client.get(PATH)[1].czxid:032x}"
    wait_until(lambda: _stored_id(clusters) == derived, "the controller's upgrade write")
    before = client.get(PATH)[1].version

    def shrink(state: PartitionState) -> PartitionState:
        return PartitionState(state.replicas, state.leader, state.leader_epoch, (1,))

    stale = "e" * 32
    assert clusters[1].alter_partition("legacy", 0, shrink, stale) is None
    assert client.get(PATH)[1].version == before  # nothing written
    shrunk = clusters[1].alter_partition("legacy", 0, shrink, derived)
    assert shrunk is not None and shrunk.isr == (1,)
