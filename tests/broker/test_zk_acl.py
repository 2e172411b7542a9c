"""ZooKeeper ACLs (``zookeeper.set.acl``, docs/security.md): real brokers on a real
ZooKeeper authenticate with the brokers' digest identity; every node they (and
``idemlog users``) create is world-readable and changeable only by that identity, and the
SCRAM users' nodes are not even readable by others. ``idemlog zookeeper set-acl`` secures a
tree built without ACLs and ``--unsecure`` opens it again. A broker without the identity
is refused at start, naming the keys.

Each check walks the whole tree as the brokers' identity and tries, as a client without
credentials and as clients with other credentials, to set, create under, delete and re-ACL
every node: each attempt must be refused with NoAuth.
"""

from __future__ import annotations

import collections
import signal
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.security import OPEN_ACL_UNSAFE

from broker_core.client.broker_client import BrokerClient
from broker_core.protocol.wire import SinkAttempt
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import ids, prepared_attempt
from tests.broker.test_sasl import add_user, idemlog
from tests.broker.test_sasl_cluster import ALICE, ALICE_PASSWORD, sasl_cluster
from tests.harness import zk_acl
from tests.harness.broker import BrokerFactory
from tests.harness.replicated import ReplicatedCluster

ZK_USER = "idemlog-brokers"
ZK_PASSWORD = "zk-Secret-4f1c"
IDENTITY = {
    "zookeeper.auth.digest.username": ZK_USER,
    "zookeeper.auth.digest.password": ZK_PASSWORD,
}
SECURED = {**IDENTITY, "zookeeper.set.acl": "true"}
TOPIC = "payments"
SINK = "job"
# Clients that must not change anything: anonymous, another user, the right user with a
# wrong password (a different digest).
OUTSIDERS = zk_acl.outsider_auths(ZK_USER)


def _properties(path: Path, keys: dict[str, str]) -> str:
    path.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
    path.chmod(0o600)
    return str(path)


def assert_secured(zk: ZooKeeperHarness, owner: KazooClient, top: str) -> list[str]:
    """``tests/harness/zk_acl.py``'s check, with this file's outsiders."""
    outsiders = [zk.client(auth_data=auth) for auth in OUTSIDERS]
    return zk_acl.assert_secured(owner, outsiders, top, ZK_USER)


def _commit(client: BrokerClient, batch: int, spans: dict[int, list[range]]) -> None:
    attempt = SinkAttempt(SINK, f"run-{batch}", batch)
    txns = [prepared_attempt(client, attempt, 0, TOPIC, spans, timeout_ms=600_000)]
    assert client.commit_sink_batch(SINK, batch, txns, f"run-{batch}") is True


def test_secured_cluster_works_and_no_outsider_can_change_any_node(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    zk_chroot.admin_auth = [("digest", f"{ZK_USER}:{ZK_PASSWORD}")]  # its teardown's delete
    connect = zk_chroot.hosts + "/secure"  # a chroot the brokers' side creates, secured
    config = _properties(tmp_path / "zk.properties", SECURED)
    where = ["--zookeeper", connect, "--config", config]
    alice = ALICE
    # SASL_PLAINTEXT (sasl_cluster's): the brokers read the private users.
    cluster = sasl_cluster(
        zk_chroot, broker_factory, where, {**SECURED, "zookeeper.connect": connect}
    )
    try:
        cluster.create_topic(TOPIC, 1)
        _commit(cluster.client, 0, {0: [range(0, 10)]})
        # A leader killed: the controller (perhaps another broker) rewrites the topic node
        # another broker created, and the registration of the dead broker goes.
        old = cluster.state(TOPIC, 0)
        leader = cluster.leader_of(TOPIC, 0)
        assert leader.kill(signal.SIGKILL) == -signal.SIGKILL
        new = cluster.wait_leader_change(TOPIC, 0, old.leader)
        assert new.leader != old.leader and new.leader_epoch > old.leader_epoch
        # A client that knows the live brokers only (the test helper does not re-route).
        live = ",".join(b.address for b in cluster.running())
        with BrokerClient(live, sasl=alice) as client:
            _commit(client, 1, {0: [range(10, 20)]})
            seen = collections.Counter(ids(client, TOPIC, 0))
        assert seen == collections.Counter(range(20))

        owner = zk_chroot.client(auth_data=zk_chroot.admin_auth)
        nodes = assert_secured(zk_chroot, owner, "/secure")
        kinds = {"/brokers/ids/", "/controller", f"/topics/{TOPIC}", "/config/users/alice"}
        assert all(any(k in n for n in nodes) for k in kinds), nodes
        ephemeral = [n for n in nodes if owner.exists(n).ephemeralOwner]
        assert len(ephemeral) >= 3, nodes  # two registrations and the controller, at least

        # A broker without the identity is refused at start, naming the keys.
        stranger_keys = {
            k: v for k, v in cluster.config.items() if not k.startswith("zookeeper.auth")
        }
        stranger_keys["zookeeper.set.acl"] = "false"
        stranger = broker_factory({**stranger_keys, "broker.id": 4}, name="b4", start=False)
        stranger.spawn()
        assert stranger.wait_exit(60) == 2
        log = stranger.log_text()
        errors = [line for line in log.splitlines() if line.startswith("idemlog:")]
        assert len(errors) == 1, log
        assert "zookeeper.auth.digest.username" in errors[0], errors
        assert "Traceback" not in log and "LISTENING" not in log
        assert not owner.exists("/secure/idemlog/brokers/ids/4")
        # The users command without the brokers' file: refused, one line naming the keys.
        for args in (["list"], ["add", "mallory", "--password-file", "-"]):
            refused = idemlog("users", *args, "--zookeeper", connect, stdin="pw-mallory\n")
            assert refused.returncode == 2, refused
            assert "Traceback" not in refused.stderr and "NoAuth" in refused.stderr
            assert "zookeeper.auth.digest.username" in refused.stderr, refused.stderr
        assert not owner.exists("/secure/idemlog/config/users/mallory")
        for b in [*cluster.brokers.values(), stranger]:  # the secret never reaches a log
            assert ZK_PASSWORD not in b.log_text(), b.name
    finally:
        cluster.close()


def test_set_acl_secures_an_existing_tree_and_unsecure_opens_it_again(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    zk_chroot.admin_auth = [("digest", f"{ZK_USER}:{ZK_PASSWORD}")]
    connect = zk_chroot.hosts + "/legacy"
    # The brokers authenticate already but create open nodes (the step before securing).
    config = _properties(tmp_path / "broker.properties", IDENTITY)
    add_user(["--zookeeper", connect, "--config", config], "alice", ALICE_PASSWORD)
    cluster = ReplicatedCluster(
        zk_chroot,
        broker_factory,
        count=1,
        extra={**IDENTITY, "zookeeper.connect": connect, "default.replication.factor": 1},
    )
    try:
        cluster.create_topic(TOPIC, 2)
        _commit(cluster.client, 0, {0: [range(0, 5)], 1: [range(5, 10)]})
        owner = zk_chroot.client(auth_data=zk_chroot.admin_auth)
        nodes = zk_acl.walk(owner, "/legacy")
        assert all(owner.get_acls(n)[0] == OPEN_ACL_UNSAFE for n in nodes)  # open before

        secure = idemlog(
            "zookeeper", "set-acl", "--zookeeper", connect, "--config", config, "--secure",
            "--progress-every", "5",
        )  # fmt: skip
        assert secure.returncode == 0, secure.stderr
        lines = secure.stdout.splitlines()
        assert lines[0].startswith(f"set-acl: walking {zk_chroot.chroot}/legacy (secure"), lines
        assert any(line.startswith("set-acl: 5 nodes") for line in lines), lines
        assert lines[-1].startswith(f"secured {len(nodes)} nodes under "), lines
        assert f": {len(nodes)} changed, 0 already so" in lines[-1], lines
        assert ZK_PASSWORD not in secure.stdout + secure.stderr
        assert_secured(zk_chroot, owner, "/legacy")

        again = idemlog(
            "zookeeper", "set-acl", "--zookeeper", connect, "--config", config, "--secure"
        )
        assert again.returncode == 0, again.stderr
        assert f": 0 changed, {len(nodes)} already so" in again.stdout, again.stdout

        # The broker (same identity) still changes its secured nodes.
        cluster.create_topic("after", 1)
        _commit(cluster.client, 1, {0: [range(10, 12)]})
        assert sorted(ids(cluster.client, TOPIC, 0)) == [0, 1, 2, 3, 4, 10, 11]

        # Without the identity the migration cannot undo it: one line naming the keys.
        refused = idemlog("zookeeper", "set-acl", "--zookeeper", connect, "--unsecure")
        assert refused.returncode == 2, refused
        assert "Traceback" not in refused.stderr
        assert "zookeeper.auth.digest.username" in refused.stderr, refused.stderr

        unsecure = idemlog(
            "zookeeper", "set-acl", "--zookeeper", connect, "--config", config, "--unsecure"
        )
        assert unsecure.returncode == 0, unsecure.stderr
        anonymous = zk_chroot.client()
        after = zk_acl.walk(anonymous, "/legacy")  # the users' node is listable again
        assert set(nodes) <= set(after)
        assert all(anonymous.get_acls(n)[0] == OPEN_ACL_UNSAFE for n in after)
    finally:
        cluster.close()
