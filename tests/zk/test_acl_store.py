"""The ACL stores: ZooKeeper's (real server) watched by a broker's cache, written with
version-checked sets so that concurrent adds never lose one; and the embedded file,
replaced atomically and re-read when it changed (broker_core.security.acl_store)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from broker_core.security.acl import (
    AclBinding,
    Operation,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from broker_core.security.acl_store import FileAclStore, ZkAclStore
from broker_core.security.principal import Principal
from testkit.zookeeper import ZooKeeperHarness
from tests.harness.waiting import wait_until

ROOT = "/idemlog"
SINK = ResourcePattern(ResourceType.TRANSACTIONAL_ID, PatternType.PREFIXED, "job/")
PAY = ResourcePattern(ResourceType.TOPIC, PatternType.LITERAL, "payments")


def write(user: str, pattern: ResourcePattern = SINK) -> AclBinding:
    return AclBinding.of(pattern, Principal.user(user), Operation.WRITE)


def test_zookeeper_change_reaches_a_watching_store_within_a_second(
    zk_chroot: ZooKeeperHarness,
) -> None:
    broker = ZkAclStore(zk_chroot.client(), ROOT, watch=True)
    assert broker.wait_loaded(10) and broker.bindings() == ()
    operator = ZkAclStore(zk_chroot.client(), ROOT, watch=False)
    assert operator.add([write("alice"), write("alice", PAY)]) == 2
    assert operator.add([write("alice")]) == 0  # already there
    wait_until(lambda: len(broker.bindings()) == 2, "the adds reached the cache", timeout=1.0)
    assert set(broker.bindings()) == {write("alice"), write("alice", PAY)}
    # The record is the resource's node; '/' of the name is encoded.
    children = zk_chroot.client().get_children(f"{ROOT}/acls")
    assert sorted(children) == ["Topic:LITERAL:payments", "TransactionalId:PREFIXED:job%2F"]
    assert operator.remove([write("alice")]) == 1
    wait_until(lambda: broker.bindings() == (write("alice", PAY),), "the removal", timeout=1.0)
    assert zk_chroot.client().get_children(f"{ROOT}/acls") == ["Topic:LITERAL:payments"]
    assert operator.remove([write("alice")]) == 0
    # A store started now loads what is there before it answers.
    late = ZkAclStore(zk_chroot.client(), ROOT, watch=True)
    assert late.wait_loaded(10)
    wait_until(lambda: late.bindings() == (write("alice", PAY),), "loaded", timeout=5)


def test_concurrent_adds_to_one_record_lose_none(zk_chroot: ZooKeeperHarness) -> None:
    users = [f"u{i}" for i in range(8)]
    barrier = threading.Barrier(len(users))
    errors: list[BaseException] = []

    def add(user: str) -> None:
        store = ZkAclStore(zk_chroot.client(), ROOT, watch=False)
        barrier.wait()
        try:
            for n in range(3):
                store.add([AclBinding.of(SINK, Principal.user(f"{user}-{n}"), Operation.WRITE)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    data, stat = zk_chroot.client().get(f"{ROOT}/acls/TransactionalId:PREFIXED:job%2F")
    assert len(json.loads(data)["acls"]) == 3 * len(users)
    assert stat.version >= 3 * len(users) - 1  # every add one conditional set (some retried)


def test_file_store_rewrites_atomically_and_is_reread_when_changed(tmp_path: Path) -> None:
    broker = FileAclStore(tmp_path)
    assert broker.bindings() == ()
    operator = FileAclStore(tmp_path)
    assert operator.add([write("alice"), write("bob")]) == 2
    assert set(broker.bindings()) == {write("alice"), write("bob")}
    assert operator.remove([write("alice")]) == 1
    assert broker.bindings() == (write("bob"),)
    assert not (tmp_path / "__acls.json.tmp").exists()
    doc = json.loads((tmp_path / "__acls.json").read_text())
    assert doc["acls"] == [
        {
            "resource_type": "TransactionalId",
            "pattern_type": "PREFIXED",
            "name": "job/",
            "principal": "User:bob",
            "host": "*",
            "operation": "Write",
            "permission": "Allow",
        }
    ]
    (tmp_path / "__acls.json").unlink()
    assert broker.bindings() == ()


def test_acls_command_on_a_secured_tree_needs_the_brokers_identity(
    zk_chroot: ZooKeeperHarness, tmp_path: Path
) -> None:
    """With ``zookeeper.set.acl`` the ACL records are created with the brokers' node ACL:
    ``idemlog acls`` without the brokers' digest identity is refused in one line naming
    the keys; with ``--config`` it writes, and others cannot change what it wrote."""
    from kazoo.exceptions import NoAuthError
    from kazoo.security import Permissions

    from tests.broker.test_sasl import idemlog

    config = tmp_path / "zk.properties"
    config.write_text(
        "zookeeper.set.acl=true\nzookeeper.auth.digest.username=idemlog-brokers\n"
        "zookeeper.auth.digest.password=zk-Secret-77ab\n"
    )
    zk_chroot.admin_auth = [("digest", "idemlog-brokers:zk-Secret-77ab")]  # its teardown
    where = ["--zookeeper", zk_chroot.hosts]
    grant = ["--allow-principal", "User:etl", "--operation", "Write", "--topic", "payments"]
    done = idemlog("acls", "add", *where, "--config", str(config), *grant)
    assert done.returncode == 0, done.stderr
    node = f"{ROOT}/acls/Topic:LITERAL:payments"
    acl, _ = zk_chroot.client().get_acls(node)
    assert {(a.id.scheme, a.perms) for a in acl} == {
        ("digest", Permissions.ALL),
        ("world", Permissions.READ),
    }
    refused = idemlog("acls", "add", *where, *grant[:4], "--topic", "other")
    assert refused.returncode == 2, refused.stderr
    assert "NoAuth" in refused.stderr and "zookeeper.auth.digest.username" in refused.stderr
    anonymous = zk_chroot.client()
    try:
        anonymous.set(node, b"{}")
        raise AssertionError("an anonymous client changed an ACL record")
    except NoAuthError:
        pass
    listed = idemlog("acls", "list", *where)  # readable by all
    assert (
        listed.returncode == 0 and "Allow User:etl Write on Topic:LITERAL:payments" in listed.stdout
    )
