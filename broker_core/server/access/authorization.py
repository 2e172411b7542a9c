"""What each request needs of the ACLs, in one place, and the check every request makes.

:data:`RULES` maps each request (the produce stream, the fetch, every ``Action``) to the
(operation, resource) Kafka checks for its counterpart; docs/security.md's table is
:func:`render_rules_table` of it (a test keeps them equal). The Flight server asks
:meth:`RequestAuthorizer.check` before a request touches any state; a refusal is one
of ``errors.AUTHORIZATION_ERRORS``, non-retriable, with Kafka's code, naming the principal,
its host, the operation, the resource and the ``idemlog acls add`` that would allow it, and
is counted in the broker's metrics. Listings (topics without names, transactions) are
filtered instead, as Kafka filters them; an abort of a run by run id alone fences only
the ids the caller may write.

A sink's transactional ids are ``<sink_id>/<task>`` (spark_sink.writer); its own calls
(heartbeat, batch commit and abort, run abort by sink) are checked as Write on the
TransactionalId ``<sink_id>/`` itself, so that the one prefixed ACL on ``<sink_id>/``
covers a job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from broker_core.errors import (
    BrokerNotAvailableError,
    ClusterAuthorizationFailedError,
    ErrorCode,
    GroupAuthorizationFailedError,
    IdemlogError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from broker_core.protocol.admin_requests import (
    AbortHangingTransactionRequest,
    AbortTransactionRequest,
    CreateTopicRequest,
    DeleteTopicRequest,
    DescribeProducersRequest,
    DescribeTopicsRequest,
    ListOffsetsRequest,
    MetadataRequest,
)
from broker_core.protocol.data_requests import FetchRequest, ProduceDescriptor
from broker_core.protocol.stable_cut import TrackedBatchesRequest
from broker_core.protocol.txn_requests import (
    AbortSinkBatchRequest,
    AbortSinkRunRequest,
    AddPartitionsToTxnRequest,
    CommitSinkBatchRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    PrepareSinkTxnRequest,
    SinkHeartbeatRequest,
    StableEndsRequest,
)
from broker_core.protocol.wire import Action
from broker_core.security.acl import (
    CLUSTER,
    AclIndex,
    Authorizer,
    Operation,
    Resource,
    ResourceType,
)
from broker_core.security.acl_store import Bindings, FileAclStore, ZkAclStore
from broker_core.security.principal import ANONYMOUS, Principal
from broker_core.server.config.broker_config import ZK_ROOT, BrokerConfig

log = logging.getLogger("idemlog.security")

PRODUCE = "produce"  # DoPut
FETCH = "fetch"  # DoGet
SINK_ID_SEPARATOR = "/"  # spark_sink.writer's transactional ids: <sink_id>/<task>

Body = dict[str, Any]


@dataclass(frozen=True)
class Caller:
    """Who sent a request and from where (the peer's IP address)."""

    principal: Principal
    host: str


def host_of_peer(peer: str) -> str:
    """The IP address of gRPC's peer text (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``);
    the text as is when it is neither (a Unix socket)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return peer


@dataclass(frozen=True)
class Need:
    """One (operation, resource) a request needs."""

    operation: Operation
    resource: Resource


# A check passes when any of its needs is allowed (e.g. Create on the Cluster or on the
# topic); a refusal names the first.
Check = tuple[Need, ...]


def _topic(op: Operation, name: str) -> Check:
    return (Need(op, Resource(ResourceType.TOPIC, name)),)


def _txn(op: Operation, transactional_id: str) -> Check:
    return (Need(op, Resource(ResourceType.TRANSACTIONAL_ID, transactional_id)),)


def _sink(sink_id: str) -> Check:
    return _txn(Operation.WRITE, sink_id + SINK_ID_SEPARATOR)


def _cluster(op: Operation) -> Check:
    return (Need(op, CLUSTER),)


@dataclass(frozen=True)
class Rule:
    """What one request needs: ``text`` for docs/security.md, ``checks`` from its body,
    and ``filters``: what its answer leaves out for the caller (docs), if anything."""

    text: str
    checks: Callable[[Body], list[Check]]
    filters: str = ""


def _none(body: Body) -> list[Check]:
    return []


def _init_producer_id(body: Body) -> list[Check]:
    txn_id = InitProducerIdRequest.from_doc(body).transactional_id
    if txn_id is None:
        return [_cluster(Operation.IDEMPOTENT_WRITE)]
    return [_txn(Operation.WRITE, txn_id)]


def _produce(body: Body) -> list[Check]:
    r = ProduceDescriptor.from_doc(body)
    checks = [_topic(Operation.WRITE, r.topic)]
    if r.transactional_id is not None:
        checks.append(_txn(Operation.WRITE, r.transactional_id))
    return checks


# Checked at each batch of a produce stream that carries a producer id and is not
# transactional (docs/security.md), as well as its producer token: the id is bound to
# the principal it was issued to (security.producer_token).
IDEMPOTENT_PRODUCE: Check = _cluster(Operation.IDEMPOTENT_WRITE)


def _add_partitions(body: Body) -> list[Check]:
    r = AddPartitionsToTxnRequest.from_doc(body)
    if r.verify_only:
        # A partition leader asking the coordinator (KIP-890): brokers only, as Kafka's
        # AddPartitionsToTxn v4+.
        return [_cluster(Operation.CLUSTER_ACTION)]
    topics = sorted({t for t, _ in r.partitions})
    return [
        _txn(Operation.WRITE, r.transactional_id),
        *(_topic(Operation.WRITE, t) for t in topics),
    ]


def _prepare_sink(body: Body) -> list[Check]:
    r = PrepareSinkTxnRequest.from_doc(body)
    topics = sorted({rng[0] for rng in r.ranges})
    return [
        _txn(Operation.WRITE, r.transactional_id),
        *(_topic(Operation.WRITE, t) for t in topics),
    ]


def _sink_batch(
    body: Body, request: type[CommitSinkBatchRequest | AbortSinkBatchRequest]
) -> list[Check]:
    r = request.from_doc(body)
    ids = sorted({t for t, _, _ in r.transactions})
    return [_sink(r.sink_id), *(_txn(Operation.WRITE, t) for t in ids)]


def _abort_sink_run(body: Body) -> list[Check]:
    sink_id = AbortSinkRunRequest.from_doc(body).sink_id
    return [] if sink_id is None else [_sink(sink_id)]


def _names(names: Iterable[str] | None) -> list[Check]:
    return [_topic(Operation.DESCRIBE, n) for n in sorted(set(names or ()))]


_CLUSTER_ACTION = Rule(
    "ClusterAction on the Cluster", lambda b: [_cluster(Operation.CLUSTER_ACTION)]
)

RULES: dict[str, Rule] = {
    PRODUCE: Rule(
        "Write on the topic; with a transactional id, Write on it too; a batch with a "
        "producer id that is not transactional: IdempotentWrite on the Cluster and the "
        "producer token its InitProducerId issued to this principal for this id (all "
        "checked again at each batch of the stream)",
        _produce,
    ),
    FETCH: Rule(
        "Read on the topic", lambda b: [_topic(Operation.READ, FetchRequest.from_doc(b).topic)]
    ),
    Action.CREATE_TOPIC: Rule(
        "Create on the topic, or Create on the Cluster",
        lambda b: [
            (
                Need(
                    Operation.CREATE,
                    Resource(ResourceType.TOPIC, CreateTopicRequest.from_doc(b).name),
                ),
                Need(Operation.CREATE, CLUSTER),
            )
        ],
    ),
    Action.DELETE_TOPIC: Rule(
        "Delete on the topic",
        lambda b: [_topic(Operation.DELETE, DeleteTopicRequest.from_doc(b).name)],
    ),
    Action.DESCRIBE_TOPICS: Rule(
        "Describe on each named topic",
        lambda b: _names(DescribeTopicsRequest.from_doc(b).names),
        "without names: the topics the caller may not Describe",
    ),
    Action.METADATA: Rule(
        "Describe on each named topic",
        lambda b: _names(MetadataRequest.from_doc(b).topics),
        "without names: the topics the caller may not Describe",
    ),
    Action.LIST_OFFSETS: Rule(
        "Describe on the topic",
        lambda b: [_topic(Operation.DESCRIBE, ListOffsetsRequest.from_doc(b).topic)],
    ),
    Action.FIND_COORDINATOR: Rule(
        "none (an address only; the calls made there are checked)", _none
    ),
    Action.INIT_PRODUCER_ID: Rule(
        "with a transactional id: Write on it; without: IdempotentWrite on the Cluster "
        "(answered with the producer token that binds the id to the caller)",
        _init_producer_id,
    ),
    Action.ADD_PARTITIONS_TO_TXN: Rule(
        "Write on the transactional id, Write on each topic added; `verify_only` (a "
        "leader's check): ClusterAction on the Cluster",
        _add_partitions,
    ),
    Action.END_TXN: Rule(
        "Write on the transactional id",
        lambda b: [_txn(Operation.WRITE, EndTxnRequest.from_doc(b).transactional_id)],
    ),
    Action.PREPARE_SINK_TXN: Rule(
        "Write on the transactional id, Write on each topic of its ranges", _prepare_sink
    ),
    Action.COMMIT_SINK_BATCH: Rule(
        "Write on the TransactionalId `<sink_id>/`, Write on each transactional id",
        lambda b: _sink_batch(b, CommitSinkBatchRequest),
    ),
    Action.ABORT_SINK_BATCH: Rule(
        "Write on the TransactionalId `<sink_id>/`, Write on each transactional id",
        lambda b: _sink_batch(b, AbortSinkBatchRequest),
    ),
    Action.ABORT_SINK_RUN: Rule(
        "by sink: Write on the TransactionalId `<sink_id>/`; by run alone: none",
        _abort_sink_run,
        "fences only the transactional ids the caller may Write",
    ),
    Action.SINK_HEARTBEAT: Rule(
        "Write on the TransactionalId `<sink_id>/`",
        lambda b: [_sink(SinkHeartbeatRequest.from_doc(b).sink_id)],
    ),
    Action.STABLE_ENDS: Rule(
        "Read on the topic", lambda b: [_topic(Operation.READ, StableEndsRequest.from_doc(b).topic)]
    ),
    Action.TRACKED_BATCHES: Rule(
        "Read on the topic",
        lambda b: [_topic(Operation.READ, TrackedBatchesRequest.from_doc(b).topic)],
    ),
    Action.LIST_TRANSACTIONS: Rule(
        "none", _none, "the transactional ids the caller may not Describe"
    ),
    Action.ABORT_TRANSACTION: Rule(
        "Write on the transactional id",
        lambda b: [_txn(Operation.WRITE, AbortTransactionRequest.from_doc(b).transactional_id)],
    ),
    Action.DESCRIBE_PRODUCERS: Rule(
        "Read on the topic",
        lambda b: [_topic(Operation.READ, DescribeProducersRequest.from_doc(b).topic)],
    ),
    Action.ABORT_HANGING_TRANSACTION: Rule(
        "Write on the topic, or Alter on the Cluster",
        lambda b: [
            (
                Need(
                    Operation.WRITE,
                    Resource(ResourceType.TOPIC, AbortHangingTransactionRequest.from_doc(b).topic),
                ),
                Need(Operation.ALTER, CLUSTER),
            )
        ],
    ),
    Action.WRITE_TXN_MARKERS: _CLUSTER_ACTION,
    Action.REPLICA_FETCH: _CLUSTER_ACTION,
    Action.OFFSETS_FOR_LEADER_EPOCH: _CLUSTER_ACTION,
    Action.REPLICA_LOG_START: _CLUSTER_ACTION,
    Action.ELECT_LEADERS: Rule("Alter on the Cluster", lambda b: [_cluster(Operation.ALTER)]),
    Action.METRICS: Rule("Describe on the Cluster", lambda b: [_cluster(Operation.DESCRIBE)]),
    Action.PING: Rule("none (liveness)", _none),
}

_ERROR_BY_TYPE: dict[ResourceType, type[IdemlogError]] = {
    ResourceType.TOPIC: TopicAuthorizationFailedError,
    ResourceType.GROUP: GroupAuthorizationFailedError,
    ResourceType.TRANSACTIONAL_ID: TransactionalIdAuthorizationFailedError,
    ResourceType.CLUSTER: ClusterAuthorizationFailedError,
}

# Every code a refusal carries: the metrics count refusals by these, each from 0.
REFUSAL_CODES = tuple(error.error_code for error in _ERROR_BY_TYPE.values())

_CLI_FLAG: dict[ResourceType, str] = {
    ResourceType.TOPIC: "--topic",
    ResourceType.GROUP: "--group",
    ResourceType.TRANSACTIONAL_ID: "--transactional-id",
    ResourceType.CLUSTER: "--cluster",
}


def render_rules_table() -> str:
    """docs/security.md's table of :data:`RULES` (a test checks the page holds it)."""
    lines = ["| request | needs | leaves out of its answer |", "|---|---|---|"]
    for name, rule in RULES.items():
        lines.append(f"| `{name}` | {rule.text} | {rule.filters or '—'} |")
    return "\n".join(lines) + "\n"


def refusal(caller: Caller, need: Need, what: str) -> IdemlogError:
    """The typed error of a refused ``need``: Kafka's code for the resource type."""
    r = need.resource
    flag = _CLI_FLAG[r.type] + ("" if r.type is ResourceType.CLUSTER else f" '{r.name}'")
    return _ERROR_BY_TYPE[r.type](
        f"{caller.principal} from host {caller.host} is not allowed {need.operation.value} "
        f"on {r} ({what}); an operator allows it with: idemlog acls add --allow-principal "
        f"{caller.principal} --operation {need.operation.value} {flag}"
    )


class RequestAuthorizer:
    """The broker's check: its :class:`Authorizer` over the store's current bindings
    (``bindings``: the ZooKeeper cache, or the embedded file re-read when changed), each
    refusal told to ``on_refusal`` (the metrics)."""

    def __init__(
        self,
        authorizer: Authorizer,
        bindings: Callable[[], Bindings],
        on_refusal: Callable[[ErrorCode], None],
    ) -> None:
        self._authorizer = authorizer
        self._bindings = bindings
        self._on_refusal = on_refusal
        self._index = AclIndex(())  # of the last set the store gave (replaced whole)

    def _current(self) -> AclIndex:
        bindings = self._bindings()
        index = self._index
        if index.bindings is not bindings:
            # A new set from the store: indexed once, then each check is a look-up.
            index = self._index = AclIndex(bindings)
        return index

    def may(self, caller: Caller, operation: Operation, resource: Resource) -> bool:
        return self._authorizer.authorize(
            self._current(), caller.principal, caller.host, operation, resource
        )

    def check(self, caller: Caller, request: str, body: Body) -> Permit:
        """Raise the refusal of the first check of ``request``'s rule that ``caller`` fails
        (``KeyError`` for a request without a rule: the server checks the action is known
        first); else the permit that filters its answer."""
        for check in RULES[request].checks(body):
            self.require(caller, check, request)
        return Permit(self, caller)

    def require(self, caller: Caller, check: Check, request: str) -> None:
        """Raise the refusal of ``check`` unless ``caller`` passes it."""
        if not any(self.may(caller, n.operation, n.resource) for n in check):
            error = refusal(caller, check[0], request)
            self._on_refusal(error.error_code)
            log.info("refused: %s", error.message)
            raise error


class Permit:
    """A request that passed its checks: what its answer may show the caller, and who
    the caller is. Without an authorizer (:data:`UNCHECKED`, or a caller known but not
    checked) it allows everything."""

    def __init__(self, authorizer: RequestAuthorizer | None, caller: Caller | None) -> None:
        self._authorizer = authorizer
        self._caller = caller

    @property
    def principal(self) -> Principal:
        """The caller's principal (:data:`ANONYMOUS` when not known)."""
        return ANONYMOUS if self._caller is None else self._caller.principal

    def may(self, operation: Operation, resource: Resource) -> bool:
        if self._authorizer is None or self._caller is None:
            return True
        return self._authorizer.may(self._caller, operation, resource)

    def may_write_txn(self, transactional_id: str) -> bool:
        return self.may(Operation.WRITE, Resource(ResourceType.TRANSACTIONAL_ID, transactional_id))

    def filter_answer(self, request: str, answer: dict[str, Any]) -> dict[str, Any]:
        """``answer`` without what the caller may not Describe (listings only)."""
        if self._authorizer is None:
            return answer

        def topic_ok(name: str) -> bool:
            return self.may(Operation.DESCRIBE, Resource(ResourceType.TOPIC, name))

        if request == Action.DESCRIBE_TOPICS:
            return {**answer, "topics": [t for t in answer["topics"] if topic_ok(t["name"])]}
        if request == Action.METADATA:
            topics = answer["topics"]
            return {**answer, "topics": {n: v for n, v in topics.items() if topic_ok(n)}}
        if request == Action.LIST_TRANSACTIONS:
            kept = [
                t
                for t in answer["transactions"]
                if self.may(
                    Operation.DESCRIBE,
                    Resource(ResourceType.TRANSACTIONAL_ID, t["transactional_id"]),
                )
            ]
            return {**answer, "transactions": kept}
        return answer


UNCHECKED = Permit(None, None)


def request_authorizer(
    cfg: BrokerConfig, zk: Any, on_refusal: Callable[[ErrorCode], None]
) -> RequestAuthorizer | None:
    """The broker's check, None with ``authorizer.enable=false``. On a cluster the ACLs
    come from ZooKeeper (``zk``, the broker's client on its chroot), cached and watched,
    loaded before this returns; embedded from ``<log.dir>/__acls.json``, re-read when it
    changed. Raises BrokerNotAvailableError if ZooKeeper's ACLs cannot be read within
    the session timeout (serving before would refuse what is allowed)."""
    settings = cfg.authorization
    if not settings.enabled:
        return None
    authorizer = Authorizer(settings.super_users, allow_if_no_acl=settings.allow_if_no_acl)
    if cfg.embedded:
        return RequestAuthorizer(authorizer, FileAclStore(cfg.log_dir).bindings, on_refusal)
    store = ZkAclStore(zk, ZK_ROOT, watch=True)
    if not store.wait_loaded(cfg.zookeeper_session_timeout_ms / 1000.0):
        raise BrokerNotAvailableError(f"the ACLs under {store.path} did not load")
    return RequestAuthorizer(authorizer, store.bindings, on_refusal)
