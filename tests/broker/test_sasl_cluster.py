"""A 3-broker SASL cluster on a real ZooKeeper: the brokers authenticate to each other as
User:broker (replication, markers), a sink batch commits exactly once through it, and
the users kept in ZooKeeper reach every broker: a removal ends the user's sessions on
each of them (docs/security.md). Run with SASL_PLAINTEXT and with SASL_SSL (the same,
every link inside TLS: the brokers' own too)."""

from __future__ import annotations

import collections
from collections.abc import Mapping

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import SaslAuthenticationFailedError, SslHandshakeError
from broker_core.protocol.wire import Action, SinkAttempt
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.scram import Mechanism
from broker_core.security.tls import PLAINTEXT_MATERIAL, Side, TlsMaterial, TlsSettings
from testkit.tls import TlsCerts
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import ids, prepared_attempt
from tests.broker.test_sasl import add_user, idemlog
from tests.harness.broker import BrokerFactory
from tests.harness.replicated import ReplicatedCluster
from tests.harness.waiting import wait_until

BROKER_PASSWORD = "broker-Secret-91d2"
ALICE_PASSWORD = "alice-Secret-5e8a"
TOPIC = "payments"
PARTITIONS = 3
SINK = "job"
ALICE = SaslCredentials(Mechanism.SCRAM_SHA_256, "alice", ALICE_PASSWORD)


def sasl_cluster(
    zk: ZooKeeperHarness,
    broker_factory: BrokerFactory,
    where: list[str],
    extra: Mapping[str, object],
    tls: TlsMaterial = PLAINTEXT_MATERIAL,
) -> ReplicatedCluster:
    """A 3-broker cluster, replication factor 3, whose listeners want SASL: the users
    ``broker`` (the brokers' own, between them) and ``alice`` (the cluster's client,
    :data:`ALICE`) added first with ``idemlog users`` at ``where``; ``extra`` adds broker
    keys or overrides these (``security.protocol`` defaults to SASL_PLAINTEXT)."""
    add_user(where, "broker", BROKER_PASSWORD)
    add_user(where, "alice", ALICE_PASSWORD)
    return ReplicatedCluster(
        zk,
        broker_factory,
        extra={
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.inter.broker.username": "broker",
            "sasl.inter.broker.password": BROKER_PASSWORD,
            "default.replication.factor": 3,
            **extra,
        },
        tls=tls,
        sasl=ALICE,
    )


def _refused(address: str, sasl: SaslCredentials | None, tls: TlsMaterial) -> bool:
    try:
        with BrokerClient(address, tls=tls, sasl=sasl, retries=0) as client:
            client.describe_topics()
    except SaslAuthenticationFailedError:
        return True
    return False


def _plaintext_refused(address: str) -> bool:
    try:
        with BrokerClient(address, retries=0) as client:
            client.describe_topics()
    except SslHandshakeError:
        return True
    return False


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_sasl_cluster_replicates_and_commits_exactly_once(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, tls_certs: TlsCerts, protocol: str
) -> None:
    tls_keys: dict[str, str] = {}
    tls = PLAINTEXT_MATERIAL
    if protocol == "SASL_SSL":
        tls_keys = {**tls_certs.broker_keys(), "security.protocol": protocol}
        client_keys = {**tls_certs.client_keys(), "security.protocol": protocol}
        tls = TlsSettings.from_values(client_keys).load(Side.CLIENT)
    where = ["--zookeeper", zk_chroot.hosts]
    alice = ALICE
    cluster = sasl_cluster(
        zk_chroot, broker_factory, where, {**tls_keys, "security.protocol": protocol}, tls
    )
    try:
        brokers = list(cluster.brokers.values())
        for b in brokers:  # every listener requires authentication
            assert _refused(b.address, None, tls)
        cluster.create_topic(TOPIC, PARTITIONS)
        client = cluster.client
        attempt = SinkAttempt(SINK, "run-1", 0)
        spans = {p: [range(p * 100, p * 100 + 10)] for p in range(PARTITIONS)}
        txns = [prepared_attempt(client, attempt, 0, TOPIC, spans, timeout_ms=600_000)]
        assert client.commit_sink_batch(SINK, 0, txns, "run-1") is True
        # The retried commit of the same batch finds it committed: nothing written twice.
        assert client.commit_sink_batch(SINK, 0, txns, "run-1") is False
        seen = collections.Counter(i for p in range(PARTITIONS) for i in ids(client, TOPIC, p))
        assert seen == collections.Counter(i for s in spans.values() for r in s for i in r)
        for p in range(PARTITIONS):
            # Followers fetched as User:broker: each replica holds the data and the marker.
            cluster.wait_in_sync(TOPIC, p)
            logs = {b.name: cluster.batches(b, TOPIC, p) for b in brokers}
            assert len({tuple(v) for v in logs.values()}) == 1 and len(logs["b1"]) == 2, logs
        if protocol == "SASL_SSL":  # the brokers' own links are TLS: no plaintext listener
            assert all(_plaintext_refused(b.address) for b in brokers)
        for b in brokers:
            assert "SCRAM handshake of User:broker" not in b.log_path.read_text()
            assert BROKER_PASSWORD not in b.log_path.read_text()

        # A user removed in ZooKeeper loses its sessions on every broker.
        sessions = BrokerClient(cluster.bootstrap, tls=tls, sasl=alice, retries=0)
        for b in brokers:
            sessions.action(b.address, Action.METADATA, {})  # a session on each broker
        removed = idemlog("users", "remove", "alice", *where)
        assert removed.returncode == 0, removed.stderr
        for b in brokers:

            def ended(address: str = b.address) -> bool:
                try:
                    sessions.action(address, Action.METADATA, {})  # the same connection
                except SaslAuthenticationFailedError:
                    return True
                return False

            wait_until(ended, f"alice's session on {b.name} ended", timeout=10)
        sessions.close()
        assert all(_refused(b.address, alice, tls) for b in brokers)
    finally:
        cluster.close()
