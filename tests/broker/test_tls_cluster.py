"""A 3-broker cluster on real ZooKeeper with every Flight link under mutual TLS: the
clients', the replica fetchers', the markers' and the coordinator's (docs/security.md).

The brokers require client certificates (``ssl.client.auth=required``) and present their
own to each other (their principal: the certificate's subject, ``User:CN=broker``), so
replication, markers and the coordinator's calls only work if each of those links is
built with the broker's files. Exactly once is checked as in the
plaintext tests: a transactional producer and a sink commit (retried, and a replayed
batch refused), read back once each, also after the leader is SIGKILLed; the replicas'
logs come out byte-identical.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import SslHandshakeError
from broker_core.producer import Producer
from broker_core.protocol.wire import Action, SinkAttempt
from broker_core.security.tls import Side, TlsSettings
from testkit.tls import TlsCerts
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import TEST_BROKER_CONFIG, ids, prepared_attempt, rows
from tests.harness.broker import BrokerFactory
from tests.harness.replicated import ReplicatedCluster

TOPIC = "secured"


@pytest.fixture
def mtls_cluster(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, tls_certs: TlsCerts
) -> Iterator[ReplicatedCluster]:
    client = TlsSettings.from_values(tls_certs.client_keys(with_cert=True)).load(Side.CLIENT)
    cluster = ReplicatedCluster(
        zk_chroot,
        broker_factory,
        extra={**TEST_BROKER_CONFIG, **tls_certs.broker_keys(client_auth="required")},
        tls=client,
    )
    try:
        yield cluster
    finally:
        cluster.close()


def test_replication_a_transaction_and_a_sink_commit_under_mutual_tls_are_exactly_once(
    mtls_cluster: ReplicatedCluster, tls_certs: TlsCerts
) -> None:
    cluster = mtls_cluster
    cluster.create_topic(TOPIC, 2, replication_factor=3)
    security = tls_certs.client_keys(with_cert=True)
    with Producer(
        cluster.bootstrap, **{"transactional.id": "tls-app", "linger.ms": 2, **security}
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(TOPIC, pa.Table.from_batches([rows(300)]), key="key")
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send(TOPIC, pa.Table.from_batches([rows(300, start=10_000)]), key="key")
        producer.abort_transaction()

    client = cluster.client
    run = SinkAttempt("tls-query", "run-1", 0)
    tasks = [
        prepared_attempt(client, run, p, TOPIC, {p: [range(1000 + 100 * p, 1000 + 100 * p + 5)]})
        for p in (0, 1)
    ]
    assert client.commit_sink_batch("tls-query", 0, tasks) is True
    assert client.commit_sink_batch("tls-query", 0, tasks) is False  # the commit, retried
    replay = [
        prepared_attempt(
            client, SinkAttempt("tls-query", "run-2", 0), p, TOPIC, {p: [range(5000, 5003)]}
        )
        for p in (0, 1)
    ]
    assert client.commit_sink_batch("tls-query", 0, replay) is False  # a re-run batch 0

    expected = sorted([*range(300), *range(1000, 1005), *range(1100, 1105)])

    def read_all() -> list[int]:
        return sorted(i for p in (0, 1) for i in ids(client, TOPIC, p))

    assert read_all() == expected
    for p in (0, 1):
        cluster.wait_in_sync(TOPIC, p)  # the fetchers copied it through mutual TLS
    # Every link authenticated by its certificate (ssl.principal.mapping.rules=DEFAULT):
    # the brokers' fetchers as the broker principal, the test's client as its own.
    for p in (0, 1):
        leader = cluster.leader_of(TOPIC, p)
        leader.wait_for_log("certificate CN=broker authenticated as User:CN=broker")
        leader.wait_for_log("certificate CN=client authenticated as User:CN=client")

    # The leader of partition 0 dies: its successor, elected among the TLS replicas,
    # serves the same rows once each.
    old = cluster.state(TOPIC, 0).leader
    cluster.brokers[old].kill(signal.SIGKILL)
    new = cluster.wait_leader_change(TOPIC, 0, old)
    assert new.leader != old
    assert read_all() == expected
    cluster.brokers[old].restart()
    for p in (0, 1):
        cluster.wait_in_sync(TOPIC, p)
    for broker in cluster.running():
        broker.stop()
    cluster.assert_stopped_replicas_identical(TOPIC, 2)


def test_a_client_without_a_certificate_is_refused_by_every_broker_of_the_cluster(
    mtls_cluster: ReplicatedCluster, tls_certs: TlsCerts
) -> None:
    no_cert = TlsSettings.from_values(tls_certs.client_keys()).load(Side.CLIENT)
    for broker in mtls_cluster.brokers.values():
        with (
            BrokerClient(broker.address, tls=no_cert, retries=0) as client,
            pytest.raises(SslHandshakeError, match="requires a client certificate"),
        ):
            client.action(broker.address, Action.METADATA, {})
