"""Transactions through the broker: timeouts, state errors, durability, sinks, two brokers."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow.flight as flight
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.client.produce_stream import ProduceStream
from broker_core.errors import (
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    NotLeaderOrFollowerError,
    ProducerFencedError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.wire import Action, SinkAttempt
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import TEST_BROKER_CONFIG, ids, prepared_attempt, rows
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.waiting import wait_until

ClientFor = Callable[..., BrokerClient]


@pytest.fixture
def client(shared_broker: BrokerProcess, client_for: ClientFor) -> BrokerClient:
    return client_for(shared_broker)


def _begin(
    client: BrokerClient,
    txn_id: str,
    topic: str,
    partitions: list[int],
    start: int,
    timeout_ms: int | None = None,
) -> tuple[int, int]:
    pid, epoch = client.init_producer_id(txn_id, timeout_ms)
    client.add_partitions_to_txn(txn_id, pid, epoch, [(topic, p) for p in partitions])
    for p in partitions:
        with client.produce_stream(topic, p, transactional_id=txn_id) as stream:
            stream.send(
                rows(3, start=start + 100 * p), producer_id=pid, producer_epoch=epoch,
                base_sequence=0, transactional=True,
            ).offsets(10)  # fmt: skip
    return pid, epoch


def _stable(client: BrokerClient, topic: str, partition: int) -> bool:
    offsets = client.list_offsets(topic, partition)
    return offsets["last_stable_offset"] == offsets["log_end_offset"]


def test_transaction_open_past_its_timeout_is_aborted_and_fenced(client: BrokerClient) -> None:
    client.create_topic("slow", 1)
    # Long enough for the begin itself on a loaded machine (it raced the abort at 300 ms).
    pid, epoch = _begin(client, "slow-app", "slow", [0], 0, timeout_ms=2000)
    assert not _stable(client, "slow", 0)
    wait_until(lambda: _stable(client, "slow", 0), "the timed-out transaction to be aborted")
    assert ids(client, "slow") == []
    assert ids(client, "slow", isolation="read_uncommitted") == [0, 1, 2]
    with pytest.raises(ProducerFencedError):
        client.end_txn("slow-app", pid, epoch, commit=True)
    with client.produce_stream("slow", 0, transactional_id="slow-app") as stream:
        late = stream.send(
            rows(1, start=3), producer_id=pid, producer_epoch=epoch, base_sequence=3,
            transactional=True,
        ).result(10)  # fmt: skip
    assert late.error_code == 47  # the abort's marker carried the bumped epoch
    assert client.metrics()["transactions"]["transactions_timed_out"] >= 1


def test_transaction_state_errors_over_the_wire(client: BrokerClient) -> None:
    client.create_topic("states", 1)
    pid, epoch = client.init_producer_id("states-app")
    with pytest.raises(InvalidTxnStateError, match="no transaction is open") as empty:
        client.end_txn("states-app", pid, epoch, commit=True)
    assert empty.value.code == 48
    with pytest.raises(InvalidProducerIdMappingError, match="unknown to the coordinator") as unk:
        client.add_partitions_to_txn("never-initialised", pid, epoch, [("states", 0)])
    assert unk.value.code == 49
    with pytest.raises(InvalidProducerIdMappingError, match=f"not {pid + 1000}"):
        client.add_partitions_to_txn("states-app", pid + 1000, epoch, [("states", 0)])
    with pytest.raises(UnknownTopicOrPartitionError, match="'missing' does not exist"):
        client.add_partitions_to_txn("states-app", pid, epoch, [("missing", 0)])
    with pytest.raises(InvalidTransactionTimeoutError) as timeout:
        client.init_producer_id("states-app", transaction_timeout_ms=10**9)
    assert timeout.value.code == 50
    # docs/design.md §9 scenario 5: a plain batch while the producer's transaction is open.
    # Over the wire it is refused before the log's validator (48 there): a transactional
    # producer id is never issued a producer token (issue 36), so 49.
    pid, epoch = _begin(client, "states-app", "states", [0], 0)
    with client.produce_stream("states", 0) as stream:
        plain = stream.send(
            rows(1, start=3), producer_id=pid, producer_epoch=epoch, base_sequence=3
        ).result(10)
    assert plain.error_code == 49 and "carries no producer token" in plain.error_message
    client.end_txn("states-app", pid, epoch, commit=False)
    assert ids(client, "states") == [] and _stable(client, "states", 0)


def test_abort_sink_batch_aborts_its_open_transactions(client: BrokerClient) -> None:
    client.create_topic("sink-abort", 2)
    txns = [(f"q2/{p}", *_begin(client, f"q2/{p}", "sink-abort", [p], 0)) for p in (0, 1)]
    client.abort_sink_batch("q2", 0, txns)
    for p in (0, 1):
        assert _stable(client, "sink-abort", p) and ids(client, "sink-abort", p) == []
    run = SinkAttempt("q2", "run-2", 0)
    again = [
        prepared_attempt(client, run, p, "sink-abort", {p: [range(500 + 100 * p, 503 + 100 * p)]})
        for p in (0, 1)
    ]
    assert client.commit_sink_batch("q2", 0, again) is True  # batch 0 was never committed
    for p in (0, 1):
        assert ids(client, "sink-abort", p) == [500 + 100 * p + i for i in range(3)]


def test_coordinator_state_survives_sigkill(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    broker = broker_factory(TEST_BROKER_CONFIG)
    client = client_for(broker)
    client.create_topic("durable", 1)
    first = prepared_attempt(
        client, SinkAttempt("durable", "run-1", 7), 0, "durable", {0: [range(0, 3)]}
    )
    assert client.commit_sink_batch("durable", 7, [first]) is True
    broker.kill()
    broker.restart()
    _, pid, epoch = first
    assert client.init_producer_id("durable/0") == (pid, epoch + 1)  # the mapping survived
    replay = prepared_attempt(
        client, SinkAttempt("durable", "run-2", 7), 0, "durable", {0: [range(900, 903)]}
    )
    assert client.commit_sink_batch("durable", 7, [replay]) is False
    assert client.commit_sink_batch("durable", 6, [replay]) is False
    assert ids(client, "durable") == [0, 1, 2]  # the replay was aborted, not committed
    assert _stable(client, "durable", 0)


def test_two_brokers_with_zookeeper_route_and_commit_across_brokers(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    # zk_chroot first: fixtures are torn down in reverse, so the brokers die before the
    # chroot is deleted (a live broker would re-create its nodes under it).
    common = {"zookeeper.connect": zk_chroot.hosts, "zookeeper.session.timeout.ms": 4000}
    first = broker_factory({**common, "broker.id": 1}, name="zk1")
    second = broker_factory({**common, "broker.id": 2}, name="zk2")
    client = client_for(first)
    wait_until(lambda: len(client.refresh_metadata().brokers) == 2, "both brokers registered")
    leaders = client.create_topic("spread", 2)
    assert sorted(leaders) == [1, 2]  # round-robin over the two live brokers
    # The client learned every leader from one bootstrap broker and routes by partition.
    assert client.refresh_metadata().controller in (1, 2)
    pid, epoch = _begin(client, "spread-app", "spread", [0, 1], 0)
    client.end_txn("spread-app", pid, epoch, commit=True)  # one marker goes broker to broker
    for p in (0, 1):
        assert ids(client, "spread", p) == [100 * p, 100 * p + 1, 100 * p + 2]
        assert _stable(client, "spread", p)
    # A broker refuses a partition it does not lead, with the retriable routing error.
    wrong = first if leaders[0] == 2 else second
    body = {"topic": "spread", "partition": 0}
    with pytest.raises(NotLeaderOrFollowerError, match="does not lead spread-0") as info:
        client.action(wrong.address, Action.LIST_OFFSETS, body)
    assert info.value.retriable and info.value.code == 6
    stream = ProduceStream(flight.connect(f"grpc://{wrong.address}"), "spread", 0)
    with pytest.raises(NotLeaderOrFollowerError, match="does not lead spread-0"):
        stream.send(rows(1)).result(10)
    stream.close()
    # A clean shutdown in ZooKeeper mode deregisters: the other broker sees it go.
    assert wrong.stop() == 0
    survivor = first if wrong is second else second
    survivor_client = client_for(survivor)
    wait_until(
        lambda: (
            list(survivor_client.refresh_metadata().brokers)
            == [survivor_client.ping()["broker_id"]]
        ),
        "the stopped broker to leave the cluster",
    )
    assert survivor.stop() == 0
