"""The broker's ZooKeeper session (broker_core.server.process.zk_session): with zookeeper.set.acl a
broker without a chroot warns that the top-level nodes stay deletable by anyone, since
ZooKeeper checks a delete against the parent's ACL and "/" is open (docs/security.md)."""

from __future__ import annotations

import logging

import pytest

from broker_core.server.config.broker_config import BrokerConfig
from broker_core.server.process.zk_session import connect_zookeeper
from testkit.zookeeper import ZooKeeperHarness

DIGEST = {
    "zookeeper.set.acl": "true",
    "zookeeper.auth.digest.username": "brokers",
    "zookeeper.auth.digest.password": "zk-session-Pa55",
}


def _connect(connect: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    cfg = BrokerConfig.from_mapping({"zookeeper.connect": connect, **DIGEST})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="idemlog.security"):
        client = connect_zookeeper(cfg)
    try:
        assert client.connected  # the session opened: the warning is all that differs
    finally:
        client.stop()
        client.close()
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_set_acl_without_a_chroot_warns_and_with_one_does_not(
    zk_chroot: ZooKeeperHarness, caplog: pytest.LogCaptureFixture
) -> None:
    (warning,) = _connect(zk_chroot.server.address, caplog)
    assert "zookeeper.set.acl=true without a chroot" in warning
    assert f"zookeeper.connect={zk_chroot.server.address}/idemlog" in warning
    assert _connect(zk_chroot.hosts, caplog) == []
