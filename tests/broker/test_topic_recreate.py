"""A topic deleted and recreated under its name is another topic (docs/failure-model.md,
"Topic ids"): its id differs, and what knew the old one is refused, never mixed in."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import IdemlogError, UnknownTopicIdError
from broker_core.producer import Producer
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import SCHEMA, rows
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.replicated import ReplicatedCluster
from tests.harness.schedule import paused
from tests.harness.waiting import wait_until

ClientFor = Callable[..., BrokerClient]


def test_metadata_and_describe_name_the_id_and_a_recreated_topic_has_another(
    shared_broker: BrokerProcess, client_for: ClientFor
) -> None:
    client = client_for(shared_broker)
    client.create_topic("recreated-ids", 2, schema=SCHEMA)
    first = client.topic_id("recreated-ids")
    (described,) = client.describe_topics(["recreated-ids"])
    assert described.topic_id == first and len(first) == 32
    assert client.metadata().topic_ids["recreated-ids"] == first

    client.delete_topic("recreated-ids")
    client.create_topic("recreated-ids", 2, schema=SCHEMA)
    second = client.topic_id("recreated-ids", refresh=True)
    assert second != first and len(second) == 32


def test_a_request_with_the_old_id_is_refused_with_code_100_naming_both_ids(
    shared_broker: BrokerProcess, client_for: ClientFor
) -> None:
    client = client_for(shared_broker)
    client.create_topic("stale-id", 1, schema=SCHEMA)
    old = client.topic_id("stale-id")
    with client.produce_stream("stale-id", 0, topic_id=old) as stream:
        stream.send(rows(5)).result(10)
    client.delete_topic("stale-id")
    client.create_topic("stale-id", 1, schema=SCHEMA)
    new = client.topic_id("stale-id", refresh=True)
    line = f"topic 'stale-id' was recreated: id {old} is now {new}"

    refusals: list[IdemlogError] = []
    with pytest.raises(UnknownTopicIdError) as fetched:
        client.fetch_once("stale-id", 0, 0, topic_id=old)
    refusals.append(fetched.value)
    with pytest.raises(UnknownTopicIdError) as listed:
        client.list_offsets("stale-id", 0, topic_id=old)
    refusals.append(listed.value)
    with (
        pytest.raises(UnknownTopicIdError) as produced,
        client.produce_stream("stale-id", 0, topic_id=old) as stream,
    ):
        stream.send(rows(5, start=100)).result(10)
    refusals.append(produced.value)
    for error in refusals:
        assert error.code == 100 and not error.retriable
        assert error.message == line
    # Under the new id (and without one, as an older client) the new topic is served,
    # and it holds none of the old rows.
    assert client.list_offsets("stale-id", 0, topic_id=new)["log_end_offset"] == 0
    assert client.read_table("stale-id", 0, topic_id=new) is None


# -- with ZooKeeper: three brokers, a follower paused across the delete and the create ----

SESSION_MS = 6000  # the session: a 3.5 s pause stays inside it
PAUSE_S = 3.5
PARTITIONS = 3  # with three brokers and replication factor 3 each broker leads one
OLD_ROWS = 2000  # per partition, ids below NEW_START
NEW_START = 1_000_000


def _recreate_cluster(zk_chroot: ZooKeeperHarness, factory: BrokerFactory) -> ReplicatedCluster:
    return ReplicatedCluster(
        zk_chroot,
        factory,
        extra={"zookeeper.session.timeout.ms": SESSION_MS, "default.replication.factor": 3},
    )


def _write_old_rows(cluster: ReplicatedCluster, topic: str) -> int:
    """OLD_ROWS acknowledged (acks=all) rows into each partition, every replica in sync."""
    client = cluster.client
    topic_id = client.topic_id(topic, refresh=True)
    for p in range(PARTITIONS):
        with client.produce_stream(topic, p, topic_id=topic_id) as stream:
            handles = [
                stream.send(rows(500, start=p * OLD_ROWS + i)) for i in range(0, OLD_ROWS, 500)
            ]
            assert all(h.result(30).ok for h in handles)
    for p in range(PARTITIONS):
        cluster.wait_in_sync(topic, p)
    return PARTITIONS * OLD_ROWS


def _others_client(cluster: ReplicatedCluster, paused_id: int) -> BrokerClient:
    """A client that bootstraps from the brokers other than ``paused_id`` (an admin call
    to the paused one would wait out its timeout)."""
    others = [b.address for i, b in cluster.brokers.items() if i != paused_id]
    return BrokerClient(",".join(others), timeout_s=10.0)


def test_a_follower_paused_across_delete_and_create_never_serves_its_old_rows(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    topic = "paused-recreate"
    cluster = _recreate_cluster(zk_chroot, broker_factory)
    try:
        cluster.create_topic(topic, PARTITIONS, replication_factor=3)
        old_id = cluster.client.topic_id(topic)
        # Broker 3: not the controller (broker 1, first up), a replica of every partition.
        target = cluster.brokers[3]
        old_written = _write_old_rows(cluster, topic)
        assert old_written == 6000
        admin = _others_client(cluster, 3)
        try:
            with paused(target):
                stopped_at = time.monotonic()
                admin.delete_topic(topic)
                deleted_at = time.monotonic()
                admin.create_topic(topic, PARTITIONS, config={"replication.factor": "3"})
                created_at = time.monotonic()
                new_id = admin.topic_id(topic, refresh=True)
                # Inside its session: still registered when it resumes.
                live = set(admin.metadata(refresh=True).brokers)
                wait_until(lambda: time.monotonic() >= stopped_at + PAUSE_S, "the pause")
                resumed_at = time.monotonic()
        finally:
            admin.close()
        assert stopped_at < deleted_at < created_at < resumed_at
        assert resumed_at - stopped_at < SESSION_MS / 1000
        assert 3 in live, f"broker 3's session ended during the pause: live {live}"
        assert new_id != old_id
        state = cluster.client.describe_topics([topic])[0]
        assert state.topic_id == new_id
        led = [p.partition for p in state.partitions if p.leader == 3]
        assert led, "the paused broker leads no partition of the new topic"

        # From the resume on, read every partition by the new id until the new rows are in.
        reader = BrokerClient(cluster.bootstrap, timeout_s=10.0)
        seen: dict[int, set[int]] = {p: set() for p in range(PARTITIONS)}
        done = threading.Event()

        def read_all() -> None:
            while not done.is_set():
                for p in range(PARTITIONS):
                    try:
                        answer = reader.fetch_once(
                            topic, p, 0, isolation="read_uncommitted", topic_id=new_id
                        )
                    except IdemlogError:
                        continue  # the leader's copy is being replaced: retriable
                    for _meta, batch in answer.batches:
                        seen[p].update(batch.column("id").to_pylist())

        thread = threading.Thread(target=read_all, daemon=True)
        thread.start()
        try:
            new_rows = 3000
            with Producer(cluster.bootstrap, **{"linger.ms": 5}) as producer:
                futures = [
                    producer.send(topic, rows(100, start=NEW_START + i))
                    for i in range(0, new_rows, 100)
                ]
                producer.flush()
                for f in futures:
                    f.result(60)
            for p in range(PARTITIONS):
                cluster.wait_in_sync(topic, p)
            wait_until(
                lambda: sum(len(s) for s in seen.values()) == new_rows,
                lambda: (
                    f"the reader to see the {new_rows} new rows: {[len(s) for s in seen.values()]}"
                ),
            )
        finally:
            done.set()
            thread.join(30)
            reader.close()
        old_served = sorted(i for s in seen.values() for i in s if i < NEW_START)
        assert old_served == [], f"{len(old_served)} old rows served as the new topic's"
        # Every replica holds the new rows only: the leaders' log ends are the new rows.
        ends = {
            p: cluster.offsets(cluster.leader_of(topic, p), topic, p) for p in range(PARTITIONS)
        }
        assert sum(o["log_end_offset"] for o in ends.values()) == new_rows
        assert json.loads((target.log_dir / topic / "topic.json").read_text())["topic_id"] == new_id
        assert "deletes its copy of topic paused-recreate" in target.log_text()
        with pytest.raises(UnknownTopicIdError) as stale:
            cluster.client.fetch_once(topic, led[0], 0, topic_id=old_id)
        assert stale.value.code == 100
        assert stale.value.message == f"topic {topic!r} was recreated: id {old_id} is now {new_id}"
    finally:
        cluster.close()


def test_an_idempotent_producer_across_delete_and_create_is_refused_and_writes_nothing(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    topic = "producer-recreate"
    cluster = _recreate_cluster(zk_chroot, broker_factory)
    try:
        cluster.create_topic(topic, PARTITIONS, replication_factor=3)
        old_id = cluster.client.topic_id(topic)
        with Producer(cluster.bootstrap, **{"linger.ms": 5}) as producer:
            before = [producer.send(topic, rows(100, start=i)) for i in range(0, 900, 100)]
            producer.flush()
            acked_before = sum(m.num_rows for f in before for m in f.result(30))
            cluster.client.delete_topic(topic)
            cluster.client.create_topic(topic, PARTITIONS, config={"replication.factor": "3"})
            new_id = cluster.client.topic_id(topic, refresh=True)
            after = [
                producer.send(topic, rows(100, start=NEW_START + i)) for i in range(0, 900, 100)
            ]
            producer.flush(60)
            errors = []
            for f in after:
                with pytest.raises(UnknownTopicIdError) as refused:
                    f.result(30)
                errors.append(refused.value)
        assert acked_before == 900
        assert {e.code for e in errors} == {100} and not any(e.retriable for e in errors)
        line = f"topic {topic!r} was recreated: id {old_id} is now {new_id}"
        assert all(e.message == line for e in errors), {e.message for e in errors}
        offsets = [
            cluster.client.list_offsets(topic, p, topic_id=new_id) for p in range(PARTITIONS)
        ]
        assert [o["log_end_offset"] for o in offsets] == [0] * PARTITIONS  # 0 rows written
    finally:
        cluster.close()


def test_a_request_by_the_id_of_a_deleted_topic_is_told_it_was_deleted(
    shared_broker: BrokerProcess, client_for: ClientFor
) -> None:
    client = client_for(shared_broker)
    client.create_topic("deleted-id", 1, schema=SCHEMA)
    old = client.topic_id("deleted-id")
    client.delete_topic("deleted-id")
    with pytest.raises(UnknownTopicIdError) as refused:
        client.fetch_once("deleted-id", 0, 0, topic_id=old)
    assert refused.value.message == f"topic 'deleted-id' was deleted: id {old} no longer exists"
    assert refused.value.code == 100 and not refused.value.retriable


def test_a_transaction_across_delete_and_create_is_refused_and_aborted_writing_nothing(
    shared_broker: BrokerProcess, client_for: ClientFor
) -> None:
    client = client_for(shared_broker)
    client.create_topic("txn-recreate", 2, schema=SCHEMA)
    old = client.topic_id("txn-recreate")
    with Producer(shared_broker.address, **{"transactional.id": "across-recreate"}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("txn-recreate", rows(50)).result(30)
        producer.commit_transaction()
        client.delete_topic("txn-recreate")
        client.create_topic("txn-recreate", 2, schema=SCHEMA)
        new = client.topic_id("txn-recreate", refresh=True)
        producer.begin_transaction()
        future = producer.send("txn-recreate", rows(50, start=NEW_START))
        with pytest.raises(IdemlogError) as failed:
            producer.commit_transaction()
        assert f"id {old} is now {new}" in str(failed.value)
        # AddPartitionsToTxn was refused (UNKNOWN_TOPIC_ID): the transaction is
        # abortable, its batch failed with that line, never sent.
        with pytest.raises(IdemlogError, match=f"id {old} is now {new}"):
            future.result(30)
        producer.abort_transaction()
    ends = [client.list_offsets("txn-recreate", p, topic_id=new) for p in (0, 1)]
    assert [o["log_end_offset"] for o in ends] == [0, 0]  # nothing, not even a marker
