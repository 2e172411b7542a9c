"""The Group resource (Kafka's operations on a consumer group), the Kafka families' one
authorizer helper (:class:`KafkaAuthorizer`: the broker's RequestAuthorizer, refusals
counted once, with Kafka's codes), a Kafka connection's authentication states, and
``idemlog acls add --group``."""

from __future__ import annotations

from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.schema.metadata.v12.request import MetadataRequest

from broker_core.cli.main import main
from broker_core.errors import ErrorCode, GroupAuthorizationFailedError
from broker_core.security.acl import (
    AclBinding,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    Resource,
    ResourcePattern,
    ResourceType,
)
from broker_core.security.acl_store import FileAclStore
from broker_core.security.principal import Principal
from broker_core.server.access.authorization import RequestAuthorizer
from broker_core.server.kafka.authorize import ALLOW_ALL, KafkaAuthorizer
from broker_core.server.kafka.connection import AuthState, KafkaConnection
from broker_core.server.kafka.framing import KafkaRequest

ALICE = Principal.user("alice")
GROUP = "orders-app"


def group(name: str, pattern: PatternType = PatternType.LITERAL) -> ResourcePattern:
    return ResourcePattern(ResourceType.GROUP, pattern, name)


def request_from(principal: Principal) -> KafkaRequest:
    connection = KafkaConnection("10.0.0.7", sasl=False, principal=principal)
    body = MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    return KafkaRequest(3, 12, 1, "test", body, connection)


def kafka_authorizer(bindings: list[AclBinding], refused: list[ErrorCode]) -> KafkaAuthorizer:
    authorizer = Authorizer([Principal.user("admin")], allow_if_no_acl=False)
    frozen = tuple(bindings)
    return KafkaAuthorizer(RequestAuthorizer(authorizer, lambda: frozen, refused.append))


def test_a_group_has_kafkas_operations_and_read_implies_describe() -> None:
    read = AclBinding.of(group("orders-"), ALICE, Operation.READ)
    auth = Authorizer([], allow_if_no_acl=False)
    resource = Resource(ResourceType.GROUP, GROUP)
    assert not auth.authorize([read], ALICE, "h", Operation.READ, resource)  # literal
    prefixed = AclBinding.of(group("orders-", PatternType.PREFIXED), ALICE, Operation.READ)
    assert auth.authorize([prefixed], ALICE, "h", Operation.READ, resource)
    assert auth.authorize([prefixed], ALICE, "h", Operation.DESCRIBE, resource)
    assert not auth.authorize([prefixed], ALICE, "h", Operation.DELETE, resource)
    for operation in (Operation.READ, Operation.DESCRIBE, Operation.DELETE, Operation.ALL):
        AclBinding.of(group(GROUP), ALICE, operation)
    with pytest.raises(ValueError, match="operation Write does not apply to a Group"):
        AclBinding.of(group(GROUP), ALICE, Operation.WRITE)


def test_the_kafka_authorizer_answers_kafkas_codes_and_counts_each_refusal() -> None:
    refused: list[ErrorCode] = []
    allowed = AclBinding.of(group(GROUP), ALICE, Operation.READ)
    denied = AclBinding.of(group(GROUP), ALICE, Operation.DELETE, Permission.DENY)
    authorizer = kafka_authorizer([allowed, denied], refused)
    alice = request_from(ALICE)
    assert authorizer.group_error(alice, Operation.READ, GROUP) == KafkaErrorCode.none
    assert authorizer.group_error(alice, Operation.DESCRIBE, GROUP) == KafkaErrorCode.none
    assert refused == []
    assert (
        authorizer.group_error(alice, Operation.DELETE, GROUP)
        == KafkaErrorCode.group_authorization_failed
    )
    assert refused == [ErrorCode.GROUP_AUTHORIZATION_FAILED]
    error = authorizer.refusal(alice, Operation.DELETE, Resource(ResourceType.GROUP, GROUP))
    assert isinstance(error, GroupAuthorizationFailedError)
    assert error.message == (
        "User:alice from host 10.0.0.7 is not allowed Delete on Group:orders-app (Kafka "
        "MetadataRequest); an operator allows it with: idemlog acls add --allow-principal "
        "User:alice --operation Delete --group 'orders-app'"
    )
    # The producer's and the topics' checks, and a filter's question (never counted).
    refused.clear()
    assert authorizer.producer_error(alice, None) == KafkaErrorCode.cluster_authorization_failed
    assert (
        authorizer.producer_error(alice, "t-1")
        == KafkaErrorCode.transactional_id_authorization_failed
    )
    assert (
        authorizer.topic_error(alice, Operation.READ, "payments")
        == KafkaErrorCode.topic_authorization_failed
    )
    assert not authorizer.may(alice, Operation.READ, Resource(ResourceType.TOPIC, "payments"))
    assert refused == [
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ]
    admin = request_from(Principal.user("admin"))
    assert authorizer.group_error(admin, Operation.DELETE, GROUP) == KafkaErrorCode.none
    assert ALLOW_ALL.group_error(alice, Operation.DELETE, GROUP) == KafkaErrorCode.none


def test_a_sasl_connection_is_authenticated_only_after_its_exchange() -> None:
    connection = KafkaConnection("10.0.0.7", sasl=True)
    assert connection.state is AuthState.HANDSHAKE and not connection.authenticated
    with pytest.raises(ValueError, match="waiting for SaslHandshake -> authenticated"):
        connection.authenticated_as(ALICE)
    connection.fail()
    assert connection.closing and not connection.authenticated
    plain = KafkaConnection("10.0.0.7", sasl=False)
    assert plain.authenticated and plain.caller.principal == Principal.user("ANONYMOUS")


def test_idemlog_acls_add_a_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--data-dir", str(tmp_path), "--allow-principal", "User:alice", "--group", GROUP]
    assert main(["acls", "add", *args, "--operation", "Read"]) == 0
    assert [str(b.pattern) for b in FileAclStore(tmp_path).bindings()] == [
        "Group:LITERAL:orders-app"
    ]
    assert main(["acls", "add", *args, "--operation", "Write"]) != 0
    assert "operation Write does not apply to a Group" in capsys.readouterr().err
