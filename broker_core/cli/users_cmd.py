"""``idemlog users add|remove|list``: the SCRAM users a SASL listener accepts.

The store is ZooKeeper's on a cluster (``--zookeeper host:port[/chroot]``, the brokers'
``zookeeper.connect``, with ``--config`` the brokers' ZooKeeper identity, ACLs and TLS:
``broker_core.cli.zk_cmd``) or the embedded broker's file (``--data-dir``, its ``log.dir``);
brokers pick a change up without a restart (docs/security.md). The password comes from
a prompt (not echoed, asked twice) or the first line of ``--password-file`` (``-``: stdin),
never from the command line, where other users could read it in the process list. Only
the salted credential is stored; ``list`` shows names and mechanisms.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from contextlib import AbstractContextManager
from pathlib import Path

from broker_core.cli.zk_cmd import add_store_arguments, open_store
from broker_core.errors import InvalidConfigError
from broker_core.security.credentials import (
    CredentialStore,
    FileCredentialStore,
    ZkCredentialStore,
    check_username,
)
from broker_core.security.scram import MECHANISM_NAMES, MIN_ITERATIONS, Mechanism, ScramCredential


def _store(args: argparse.Namespace) -> AbstractContextManager[CredentialStore]:
    return open_store(
        args, FileCredentialStore, lambda client, root: ZkCredentialStore(client, root, watch=False)
    )


def _password(args: argparse.Namespace) -> str:
    if args.password_file is not None:
        if args.password_file == "-":
            text = sys.stdin.readline()
        else:
            text = Path(args.password_file).read_text(encoding="utf-8").split("\n", 1)[0]
        password = text.rstrip("\r\n")
    else:
        password = getpass.getpass(f"password for {args.user}: ")
        if getpass.getpass("again: ") != password:
            raise InvalidConfigError("the two passwords differ")
    if not password:
        raise InvalidConfigError(f"empty password for user {args.user!r}")
    return password


def users_add(args: argparse.Namespace) -> int:
    user = check_username(args.user)
    mechanisms = [Mechanism.parse(m) for m in (args.mechanism or MECHANISM_NAMES)]
    password = _password(args)
    try:
        record = {
            m: ScramCredential.derive(m, password, iterations=args.iterations) for m in mechanisms
        }
    except ValueError as exc:
        raise InvalidConfigError(f"--iterations: {exc}") from None
    with _store(args) as store:
        store.upsert(user, record)
    names = ", ".join(m.sasl_name for m in mechanisms)
    print(f"user {user}: {names} ({args.iterations} iterations)")
    return 0


def users_remove(args: argparse.Namespace) -> int:
    with _store(args) as store:
        removed = store.remove(check_username(args.user))
    if not removed:
        print(f"idemlog: no user {args.user}", file=sys.stderr)
        return 1
    print(f"removed user {args.user}")
    return 0


def users_list(args: argparse.Namespace) -> int:
    with _store(args) as store:
        users = store.users()
    for name, record in sorted(users.items()):
        print(f"{name}  {','.join(sorted(m.sasl_name for m in record))}")
    if not users:
        print("no users")
    return 0


def fill_users(users: argparse.ArgumentParser) -> None:
    """Fill ``idemlog users``'s parser."""
    users_sub = users.add_subparsers(dest="action", required=True)
    for name, func, help_text in (
        ("add", users_add, "add a user or change its password"),
        ("remove", users_remove, "remove a user: its sessions end at once"),
        ("list", users_list, "user names and mechanisms"),
    ):
        cmd = users_sub.add_parser(name, help=help_text)
        add_store_arguments(cmd, "--data-dir")
        if name != "list":
            cmd.add_argument("user", help="the user name (principal User:<name>)")
        if name == "add":
            cmd.add_argument(
                "--mechanism",
                action="append",
                choices=MECHANISM_NAMES,
                help="repeatable; default: both",
            )
            cmd.add_argument(
                "--iterations",
                type=int,
                default=MIN_ITERATIONS,
                help=f"SCRAM's hash iterations (default and minimum: {MIN_ITERATIONS})",
            )
            cmd.add_argument(
                "--password-file",
                help="read the password from this file's first line ('-': stdin) "
                "instead of a prompt",
            )
        cmd.set_defaults(func=func)
