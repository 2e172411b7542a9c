"""The ACL decision (broker_core.security.acl.Authorizer): Kafka's matching rules and
implied operations; the authorization keys' start check; and docs/security.md's table of
what each request needs, which must be the code's (server.access.authorization.RULES)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_core.errors import InvalidConfigError
from broker_core.protocol.wire import Action
from broker_core.security.acl import (
    CLUSTER,
    AclBinding,
    AclIndex,
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
from broker_core.server.access.authorization import (
    FETCH,
    PRODUCE,
    RULES,
    host_of_peer,
    render_rules_table,
)
from broker_core.server.config.broker_config import BrokerConfig
from testkit.tls import make_certs

ROOT = Path(__file__).resolve().parents[2]
ALICE, BOB = Principal.user("alice"), Principal.user("bob")
HOST = "10.0.0.1"
Op = Operation


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
    assert not may([], Op.WRITE)
    assert may([], Op.WRITE, who=Principal.user("admin"))
    assert may([], Op.CLUSTER_ACTION, who=Principal.user("admin"), resource=CLUSTER)


def test_allow_matches_principal_host_and_operation_only() -> None:
    acl = [allow(topic("payments"), ALICE, Op.WRITE, HOST)]
    assert may(acl, Op.WRITE)
    assert not may(acl, Op.WRITE, who=BOB)
    assert not may(acl, Op.WRITE, host="10.0.0.2")
    assert not may(acl, Op.READ)
    assert not may(acl, Op.WRITE, resource=Resource(ResourceType.TOPIC, "payments2"))
    assert not may(acl, Op.WRITE, resource=Resource(ResourceType.TRANSACTIONAL_ID, "payments"))


def test_implied_operations_are_kafkas() -> None:
    for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        assert may([allow(topic("payments"), ALICE, op)], Op.DESCRIBE), op
    assert not may([allow(topic("payments"), ALICE, Op.CREATE)], Op.DESCRIBE)
    assert not may([allow(topic("payments"), ALICE, Op.DESCRIBE)], Op.READ)
    assert may([allow(topic("payments"), ALICE, Op.ALTER_CONFIGS)], Op.DESCRIBE_CONFIGS)
    everything = [allow(topic("payments"), ALICE, Op.ALL)]
    assert all(may(everything, op) for op in (Op.READ, Op.WRITE, Op.DELETE, Op.DESCRIBE))
    # A deny of Read does not deny Describe; a deny of All denies every operation.
    acl = [allow(topic("payments"), ALICE, Op.ALL), deny(topic("payments"), ALICE, Op.READ)]
    assert may(acl, Op.DESCRIBE) and not may(acl, Op.READ) and may(acl, Op.WRITE)
    acl = [allow(topic("payments"), ALICE, Op.WRITE), deny(topic("payments"), ALICE, Op.ALL)]
    assert not may(acl, Op.WRITE) and not may(acl, Op.DESCRIBE)


def test_deny_wins_over_every_allow_and_wildcards() -> None:
    acl = [
        allow(topic("*"), Principal.user("*"), Op.ALL),
        deny(topic("pay", PatternType.PREFIXED), ALICE, Op.WRITE, HOST),
    ]
    assert not may(acl, Op.WRITE)
    assert may(acl, Op.WRITE, host="10.0.0.2")  # the deny holds for its host only
    assert may(acl, Op.WRITE, who=BOB)
    assert may(acl, Op.READ)


def test_prefixed_and_wildcard_patterns() -> None:
    sink = ResourcePattern(ResourceType.TRANSACTIONAL_ID, PatternType.PREFIXED, "job/")
    acl = [allow(sink, ALICE, Op.WRITE)]
    for name, ok in (
        ("job/", True),
        ("job/0", True),
        ("job/17", True),
        ("job", False),
        ("jobs/0", False),
        ("other/0", False),
    ):
        assert may(acl, Op.WRITE, resource=Resource(ResourceType.TRANSACTIONAL_ID, name)) is ok, (
            name
        )
    # A literal "*" is every name; a literal of another name only that one.
    assert may([allow(topic("*"), ALICE, Op.READ)], Op.READ)
    assert not may([allow(topic("pay"), ALICE, Op.READ)], Op.READ)


def test_allow_everyone_if_no_acl_found_only_where_no_acl_names_the_resource() -> None:
    lax = Authorizer([], allow_if_no_acl=True)
    assert may([], Op.WRITE, auth=lax)
    assert may([allow(topic("other"), BOB, Op.READ)], Op.WRITE, auth=lax)
    assert not may([allow(topic("payments"), BOB, Op.READ)], Op.WRITE, auth=lax)


def test_bindings_are_checked_when_built() -> None:
    txn = ResourcePattern(ResourceType.TRANSACTIONAL_ID, PatternType.LITERAL, "t")
    with pytest.raises(ValueError, match="Read does not apply to a TransactionalId"):
        allow(txn, ALICE, Op.READ)
    with pytest.raises(ValueError, match="PREFIXED pattern of"):
        allow(topic("*", PatternType.PREFIXED), ALICE, Op.READ)
    with pytest.raises(ValueError, match="kafka-cluster"):
        allow(ResourcePattern(ResourceType.CLUSTER, PatternType.LITERAL, "c"), ALICE, Op.ALTER)
    assert Operation.parse("idempotent_write") is Op.IDEMPOTENT_WRITE
    assert Operation.parse("clusteraction") is Op.CLUSTER_ACTION
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


def test_hanging_transaction_tools_need_read_or_write_on_the_topic_or_alter_on_the_cluster() -> (
    None
):
    describe = RULES[Action.DESCRIBE_PRODUCERS].checks({"topic": "payments", "partition": 0})
    assert [[(n.operation, n.resource) for n in c] for c in describe] == [[(Op.READ, PAY)]]
    body = {"topic": "payments", "partition": 0, "producer_id": 4}
    abort = RULES[Action.ABORT_HANGING_TRANSACTION].checks(body)
    assert [[(n.operation, n.resource) for n in c] for c in abort] == [
        [(Op.WRITE, PAY), (Op.ALTER, CLUSTER)]
    ]


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
    with pytest.raises(InvalidConfigError, match=r"User:broker must be in super\.users"):
        BrokerConfig.from_mapping(_cluster())
    with pytest.raises(InvalidConfigError, match=r"User:ANONYMOUS must be in super\.users"):
        BrokerConfig.from_mapping({"zookeeper.connect": "h:1", "authorizer.enable": "true"})
    with pytest.raises(InvalidConfigError, match=r"super\.users: principal 'broker'"):
        BrokerConfig.from_mapping(_cluster(**{"super.users": "broker"}))
    cfg = BrokerConfig.from_mapping(_cluster(**{"super.users": "User:admin;User:broker"}))
    assert cfg.authorization.enabled
    assert cfg.authorization.super_users == {Principal.user("admin"), Principal.user("broker")}
    # Embedded there are no other brokers to serve: nothing to require.
    assert BrokerConfig.from_mapping({"authorizer.enable": "true"}).authorization.enabled


def test_the_index_decides_as_the_scan() -> None:
    """``AclIndex`` (what a broker checks against) gives every decision the plain scan
    gives, over literal, wildcard, prefixed and other-type bindings."""
    txn = ResourceType.TRANSACTIONAL_ID
    bindings = [
        allow(topic("payments"), ALICE, Op.WRITE),
        allow(topic("*"), BOB, Op.READ),
        deny(topic("pay", PatternType.PREFIXED), BOB, Op.READ, HOST),
        allow(topic("pa", PatternType.PREFIXED), Principal.user("*"), Op.DESCRIBE),
        allow(ResourcePattern(txn, PatternType.PREFIXED, "job/"), ALICE, Op.WRITE),
    ]
    index = AclIndex(bindings)
    lax = Authorizer([], allow_if_no_acl=True)
    resources = (
        [Resource(ResourceType.TOPIC, n) for n in ("payments", "pay", "other", "*", "p")]
        + [Resource(txn, n) for n in ("job/1", "job", "x")]
        + [CLUSTER]
    )
    for auth in (AUTH, lax):
        for resource in resources:
            for who in (ALICE, BOB, Principal.user("carol")):
                for host in (HOST, "10.0.0.2"):
                    for op in (Op.READ, Op.WRITE, Op.DESCRIBE, Op.CLUSTER_ACTION):
                        plain = auth.authorize(bindings, who, host, op, resource)
                        indexed = auth.authorize(index, who, host, op, resource)
                        assert plain == indexed, (resource, who, host, op)


def test_a_mutual_tls_brokers_principal_is_its_own_certificates_mapped_subject(
    tmp_path: Path,
) -> None:
    """Under SSL with ssl.client.auth=required (no SASL) the other brokers see a broker as
    its certificate's subject mapped by ssl.principal.mapping.rules, so that is the
    principal the start check requires in super.users (not User:ANONYMOUS)."""
    certs = make_certs(tmp_path / "tls")
    mutual = {
        "zookeeper.connect": "h:1",
        "authorizer.enable": "true",
        **certs.broker_keys(client_auth="required"),
    }
    with pytest.raises(InvalidConfigError, match=r"User:CN=broker must be in super\.users"):
        BrokerConfig.from_mapping(mutual)
    mapped = {**mutual, "ssl.principal.mapping.rules": "RULE:^CN=(.*)$/$1-host/,DEFAULT"}
    with pytest.raises(InvalidConfigError, match=r"User:broker-host must be in super\.users"):
        BrokerConfig.from_mapping(mapped)
    cfg = BrokerConfig.from_mapping({**mapped, "super.users": "User:broker-host"})
    assert cfg.authorization.super_users == {Principal.user("broker-host")}
    # One-way TLS authenticates nobody: the brokers are User:ANONYMOUS, refused as before.
    one_way = {**mutual, **certs.broker_keys(client_auth="none")}
    with pytest.raises(InvalidConfigError, match=r"User:ANONYMOUS must be in super\.users"):
        BrokerConfig.from_mapping(one_way)
