"""A secured broker's ephemeral nodes across a new ZooKeeper session: kazoo sends the
digest identity again at every connect, and the registration and the controller node that
the broker creates again in its new session get the ACL again (docs/security.md,
Authentication and node ACLs). In-process, on a real ZooKeeper, with the session expired
by the server (``ZooKeeperHarness.expire_session``)."""

from __future__ import annotations

import pytest
from kazoo.exceptions import NoAuthError

from broker_core.cluster.records import BrokerInfo
from broker_core.cluster.zk import ZkCluster
from broker_core.security.zk_acl import ZkAuth
from broker_core.server.config.broker_config import ZK_ROOT
from testkit.zookeeper import ZooKeeperHarness
from tests.harness.waiting import Recorder

KEYS = {
    "zookeeper.set.acl": "true",
    "zookeeper.auth.digest.username": "idemlog-brokers",
    "zookeeper.auth.digest.password": "zk-Secret-session",
}


def test_ephemeral_nodes_made_again_in_a_new_session_get_the_acl_again(
    zk_chroot: ZooKeeperHarness,
) -> None:
    auth = ZkAuth.from_values(KEYS)
    zk_chroot.admin_auth = [("digest", "idemlog-brokers:zk-Secret-session")]
    client = zk_chroot.client(**auth.kazoo_arguments())
    cluster = ZkCluster(client, ZK_ROOT, default_replication_factor=1)
    control = Recorder()
    cluster.on_controller_change(control)
    try:
        cluster.register(BrokerInfo(7, "10.0.0.1", 9007))
        control.wait(lambda v: v == [True], "control")
        first_session = client.client_id[0]
        ephemeral = (f"{ZK_ROOT}/controller", f"{ZK_ROOT}/brokers/ids/7")

        zk_chroot.expire_session(client)
        control.wait(lambda v: v == [True, False, True], "loss, then control again")

        session = client.client_id[0]
        assert session != first_session  # the fault happened: a new session
        outsider = zk_chroot.client()
        for path in ephemeral:
            stat = client.exists(path)
            assert stat is not None and stat.ephemeralOwner == session, path
            acl, _ = client.get_acls(path)
            assert sorted(acl) == sorted(auth.secure_acl()), (path, acl)
            with pytest.raises(NoAuthError):
                outsider.delete(path)
            with pytest.raises(NoAuthError):
                outsider.set(path, b"tampered")
    finally:
        cluster.close()
