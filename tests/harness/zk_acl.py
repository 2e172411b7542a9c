"""Checks of a ZooKeeper tree secured with ``zookeeper.set.acl`` (docs/security.md,
"Authentication and node ACLs"): the tree walked as the brokers' identity, then every
change an outsider could try (set, create under, delete, re-ACL) attempted on each node;
each must be refused with NoAuth. Shared by ``tests/broker/test_zk_acl.py`` and the
secured multi-host stack (``tests/cluster/test_secured_cluster.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, Permissions

from broker_core.security.zk_acl import is_sensitive

USERS_NODE = "/config/users"
KEY_NODE = "/config/producer_id_key"  # the producer-token key (security.producer_token)


def outsider_auths(identity_user: str) -> list[list[tuple[str, str]] | None]:
    """Credentials of clients that must not change anything: none, another user, the
    brokers' user with a wrong password (a different digest)."""
    return [
        None,
        [("digest", "intruder:guess")],
        [("digest", f"{identity_user}:not-the-password")],
    ]


def walk(client: KazooClient, top: str) -> list[str]:
    """Every node at and below ``top``, parents first (as the brokers' identity)."""
    nodes, stack = [], [top]
    while stack:
        path = stack.pop()
        nodes.append(path)
        stack.extend(f"{path}/{c}" for c in sorted(client.get_children(path), reverse=True))
    return nodes


def refusals(outsider: KazooClient, path: str, *, top: bool) -> dict[str, str]:
    """Each change attempted on ``path``, mapped to what ZooKeeper answered. ``top``: the
    walk's top, whose parent is not an idemlog node, so its delete is not attempted."""
    attempts: dict[str, Any] = {
        "set": lambda: outsider.set(path, b"tampered"),
        "create": lambda: outsider.create(f"{path}/intruder", b"x"),
        "set_acls": lambda: outsider.set_acls(path, OPEN_ACL_UNSAFE),
    }
    if not top:
        attempts["delete"] = lambda: outsider.delete(path, recursive=False)
    answers = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            answers[name] = "ALLOWED"
        except NoAuthError:
            answers[name] = "NoAuth"
        except Exception as exc:  # anything but NoAuth is a failure of the guarantee
            answers[name] = type(exc).__name__
    return answers


def assert_secured(
    owner: KazooClient, outsiders: Iterable[KazooClient], top: str, identity_user: str
) -> list[str]:
    """No outsider can change any node under ``top``, nor read the users' nodes and the
    producer-token key; the metadata stays world-readable; every node's ACL is the
    brokers' digest ALL and world READ at most. ``owner`` authenticates as
    ``identity_user``. Returns the nodes walked."""
    nodes = walk(owner, top)
    users = [n for n in nodes if is_sensitive(n)]
    assert any(USERS_NODE in n for n in users) and any(KEY_NODE in n for n in users), nodes
    for outsider in outsiders:
        bad = {}
        for path in nodes:
            answers = refusals(outsider, path, top=path == top)
            if set(answers.values()) != {"NoAuth"}:
                bad[path] = answers
        assert not bad, bad
        for path in users:  # salted credentials and the key: the brokers' only
            for read in (outsider.get, outsider.get_children):
                try:
                    read(path)
                    raise AssertionError(f"{path} readable by an outsider")
                except NoAuthError:
                    pass
        for path in (n for n in nodes if not is_sensitive(n)):  # a metadata reader's view
            outsider.get(path)
    for path in nodes:  # the ACL itself: the brokers' digest ALL, world READ at most
        acl, _ = owner.get_acls(path)
        world = [a for a in acl if a.id.scheme == "world"]
        assert [a.perms for a in world] in ([], [Permissions.READ]), (path, acl)
        assert any(
            a.id.scheme == "digest" and a.id.id.startswith(identity_user + ":") for a in acl
        ), (path, acl)
    return nodes
