"""Upgrade from the previous format (``server.coordination.state_migration``): a ZooKeeper
cluster whose coordinator state is in znodes (idemlog 0.1, the controller's coordinator) and whose
partitions saw markers stamped with the controller epoch. Three real broker processes on
a real ZooKeeper: the first coordinator of ``__transaction_state-0`` copies the znodes
into the log, raises its leader epoch above the old controller epochs, and the ids go on
where they were: a producer's next epoch, its markers accepted by partitions that
refused a lower coordinator epoch."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.protocol.coordinator_keys import TXN_STATE_TOPIC, state_partition_of
from broker_core.protocol.txn_requests import WriteTxnMarkersRequest
from broker_core.protocol.wire import Action
from broker_core.server.config.broker_config import ZK_ROOT
from broker_core.txn.state_topic.records import TransactionMetadata, TransactionState
from testkit.broker_failpoints import ENV, UNVERIFIED_TXN_PRODUCE
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import TEST_BROKER_CONFIG, ids, rows
from tests.harness.broker import TEST_HOOKS, BrokerFactory
from tests.harness.client_calls import answering_address
from tests.harness.legacy_zk_state import write_legacy_state
from tests.harness.waiting import wait_until

ClientFor = Callable[..., BrokerClient]
OLD_CONTROLLER_EPOCH = 5  # what the previous format's coordinator stamped on markers
PID, EPOCH = 7, 3  # the legacy id's producer


@pytest.mark.parametrize("state_partitions", [1, 4])
def test_previous_formats_znodes_are_migrated_and_markers_stay_newer(
    zk_chroot: ZooKeeperHarness,
    broker_factory: BrokerFactory,
    client_for: ClientFor,
    state_partitions: int,
) -> None:
    # With several state partitions each copies its share: the id lands in its own.
    zk = zk_chroot.client()
    zk.create(
        f"{ZK_ROOT}/controller_epoch",
        json.dumps({"version": 1, "controller_epoch": OLD_CONTROLLER_EPOCH}).encode(),
        makepath=True,
    )
    meta = TransactionMetadata(
        "legacy-app", PID, EPOCH, 60_000, TransactionState.COMPLETE_COMMIT, set(), 0, 0
    )
    write_legacy_state(zk, ZK_ROOT, transactions=[meta], coordinator_epoch=OLD_CONTROLLER_EPOCH)

    config = {
        **TEST_BROKER_CONFIG,
        "zookeeper.connect": zk_chroot.hosts,
        "transaction.state.log.num.partitions": state_partitions,
        **TEST_HOOKS,  # the old coordinator's transaction, written unverified
    }
    hook = {ENV: UNVERIFIED_TXN_PRODUCE}
    brokers = [
        broker_factory({**config, "broker.id": i}, name=f"u{i}", env=hook) for i in (1, 2, 3)
    ]
    client = client_for(brokers[0])
    wait_until(lambda: len(client.refresh_metadata().brokers) == 3, "3 brokers registered")
    client.init_producer_id()  # leases block 0..999: PID is a known producer id
    leaders = client.create_topic("up", 1)
    # The old coordinator's last transaction and marker for PID on up-0, at its controller
    # epoch (written as before issue 36: no transactional id, unverified).
    with client.produce_stream("up", 0) as stream:
        assert (
            stream.send(
                rows(2), producer_id=PID, producer_epoch=EPOCH, base_sequence=0, transactional=True
            )
            .result(10)
            .ok
        )
    leader = next(b for b in brokers if b.address.endswith(f":{_port(client, leaders[0])}"))
    marker = WriteTxnMarkersRequest(((PID, EPOCH, (("up", 0),)),), True, OLD_CONTROLLER_EPOCH)
    client.action(leader.address, Action.WRITE_TXN_MARKERS, marker.to_doc())
    assert ids(client, "up", 0) == [0, 1]

    # The first coordinator call creates __transaction_state; its leader migrates.
    pid, epoch = wait_until(lambda: _init(client), "the migrated coordinator to serve")
    assert (pid, epoch) == (PID, EPOCH + 1)  # the legacy id, not a new one
    client.add_partitions_to_txn("legacy-app", pid, epoch, [("up", 0)])
    with client.produce_stream("up", 0, transactional_id="legacy-app") as stream:
        assert stream.send(
            rows(2, start=10), producer_id=pid, producer_epoch=epoch, base_sequence=0,
            transactional=True,
        ).result(10).ok  # fmt: skip
    client.end_txn("legacy-app", pid, epoch, commit=True)  # refused were its epoch < 5
    offsets = client.list_offsets("up", 0)
    assert offsets["last_stable_offset"] == offsets["log_end_offset"]
    assert ids(client, "up", 0) == [0, 1, 10, 11]
    find = {"transactional_id": "legacy-app"}
    coordinator = client.action(answering_address(client), Action.FIND_COORDINATOR, find)
    assert coordinator["state_partitions"] == state_partitions
    home = state_partition_of("legacy-app", state_partitions)
    assert coordinator["state_partition"] == home
    address = f"{coordinator['host']}:{coordinator['port']}"
    metrics = client.action(address, Action.METRICS, {})
    assert metrics["transactions"]["coordinator_epochs"][str(home)] > OLD_CONTROLLER_EPOCH
    logs = "".join(b.log_text() for b in brokers)
    upgraded = "upgraded the coordinator state of idemlog 0.1"
    assert logs.count(upgraded) == 1  # only the id's own partition held a share
    assert f"into {TXN_STATE_TOPIC}-{home}:" in logs


def _port(client: BrokerClient, broker_id: int) -> int:
    return client.refresh_metadata().brokers[broker_id].port


def _init(client: BrokerClient) -> tuple[int, int] | None:
    try:
        return client.init_producer_id("legacy-app")
    except Exception as exc:
        if getattr(exc, "retriable", False):
            return None
        raise
