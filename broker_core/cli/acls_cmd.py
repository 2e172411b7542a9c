"""``idemlog acls add|remove|list``: the ACLs a broker with ``authorizer.enable`` checks.

Options as Kafka's ``kafka-acls.sh``: ``--allow-principal`` / ``--deny-principal``
(repeatable), ``--allow-host`` / ``--deny-host`` (default ``*``), ``--operation``
(repeatable), one resource (``--topic``, ``--group``, ``--transactional-id`` or
``--cluster``) and
``--resource-pattern-type literal|prefixed``. The store is ZooKeeper's on a cluster
(``--zookeeper host:port[/chroot]``, the brokers' ``zookeeper.connect``, with ``--config``
the brokers' ZooKeeper identity, node ACLs and TLS: ``broker_core.cli.zk_cmd``) or the embedded
broker's file (``--data-dir``/``--log-dir``, its ``log.dir``); brokers pick a change up
at their next request, without a restart (docs/security.md, Authorization).
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import AbstractContextManager

from broker_core.cli.zk_cmd import add_store_arguments, open_store
from broker_core.errors import InvalidConfigError
from broker_core.security.acl import (
    CLUSTER_NAME,
    WILDCARD,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
)
from broker_core.security.acl_store import AclStore, FileAclStore, ZkAclStore, binding_doc
from broker_core.security.principal import Principal


def _store(args: argparse.Namespace) -> AbstractContextManager[AclStore]:
    return open_store(
        args, FileAclStore, lambda client, root: ZkAclStore(client, root, watch=False)
    )


def _pattern(args: argparse.Namespace, *, required: bool) -> ResourcePattern | None:
    named = [
        (t, n)
        for t, n in (
            (ResourceType.TOPIC, args.topic),
            (ResourceType.GROUP, args.group),
            (ResourceType.TRANSACTIONAL_ID, args.transactional_id),
            (ResourceType.CLUSTER, CLUSTER_NAME if args.cluster else None),
        )
        if n is not None
    ]
    if not named:
        if required:
            raise InvalidConfigError(
                "name a resource: --topic, --group, --transactional-id or --cluster"
            )
        return None
    if len(named) > 1:
        raise InvalidConfigError(
            "one resource at a time: --topic, --group, --transactional-id or --cluster"
        )
    kind, name = named[0]
    pattern = PatternType.parse(args.resource_pattern_type)
    if kind is ResourceType.CLUSTER and pattern is PatternType.PREFIXED:
        raise InvalidConfigError("--resource-pattern-type prefixed: not for --cluster")
    return ResourcePattern(kind, pattern, name)


def _principal(text: str) -> Principal:
    try:
        return Principal.parse(text)
    except ValueError as exc:
        raise InvalidConfigError(f"--allow-principal/--deny-principal: {exc}") from None


def _bindings(args: argparse.Namespace) -> list[AclBinding]:
    pattern = _pattern(args, required=True)
    assert pattern is not None
    if not args.allow_principal and not args.deny_principal:
        raise InvalidConfigError("name a principal: --allow-principal or --deny-principal")
    if not args.operation:
        raise InvalidConfigError("name an operation: --operation (repeatable)")
    try:
        operations = [Operation.parse(o) for o in args.operation]
    except ValueError as exc:
        raise InvalidConfigError(f"--operation: {exc}") from None
    wanted = [
        (Permission.ALLOW, p, h)
        for p in args.allow_principal or []
        for h in args.allow_host or [WILDCARD]
    ] + [
        (Permission.DENY, p, h)
        for p in args.deny_principal or []
        for h in args.deny_host or [WILDCARD]
    ]
    bindings = []
    for permission, principal, host in wanted:
        for op in operations:
            try:
                bindings.append(AclBinding.of(pattern, _principal(principal), op, permission, host))
            except ValueError as exc:
                raise InvalidConfigError(f"{pattern}: {exc}") from None
    return bindings


def acls_add(args: argparse.Namespace) -> int:
    bindings = _bindings(args)
    with _store(args) as store:
        added = store.add(bindings)
    for b in bindings:
        print(f"acl {b}")
    print(f"{added} added, {len(bindings) - added} already there")
    return 0


def acls_remove(args: argparse.Namespace) -> int:
    bindings = _bindings(args)
    with _store(args) as store:
        removed = store.remove(bindings)
    if removed == 0:
        print("idemlog: no such ACL", file=sys.stderr)
        return 1
    print(f"{removed} removed")
    return 0


def acls_list(args: argparse.Namespace) -> int:
    pattern = _pattern(args, required=False)
    with _store(args) as store:
        found = [b for b in store.bindings() if pattern is None or b.pattern == pattern]
    if args.json:
        print(json.dumps([binding_doc(b) for b in found], indent=2))
        return 0
    for b in found:
        print(f"acl {b}")
    if not found:
        print("no ACLs")
    return 0


def fill_acls(acls: argparse.ArgumentParser) -> None:
    """Fill ``idemlog acls``'s parser."""
    acls_sub = acls.add_subparsers(dest="action", required=True)
    for name, func, help_text in (
        ("add", acls_add, "allow or deny principals an operation on a resource"),
        ("remove", acls_remove, "remove exactly these ACLs"),
        ("list", acls_list, "the ACLs, of one resource pattern or all"),
    ):
        cmd = acls_sub.add_parser(name, help=help_text)
        add_store_arguments(cmd, "--data-dir", "--log-dir")
        cmd.add_argument("--topic", help="a topic name (literal: '*' is every topic)")
        cmd.add_argument("--group", help="a Kafka consumer group id (literal: '*' is every group)")
        cmd.add_argument("--transactional-id", help="a transactional id (or a prefix)")
        cmd.add_argument("--cluster", action="store_true", help="the Cluster resource")
        cmd.add_argument(
            "--resource-pattern-type",
            choices=["literal", "prefixed"],
            default="literal",
            help="literal (default): the name; prefixed: every name starting with it",
        )
        if name == "list":
            cmd.add_argument("--json", action="store_true", help="print JSON")
        else:
            for flag, text in (
                ("--allow-principal", "principal allowed, Type:name (User:alice, User:*)"),
                ("--deny-principal", "principal denied, Type:name"),
                ("--allow-host", "host the allow holds for (default: *)"),
                ("--deny-host", "host the deny holds for (default: *)"),
                (
                    "--operation",
                    "Read, Write, Create, Delete, Alter, Describe, "
                    "DescribeConfigs, AlterConfigs, IdempotentWrite, ClusterAction, All",
                ),
            ):
                cmd.add_argument(flag, action="append", help=text + " (repeatable)")
        cmd.set_defaults(func=func)
