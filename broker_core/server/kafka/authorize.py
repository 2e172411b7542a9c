"""The Kafka APIs' one door to the ACLs: every family asks :class:`KafkaAuthorizer` about
the request's caller (``request.connection.caller``), and it asks the broker's
``RequestAuthorizer``, the Flight listener's, so both listeners decide with the same
bindings, super users and ``allow.everyone.if.no.acl.found``, and count each refusal in the
same metrics (``authorization_refusals`` by error).

Kafka's semantics: a request refused on one resource answers that resource's error in
its place (a topic's partitions TOPIC_AUTHORIZATION_FAILED, a group's
GROUP_AUTHORIZATION_FAILED...) and serves the others; a listing without names leaves out
what the caller may not Describe, uncounted (:meth:`KafkaAuthorizer.may`). What each API
needs is docs/kafka.md's table, "What each API requires".
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode as KafkaErrorCode

from broker_core.errors import IdemlogError
from broker_core.security.acl import CLUSTER, Operation, Resource, ResourceType
from broker_core.server.access.authorization import Need, RequestAuthorizer
from broker_core.server.kafka.framing import KafkaRequest
from broker_core.server.kafka.messages import kafka_error


class KafkaAuthorizer:
    """``authorizer``: the broker's (None: ``authorizer.enable=false``, everything is
    allowed)."""

    def __init__(self, authorizer: RequestAuthorizer | None) -> None:
        self._authorizer = authorizer

    @property
    def enabled(self) -> bool:
        return self._authorizer is not None

    def may(self, request: KafkaRequest, operation: Operation, resource: Resource) -> bool:
        """Whether the caller may: a filter's question, neither counted nor logged."""
        if self._authorizer is None:
            return True
        return self._authorizer.may(request.connection.caller, operation, resource)

    def refusal(
        self, request: KafkaRequest, operation: Operation, resource: Resource
    ) -> IdemlogError | None:
        """None when the caller may; else the typed refusal (Kafka's code for the
        resource type, a message naming principal, host, operation, resource and the
        ``idemlog acls add`` that would allow it), counted and logged once."""
        if self._authorizer is None:
            return None
        try:
            self._authorizer.require(
                request.connection.caller,
                (Need(operation, resource),),
                f"Kafka {type(request.body).__name__}",
            )
        except IdemlogError as exc:
            return exc
        return None

    def error(
        self, request: KafkaRequest, operation: Operation, resource: Resource
    ) -> KafkaErrorCode:
        """:meth:`refusal` as the Kafka error code a response carries (none: allowed)."""
        refused = self.refusal(request, operation, resource)
        return KafkaErrorCode.none if refused is None else kafka_error(refused)

    def require(self, request: KafkaRequest, operation: Operation, resource: Resource) -> None:
        """Raise :meth:`refusal`'s error unless the caller may."""
        refused = self.refusal(request, operation, resource)
        if refused is not None:
            raise refused

    # -- the resources Kafka's APIs name -------------------------------------------------
    def topic_error(
        self, request: KafkaRequest, operation: Operation, topic: str
    ) -> KafkaErrorCode:
        """Metadata, ListOffsets, OffsetForLeaderEpoch: Describe; Fetch: Read; Produce:
        Write. TOPIC_AUTHORIZATION_FAILED or none."""
        return self.error(request, operation, Resource(ResourceType.TOPIC, topic))

    def group_error(
        self, request: KafkaRequest, operation: Operation, group_id: str
    ) -> KafkaErrorCode:
        """The consumer-group APIs, as Kafka: FindCoordinator (group), JoinGroup,
        SyncGroup, Heartbeat, LeaveGroup, OffsetCommit: Read; OffsetFetch: Describe (and
        Describe on each topic); DescribeGroups, ListGroups' filter: Describe;
        DeleteGroups: Delete. GROUP_AUTHORIZATION_FAILED or none."""
        return self.error(request, operation, Resource(ResourceType.GROUP, group_id))

    def producer_error(self, request: KafkaRequest, transactional_id: str | None) -> KafkaErrorCode:
        """InitProducerId and Produce's batches: with a transactional id Write on it
        (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), without IdempotentWrite on the Cluster
        (CLUSTER_AUTHORIZATION_FAILED), as the Flight listener's InitProducerId."""
        if transactional_id is None:
            return self.error(request, Operation.IDEMPOTENT_WRITE, CLUSTER)
        resource = Resource(ResourceType.TRANSACTIONAL_ID, transactional_id)
        return self.error(request, Operation.WRITE, resource)

    def cluster_error(self, request: KafkaRequest, operation: Operation) -> KafkaErrorCode:
        """Admin APIs on the Cluster (CreateTopics' fallback Create, DescribeCluster's
        Describe, ...): CLUSTER_AUTHORIZATION_FAILED or none."""
        return self.error(request, operation, CLUSTER)


ALLOW_ALL = KafkaAuthorizer(None)  # authorizer.enable=false, and unit tests
