"""Kafka's admin APIs: CreateTopics, DeleteTopics, DescribeConfigs and DescribeCluster.

A topic is created and deleted through the broker's own topic actions (the Flight
``create_topic`` and ``delete_topic``: :class:`TopicActions`), so the rules and errors are
the same whichever protocol asks: a name no topic can have or an internal one is
INVALID_TOPIC_EXCEPTION, an unknown config key or a bad value INVALID_CONFIG naming it,
a factor above the live brokers INVALID_REPLICATION_FACTOR, a taken name
TOPIC_ALREADY_EXISTS. A topic created over Kafka is Kafka-shaped
(:data:`KAFKA_TOPIC_SCHEMA`), so Kafka clients read it and Spark writes it.

Topic configs are idemlog's keys, which carry Kafka's names where Kafka has the setting
(``broker_core/log/config.py``); they are fixed at creation (no AlterConfigs), so every
config is answered read-only. docs/kafka.md, "Admin APIs", lists what is answered.

The topic actions are called in process, past the Flight server's ACL check, so each API
checks Kafka's ACLs itself (docs/kafka.md, "What each API requires"): CreateTopics Create
on the Cluster or on the topic, DeleteTopics Delete on the topic, DescribeConfigs
DescribeConfigs on the topic (TOPIC_AUTHORIZATION_FAILED) or the Cluster for a broker
(CLUSTER_AUTHORIZATION_FAILED); DescribeCluster needs nothing, as Kafka's.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.static.primitive import i8, i16, i32

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.topic_creation import (
    assign_partitions,
    replication_factor_of,
    validate_new_topic,
)
from broker_core.config import INT_MAX, ConfigKey
from broker_core.errors import (
    IdemlogError,
    InvalidConfigError,
    InvalidRequestError,
    TopicAlreadyExistsError,
    UnknownTopicIdError,
)
from broker_core.log.compaction import check_key_columns
from broker_core.log.config import LOG_CONFIG
from broker_core.protocol.admin_requests import (
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteTopicRequest,
)
from broker_core.protocol.requests import EmptyResponse
from broker_core.protocol.topics import validate_user_topic_name
from broker_core.security.acl import CLUSTER, Operation, Resource, ResourceType
from broker_core.server.config.broker_config import BROKER_CONFIG, LOG_PREFIX, BrokerConfig
from broker_core.server.kafka.authorize import ALLOW_ALL, KafkaAuthorizer
from broker_core.server.kafka.framing import KafkaRequest
from broker_core.server.kafka.messages import (
    NO_THROTTLE,
    ServedApi,
    build,
    kafka_error,
    nested,
)
from broker_core.server.kafka.metadata import NO_OPERATIONS, kafka_brokers

log = logging.getLogger("idemlog.kafka")

CREATE_TOPICS = 19
DELETE_TOPICS = 20
DESCRIBE_CONFIGS = 32
DESCRIBE_CLUSTER = 60
CONFIGS_IN_CREATE = 5  # CreateTopics answers the created topic's configs from v5 (KIP-525)

# What a Kafka-shaped topic created over Kafka holds: the columns of Spark's Kafka source
# that a record carries, in the Arrow form Spark gives them (what the idemlog sink writes
# from such a DataFrame, so Spark can write the topic and any Kafka client read it).
KAFKA_TOPIC_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field(
            "headers",
            pa.list_(
                pa.field(
                    "element",
                    pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]),
                )
            ),
        ),
    ]
)
DEFAULT_PARTITIONS = 1  # num_partitions -1: Kafka's num.partitions default (idemlog has no key)
NO_FACTOR = -1  # replication_factor -1: the cluster's default.replication.factor
FACTOR_KEY = "replication.factor"  # where a topic keeps the factor asked
_NO_TOPIC_ID = uuid.UUID(int=0)

# DescribeConfigs' resource types and config sources (Kafka's ConfigResource.Type and
# DescribeConfigsResponse.ConfigSource).
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
# Kafka's ConfigDef.Type numbers (DescribeConfigs v3+).
_BOOLEAN, _STRING, _INT, _LONG, _DOUBLE, _LIST, _PASSWORD = 1, 2, 3, 5, 6, 7, 9
_LISTS = frozenset({"cleanup.policy", "compaction.key.columns"})
# DescribeCluster's endpoint types (v1+): brokers; a controller quorum's endpoints are KRaft's.
BROKERS_ENDPOINT = 1


class TopicActions(Protocol):
    """The broker's topic actions, as Flight serves them (``requests.handlers``)."""

    def create_topic(self, body: dict[str, Any]) -> CreateTopicResponse: ...

    def delete_topic(self, body: dict[str, Any]) -> EmptyResponse: ...


@dataclass(frozen=True)
class MadeTopic:
    """A topic CreateTopics created (or only checked): what its answer says of it."""

    name: str
    partitions: int
    factor: int
    config: Mapping[str, str]  # its own configs, idemlog's keys
    topic_id: uuid.UUID  # the zero id when only checked


@dataclass(frozen=True)
class ConfigEntry:
    """One config as DescribeConfigs answers it: its value (None: sensitive), source and
    synonyms (most specific first), Kafka's type number and documentation."""

    name: str
    value: str | None
    source: int
    sensitive: bool
    synonyms: tuple[tuple[str, str | None, int], ...]
    config_type: int
    doc: str


class AdminApis:
    """CreateTopics v2-v7 (v0-v1 Kafka 4 dropped), DeleteTopics v1-v6 (v6 by topic id),
    DescribeConfigs v1-v4 (v0 Kafka 4 dropped), DescribeCluster v0-v1 (v2 lists fenced
    brokers, which ZooKeeper has none of), over the broker's ``actions``, ``cluster()``,
    its ``config`` and the ``cluster_id()``, for callers ``authorizer`` allows."""

    def __init__(
        self,
        broker_id: int,
        config: BrokerConfig,
        actions: TopicActions,
        cluster: Callable[[], ClusterMetadata],
        cluster_id: Callable[[], str],
        *,
        authorizer: KafkaAuthorizer = ALLOW_ALL,
    ) -> None:
        self._broker_id = broker_id
        self._config = config
        self._actions = actions
        self._cluster = cluster
        self._cluster_id = cluster_id
        self._authorizer = authorizer

    def apis(self) -> Sequence[ServedApi]:
        return (
            ServedApi(CREATE_TOPICS, 2, 7, "kafka_create_topics", self.create_topics),
            ServedApi(DELETE_TOPICS, 1, 6, "kafka_delete_topics", self.delete_topics),
            ServedApi(DESCRIBE_CONFIGS, 1, 4, "kafka_describe_configs", self.describe_configs),
            ServedApi(DESCRIBE_CLUSTER, 0, 1, "kafka_describe_cluster", self.describe_cluster),
        )

    # -- CreateTopics --------------------------------------------------------------------
    def create_topics(self, request: KafkaRequest, response: type[Any]) -> Any:
        """Each topic created (or, with ``validate_only``, checked as the create would),
        Kafka-shaped, with the factor asked (-1: the cluster's default) and its configs;
        answered with its id (v7), partitions, factor and configs (v5+). Replica
        assignments are refused (INVALID_REPLICA_ASSIGNMENT): idemlog places replicas
        itself. A name asked twice in one request is INVALID_REQUEST for each."""
        body = request.body
        names = [t.name for t in body.topics]
        result_cls = nested(response, "CreatableTopicResult")
        results = []
        for topic in body.topics:
            refusal: tuple[KafkaErrorCode, str] | None = None
            if topic.assignments:
                refusal = (
                    KafkaErrorCode.invalid_replica_assignment,
                    f"topic {topic.name!r}: replica assignments are not served; idemlog "
                    "places replicas itself (ask with partitions and a replication factor)",
                )
            elif names.count(topic.name) > 1:
                refusal = (
                    KafkaErrorCode.invalid_request,
                    f"topic {topic.name!r} is asked more than once in one request",
                )
            elif (denied := self._create_refusal(request, topic.name)) is not None:
                refusal = (kafka_error(denied), denied.message)
            else:
                try:
                    made = self._create(topic, validate_only=body.validate_only)
                except IdemlogError as exc:
                    refusal = (kafka_error(exc), exc.message)
            if refusal is not None:
                code, message = refusal
                log.info("kafka: CreateTopics %r refused: %s", topic.name, message)
                results.append(
                    build(
                        result_cls,
                        name=topic.name,
                        topic_id=_NO_TOPIC_ID,
                        error_code=code,
                        error_message=message,
                        num_partitions=i32(-1),
                        replication_factor=i16(-1),
                        configs=None,
                    )
                )
                continue
            configs = None
            if request.api_version >= CONFIGS_IN_CREATE:
                config_cls = nested(response, "CreatableTopicConfigs")
                configs = tuple(
                    build(
                        config_cls,
                        name=e.name,
                        value=e.value,
                        read_only=True,
                        config_source=i8(e.source),
                        is_sensitive=e.sensitive,
                    )
                    for e in self._topic_entries(made.config, made.factor)
                )
            results.append(
                build(
                    result_cls,
                    name=made.name,
                    topic_id=made.topic_id,
                    error_code=KafkaErrorCode.none,
                    error_message=None,
                    num_partitions=i32(made.partitions),
                    replication_factor=i16(made.factor),
                    configs=configs,
                )
            )
        return build(response, throttle_time=NO_THROTTLE, topics=tuple(results))

    def _create_refusal(self, request: KafkaRequest, name: str) -> IdemlogError | None:
        """Create on the Cluster allows every topic; else Create on the topic (the refusal
        names it), as the Flight create_topic."""
        if self._authorizer.may(request, Operation.CREATE, CLUSTER):
            return None
        return self._authorizer.refusal(
            request, Operation.CREATE, Resource(ResourceType.TOPIC, name)
        )

    def _create(self, topic: Any, *, validate_only: bool) -> MadeTopic:
        """``topic`` (a CreatableTopic) created, or only checked; IdemlogError when refused."""
        partitions = DEFAULT_PARTITIONS if topic.num_partitions == -1 else int(topic.num_partitions)
        nulls = sorted(c.name for c in topic.configs if c.value is None)
        if nulls:
            raise InvalidConfigError(f"topic {topic.name!r}: config {nulls[0]!r} has a null value")
        overrides: dict[str, str] = {c.name: c.value for c in topic.configs}
        if topic.replication_factor != NO_FACTOR:
            asked = str(int(topic.replication_factor))
            if overrides.get(FACTOR_KEY, asked) != asked:
                raise InvalidRequestError(
                    f"topic {topic.name!r}: replication_factor={asked} and the config "
                    f"{FACTOR_KEY}={overrides[FACTOR_KEY]} disagree"
                )
            overrides[FACTOR_KEY] = asked
        if validate_only:
            name, factor = self._validate(topic.name, partitions, overrides)
            return MadeTopic(name, partitions, factor, overrides, _NO_TOPIC_ID)
        schema = KAFKA_TOPIC_SCHEMA.serialize().to_pybytes()
        created = self._actions.create_topic(
            CreateTopicRequest(topic.name, partitions, schema, overrides).to_doc()
        )
        # As stored, not as the cache last saw it: with ZooKeeper, the watch may lag.
        assignment = self._cluster().read_topic(created.name)
        factor = len(assignment.state(0).replicas)
        log.info(
            "kafka: created topic %s (%d partitions, factor %d)", created.name, partitions, factor
        )
        topic_id = uuid.UUID(hex=assignment.topic_id) if assignment.topic_id else _NO_TOPIC_ID
        return MadeTopic(created.name, partitions, factor, dict(assignment.config), topic_id)

    def _validate(self, name: str, partitions: int, overrides: dict[str, str]) -> tuple[str, int]:
        """What ``create_topic`` and the cluster check, without creating: the name, the
        partitions, the configs (with the broker's defaults), the key columns, that the
        name is free and that the factor fits the live brokers. Returns the name and factor."""
        name = validate_user_topic_name(name)
        name, partitions, _, checked = validate_new_topic(name, partitions, None, overrides)
        log_config = self._config.log_defaults.overlaid(checked)
        check_key_columns(name, log_config, KAFKA_TOPIC_SCHEMA)
        cluster = self._cluster()
        if name in cluster.topics():
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        live = [b.broker_id for b in cluster.brokers()]
        # As the clusters choose (embedded: one broker, so -1's min(3, live) is 1).
        default = -1 if self._config.embedded else self._config.default_replication_factor
        factor = replication_factor_of(name, checked, len(live), default)
        assign_partitions(name, partitions, live, factor)  # a factor above the live brokers
        return name, factor

    # -- DeleteTopics --------------------------------------------------------------------
    def delete_topics(self, request: KafkaRequest, response: type[Any]) -> Any:
        """Each topic deleted, asked by name (v1-v5's ``topic_names``, v6's name) or by id
        (v6): UNKNOWN_TOPIC_OR_PARTITION for a name no topic has, UNKNOWN_TOPIC_ID for an
        id; an internal topic INVALID_TOPIC_EXCEPTION. An id is resolved to its topic's
        name, which is then deleted."""
        body = request.body
        asked: list[tuple[str | None, uuid.UUID | None]]
        if hasattr(body, "topic_names"):
            asked = [(n, None) for n in body.topic_names]
        else:
            asked = [
                (t.name, t.topic_id if t.topic_id not in (None, _NO_TOPIC_ID) else None)
                for t in body.topics
            ]
        result_cls = nested(response, "DeletableTopicResult")
        results = []
        for name, topic_id in asked:
            error: IdemlogError | None = None
            try:
                name = self._delete(request, name, topic_id)
            except IdemlogError as exc:
                error = exc
                log.info("kafka: DeleteTopics %s refused: %s", name or topic_id, exc.message)
            results.append(
                build(
                    result_cls,
                    name=name,
                    topic_id=topic_id or _NO_TOPIC_ID,
                    error_code=KafkaErrorCode.none if error is None else kafka_error(error),
                    error_message=None if error is None else error.message,
                )
            )
        return build(response, throttle_time=NO_THROTTLE, responses=tuple(results))

    def _delete(self, request: KafkaRequest, name: str | None, topic_id: uuid.UUID | None) -> str:
        if topic_id is not None:
            found = [
                a.name for a in self._cluster().topics().values() if a.topic_id == topic_id.hex
            ]
            if not found:
                raise UnknownTopicIdError(f"no topic has the id {topic_id}")
            name = found[0]
        if name is None:
            raise InvalidRequestError("a topic to delete asked with neither name nor id")
        self._authorizer.require(request, Operation.DELETE, Resource(ResourceType.TOPIC, name))
        name = validate_user_topic_name(name)
        self._actions.delete_topic(DeleteTopicRequest(name).to_doc())
        log.info("kafka: deleted topic %s", name)
        return name

    # -- DescribeConfigs -----------------------------------------------------------------
    def describe_configs(self, request: KafkaRequest, response: type[Any]) -> Any:
        """Each resource's configs: a topic's (every topic key: its own value, else the
        broker's ``log.<key>``, else the default; ``replication.factor`` the factor it
        has) and this broker's (every key of its file; passwords null and sensitive).
        Synonyms (with ``include_synonyms``) run from the most specific to the default;
        documentation with ``include_documentation`` (v3+). Every config is read-only:
        none changes after creation or start. No key named (null or an empty list): every
        key, as Kafka answers. Another broker's configs are asked of it (INVALID_REQUEST
        here); broker loggers and other resources INVALID_REQUEST."""
        body = request.body
        synonyms = bool(getattr(body, "include_synonyms", False))
        with_docs = bool(getattr(body, "include_documentation", False))
        result_cls = nested(response, "DescribeConfigsResult")
        entry_cls = nested(response, "DescribeConfigsResourceResult")
        synonym_cls = nested(response, "DescribeConfigsSynonym")
        results = []
        for resource in body.resources:
            keys = resource.configuration_keys
            wanted = set(keys) if keys else None  # null or none named: every key, as Kafka
            try:
                entries = self._resource_entries(
                    request, resource.resource_type, resource.resource_name
                )
            except IdemlogError as exc:
                results.append(
                    build(
                        result_cls,
                        error_code=kafka_error(exc),
                        error_message=exc.message,
                        resource_type=resource.resource_type,
                        resource_name=resource.resource_name,
                        configs=(),
                    )
                )
                continue
            configs = tuple(
                build(
                    entry_cls,
                    name=e.name,
                    value=e.value,
                    read_only=True,
                    config_source=i8(e.source),
                    is_sensitive=e.sensitive,
                    synonyms=tuple(
                        build(synonym_cls, name=n, value=v, source=i8(s))
                        for n, v, s in (e.synonyms if synonyms else ())
                    ),
                    config_type=i8(e.config_type),
                    documentation=e.doc if with_docs else None,
                )
                for e in entries
                if wanted is None or e.name in wanted
            )
            results.append(
                build(
                    result_cls,
                    error_code=KafkaErrorCode.none,
                    error_message=None,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=configs,
                )
            )
        return build(response, throttle_time=NO_THROTTLE, results=tuple(results))

    def _resource_entries(
        self, request: KafkaRequest, resource_type: int, name: str
    ) -> list[ConfigEntry]:
        if resource_type == TOPIC_RESOURCE:
            self._authorizer.require(
                request, Operation.DESCRIBE_CONFIGS, Resource(ResourceType.TOPIC, name)
            )
            validate_user_topic_name(name)
            assignment = self._cluster().topic(name)  # UNKNOWN_TOPIC_OR_PARTITION
            return self._topic_entries(dict(assignment.config), len(assignment.state(0).replicas))
        if resource_type == BROKER_RESOURCE:
            self._authorizer.require(request, Operation.DESCRIBE_CONFIGS, CLUSTER)
            if name == "":
                return []  # the cluster-wide dynamic defaults: idemlog has none
            if name != str(self._broker_id):
                raise InvalidRequestError(
                    f"broker {self._broker_id} describes its own configs: ask broker {name!r}"
                )
            return self._broker_entries()
        raise InvalidRequestError(
            f"DescribeConfigs: resource type {resource_type} is not served (topics: "
            f"{TOPIC_RESOURCE}, brokers: {BROKER_RESOURCE})"
        )

    def _topic_entries(self, overrides: Mapping[str, str], factor: int) -> list[ConfigEntry]:
        """Every topic key as a topic of ``overrides`` and ``factor`` replicas has it: its
        override, else the broker's log.<key> if set, else the default."""
        broker_values = self._config.values
        entries = []
        for key in LOG_CONFIG:
            synonyms: list[tuple[str, str | None, int]] = []
            if key.name in overrides:
                own = _text(key.parse(overrides[key.name]))
                synonyms.append((key.name, own, DYNAMIC_TOPIC_CONFIG))
            broker_key = LOG_PREFIX + key.name
            if broker_key in BROKER_CONFIG:
                set_value = broker_values[broker_key]
                if set_value != BROKER_CONFIG.key(broker_key).default:
                    synonyms.append((broker_key, _text(set_value), STATIC_BROKER_CONFIG))
            if key.name == FACTOR_KEY and key.name not in overrides:
                # The factor the cluster chose at creation: the topic's, whatever the default.
                synonyms.insert(0, (key.name, str(factor), DEFAULT_CONFIG))
            synonyms.append((key.name, _text(key.default), DEFAULT_CONFIG))
            _, value, source = synonyms[0]
            entries.append(
                ConfigEntry(
                    key.name,
                    value,
                    source,
                    False,
                    tuple(dict.fromkeys(synonyms)),  # the chosen factor may equal the default
                    _config_type(key),
                    key.doc,
                )
            )
        return entries

    def _broker_entries(self) -> list[ConfigEntry]:
        values = self._config.values
        entries = []
        for key in BROKER_CONFIG:
            sensitive = _is_sensitive(key.name)
            value = None if sensitive else _text(values[key.name])
            source = STATIC_BROKER_CONFIG if values[key.name] != key.default else DEFAULT_CONFIG
            shown_default = None if sensitive else _text(key.default)
            synonyms = [(key.name, value, source)]
            if source == STATIC_BROKER_CONFIG:
                synonyms.append((key.name, shown_default, DEFAULT_CONFIG))
            entries.append(
                ConfigEntry(
                    key.name,
                    value,
                    source,
                    sensitive,
                    tuple(synonyms),
                    _PASSWORD if sensitive else _config_type(key),
                    key.doc,
                )
            )
        return entries

    # -- DescribeCluster -----------------------------------------------------------------
    def describe_cluster(self, request: KafkaRequest, response: type[Any]) -> Any:
        """The cluster's id, its controller (-1 if none serves a Kafka listener) and the
        live brokers with a Kafka listener, as Metadata names them. Asked for the
        controllers' endpoints (v1, endpoint type 2: KRaft's quorum), UNSUPPORTED_ENDPOINT_TYPE:
        idemlog's controller is a broker."""
        endpoint_type = int(getattr(request.body, "endpoint_type", BROKERS_ENDPOINT))
        cluster = self._cluster()
        brokers = kafka_brokers(cluster.brokers())
        controller = cluster.controller()
        controller_id = -1
        if controller is not None and controller.broker_id in brokers:
            controller_id = controller.broker_id
        if endpoint_type != BROKERS_ENDPOINT:
            return build(
                response,
                throttle_time=NO_THROTTLE,
                error_code=KafkaErrorCode.unsupported_endpoint_type,
                error_message=f"endpoint type {endpoint_type}: only brokers (1) are described",
                endpoint_type=i8(endpoint_type),
                cluster_id=self._cluster_id(),
                controller_id=i32(-1),
                brokers=(),
                cluster_authorized_operations=NO_OPERATIONS,
            )
        broker_cls = nested(response, "DescribeClusterBroker")
        listed = []
        for broker_id, info in sorted(brokers.items()):
            assert info.kafka_listener is not None
            host, port = info.kafka_listener
            listed.append(
                build(broker_cls, broker_id=i32(broker_id), host=host, port=i32(port), rack=None)
            )
        return build(
            response,
            throttle_time=NO_THROTTLE,
            error_code=KafkaErrorCode.none,
            error_message=None,
            endpoint_type=i8(endpoint_type),
            cluster_id=self._cluster_id(),
            controller_id=i32(controller_id),
            brokers=tuple(listed),
            cluster_authorized_operations=NO_OPERATIONS,
        )


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _is_sensitive(name: str) -> bool:
    """A secret the broker never tells (Kafka's PASSWORD keys): its value is null."""
    return name.endswith(".password")


def _config_type(key: ConfigKey) -> int:
    if key.name in _LISTS:
        return _LIST
    if key.type is bool:
        return _BOOLEAN
    if key.type is float:
        return _DOUBLE
    if key.type is int:
        return _INT if key.max is not None and key.max <= INT_MAX else _LONG
    return _STRING
