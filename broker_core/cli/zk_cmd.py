"""The commands' ZooKeeper client, and ``idemlog zookeeper set-acl`` (the migration).

Every command that writes to ZooKeeper (``idemlog users``, ``idemlog acls``)
opens its client with :func:`open_zookeeper`: ``--zookeeper`` is the brokers'
``zookeeper.connect`` and ``--config`` a broker properties file whose
``zookeeper.set.acl``, ``zookeeper.auth.digest.*`` and ``zookeeper.ssl.*`` the command uses
as a broker would (the same file the brokers start with, or one holding only those keys): it
authenticates as the brokers' identity, and creates its nodes with the brokers' ACL.

``idemlog zookeeper set-acl --secure|--unsecure`` is Kafka's
``zookeeper-security-migration.sh --zookeeper.acl secure|unsecure``: it walks the
cluster's tree (the whole chroot; without one ``/idemlog`` and
``/latest_producer_id_block``) and sets every node's ACL
to what a broker with ``zookeeper.set.acl=true`` (``--secure``) or ``false``
(``--unsecure``) would create it with. Each change is conditional on the ACL version read
(a concurrent change is read again); a node already right is left alone, so a second run
changes nothing. Bound: the walk holds one list of children per level of the tree.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from broker_core.cli.failures import Unreachable
from broker_core.config import load_properties
from broker_core.errors import InvalidConfigError
from broker_core.producer_ids.block import LATEST_PRODUCER_ID_BLOCK_PATH
from broker_core.security import zk_acl
from broker_core.security.zk_acl import ZkAuth
from broker_core.security.zk_tls import ZkTlsSettings
from broker_core.server.config.broker_config import BROKER_CONFIG, ZK_ROOT, split_zookeeper_connect

T = TypeVar("T")

ZK_TIMEOUT_S = 15.0
PROGRESS_EVERY = 100  # default nodes between two progress lines of set-acl


@dataclass(frozen=True)
class CommandZk:
    """What a command's ZooKeeper client takes from ``--config``: the identity and ACL
    policy (``zookeeper.set.acl``, ``zookeeper.auth.digest.*``) and the TLS arguments
    (``zookeeper.ssl.*``, files checked)."""

    auth: ZkAuth = field(default_factory=ZkAuth)
    tls: Mapping[str, Any] = field(default_factory=dict)


def command_zk(config: str | None) -> CommandZk:
    """The ``zookeeper.*`` settings of ``--config`` (none: anonymous, open, plaintext);
    the file's keys are checked as a broker checks them (InvalidConfigError naming one)."""
    if config is None:
        return CommandZk()
    path = Path(config)
    if not path.is_file():
        raise InvalidConfigError(f"--config {config}: no such file; name the brokers' properties")
    values = BROKER_CONFIG.parse(load_properties(path))
    return CommandZk(
        ZkAuth.from_values(values), ZkTlsSettings.from_values(values).kazoo_arguments()
    )


@contextmanager
def open_zookeeper(
    zookeeper: str, settings: CommandZk, *, set_acl: bool | None = None
) -> Iterator[tuple[Any, str]]:
    """A started kazoo client on ``zookeeper``'s hosts *without* its chroot (so a command
    can create every missing level of it, as a broker does), and the chroot ("" for none).
    It connects as ``settings`` say (TLS), authenticates as ``settings.auth`` and creates
    nodes with its ACL (``set_acl``: instead of ``zookeeper.set.acl``). Raises
    :class:`Unreachable` naming ``--zookeeper`` when no server answers within
    ``ZK_TIMEOUT_S``."""
    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError

    auth = settings.auth
    hosts, chroot = split_zookeeper_connect(zookeeper.strip())
    client: Any = KazooClient(
        hosts=hosts,
        timeout=ZK_TIMEOUT_S,
        **settings.tls,
        **auth.kazoo_arguments(set_acl=set_acl),
    )
    # Its reconnect warnings, one per retry, would bury the one line said below.
    kazoo_log = logging.getLogger("kazoo.client")
    level = kazoo_log.level
    kazoo_log.setLevel(logging.ERROR)
    try:
        client.start(timeout=ZK_TIMEOUT_S)
    except KazooTimeoutError:
        client.stop()  # its connection thread retries until stopped
        client.close()
        raise Unreachable(
            f"--zookeeper {zookeeper}: no ZooKeeper server answered within "
            f"{ZK_TIMEOUT_S:g} s; start ZooKeeper or correct --zookeeper"
        ) from None
    finally:
        kazoo_log.setLevel(level)
    from kazoo.exceptions import NoAuthError

    try:
        yield client, chroot
    except NoAuthError:
        who = f"as {auth.username}" if auth.username else "without credentials"
        raise InvalidConfigError(
            f"--zookeeper {zookeeper}: ZooKeeper refused the command {who} (NoAuth): pass "
            f"--config with the brokers' {zk_acl.ZK_DIGEST_USERNAME} and "
            f"{zk_acl.ZK_DIGEST_PASSWORD}"
        ) from None
    finally:
        client.stop()
        client.close()


def add_store_arguments(cmd: Any, *data_dir_flags: str) -> None:
    """The options :func:`open_store` reads, on a security command's parser: one of
    ``--zookeeper`` or ``data_dir_flags`` (``--data-dir`` and its aliases), and
    ``--config``."""
    where = cmd.add_mutually_exclusive_group(required=True)
    where.add_argument("--zookeeper", help="the cluster's zookeeper.connect")
    where.add_argument(*data_dir_flags, dest="data_dir", help="the embedded broker's log.dir")
    cmd.add_argument(
        "--config",
        help="with --zookeeper: broker properties whose zookeeper.set.acl, "
        "zookeeper.auth.digest.* and zookeeper.ssl.* the command uses (docs/security.md)",
    )


@contextmanager
def open_store(
    args: argparse.Namespace,
    file_store: Callable[[Path], T],
    zk_store: Callable[[Any, str], T],
) -> Iterator[T]:
    """The store a security command (``idemlog users``, ``idemlog acls``) works on: the
    embedded broker's file in ``--data-dir`` (``file_store(path)``), or ZooKeeper's under
    the brokers' root (``zk_store(client, root)``, the client authenticated with
    ``--config``'s ZooKeeper identity, node ACLs and TLS, closed on exit). Raises
    :class:`InvalidConfigError` when ``--data-dir`` is no directory or comes with
    ``--config``; :class:`Unreachable` as :func:`open_zookeeper`."""
    if args.data_dir is not None:
        path = Path(args.data_dir)
        if not path.is_dir():
            raise InvalidConfigError(f"--data-dir {args.data_dir}: no such directory")
        if args.config is not None:
            raise InvalidConfigError("--config is for --zookeeper (the embedded file has no ACL)")
        yield file_store(path)
        return
    with open_zookeeper(args.zookeeper, command_zk(args.config)) as (client, chroot):
        yield zk_store(client, chroot + ZK_ROOT)


@dataclass
class AclWalk:
    """What a set-acl run did: nodes walked, changed, already right, gone meanwhile."""

    walked: int = 0
    changed: int = 0
    unchanged: int = 0
    gone: int = 0


def set_acls(
    client: Any,
    top: str,
    *,
    progress: Any = print,
    every: int = PROGRESS_EVERY,
    result: AclWalk | None = None,
) -> AclWalk:
    """Set :func:`zk_acl.acl_for` on ``top`` and every node below it, parents first.

    Each set is conditional on the ACL version just read (BadVersion: read again); a node
    deleted meanwhile is counted as gone. Raises InvalidConfigError naming the node and
    ``zookeeper.auth.digest.*`` when the client may not change a node's ACL (NoAuth).
    """
    from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError

    result = AclWalk() if result is None else result  # counts go on across several tops
    stack = [top]
    while stack:
        path = stack.pop()
        wanted = zk_acl.acl_for(client, path)
        try:
            while True:
                current, stat = client.get_acls(path)
                if sorted(current) == sorted(wanted):
                    result.unchanged += 1
                    break
                try:
                    client.set_acls(path, wanted, version=stat.aversion)
                except BadVersionError:
                    continue  # changed under us: read again
                result.changed += 1
                break
            children = client.get_children(path)
        except NoNodeError:
            result.gone += 1
            continue
        except NoAuthError:
            raise InvalidConfigError(
                f"ZooKeeper node {path}: not allowed to change its ACL (NoAuth); --config's "
                f"{zk_acl.ZK_DIGEST_USERNAME} and {zk_acl.ZK_DIGEST_PASSWORD} must be the "
                "identity that owns it"
            ) from None
        result.walked += 1
        if result.walked % every == 0:
            progress(f"set-acl: {result.walked} nodes, {result.changed} changed")
        stack.extend(f"{path.rstrip('/')}/{child}" for child in sorted(children, reverse=True))
    return result


def zookeeper_set_acl(args: argparse.Namespace) -> int:
    secure = bool(args.secure)
    settings = command_zk(args.config)
    auth = settings.auth
    if secure and not auth.username:
        raise InvalidConfigError(
            f"--secure needs the brokers' identity: --config must set "
            f"{zk_acl.ZK_DIGEST_USERNAME} and {zk_acl.ZK_DIGEST_PASSWORD}"
        )
    with open_zookeeper(args.zookeeper, settings, set_acl=secure) as (client, chroot):
        # The chroot is the cluster's; without one, only idemlog's two top nodes (never
        # ZooKeeper's own /zookeeper or another application's nodes).
        tops = [chroot] if chroot else [ZK_ROOT, LATEST_PRODUCER_ID_BLOCK_PATH]
        tops = [top for top in tops if client.exists(top) is not None]
        if not tops:
            raise InvalidConfigError(f"--zookeeper {args.zookeeper}: no idemlog node to walk")
        where = ", ".join(tops)
        mode = "secure" if secure else "unsecure"
        print(f"set-acl: walking {where} ({mode}, as {auth.username or 'nobody'})", flush=True)
        result = AclWalk()
        for top in tops:
            set_acls(
                client,
                top,
                progress=lambda line: print(line, flush=True),
                every=args.progress_every,
                result=result,
            )
    print(
        f"{mode}d {result.walked} nodes under {where}: {result.changed} changed, "
        f"{result.unchanged} already so, {result.gone} gone meanwhile"
    )
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1")
    return value


def fill_zookeeper(zk: argparse.ArgumentParser) -> None:
    """Fill ``idemlog zookeeper``'s parser (``set-acl``)."""
    zk_sub = zk.add_subparsers(dest="action", required=True)
    cmd = zk_sub.add_parser(
        "set-acl",
        help="set every idemlog node's ACL (Kafka's zookeeper-security-migration)",
    )
    cmd.add_argument("--zookeeper", required=True, help="the brokers' zookeeper.connect")
    cmd.add_argument(
        "--config",
        help="broker properties whose zookeeper.auth.digest.* identity owns the nodes",
    )
    cmd.add_argument(
        "--progress-every",
        type=_positive,
        default=PROGRESS_EVERY,
        help=f"print a progress line every N nodes (default {PROGRESS_EVERY})",
    )
    mode = cmd.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--secure",
        action="store_true",
        help="world-readable, changeable by the brokers' identity only (users: brokers only)",
    )
    mode.add_argument(
        "--unsecure", action="store_true", help="open to anyone again (ZooKeeper's default)"
    )
    cmd.set_defaults(func=zookeeper_set_acl)
