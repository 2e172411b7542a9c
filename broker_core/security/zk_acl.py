"""Who may change idemlog's znodes: the brokers' ZooKeeper identity and the nodes' ACLs.

Kafka's ``zookeeper.set.acl``: with it, every node a broker, the coordinator or an
``idemlog`` command creates is world-readable and changeable only by the brokers'
identity (ZooKeeper's ``digest`` scheme, one ``user:password`` all brokers share, as
Kafka's brokers share one principal); the SCRAM users' nodes (``<root>/config/users``
and below: salted credentials) and the producer-token key (``<root>/config/
producer_id_key``) are not even world-readable. docs/security.md
(ZooKeeper: authentication and ACLs) says how to set it up and why.

One rule, one place: :func:`acl_for` gives a path's ACL from the kazoo client it is
created with (the client carries the policy: ``kazoo_arguments`` sets its ``auth_data``
and ``default_acl``), and every creation in product code goes through :func:`create_async`,
:func:`ensure_path_async`, :func:`ensure_path` or :func:`transaction_create`
(``tests/unit/test_zk_acl.py`` checks that no other call site exists). A client without a
``default_acl`` creates open nodes, as before.

State: none beyond the client's two attributes; the ACL lists are built per call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.security import (
    ACL,
    ANYONE_ID_UNSAFE,
    OPEN_ACL_UNSAFE,
    Id,
    Permissions,
    make_digest_acl_credential,
)

from broker_core.config import ConfigKey
from broker_core.errors import InvalidConfigError

ZK_SET_ACL = "zookeeper.set.acl"
ZK_DIGEST_USERNAME = "zookeeper.auth.digest.username"
ZK_DIGEST_PASSWORD = "zookeeper.auth.digest.password"
DIGEST_SCHEME = "digest"
# Under the cluster's root znode: the SCRAM users (credentials.USERS_ZNODE) and the key
# that signs producer tokens (producer_token.KEY_ZNODE). Kafka keeps /config/users
# readable by the brokers only; a reader of the metadata needs none of it.
SENSITIVE_LEVELS = (("config", "users"), ("config", "producer_id_key"))

ZK_ACL_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        ZK_SET_ACL,
        bool,
        False,
        "Create every ZooKeeper node with an ACL (Kafka's name): world-readable, changeable "
        "only by the brokers' identity (zookeeper.auth.digest.*); the SCRAM users' nodes "
        "and the producer-token key readable by the brokers only. Existing nodes keep "
        "theirs: `idemlog zookeeper set-acl` secures them.",
    ),
    ConfigKey(
        ZK_DIGEST_USERNAME,
        str,
        "",
        "User of ZooKeeper's digest scheme the broker authenticates as (every broker the "
        "same: Kafka's JAAS Client section's username). Empty: no authentication.",
    ),
    ConfigKey(
        ZK_DIGEST_PASSWORD,
        str,
        "",
        "Password of zookeeper.auth.digest.username (a secret: keep the file mode 0600).",
    ),
)


@dataclass(frozen=True)
class ZkAuth:
    """The checked ``zookeeper.set.acl`` / ``zookeeper.auth.digest.*`` values.

    ``username`` empty: the client does not authenticate (then ``set_acl`` is False).
    """

    set_acl: bool = False
    username: str = ""
    password: str = ""

    @classmethod
    def from_values(cls, values: Mapping[str, object]) -> ZkAuth:
        """From typed values (missing keys: defaults). Raises InvalidConfigError naming
        the key when the pair is incomplete, the user holds ``:`` (the digest scheme splits
        ``user:password`` at the first one), or ``zookeeper.set.acl=true`` lacks them."""
        set_acl = bool(values.get(ZK_SET_ACL, False))
        username = str(values.get(ZK_DIGEST_USERNAME, "") or "")
        password = str(values.get(ZK_DIGEST_PASSWORD, "") or "")
        if ":" in username:
            raise InvalidConfigError(
                f"{ZK_DIGEST_USERNAME}={username!r} holds ':', which ZooKeeper's digest "
                "scheme uses to split user and password"
            )
        if bool(username) != bool(password):
            have, missing = (
                (ZK_DIGEST_USERNAME, ZK_DIGEST_PASSWORD)
                if username
                else (ZK_DIGEST_PASSWORD, ZK_DIGEST_USERNAME)
            )
            raise InvalidConfigError(f"{have} is set but {missing} is empty: set both or neither")
        if set_acl and not username:
            raise InvalidConfigError(
                f"{ZK_SET_ACL}=true needs the brokers' ZooKeeper identity: set "
                f"{ZK_DIGEST_USERNAME} and {ZK_DIGEST_PASSWORD}"
            )
        return cls(set_acl, username, password)

    @property
    def identity(self) -> str:
        """How ZooKeeper names this client: ``digest:user:<hash>``, or ``world:anyone``."""
        if not self.username:
            return "world:anyone"
        return f"{DIGEST_SCHEME}:{make_digest_acl_credential(self.username, self.password)}"

    def secure_acl(self) -> list[ACL]:
        """Every permission for the brokers' identity, READ for the world."""
        if not self.username:
            raise InvalidConfigError(
                f"an ACL needs the brokers' identity: set {ZK_DIGEST_USERNAME} and "
                f"{ZK_DIGEST_PASSWORD}"
            )
        owner = Id(DIGEST_SCHEME, make_digest_acl_credential(self.username, self.password))
        return [ACL(Permissions.ALL, owner), ACL(Permissions.READ, ANYONE_ID_UNSAFE)]

    def kazoo_arguments(self, *, set_acl: bool | None = None) -> dict[str, Any]:
        """``KazooClient`` keyword arguments: the digest ``auth_data`` when a user is set
        (sent at every connect, so a new session is authenticated too), and the
        ``default_acl`` :func:`acl_for` derives every node's ACL from when ``set_acl``
        (default: ``zookeeper.set.acl``)."""
        arguments: dict[str, Any] = {}
        if self.username:
            arguments["auth_data"] = [(DIGEST_SCHEME, f"{self.username}:{self.password}")]
        if self.set_acl if set_acl is None else set_acl:
            arguments["default_acl"] = self.secure_acl()
        return arguments

    def may_change(self, acl: list[ACL]) -> bool:
        """Whether a node with ``acl`` lets this identity create children and write it."""
        needed = Permissions.WRITE | Permissions.CREATE
        mine = {"world:anyone", self.identity}
        return any(a.perms & needed == needed and f"{a.id.scheme}:{a.id.id}" in mine for a in acl)


def is_sensitive(path: str) -> bool:
    """Whether ``path`` is the SCRAM users' node or the producer-token key, or below
    them (not world-readable)."""
    levels = [level for level in path.split("/") if level]
    return any(
        tuple(levels[i : i + len(secret)]) == secret
        for secret in SENSITIVE_LEVELS
        for i in range(len(levels) - len(secret) + 1)
    )


def acl_for(client: Any, path: str) -> list[ACL]:
    """The ACL a node at ``path`` is created with (or set to by ``idemlog zookeeper
    set-acl``) through ``client``: open when the client has no ``default_acl``; else that
    (the brokers' identity ALL, world READ), without the world's READ on a sensitive
    node (:func:`is_sensitive`)."""
    default: list[ACL] | None = getattr(client, "default_acl", None)
    if not default:
        return list(OPEN_ACL_UNSAFE)
    if is_sensitive(path):
        return [a for a in default if a.id != ANYONE_ID_UNSAFE]
    return list(default)


def create_async(
    client: Any,
    path: str,
    value: bytes = b"",
    *,
    ephemeral: bool = False,
    makepath: bool = False,
) -> Any:
    """``client.create_async`` with ``path``'s ACL; missing parents (``makepath``) get the
    same one (kazoo's), so never use ``makepath`` below a level of another kind."""
    return client.create_async(
        path, value, acl=acl_for(client, path), ephemeral=ephemeral, makepath=makepath
    )


def ensure_path_async(client: Any, path: str) -> Any:
    """``client.ensure_path_async`` with ``path``'s ACL for every missing level; refuses a
    sensitive path, whose parents must stay world-readable (use :func:`ensure_path`)."""
    if is_sensitive(path):
        raise ValueError(f"{path}: sensitive; ensure_path creates each level with its own ACL")
    return client.ensure_path_async(path, acl=acl_for(client, path))


def ensure_path(client: Any, path: str) -> None:
    """Create every missing level of ``path``, each with its own ACL (synchronous)."""
    from kazoo.exceptions import NodeExistsError

    prefix = ""
    for level in (level for level in path.split("/") if level):
        prefix = f"{prefix}/{level}"
        if client.exists(prefix) is None:
            # Created meanwhile: its creator gave it the same rule's ACL.
            with contextlib.suppress(NodeExistsError):
                client.create(prefix, b"", acl=acl_for(client, prefix))


def transaction_create(client: Any, transaction: Any, path: str, value: bytes) -> None:
    """Add the creation of ``path`` (with its ACL) to a kazoo ``transaction`` of ``client``."""
    transaction.create(path, value, acl=acl_for(client, path))


def check_access(client: Any, path: str, auth: ZkAuth) -> None:
    """Raise InvalidConfigError (one line naming ``zookeeper.auth.digest.*``) when the
    deepest existing node of ``path`` does not let ``auth``'s identity write it and create
    under it: a broker without the brokers' credentials on a secured tree is refused at
    start, clearly, instead of failing its first registration with a bare NoAuth. Only the
    message depends on this read; ZooKeeper itself refuses every write not allowed."""
    from kazoo.exceptions import NoNodeError

    node = path
    while True:
        try:
            acl, _stat = client.get_acls(node)
            break
        except NoNodeError:
            if node in ("", "/"):
                return
            node = node.rsplit("/", 1)[0] or "/"
    if auth.may_change(acl):
        return
    owners = ", ".join(
        sorted(
            f"{a.id.scheme}:{a.id.id.split(':', 1)[0]}" for a in acl if a.perms & Permissions.WRITE
        )
    )
    raise InvalidConfigError(
        f"ZooKeeper node {node} can be changed only by {owners or 'nobody'}, and this broker "
        f"authenticates as {auth.username or 'nobody'}: set {ZK_DIGEST_USERNAME} and "
        f"{ZK_DIGEST_PASSWORD} to the brokers' ZooKeeper identity"
    )
