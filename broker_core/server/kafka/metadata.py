"""Kafka's Metadata API: the brokers that serve a Kafka listener, the topics, their
partitions' leaders, leader epochs, replicas, ISR and ids, from the cluster metadata."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.static.primitive import i32

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.records import BrokerInfo, TopicAssignment
from broker_core.errors import (
    IdemlogError,
    InvalidRequestError,
    InvalidTopicError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.topics import INTERNAL_TOPIC_PREFIX, validate_topic_name
from broker_core.security.acl import Operation, Resource, ResourceType
from broker_core.server.kafka.authorize import ALLOW_ALL, KafkaAuthorizer
from broker_core.server.kafka.framing import KafkaRequest
from broker_core.server.kafka.messages import (
    NO_THROTTLE,
    ServedApi,
    build,
    kafka_error,
    nested,
)

METADATA = 3
_NO_TOPIC_ID = uuid.UUID(int=0)
NO_OPERATIONS = i32(-(2**31))  # authorized operations not asked for


def kafka_brokers(live: Iterable[BrokerInfo]) -> dict[int, BrokerInfo]:
    """Those of the ``live`` brokers that serve a Kafka listener, by id."""
    return {b.broker_id: b for b in live if b.kafka_listener is not None}


class MetadataApi:
    """Metadata v1-13 (v0's empty list meant "every topic"; Kafka 4 dropped it) from
    ``cluster()`` (raises NotLeaderOrFollowerError before the broker joined) and the
    cluster's id, ``cluster_id()`` (None: answered null), each topic shown to a caller
    ``authorizer`` lets Describe it."""

    def __init__(
        self,
        cluster: Callable[[], ClusterMetadata],
        cluster_id: Callable[[], str | None] = lambda: None,
        *,
        authorizer: KafkaAuthorizer = ALLOW_ALL,
    ) -> None:
        self._cluster = cluster
        self._cluster_id = cluster_id
        self._authorizer = authorizer

    def apis(self) -> Sequence[ServedApi]:
        return (ServedApi(METADATA, 1, 13, "kafka_metadata", self.metadata),)

    def metadata(self, request: KafkaRequest, response: type[Any]) -> Any:
        """The brokers that serve a Kafka listener and the topics asked (null: every topic
        but the broker's internal ones, which hold no Kafka records). A topic never
        created is UNKNOWN_TOPIC_OR_PARTITION (topics are not created by asking), a name
        no topic can have INVALID_TOPIC_EXCEPTION; a partition whose leader is down or
        serves no Kafka listener has leader -1 and LEADER_NOT_AVAILABLE, so the client
        asks again. A topic the caller may not Describe is TOPIC_AUTHORIZATION_FAILED
        when asked (by name or id: its name not told), whether it exists or not (the
        answer must not tell), and left out of "every topic", as Kafka does."""
        cluster = self._cluster()
        registered = cluster.brokers()
        live = {b.broker_id for b in registered}
        serving = kafka_brokers(registered)
        assignments = cluster.topics()
        asked = request.body.topics
        if asked is None:
            entries: list[tuple[str | None, TopicAssignment | None, IdemlogError | None]] = [
                (name, a, None)
                for name, a in sorted(assignments.items())
                if not name.startswith(INTERNAL_TOPIC_PREFIX)
                and self._authorizer.may(
                    request, Operation.DESCRIBE, Resource(ResourceType.TOPIC, name)
                )
            ]
        else:
            entries = [self._authorized(request, self._find_topic(t, assignments)) for t in asked]
        broker_cls = nested(response, "MetadataResponseBroker")
        brokers = tuple(_broker(broker_cls, info) for _, info in sorted(serving.items()))
        controller = cluster.controller()
        controller_id = -1
        if controller is not None and controller.broker_id in serving:
            controller_id = controller.broker_id
        topics = tuple(
            self._topic(response, name, a, error, live, set(serving)) for name, a, error in entries
        )
        return build(
            response,
            throttle_time=NO_THROTTLE,
            brokers=brokers,
            cluster_id=self._cluster_id(),
            controller_id=i32(controller_id),
            topics=topics,
            error_code=KafkaErrorCode.none,
        )

    def _authorized(
        self,
        request: KafkaRequest,
        entry: tuple[str | None, TopicAssignment | None, IdemlogError | None],
    ) -> tuple[str | None, TopicAssignment | None, IdemlogError | None]:
        name, assignment, _ = entry
        if name is None:
            return entry  # no topic has the id (or none was named): nothing to hide
        refused = self._authorizer.refusal(
            request, Operation.DESCRIBE, Resource(ResourceType.TOPIC, name)
        )
        if refused is None:
            return entry
        # Asked by id, the name is not told to who may not Describe the topic.
        asked_by_name = assignment is None or any(t.name == name for t in request.body.topics)
        return (name if asked_by_name else None), None, refused

    def _find_topic(
        self, asked: Any, assignments: Mapping[str, TopicAssignment]
    ) -> tuple[str | None, TopicAssignment | None, IdemlogError | None]:
        name: str | None = asked.name
        topic_id = getattr(asked, "topic_id", None)
        if name is None and topic_id is not None and topic_id != _NO_TOPIC_ID:
            for a in assignments.values():
                if a.topic_id == topic_id.hex and not a.name.startswith(INTERNAL_TOPIC_PREFIX):
                    return a.name, a, None
            return None, None, UnknownTopicIdError(f"no topic has the id {topic_id}")
        if name is None:
            return None, None, InvalidRequestError("a topic asked with neither name nor id")
        if name.startswith(INTERNAL_TOPIC_PREFIX):
            return name, None, InvalidTopicError(f"topic {name!r} is internal to the broker")
        found = assignments.get(name)
        if found is None:
            try:
                validate_topic_name(name)  # a name no topic can have: INVALID_TOPIC_EXCEPTION
            except IdemlogError as exc:
                return name, None, exc
            return name, None, UnknownTopicOrPartitionError(f"no topic {name!r}")
        return name, found, None

    def _topic(
        self,
        response: type[Any],
        name: str | None,
        assignment: TopicAssignment | None,
        error: IdemlogError | None,
        live: set[int],
        kafka_brokers: set[int],
    ) -> Any:
        topic_cls = nested(response, "MetadataResponseTopic")
        if assignment is None:
            assert error is not None
            return build(
                topic_cls,
                error_code=kafka_error(error),
                name=name,
                topic_id=_NO_TOPIC_ID,
                is_internal=False,
                partitions=(),
                topic_authorized_operations=NO_OPERATIONS,
            )
        partition_cls = nested(response, "MetadataResponsePartition")
        partitions = []
        for index, state in sorted(assignment.states.items()):
            servable = state.leader in live and state.leader in kafka_brokers
            partitions.append(
                build(
                    partition_cls,
                    error_code=(
                        KafkaErrorCode.none if servable else KafkaErrorCode.leader_not_available
                    ),
                    partition_index=i32(index),
                    leader_id=i32(state.leader if servable else -1),
                    leader_epoch=i32(state.leader_epoch),
                    replica_nodes=tuple(i32(b) for b in state.replicas),
                    isr_nodes=tuple(i32(b) for b in state.isr),
                    offline_replicas=tuple(i32(b) for b in state.replicas if b not in live),
                )
            )
        topic_id = uuid.UUID(hex=assignment.topic_id) if assignment.topic_id else _NO_TOPIC_ID
        return build(
            topic_cls,
            error_code=KafkaErrorCode.none,
            name=assignment.name,
            topic_id=topic_id,
            is_internal=False,
            partitions=tuple(partitions),
            topic_authorized_operations=NO_OPERATIONS,
        )


def _broker(cls: type[Any], info: BrokerInfo) -> Any:
    assert info.kafka_listener is not None
    host, port = info.kafka_listener
    return build(cls, node_id=i32(info.broker_id), host=host, port=i32(port), rack=None)
