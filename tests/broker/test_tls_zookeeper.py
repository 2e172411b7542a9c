"""A broker's ZooKeeper session over TLS: a real ZooKeeper serving its secureClientPort
with ``ssl.clientAuth=need`` (``testkit.tls.SecureZooKeeperServer``), brokers with
``zookeeper.ssl.*`` (docs/security.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import Permissions

from broker_core.client.broker_client import BrokerClient
from testkit.tls import SecureZooKeeperServer, TlsCerts
from tests.broker.helpers import TEST_BROKER_CONFIG
from tests.broker.test_sasl import add_user
from tests.harness.broker import BrokerFactory

pytestmark = pytest.mark.zookeeper  # a real ZooKeeper, without the zk_server fixture


@pytest.fixture
def secure_zk(tmp_path: Path, tls_certs: TlsCerts) -> Iterator[SecureZooKeeperServer]:
    server = SecureZooKeeperServer(tmp_path / "zk", tls_certs)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _config(zk: SecureZooKeeperServer, certs: TlsCerts, **extra: object) -> dict[str, object]:
    return {
        **TEST_BROKER_CONFIG,
        "broker.id": 1,
        "zookeeper.connect": f"{zk.secure_address}/tls",
        "zookeeper.session.timeout.ms": 4000,
        "zookeeper.ssl.client.enable": "true",
        "zookeeper.ssl.ca.location": str(certs.ca),
        "zookeeper.ssl.certificate.location": str(certs.broker.cert),
        "zookeeper.ssl.key.location": str(certs.broker.key),
        **extra,
    }


def _tls_reader(
    zk: SecureZooKeeperServer, certs: TlsCerts, auth: list[tuple[str, str]] | None = None
) -> KazooClient:
    """A started kazoo client on ``zk``'s TLS port under ``/tls``, with the client
    certificate, as ``auth`` (anonymous by default); the caller stops and closes it."""
    client = KazooClient(
        hosts=f"{zk.secure_address}/tls",
        use_ssl=True,
        ca=str(certs.ca),
        certfile=str(certs.client.cert),
        keyfile=str(certs.client.key),
        check_hostname=True,
        auth_data=auth,
    )
    client.start(timeout=10)
    return client


def test_a_broker_registers_and_serves_over_a_tls_zookeeper_session(
    secure_zk: SecureZooKeeperServer, broker_factory: BrokerFactory, tls_certs: TlsCerts
) -> None:
    broker = broker_factory(_config(secure_zk, tls_certs), name="zk-tls")
    with BrokerClient(broker.address) as client:
        assert client.create_topic("over-tls", 1) == [1]
    # What it wrote is in ZooKeeper, read back over TLS with a client certificate.
    reader = _tls_reader(secure_zk, tls_certs)
    try:
        assert reader.get_children("/idemlog/brokers/ids") == ["1"]
        assert "over-tls" in reader.get_children("/idemlog/topics")
    finally:
        reader.stop()
        reader.close()


def test_a_plaintext_session_to_the_secure_port_and_a_missing_key_are_refused(
    secure_zk: SecureZooKeeperServer, broker_factory: BrokerFactory, tls_certs: TlsCerts
) -> None:
    plain = broker_factory(
        _config(secure_zk, tls_certs, **{"zookeeper.ssl.client.enable": "false"}),
        name="zk-plain",
        start=False,
    )
    plain.spawn()
    assert plain.wait_exit(timeout=60) != 0
    assert "LISTENING" not in plain.log_text()
    missing = tls_certs.ca.parent / "absent.key"
    broken = broker_factory(
        _config(secure_zk, tls_certs, **{"zookeeper.ssl.key.location": str(missing)}),
        name="zk-missing",
        start=False,
    )
    broken.spawn()
    assert broken.wait_exit() != 0
    assert f"zookeeper.ssl.key.location={str(missing)!r}: cannot read it" in broken.log_text()


def test_users_command_with_the_brokers_file_speaks_tls_and_secures_the_user_node(
    secure_zk: SecureZooKeeperServer, tls_certs: TlsCerts, tmp_path: Path
) -> None:
    # The command reads the same zookeeper.* keys as a broker (broker_core/cli/zk_cmd.py).
    keys = {
        "zookeeper.ssl.client.enable": "true",
        "zookeeper.ssl.ca.location": str(tls_certs.ca),
        "zookeeper.ssl.certificate.location": str(tls_certs.client.cert),
        "zookeeper.ssl.key.location": str(tls_certs.client.key),
        "zookeeper.auth.digest.username": "idemlog-brokers",
        "zookeeper.auth.digest.password": "zk-Secret-77",
        "zookeeper.set.acl": "true",
    }
    config = tmp_path / "zk.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
    add_user(
        ["--zookeeper", f"{secure_zk.secure_address}/tls", "--config", str(config)],
        "alice",
        "pw-alice-1",
    )
    owner = _tls_reader(secure_zk, tls_certs, [("digest", "idemlog-brokers:zk-Secret-77")])
    anonymous = _tls_reader(secure_zk, tls_certs)
    try:
        acl, _ = owner.get_acls("/idemlog/config/users/alice")
        assert [(a.id.scheme, a.perms) for a in acl] == [("digest", Permissions.ALL)]
        with pytest.raises(NoAuthError):
            anonymous.get("/idemlog/config/users/alice")
        acl, _ = anonymous.get_acls("/idemlog/config")  # world-readable, brokers-only writes
        assert sorted((a.id.scheme, a.perms) for a in acl) == [
            ("digest", Permissions.ALL),
            ("world", Permissions.READ),
        ]
    finally:
        for client in (owner, anonymous):
            client.stop()
            client.close()
