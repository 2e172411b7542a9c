"""Issue 23, test 4: a new coordinator's load never blocks and never punishes. Four real
broker processes on a real ZooKeeper: ten transactions decided (PREPARE_COMMIT stored)
whose markers cannot be written (their partition's only replica is down) are found by
the next coordinator of ``__transaction_state-0``; it serves at once and another
transaction commits meanwhile, while the ten stay pending; once the partition is back
they complete, every row once."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import IdemlogError
from broker_core.protocol.wire import Action
from broker_core.retry import RetryPolicy
from broker_core.server.config.broker_config import ZK_ROOT
from broker_core.txn.state_topic.schema import TXN_STATE_TOPIC
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import TEST_BROKER_CONFIG, ids, rows
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.waiting import wait_until

ClientFor = Callable[..., BrokerClient]
STUCK = 10
WAIT_S = 60.0


def _retry(call: Callable[[], object]) -> object:
    return RetryPolicy(deadline_s=WAIT_S, backoff_s=0.05, max_backoff_s=0.2, jitter=0.0).call(call)


def _coordinator(client: BrokerClient, live: list[BrokerProcess], old: int | None) -> int:
    found: list[int] = []

    def named() -> bool:
        try:
            answers = {
                client.action(b.address, Action.FIND_COORDINATOR, {})["broker_id"] for b in live
            }
        except IdemlogError:
            return False
        if len(answers) != 1 or old in answers:
            return False
        found.append(answers.pop())
        return True

    wait_until(named, f"one coordinator other than {old}", timeout=WAIT_S)
    return found[-1]


def _stable(client: BrokerClient, topic: str, p: int) -> bool:
    offsets = client.list_offsets(topic, p)
    return bool(offsets["last_stable_offset"] == offsets["log_end_offset"])


def test_transactions_stuck_on_an_offline_partition_delay_only_themselves(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    config = {
        **TEST_BROKER_CONFIG,
        "zookeeper.connect": zk_chroot.hosts,
        "zookeeper.session.timeout.ms": 2000,
        "default.replication.factor": 1,
        "replica.lag.time.max.ms": 3000,
        "transaction.marker.retry.deadline.ms": 17_000,  # > 2 x lag + 10 s
    }
    brokers = [broker_factory({**config, "broker.id": i}, name=f"l{i}") for i in (1, 2, 3, 4)]
    client = client_for(brokers[0])
    wait_until(lambda: len(client.refresh_metadata().brokers) == 4, "4 brokers registered")
    coordinator = _coordinator(client, brokers, None)
    doc = json.loads(zk_chroot.client().get(f"{ZK_ROOT}/topics/{TXN_STATE_TOPIC}")[0])
    (outsider,) = {1, 2, 3, 4} - set(doc["partitions"]["0"]["replicas"])  # holds no state
    stuck_leaders = client.create_topic("stuck", 4)
    healthy_leaders = client.create_topic("healthy", 4)
    sp = stuck_leaders.index(outsider)
    hp = next(p for p, b in enumerate(healthy_leaders) if b not in (outsider, coordinator))

    txns = []
    for i in range(STUCK):
        tid = f"stuck-{i}"
        pid, epoch = client.init_producer_id(tid)
        client.add_partitions_to_txn(tid, pid, epoch, [("stuck", sp)])
        with client.produce_stream("stuck", sp, transactional_id=tid) as stream:
            batch = rows(2, start=i * 10)
            assert (
                stream.send(
                    batch,
                    producer_id=pid,
                    producer_epoch=epoch,
                    base_sequence=0,
                    transactional=True,
                )
                .result(10)
                .ok
            )
        txns.append((tid, pid, epoch))
    assert brokers[outsider - 1].kill() == -9  # the stuck partition's only replica
    failed: list[BaseException] = []

    def commit(tid: str, pid: int, epoch: int) -> None:
        try:
            client_for(brokers[coordinator - 1], retries=0).end_txn(tid, pid, epoch, commit=True)
        except IdemlogError as exc:
            failed.append(exc)

    threads = [threading.Thread(target=commit, args=t) for t in txns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    # Decided (PREPARE_COMMIT stored, acks=all) but no marker written: every call failed.
    assert len(failed) == STUCK and all(e.retriable for e in failed), failed

    assert brokers[coordinator - 1].kill() == -9
    live = [b for i, b in enumerate(brokers, 1) if i not in (outsider, coordinator)]
    new = _coordinator(client, live, coordinator)
    probe = client_for(live[0])
    # The new coordinator serves while its ten leftovers wait for their partition.
    pid, epoch = _retry(lambda: probe.init_producer_id("healthy-app"))  # type: ignore[misc]
    probe.add_partitions_to_txn("healthy-app", pid, epoch, [("healthy", hp)])
    with probe.produce_stream("healthy", hp, transactional_id="healthy-app") as stream:
        assert stream.send(
            rows(3, start=900), producer_id=pid, producer_epoch=epoch, base_sequence=0,
            transactional=True,
        ).result(10).ok  # fmt: skip
    probe.end_txn("healthy-app", pid, epoch, commit=True)
    assert _stable(probe, "healthy", hp) and ids(probe, "healthy", hp) == [900, 901, 902]
    address = next(b.address for i, b in enumerate(brokers, 1) if i == new)
    metrics = probe.action(address, Action.METRICS, {})["transactions"]
    assert metrics["by_state"]["PREPARE_COMMIT"] == STUCK  # still pending: the fault held

    brokers[outsider - 1].restart(same_port=False)
    wait_until(
        functools.partial(_retry, lambda: _stable(probe, "stuck", sp)),
        "the stuck transactions completed",
        timeout=WAIT_S,
    )
    assert ids(probe, "stuck", sp) == sorted(i * 10 + j for i in range(STUCK) for j in range(2))
