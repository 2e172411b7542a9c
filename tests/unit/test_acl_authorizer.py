"""The ACL decision (broker_core.security.acl.Authorizer): Kafka's matching rules and
implied operations; the authorization keys' start check; and docs/security.md's table of
what each request needs, which must be the code's (server.authorization.RULES)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_core.errors import InvalidConfigError
from broker_core.protocol.wire import Action
from broker_core.security.acl import (
    CLUSTER,
    AclBinding,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    Resource,
    ResourcePattern,
    ResourceType,
    parse_super_users,
)
from broker_core.security.principal import Principal
from broker_core.server.authorization import FETCH, PRODUCE, RULES, host_of_peer, render_rules_table
from broker_core.server.config import BrokerConfig

ROOT = Path(__file__).resolve().parents[2]
ALICE, BOB = Principal.user("alice"), Principal.user("bob")
HOST = "10.0.0.1"
O = Operation


def topic(name: str, pattern: PatternType = PatternType.LITERAL) -> ResourcePattern:
    return ResourcePattern(ResourceType.TOPIC, pattern, name)


def allow(p: ResourcePattern, who: Principal, op: Operation, host: str = "*") -> AclBinding:
    return AclBinding.of(p, who, op, Permission.ALLOW, host)


def deny(p: ResourcePattern, who: Principal, op: Operation, host: str = "*") -> AclBinding:
    return AclBinding.of(p, who, op, Permission.DENY, host)


AUTH = Authorizer([Principal.user("admin")], allow_if_no_acl=False)
PAY = Resource(ResourceType.TOPIC, "payments")


def may(
    bindings: list[AclBinding],
    op: Operation,
    who: Principal = ALICE,
    host: str = HOST,
    resource: Resource = PAY,
    auth: Authorizer = AUTH,
) -> bool:
    return auth.authorize(bindings, who, host, op, resource)


def test_no_acl_denies_and_super_users_need_none() -> None:
    assert not may([], O.WRITE)
    assert may([], O.WRITE, who=Principal.user("admin"))
    assert may([], O.CLUSTER_ACTION, who=Principal.user("admin"), resource=CLUSTER)


def test_allow_matches_principal_host_and_operation_only() -> None:
    acl = [allow(topic("payments"), ALICE, O.WRITE, HOST)]
    assert may(acl, O.WRITE)
    assert not may(acl, O.WRITE, who=BOB)
    assert not may(acl, O.WRITE, host="10.0.0.2")
    assert not may(acl, O.READ)
    assert not may(acl, O.WRITE, resource=Resource(ResourceType.TOPIC, "payments2"))
    assert not may(acl, O.WRITE, resource=Resource(ResourceType.TRANSACTIONAL_ID, "payments"))


def test_implied_operations_are_kafkas() -> None:
    for op in (O.READ, O.WRITE, O.DELETE, O.ALTER):
        assert may([allow(topic("payments"), ALICE, op)], O.DESCRIBE), op
    assert not may([allow(topic("payments"), ALICE, O.CREATE)], O.DESCRIBE)
    assert not may([allow(topic("payments"), ALICE, O.DESCRIBE)], O.READ)
    assert may([allow(topic("payments"), ALICE, O.ALTER_CONFIGS)], O.DESCRIBE_CONFIGS)
    everything = [allow(topic("payments"), ALICE, O.ALL)]
    assert all(may(everything, op) for op in (O.READ, O.WRITE, O.DELETE, O.DESCRIBE))
    # A deny of Read does not deny Describe; a deny of All denies every operation.
    acl = [allow(topic("payments"), ALICE, O.ALL), deny(topic("payments"), ALICE, O.READ)]
    assert may(acl, O.DESCRIBE) and not may(acl, O.READ) and may(acl, O.WRITE)
    acl = [allow(topic("payments"), ALICE, O.WRITE), deny(topic("payments"), ALICE, O.ALL)]
    assert not may(acl, O.WRITE) and not may(acl, O.DESCRIBE)


def test_deny_wins_over_every_allow_and_wildcards() -> None:
    acl = [
        allow(topic("*"), Principal.user("*"), O.ALL),
        deny(topic("pay", PatternType.PREFIXED), ALICE, O.WRITE, HOST),
    ]
    assert not may(acl, O.WRITE)
    assert may(acl, O.WRITE, host="10.0.0.2")  # the deny holds for its host only
    assert may(acl, O.WRITE, who=BOB)
    assert may(acl, O.READ)


def test_prefixed_and_wildcard_patterns() -> None:
    sink = ResourcePattern(ResourceType.TRANSACTIONAL_ID, PatternType.PREFIXED, "job/")
    acl = [allow(sink, ALICE, O.WRITE)]
    for name, ok in (
        ("job/", True),
        ("job/0", True),
        ("job/17", True),
        ("job", False),
        ("jobs/0", False),
        ("other/0", False),
    ):
        assert may(acl, O.WRITE, resource=Resource(ResourceType.TRANSACTIONAL_ID, name)) is ok, name
    # A literal "*" is every name; a literal of another name only that one.
    assert may([allow(topic("*"), ALICE, O.READ)], O.READ)
    assert not may([allow(topic("pay"), ALICE, O.READ)], O.READ)


def test_allow_everyone_if_no_acl_found_only_where_no_acl_names_the_resource() -> None:
    lax = Authorizer([], allow_if_no_acl=True)
    assert may([], O.WRITE, auth=lax)
    assert may([allow(topic("other"), BOB, O.READ)], O.WRITE, auth=lax)
    assert not may([allow(topic("payments"), BOB, O.READ)], O.WRITE, auth=lax)


def test_bindings_are_checked_when_built() -> None:
    txn = ResourcePattern(ResourceType.TRANSACTIONAL_ID, PatternType.LITERAL, "t")
    with pytest.raises(ValueError, match="Read does not apply to a TransactionalId"):
        allow(txn, ALICE, O.READ)
    with pytest.raises(ValueError, match="PREFIXED pattern of"):
        allow(topic("*", PatternType.PREFIXED), ALICE, O.READ)
    with pytest.raises(ValueError, match="kafka-cluster"):
        allow(ResourcePattern(ResourceType.CLUSTER, PatternType.LITERAL, "c"), ALICE, O.ALTER)
    assert Operation.parse("idempotent_write") is O.IDEMPOTENT_WRITE
    assert Operation.parse("clusteraction") is O.CLUSTER_ACTION
    with pytest.raises(ValueError, match="operation 'Fly'"):
        Operation.parse("Fly")
    assert parse_super_users("User:a; User:b;") == [Principal.user("a"), Principal.user("b")]


def test_peer_hosts() -> None:
    assert host_of_peer("ipv4:127.0.0.1:51234") == "127.0.0.1"
    assert host_of_peer("ipv6:[::1]:51234") == "::1"
    assert host_of_peer("unix:/tmp/s") == "unix:/tmp/s"


def test_every_request_has_a_rule_and_the_docs_table_is_the_codes() -> None:
    assert set(RULES) == {PRODUCE, FETCH, *Action}
    docs = (ROOT / "docs" / "security.md").read_text()
    assert render_rules_table() in docs, "docs/security.md: paste render_rules_table()"


def _cluster(**extra: str) -> dict[str, str]:
    return {
        "zookeeper.connect": "127.0.0.1:2181/x",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.inter.broker.username": "broker",
        "sasl.inter.broker.password": "pw",
        "authorizer.enable": "true",
        **extra,
    }


def test_a_cluster_broker_must_be_a_super_user() -> None:
    with pytest.raises(InvalidConfigError, match="User:broker must be in super.users"):
        BrokerConfig.from_mapping(_cluster())
    with pytest.raises(InvalidConfigError, match="User:ANONYMOUS must be in super.users"):
        BrokerConfig.from_mapping({"zookeeper.connect": "h:1", "authorizer.enable": "true"})
    with pytest.raises(InvalidConfigError, match="super.users: principal 'broker'"):
        BrokerConfig.from_mapping(_cluster(**{"super.users": "broker"}))
    cfg = BrokerConfig.from_mapping(_cluster(**{"super.users": "User:admin;User:broker"}))
    assert cfg.authorization.enabled
    assert cfg.authorization.super_users == {Principal.user("admin"), Principal.user("broker")}
    # Embedded there are no other brokers to serve: nothing to require.
    assert BrokerConfig.from_mapping({"authorizer.enable": "true"}).authorization.enabled
