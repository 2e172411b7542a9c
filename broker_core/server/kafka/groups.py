"""The consumer group APIs of the Kafka listener (Kafka's classic group protocol).

FindCoordinator names the leader of the group's ``__consumer_offsets`` partition (created
on first need); the other APIs are served by this broker's coordinator of that partition
(``server.coordination.group_coordinators``), or answered NOT_COORDINATOR /
COORDINATOR_LOAD_IN_PROGRESS, so the client finds it again. JoinGroup and SyncGroup hold
their connection's thread until the rebalance phase ends (the listener runs a thread per
connection, and Kafka clients send nothing else on it meanwhile).

Versions served: what librdkafka 2.x, kafka-python 3.x and Kafka 4.x's Java client
negotiate, the flexible versions included (docs/kafka.md, "Consumer groups"). OffsetCommit
v10 and OffsetFetch v10 (topics by id, for KIP-848's protocol) are not served.

With ``authorizer.enable``, Kafka's ACLs on the Group resource (docs/kafka.md, "What each
API requires"): FindCoordinator, DescribeGroups and OffsetFetch need Describe on the
group; JoinGroup, SyncGroup, Heartbeat, LeaveGroup and OffsetCommit Read; DeleteGroups
Delete: GROUP_AUTHORIZATION_FAILED otherwise. OffsetCommit needs Read on each topic,
OffsetFetch Describe (TOPIC_AUTHORIZATION_FAILED per partition; a fetch of every topic
leaves the others out); ListGroups lists every group to Describe on the Cluster, else the
groups the caller may Describe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.static.primitive import i32, i64

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.errors import (
    GroupIdNotFoundError,
    IdemlogError,
    InvalidGroupIdError,
)
from broker_core.groups.coordinator import GroupCoordinator, JoinRequest, OffsetToCommit
from broker_core.groups.records import CommittedOffset
from broker_core.groups.state import GroupState, parse_state
from broker_core.security.acl import CLUSTER, Operation, Resource, ResourceType
from broker_core.server.coordination.group_coordinators import GroupCoordinators
from broker_core.server.kafka.authorize import ALLOW_ALL, KafkaAuthorizer
from broker_core.server.kafka.framing import KafkaRequest
from broker_core.server.kafka.messages import NO_THROTTLE, ServedApi, build, kafka_error, nested

log = logging.getLogger("idemlog.kafka")

FIND_COORDINATOR = 10
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
DELETE_GROUPS = 42

# api key -> (min, max) version served, the metrics' request kind. Kafka 4 dropped
# OffsetCommit v0-v1 and OffsetFetch v0 (KIP-896; kio has none of them); v10 of both
# names topics by id for KIP-848's protocol, not served.
SERVED: dict[int, tuple[int, int, str]] = {
    FIND_COORDINATOR: (0, 6, "kafka_find_coordinator"),
    OFFSET_COMMIT: (2, 9, "kafka_offset_commit"),
    OFFSET_FETCH: (1, 9, "kafka_offset_fetch"),
    JOIN_GROUP: (0, 9, "kafka_join_group"),
    HEARTBEAT: (0, 4, "kafka_heartbeat"),
    LEAVE_GROUP: (0, 5, "kafka_leave_group"),
    SYNC_GROUP: (0, 5, "kafka_sync_group"),
    DESCRIBE_GROUPS: (0, 6, "kafka_describe_groups"),
    LIST_GROUPS: (0, 5, "kafka_list_groups"),
    DELETE_GROUPS: (0, 2, "kafka_delete_groups"),
}

GROUP_KEY = 0  # FindCoordinator's key_type for a group (1: a transactional id)
CLASSIC = "classic"  # ListGroups v5's group type: every group here
_NO_OPERATIONS = i32(-(2**31))


def _error(exc: IdemlogError) -> KafkaErrorCode:
    return kafka_error(exc)


class GroupApis:
    """The group APIs of one broker: ``coordinators`` its group coordinators, ``cluster()``
    the cluster metadata (topic ids and partition counts for OffsetCommit and OffsetFetch),
    each request checked by ``authorizer``."""

    def __init__(
        self,
        coordinators: GroupCoordinators,
        cluster: Callable[[], ClusterMetadata],
        *,
        authorizer: KafkaAuthorizer = ALLOW_ALL,
    ) -> None:
        self._coordinators = coordinators
        self._cluster = cluster
        self._authorizer = authorizer
        self._handlers: dict[int, Callable[[KafkaRequest, type[Any]], Any]] = {
            FIND_COORDINATOR: self.find_coordinator,
            JOIN_GROUP: self.join_group,
            SYNC_GROUP: self.sync_group,
            HEARTBEAT: self.heartbeat,
            LEAVE_GROUP: self.leave_group,
            OFFSET_COMMIT: self.offset_commit,
            OFFSET_FETCH: self.offset_fetch,
            DESCRIBE_GROUPS: self.describe_groups,
            LIST_GROUPS: self.list_groups,
            DELETE_GROUPS: self.delete_groups,
        }

    def apis(self) -> Sequence[ServedApi]:
        return tuple(
            ServedApi(key, low, high, kind, self._handlers[key])
            for key, (low, high, kind) in SERVED.items()
        )

    # -- FindCoordinator -----------------------------------------------------------------
    def find_coordinator(self, request: KafkaRequest, response: type[Any]) -> Any:
        """v0-v3 one key, v4+ a list (KIP-699). Groups only: a transactional id's
        coordinator is not served on the Kafka listener (INVALID_REQUEST, with a message
        from v1)."""
        body = request.body
        key_type = int(getattr(body, "key_type", GROUP_KEY))
        keys: list[str] = (
            list(body.coordinator_keys) if hasattr(body, "coordinator_keys") else [body.key]
        )
        found = [self._find(request, key, key_type) for key in keys]
        if not hasattr(body, "coordinator_keys"):
            error, message, node, host, port = found[0]
            return build(
                response,
                throttle_time=NO_THROTTLE,
                error_code=error,
                error_message=message,
                node_id=i32(node),
                host=host,
                port=i32(port),
            )
        coordinator_cls = nested(response, "Coordinator")
        return build(
            response,
            throttle_time=NO_THROTTLE,
            coordinators=tuple(
                build(
                    coordinator_cls,
                    key=key,
                    node_id=i32(node),
                    host=host,
                    port=i32(port),
                    error_code=error,
                    error_message=message,
                )
                for key, (error, message, node, host, port) in zip(keys, found, strict=True)
            ),
        )

    def _find(
        self, request: KafkaRequest, key: str, key_type: int
    ) -> tuple[KafkaErrorCode, str | None, int, str, int]:
        if key_type != GROUP_KEY:
            message = (
                f"key type {key_type}: only group coordinators (key type 0) are served on "
                "idemlog's Kafka listener"
            )
            return KafkaErrorCode.invalid_request, message, -1, "", -1
        if not key:
            return KafkaErrorCode.invalid_group_id, "the group id is empty", -1, "", -1
        refused = self._authorizer.refusal(
            request, Operation.DESCRIBE, Resource(ResourceType.GROUP, key)
        )
        if refused is not None:
            return kafka_error(refused), refused.message, -1, "", -1
        try:
            info = self._coordinators.find(key)
        except IdemlogError as exc:
            log.debug("kafka: FindCoordinator %r: %s", key, exc)
            return _error(exc), exc.message, -1, "", -1
        assert info.kafka_listener is not None
        host, port = info.kafka_listener
        return KafkaErrorCode.none, None, info.broker_id, host, port

    # -- JoinGroup, SyncGroup, Heartbeat, LeaveGroup -------------------------------------
    def join_group(self, request: KafkaRequest, response: type[Any]) -> Any:
        body = request.body
        session_ms = int(body.session_timeout.total_seconds() * 1000)
        rebalance = getattr(body, "rebalance_timeout", None)
        rebalance_ms = session_ms if rebalance is None else int(rebalance.total_seconds() * 1000)
        member_cls = nested(response, "JoinGroupResponseMember")
        joined = JoinRequest(
            group_id=body.group_id,
            member_id=body.member_id,
            group_instance_id=getattr(body, "group_instance_id", None),
            client_id=request.client_id or "",
            client_host="",
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms,
            protocol_type=body.protocol_type,
            protocols=tuple((p.name, bytes(p.metadata)) for p in body.protocols),
        )
        try:
            self._require(request, Operation.READ, body.group_id)
            answer = self._coordinator(body.group_id).join(joined)
        except IdemlogError as exc:
            log.debug("kafka: JoinGroup %r: %s", body.group_id, exc)
            return build(
                response,
                throttle_time=NO_THROTTLE,
                error_code=_error(exc),
                generation_id=i32(-1),
                protocol_type=None,
                protocol_name=None if request.api_version >= 7 else "",
                leader="",
                skip_assignment=False,
                member_id=body.member_id,
                members=(),
            )
        return build(
            response,
            throttle_time=NO_THROTTLE,
            error_code=KafkaErrorCode.none,
            generation_id=i32(answer.generation),
            protocol_type=answer.protocol_type,
            protocol_name=answer.protocol,
            leader=answer.leader,
            skip_assignment=False,
            member_id=answer.member_id,
            members=tuple(
                build(member_cls, member_id=m, group_instance_id=None, metadata=meta)
                for m, meta in answer.members
            ),
        )

    def sync_group(self, request: KafkaRequest, response: type[Any]) -> Any:
        body = request.body
        assignments = {a.member_id: bytes(a.assignment) for a in body.assignments}
        try:
            self._require(request, Operation.READ, body.group_id)
            protocol_type, protocol, assignment = self._coordinator(body.group_id).sync(
                body.group_id,
                body.member_id,
                int(body.generation_id),
                getattr(body, "protocol_type", None),
                getattr(body, "protocol_name", None),
                assignments,
            )
        except IdemlogError as exc:
            log.debug("kafka: SyncGroup %r: %s", body.group_id, exc)
            return build(
                response,
                throttle_time=NO_THROTTLE,
                error_code=_error(exc),
                protocol_type=None,
                protocol_name=None,
                assignment=b"",
            )
        return build(
            response,
            throttle_time=NO_THROTTLE,
            error_code=KafkaErrorCode.none,
            protocol_type=protocol_type,
            protocol_name=protocol,
            assignment=assignment,
        )

    def heartbeat(self, request: KafkaRequest, response: type[Any]) -> Any:
        body = request.body
        error = KafkaErrorCode.none
        try:
            self._require(request, Operation.READ, body.group_id)
            self._coordinator(body.group_id).heartbeat(
                body.group_id, body.member_id, int(body.generation_id)
            )
        except IdemlogError as exc:
            error = _error(exc)
        return build(response, throttle_time=NO_THROTTLE, error_code=error)

    def leave_group(self, request: KafkaRequest, response: type[Any]) -> Any:
        """v0-v2 one member; v3+ a list (KIP-345), each answered."""
        body = request.body
        many = hasattr(body, "members")
        member_ids = [m.member_id for m in body.members] if many else [body.member_id]
        try:
            self._require(request, Operation.READ, body.group_id)
            answers = self._coordinator(body.group_id).leave(body.group_id, member_ids)
        except IdemlogError as exc:
            return build(response, throttle_time=NO_THROTTLE, error_code=_error(exc), members=())
        if not many:
            error = answers[0]
            code = KafkaErrorCode.none if error is None else _error(error)
            return build(response, throttle_time=NO_THROTTLE, error_code=code)
        member_cls = nested(response, "MemberResponse")
        return build(
            response,
            throttle_time=NO_THROTTLE,
            error_code=KafkaErrorCode.none,
            members=tuple(
                build(
                    member_cls,
                    member_id=m,
                    group_instance_id=None,
                    error_code=KafkaErrorCode.none if e is None else _error(e),
                )
                for m, e in zip(member_ids, answers, strict=True)
            ),
        )

    # -- OffsetCommit, OffsetFetch -------------------------------------------------------
    def offset_commit(self, request: KafkaRequest, response: type[Any]) -> Any:
        """Each partition of an existing topic is committed with the topic's id (one
        acks=all append for the request); a partition the cluster does not have is
        UNKNOWN_TOPIC_OR_PARTITION, and the rest are committed."""
        body = request.body
        topics = self._cluster().topics()
        errors: dict[tuple[str, int], KafkaErrorCode] = {}
        wanted: list[OffsetToCommit] = []
        group_refused = self._group_error(request, Operation.READ, body.group_id)
        for topic in body.topics:
            assignment = topics.get(topic.name)
            refused = group_refused
            if refused == KafkaErrorCode.none:
                refused = self._authorizer.topic_error(request, Operation.READ, topic.name)
            for p in topic.partitions:
                index = int(p.partition_index)
                if refused != KafkaErrorCode.none:
                    errors[(topic.name, index)] = refused
                    continue
                if assignment is None or index not in assignment.partitions:
                    errors[(topic.name, index)] = KafkaErrorCode.unknown_topic_or_partition
                    continue
                wanted.append(
                    OffsetToCommit(
                        topic.name,
                        index,
                        int(p.committed_offset),
                        int(getattr(p, "committed_leader_epoch", -1)),
                        p.committed_metadata,
                        assignment.topic_id,
                    )
                )
        if wanted:
            try:
                self._coordinator(body.group_id).commit(
                    body.group_id,
                    body.member_id,
                    int(body.generation_id_or_member_epoch),
                    wanted,
                )
            except IdemlogError as exc:
                log.debug("kafka: OffsetCommit %r: %s", body.group_id, exc)
                for o in wanted:
                    errors[(o.topic, o.partition)] = _error(exc)
        topic_cls = nested(response, "OffsetCommitResponseTopic")
        partition_cls = nested(response, "OffsetCommitResponsePartition")
        return build(
            response,
            throttle_time=NO_THROTTLE,
            topics=tuple(
                build(
                    topic_cls,
                    name=topic.name,
                    partitions=tuple(
                        build(
                            partition_cls,
                            partition_index=p.partition_index,
                            error_code=errors.get(
                                (topic.name, int(p.partition_index)), KafkaErrorCode.none
                            ),
                        )
                        for p in topic.partitions
                    ),
                )
                for topic in body.topics
            ),
        )

    def offset_fetch(self, request: KafkaRequest, response: type[Any]) -> Any:
        """v1-v7 one group, v8+ a list (KIP-709); topics null (v2+): every partition the
        group committed. An offset committed for a topic since deleted (and perhaps
        recreated under its name: another id) is answered as none (-1)."""
        body = request.body
        if hasattr(body, "groups"):
            group_cls = nested(response, "OffsetFetchResponseGroup")
            groups = tuple(
                self._fetch_group(
                    request,
                    response,
                    g.group_id,
                    g.topics,
                    group_cls,
                    "OffsetFetchResponseTopics",
                    "OffsetFetchResponsePartitions",
                )
                for g in body.groups
            )
            return build(response, throttle_time=NO_THROTTLE, groups=groups)
        answer = self._fetch_group(
            request,
            response,
            body.group_id,
            body.topics,
            None,
            "OffsetFetchResponseTopic",
            "OffsetFetchResponsePartition",
        )
        return build(response, throttle_time=NO_THROTTLE, **answer)

    def _fetch_group(
        self,
        request: KafkaRequest,
        response: type[Any],
        group_id: str,
        asked_topics: Any,
        group_cls: type[Any] | None,
        topic_name: str,
        partition_name: str,
    ) -> Any:
        topic_cls = nested(response, topic_name)
        partition_cls = nested(response, partition_name)
        asked = (
            None
            if asked_topics is None
            else [(t.name, int(i)) for t in asked_topics for i in t.partition_indexes]
        )
        error = KafkaErrorCode.none
        found: list[tuple[str, int, CommittedOffset | None]] = []
        try:
            self._require(request, Operation.DESCRIBE, group_id)
            found = self._coordinator(group_id).fetch(group_id, asked)
        except IdemlogError as exc:
            log.debug("kafka: OffsetFetch %r: %s", group_id, exc)
            error = _error(exc)
            found = [(t, p, None) for t, p in asked or []]
        # Describe on each topic: one asked is refused per partition (counted), the others
        # of a fetch of every topic left out (uncounted), as Kafka.
        denied: dict[str, KafkaErrorCode] = {}
        if error == KafkaErrorCode.none:
            for topic in sorted({t for t, _, _ in found}):
                if asked is not None:
                    denied[topic] = self._authorizer.topic_error(request, Operation.DESCRIBE, topic)
                elif not self._authorizer.may(
                    request, Operation.DESCRIBE, Resource(ResourceType.TOPIC, topic)
                ):
                    denied[topic] = KafkaErrorCode.topic_authorization_failed
            if asked is None:
                found = [f for f in found if f[0] not in denied]
        ids = {name: a.topic_id for name, a in self._cluster().topics().items()}
        by_topic: dict[str, list[Any]] = {}
        for topic, index, committed in found:
            topic_error = denied.get(topic, KafkaErrorCode.none)
            if topic_error != KafkaErrorCode.none:
                committed = None  # not told to who may not Describe the topic
            if (
                committed is not None
                and committed.topic_id
                and ids.get(topic) != committed.topic_id
            ):
                committed = None  # committed for a topic deleted since
            by_topic.setdefault(topic, []).append(
                build(
                    partition_cls,
                    partition_index=i32(index),
                    committed_offset=i64(-1 if committed is None else committed.offset),
                    committed_leader_epoch=i32(-1 if committed is None else committed.leader_epoch),
                    metadata=None if committed is None else committed.metadata,
                    error_code=topic_error,
                )
            )
        topics = tuple(
            build(topic_cls, name=name, partitions=tuple(parts)) for name, parts in by_topic.items()
        )
        if group_cls is None:
            return {"topics": topics, "error_code": error}
        return build(group_cls, group_id=group_id, topics=topics, error_code=error)

    # -- DescribeGroups, ListGroups, DeleteGroups ----------------------------------------
    def describe_groups(self, request: KafkaRequest, response: type[Any]) -> Any:
        """A group this coordinator does not hold is Dead (v6+: GROUP_ID_NOT_FOUND), as
        Kafka answers; members' metadata and assignments only while the group is Stable."""
        group_cls = nested(response, "DescribedGroup")
        member_cls = nested(response, "DescribedGroupMember")
        groups = []
        for group_id in request.body.groups:
            error, message, described = KafkaErrorCode.none, None, None
            try:
                self._require(request, Operation.DESCRIBE, group_id)
                described = self._coordinator(group_id).describe(group_id)
                if described is None and request.api_version >= 6:
                    raise GroupIdNotFoundError(f"no group {group_id!r}")
            except IdemlogError as exc:
                error, message = _error(exc), exc.message
            groups.append(
                build(
                    group_cls,
                    error_code=error,
                    error_message=message,
                    group_id=group_id,
                    group_state=(described.state if described else GroupState.DEAD).value,
                    protocol_type=described.protocol_type if described else "",
                    protocol_data=described.protocol if described else "",
                    members=tuple(
                        build(
                            member_cls,
                            member_id=m.member_id,
                            group_instance_id=None,
                            client_id=m.client_id,
                            client_host=m.client_host,
                            member_metadata=m.metadata,
                            member_assignment=m.assignment,
                        )
                        for m in (described.members if described else ())
                    ),
                    authorized_operations=_NO_OPERATIONS,
                )
            )
        return build(response, throttle_time=NO_THROTTLE, groups=tuple(groups))

    def list_groups(self, request: KafkaRequest, response: type[Any]) -> Any:
        """The groups of every coordinator running on this broker (a client asks every
        broker), filtered by state (v4+) and type (v5+: every group here is classic)."""
        body = request.body
        states_asked = list(getattr(body, "states_filter", ()))
        states = {parse_state(s) for s in states_asked}
        types = {t.lower() for t in getattr(body, "types_filter", ())}
        listed_cls = nested(response, "ListedGroup")
        if types and CLASSIC not in types:
            listed: list[tuple[str, str, GroupState]] = []
        else:
            listed = [g for c in self._coordinators.running() for g in _listed(c)]
        if not self._authorizer.may(request, Operation.DESCRIBE, CLUSTER):
            listed = [
                g
                for g in listed
                if self._authorizer.may(
                    request, Operation.DESCRIBE, Resource(ResourceType.GROUP, g[0])
                )
            ]
        groups = tuple(
            build(
                listed_cls,
                group_id=group_id,
                protocol_type=protocol_type,
                group_state=state.value,
                group_type=CLASSIC,
            )
            for group_id, protocol_type, state in listed
            if not states_asked or state in states
        )
        return build(
            response, throttle_time=NO_THROTTLE, error_code=KafkaErrorCode.none, groups=groups
        )

    def delete_groups(self, request: KafkaRequest, response: type[Any]) -> Any:
        result_cls = nested(response, "DeletableGroupResult")
        results = []
        for group_id in request.body.groups_names:
            error = KafkaErrorCode.none
            try:
                self._require(request, Operation.DELETE, group_id)
                self._coordinator(group_id).delete(group_id)
            except IdemlogError as exc:
                log.debug("kafka: DeleteGroups %r: %s", group_id, exc)
                error = _error(exc)
            results.append(build(result_cls, group_id=group_id, error_code=error))
        return build(response, throttle_time=NO_THROTTLE, results=tuple(results))

    def _require(self, request: KafkaRequest, operation: Operation, group_id: str | None) -> None:
        """Raise GroupAuthorizationFailedError unless the caller may ``operation`` the
        group (an empty id is left to :meth:`_coordinator`'s INVALID_GROUP_ID)."""
        if group_id:
            self._authorizer.require(request, operation, Resource(ResourceType.GROUP, group_id))

    def _group_error(
        self, request: KafkaRequest, operation: Operation, group_id: str | None
    ) -> KafkaErrorCode:
        if not group_id:
            return KafkaErrorCode.none  # INVALID_GROUP_ID, from the coordinator
        return self._authorizer.group_error(request, operation, group_id)

    def _coordinator(self, group_id: str | None) -> GroupCoordinator:
        if not group_id:
            raise InvalidGroupIdError("the group id is empty")
        return self._coordinators.coordinator_for(group_id)


def _listed(coordinator: GroupCoordinator) -> list[tuple[str, str, GroupState]]:
    try:
        return coordinator.list_groups()
    except IdemlogError:
        return []  # closed since it was listed: its groups are another broker's now
