"""DoAction handlers: one function per ``protocol.Action``, JSON body in, typed answer out.

Every body is decoded by its typed request (``broker_core.protocol.*_requests``), so a
missing or mistyped field is an ``INVALID_REQUEST`` naming the action and the field; every
handler answers its typed response, which :meth:`ActionHandlers.handle` alone turns into
the wire document. What each action takes and answers is not repeated here: each request
class shows its own (``WIRE``), and docs/protocol.md's tables ("Everything else: DoAction"
and "Between brokers") are generated from them (``protocol.action_table``).

Without a transactional id, InitProducerId is served by any broker from its own leased
producer-id block (as Kafka does); everything transactional goes to the coordinator of
its key's ``__transaction_state`` partition, the partition's leader (``NOT_COORDINATOR``
elsewhere, retriable; ``server.coordination.coordinators``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import pyarrow as pa

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.records import TopicAssignment
from broker_core.cluster.topic_creation import validate_new_topic
from broker_core.errors import (
    CoordinatorNotAvailableError,
    InvalidRequestError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
    UnknownTopicOrPartitionError,
)
from broker_core.log.compaction import check_key_columns
from broker_core.log.partition_log import HangingAbort, PartitionLog
from broker_core.log.store import LogStore
from broker_core.producer_ids.manager import ProducerIdManager
from broker_core.protocol.admin_requests import (
    AbortHangingTransactionRequest,
    AbortHangingTransactionResponse,
    AbortTransactionRequest,
    AbortTransactionResponse,
    BrokerAddress,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteTopicRequest,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTopicsRequest,
    DescribeTopicsResponse,
    FindCoordinatorRequest,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
    MetadataRequest,
    MetadataResponse,
    PartitionInfo,
    PartitionOffsets,
    PingResponse,
    TopicDescription,
    merge_listings,
)
from broker_core.protocol.coordinator_keys import CoordinatorAddress
from broker_core.protocol.metrics import MetricsRequest, MetricsResponse
from broker_core.protocol.replica import (
    ElectLeadersRequest,
    ElectLeadersResponse,
    OffsetsForLeaderEpochRequest,
    OffsetsForLeaderEpochResponse,
    ReplicaFetchRequest,
    ReplicaLogStartRequest,
)
from broker_core.protocol.requests import EmptyResponse, Response
from broker_core.protocol.stable_cut import TrackedBatches, TrackedBatchesRequest
from broker_core.protocol.topics import validate_user_topic_name
from broker_core.protocol.txn_requests import (
    AbortSinkBatchRequest,
    AbortSinkRunRequest,
    AbortSinkRunResponse,
    AddPartitionsToTxnRequest,
    CommitSinkBatchRequest,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    PrepareSinkTxnRequest,
    SinkBatchResponse,
    SinkHeartbeatRequest,
    StableEndsRequest,
    StableEndsResponse,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from broker_core.protocol.wire import Action
from broker_core.security.producer_token import ProducerTokens
from broker_core.server.access.authorization import UNCHECKED, Permit
from broker_core.server.config.broker_config import BrokerConfig
from broker_core.server.coordination.coordinators import EMBEDDED_STATE_PARTITIONS, Coordinators
from broker_core.server.coordination.txn_state_topic import ensure_state_topic
from broker_core.server.replication.replica_manager import ReplicaManager
from broker_core.txn.coordinator.coordinator import TransactionCoordinator
from broker_core.txn.coordinator.markers import ProducerMarkers, StableOffsets
from broker_core.txn.state_topic.schema import TXN_STATE_TOPIC, state_partition_of

Handler = Callable[[dict[str, Any]], Response]


class Topics(Protocol):
    """What the handlers use of the broker's local topics (``LocalTopics``)."""

    def assignment(self, topic: str) -> TopicAssignment: ...

    def leader_log(
        self, topic: str, partition: int, topic_id: str | None = None
    ) -> PartitionLog: ...

    def check_topic_id(self, topic: str, topic_id: str | None) -> None: ...

    def ensure(self, assignment: TopicAssignment) -> object: ...

    def delete(self, name: str) -> None: ...


class LocalMarkers(Protocol):
    """Writes markers into partitions this broker leads (``RoutingMarkerWriter``)."""

    def write_local(
        self, producers: Sequence[ProducerMarkers], commit: bool, coordinator_epoch: int
    ) -> StableOffsets: ...

    def abort_hanging(
        self,
        topic: str,
        partition: int,
        producer_id: int | None,
        producer_epoch: int | None,
        start_offset: int | None,
    ) -> HangingAbort: ...


class ActionHandlers:
    """The DoAction table of one broker.

    Its collaborators come in through the constructor; the ones that exist only once the
    broker has started (the store, the cluster, the producer ids, the marker writer, the
    replicas) are callables asked at each request, and ``coordinators`` asks the broker's
    coordinator role at each request. ``cluster`` and ``coordinators`` raise the retriable
    error that says where to go instead; ``markers``, ``pids``, ``store`` and ``replicas``
    may answer None before the start.
    """

    def __init__(
        self,
        *,
        broker_id: int,
        config: BrokerConfig,
        topics: Topics,
        store: Callable[[], LogStore | None],
        cluster: Callable[[], ClusterMetadata],
        coordinators: Coordinators,
        pids: Callable[[], ProducerIdManager | None],
        producer_tokens: ProducerTokens,
        markers: Callable[[], LocalMarkers | None],
        metrics_document: Callable[[MetricsRequest], dict[str, Any]],
        replicas: Callable[[], ReplicaManager | None] = lambda: None,
    ) -> None:
        self._broker_id = broker_id
        self._config = config
        self._topics = topics
        self._store = store
        self._cluster = cluster
        self._coordinators = coordinators
        self._pids = pids
        self._producer_tokens = producer_tokens
        self._markers = markers
        self._metrics_document = metrics_document
        self._replicas = replicas
        # Answers that are not JSON (a follower's fetch carries the batches' bytes).
        self.binary: dict[Action, Callable[[dict[str, Any]], bytes]] = {
            Action.REPLICA_FETCH: self.replica_fetch,
            Action.REPLICA_LOG_START: self.replica_log_start,
        }
        self.table: dict[Action, Handler] = {
            Action.OFFSETS_FOR_LEADER_EPOCH: self.offsets_for_leader_epoch,
            Action.ELECT_LEADERS: self.elect_leaders,
            Action.CREATE_TOPIC: self.create_topic,
            Action.DELETE_TOPIC: self.delete_topic,
            Action.DESCRIBE_TOPICS: self.describe_topics,
            Action.LIST_OFFSETS: self.list_offsets,
            Action.METADATA: self.metadata,
            Action.FIND_COORDINATOR: self.find_coordinator,
            Action.INIT_PRODUCER_ID: self.init_producer_id,
            Action.ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            Action.END_TXN: self.end_txn,
            Action.PREPARE_SINK_TXN: self.prepare_sink_txn,
            Action.WRITE_TXN_MARKERS: self.write_txn_markers,
            Action.COMMIT_SINK_BATCH: self.commit_sink_batch,
            Action.ABORT_SINK_BATCH: self.abort_sink_batch,
            Action.ABORT_SINK_RUN: self.abort_sink_run,
            Action.SINK_HEARTBEAT: self.sink_heartbeat,
            Action.STABLE_ENDS: self.stable_ends,
            Action.TRACKED_BATCHES: self.tracked_batches,
            Action.LIST_TRANSACTIONS: self.list_transactions,
            Action.ABORT_TRANSACTION: self.abort_transaction,
            Action.DESCRIBE_PRODUCERS: self.describe_producers,
            Action.ABORT_HANGING_TRANSACTION: self.abort_hanging_transaction,
            Action.METRICS: self.metrics,
            Action.PING: self.ping,
        }

    @staticmethod
    def known(action_type: str) -> Action:
        """The action named ``action_type``; ``InvalidRequestError`` listing the known
        ones otherwise."""
        try:
            return Action(action_type)
        except ValueError:
            known = ", ".join(a.value for a in Action)
            raise InvalidRequestError(
                f"unknown action {action_type!r}; known actions: {known}"
            ) from None

    def handle(
        self, action_type: str, body: dict[str, Any], permit: Permit = UNCHECKED
    ) -> dict[str, Any] | bytes:
        """The answer of one action: its typed response's document, the one place a
        response becomes the wire answer (bytes for the binary ones, ``binary``).
        ``InvalidRequestError`` for an unknown action or a malformed body, else whatever
        the action raises (typed ``IdemlogError``). ``permit``: what the caller passed of
        its ACL checks (``server.access.authorization``), for the actions that act only on what
        it may (an abort of a run)."""
        action = self.known(action_type)
        binary = self.binary.get(action)
        if binary is not None:
            return binary(body)
        response: Response
        if action is Action.ABORT_SINK_RUN:
            response = self.abort_sink_run(body, permit)
        elif action is Action.INIT_PRODUCER_ID:
            response = self.init_producer_id(body, permit)
        else:
            response = self.table[action](body)
        return response.to_doc()

    # -- topics --------------------------------------------------------------------------
    def create_topic(self, body: dict[str, Any]) -> CreateTopicResponse:
        request = CreateTopicRequest.from_doc(body)
        validate_user_topic_name(request.name)
        name, partitions, schema, overrides = validate_new_topic(
            request.name, request.partitions, request.schema, dict(request.config)
        )
        # Checked here too, before the cluster records the topic: e.g. max.message.bytes
        # over segment.bytes, or a compacted topic whose schema lacks a key column.
        log_config = self._config.log_defaults.overlaid(overrides)
        if schema is not None:
            check_key_columns(name, log_config, pa.ipc.read_schema(pa.py_buffer(schema)))
        assignment = self._cluster().create_topic(name, partitions, schema, overrides)
        if assignment.replicas_of(self._broker_id):
            self._topics.ensure(assignment)
        leaders = tuple(assignment.partitions[p] for p in sorted(assignment.partitions))
        return CreateTopicResponse(name, leaders)

    def delete_topic(self, body: dict[str, Any]) -> EmptyResponse:
        name = DeleteTopicRequest.from_doc(body).name
        self._topics.assignment(name)  # unknown -> UNKNOWN_TOPIC_OR_PARTITION
        self._cluster().delete_topic(name)
        self._topics.delete(name)
        return EmptyResponse()

    def describe_topics(self, body: dict[str, Any]) -> DescribeTopicsResponse:
        names = DescribeTopicsRequest.from_doc(body).names
        if names is None:
            assignments = list(self._cluster().topics().values())
        else:
            assignments = [self._topics.assignment(n) for n in names]
        store = self._store()
        topics = []
        for a in sorted(assignments, key=lambda a: a.name):
            schema = None if a.schema is None else pa.ipc.read_schema(pa.py_buffer(a.schema))
            if schema is None and store is not None:
                # The first append fixes a schema-less topic's schema in the leader's store.
                # UnknownTopicOrPartition: this broker leads none of its partitions.
                with contextlib.suppress(UnknownTopicOrPartitionError):
                    schema = store.topic(a.name).schema
            partitions = []
            for p in sorted(a.partitions):
                state = a.state(p)
                partitions.append(
                    PartitionInfo(p, state.leader, state.replicas, state.isr, state.leader_epoch)
                )
            topics.append(
                TopicDescription(a.name, schema, dict(a.config), tuple(partitions), a.topic_id)
            )
        return DescribeTopicsResponse(tuple(topics))

    def list_offsets(self, body: dict[str, Any]) -> ListOffsetsResponse:
        request = ListOffsetsRequest.from_doc(body)
        log = self._topics.leader_log(request.topic, request.partition, request.topic_id)
        offsets = PartitionOffsets(
            log.log_start_offset, log.log_end_offset, log.high_watermark, log.last_stable_offset
        )
        return ListOffsetsResponse(request.topic, request.partition, offsets)

    def metadata(self, body: dict[str, Any]) -> MetadataResponse:
        names = MetadataRequest.from_doc(body).topics
        cluster = self._cluster()
        assignments = cluster.topics()
        if names is not None:
            assignments = {n: assignments[n] for n in names if n in assignments}
        controller = cluster.controller()
        return MetadataResponse(
            tuple(
                BrokerAddress(b.broker_id, b.host, b.port)
                for b in sorted(cluster.brokers(), key=lambda b: b.broker_id)
            ),
            None if controller is None else controller.broker_id,
            {
                name: tuple(a.partitions[p] for p in sorted(a.partitions))
                for name, a in sorted(assignments.items())
            },
            {name: a.topic_id for name, a in sorted(assignments.items()) if a.topic_id},
        )

    def find_coordinator(self, body: dict[str, Any]) -> CoordinatorAddress:
        """The coordinator of the request's key or named state partition: with ZooKeeper
        the leader of that ``__transaction_state`` partition (the topic created now if the
        cluster has none, as Kafka does), embedded the one broker (one state partition).
        COORDINATOR_NOT_AVAILABLE (retriable) while the partition has no live leader;
        INVALID_REQUEST for a partition the topic does not have."""
        request = FindCoordinatorRequest.from_doc(body)
        cluster = self._cluster()
        if self._config.embedded:
            count = EMBEDDED_STATE_PARTITIONS
            leader = cluster.controller()
            self._asked_partition(request, count)  # a partition other than 0: refused
            if leader is None:
                raise CoordinatorNotAvailableError("no controller is elected right now")
            return CoordinatorAddress(leader.broker_id, leader.host, leader.port, 0, 1)
        topic = ensure_state_topic(cluster, self._config)
        count = len(topic.partitions)
        partition = self._asked_partition(request, count)
        leader_id = topic.leader(partition)
        found = next((b for b in cluster.brokers() if b.broker_id == leader_id), None)
        if found is None:
            raise CoordinatorNotAvailableError(
                f"{TXN_STATE_TOPIC}-{partition} has no live leader (broker {leader_id})"
            )
        return CoordinatorAddress(found.broker_id, found.host, found.port, partition, count)

    @staticmethod
    def _asked_partition(request: FindCoordinatorRequest, count: int) -> int:
        if request.state_partition is None:
            return state_partition_of(request.transactional_id or "", count)
        if request.state_partition >= count:
            raise InvalidRequestError(
                f"find_coordinator: state_partition {request.state_partition}: "
                f"{TXN_STATE_TOPIC} has {count} partitions"
            )
        return request.state_partition

    # -- producers and transactions ------------------------------------------------------
    def init_producer_id(
        self, body: dict[str, Any], permit: Permit = UNCHECKED
    ) -> InitProducerIdResponse:
        """An idempotent producer's id comes with the token binding it to the caller's
        principal (``permit``'s; its batches carry the token); a transactional one never
        has a token."""
        request = InitProducerIdRequest.from_doc(body)
        txn_id, timeout_ms = request.transactional_id, request.transaction_timeout_ms
        if txn_id is None:
            pids = self._pids()
            assert pids is not None
            pid = pids.generate_producer_id()
            token = self._producer_tokens.issue(pid, str(permit.principal))
            return InitProducerIdResponse(pid, 0, producer_token=token)
        coordinator = self._coordinators.for_key(txn_id)
        if request.sink is not None:
            pid, epoch, status = coordinator.init_sink_producer(txn_id, timeout_ms, request.sink)
            return InitProducerIdResponse(pid, epoch, status)
        pid, epoch = coordinator.init_producer_id(txn_id, timeout_ms)
        return InitProducerIdResponse(pid, epoch)

    def prepare_sink_txn(self, body: dict[str, Any]) -> EmptyResponse:
        r = PrepareSinkTxnRequest.from_doc(body)
        self._check_topic_ids([t for t, _p, _f, _l in r.ranges], r.topic_ids)
        self._coordinators.for_key(r.transactional_id).prepare_sink_txn(
            r.transactional_id, r.producer_id, r.producer_epoch, r.batch_id, list(r.ranges)
        )
        return EmptyResponse()

    def sink_heartbeat(self, body: dict[str, Any]) -> EmptyResponse:
        request = SinkHeartbeatRequest.from_doc(body)
        self._coordinators.for_key(request.sink_id).sink_heartbeat(request.sink_id, request.run_id)
        return EmptyResponse()

    def abort_sink_run(
        self, body: dict[str, Any], permit: Permit = UNCHECKED
    ) -> AbortSinkRunResponse:
        r = AbortSinkRunRequest.from_doc(body)
        if r.sink_id is not None:
            partition = self._coordinators.partition_of(r.sink_id)
            answering = {partition: self._coordinators.for_partition(partition)}
        else:  # by run alone: no key, every coordinator asked holds some of the run
            answering = self._coordinators.answering(r.state_partition)
        aborted = [
            t
            for c in answering.values()
            for t in c.abort_sink_run(
                r.run_id, r.batch_id, sink_id=r.sink_id, allowed=permit.may_write_txn
            )
        ]
        return AbortSinkRunResponse(tuple(aborted), tuple(sorted(answering)))

    def _one_cut_coordinator(
        self, state_partition: int | None, what: str
    ) -> TransactionCoordinator:
        """The coordinator whose cut a reader asked for: a named state partition's, or
        the only one there is; a cut from one of several would miss the others' batches."""
        if state_partition is None and self._coordinators.partition_count() > 1:
            raise InvalidRequestError(
                f"{what}: {TXN_STATE_TOPIC} has {self._coordinators.partition_count()} "
                "partitions, each with its own coordinator: name a state_partition and "
                "combine every one's tracked_batches (BrokerClient.stable_ends)"
            )
        return self._coordinators.for_partition(state_partition or 0)

    def stable_ends(self, body: dict[str, Any]) -> StableEndsResponse:
        r = StableEndsRequest.from_doc(body)
        coordinator = self._one_cut_coordinator(r.state_partition, "stable_ends")
        return StableEndsResponse(dict(coordinator.stable_ends(r.topic)))

    def tracked_batches(self, body: dict[str, Any]) -> TrackedBatches:
        r = TrackedBatchesRequest.from_doc(body)
        coordinator = self._one_cut_coordinator(r.state_partition, "tracked_batches")
        return coordinator.tracked_batches(r.topic, r.since)

    def list_transactions(self, body: dict[str, Any]) -> ListTransactionsResponse:
        r = ListTransactionsRequest.from_doc(body)
        answering = self._coordinators.answering(r.state_partition)
        parts = {
            p: c.list_transactions(r.min_age_ms, every_id=r.every_id) for p, c in answering.items()
        }
        return ListTransactionsResponse(
            tuple(merge_listings(parts, r.every_id)), tuple(sorted(answering))
        )

    def abort_transaction(self, body: dict[str, Any]) -> AbortTransactionResponse:
        txn_id = AbortTransactionRequest.from_doc(body).transactional_id
        return AbortTransactionResponse(
            self._coordinators.for_key(txn_id).abort_transaction(txn_id)
        )

    def describe_producers(self, body: dict[str, Any]) -> DescribeProducersResponse:
        r = DescribeProducersRequest.from_doc(body)
        log = self._topics.leader_log(r.topic, r.partition)
        producers = tuple(log.describe_producers())
        return DescribeProducersResponse(
            r.topic, r.partition, producers, log.log_end_offset, log.last_stable_offset
        )

    def abort_hanging_transaction(self, body: dict[str, Any]) -> AbortHangingTransactionResponse:
        r = AbortHangingTransactionRequest.from_doc(body)
        markers = self._markers()
        assert markers is not None
        done = markers.abort_hanging(
            r.topic, r.partition, r.producer_id, r.producer_epoch, r.start_offset
        )
        return AbortHangingTransactionResponse(
            r.topic,
            r.partition,
            done.producer_id,
            done.txn_start_offset,
            done.marker.offset,
            done.marker_epoch,
            done.marker.last_stable_offset,
        )

    def add_partitions_to_txn(self, body: dict[str, Any]) -> EmptyResponse:
        r = AddPartitionsToTxnRequest.from_doc(body)
        for topic, partition in r.partitions:
            self._topics.assignment(topic).leader(partition)  # exists?
        self._check_topic_ids([t for t, _p in r.partitions], r.topic_ids)
        coordinator = self._coordinators.for_key(r.transactional_id)
        if r.verify_only:
            coordinator.verify_partitions(
                r.transactional_id, r.producer_id, r.producer_epoch, list(r.partitions)
            )
            return EmptyResponse()
        coordinator.add_partitions(
            r.transactional_id, r.producer_id, r.producer_epoch, list(r.partitions)
        )
        return EmptyResponse()

    def _check_topic_ids(self, topics: Sequence[str], topic_ids: Mapping[str, str]) -> None:
        """Each topic a transaction request names by id (``topic_ids``) must still have
        that id: a producer's transaction never takes in the partitions of a topic
        recreated since it learned them (UNKNOWN_TOPIC_ID, naming both ids)."""
        unknown = sorted(set(topic_ids) - set(topics))
        if unknown:
            raise InvalidRequestError(
                f"topic_ids names {unknown}, which the request's partitions do not"
            )
        for topic in sorted(set(topics)):
            self._topics.check_topic_id(topic, topic_ids.get(topic))

    def end_txn(self, body: dict[str, Any]) -> EndTxnResponse:
        r = EndTxnRequest.from_doc(body)
        pid, epoch = self._coordinators.for_key(r.transactional_id).end_txn(
            r.transactional_id, r.producer_id, r.producer_epoch, r.commit
        )
        return EndTxnResponse(pid, epoch)

    def write_txn_markers(self, body: dict[str, Any]) -> WriteTxnMarkersResponse:
        r = WriteTxnMarkersRequest.from_doc(body)
        markers = self._markers()
        assert markers is not None
        producers = [ProducerMarkers(pid, epoch, tps) for pid, epoch, tps in r.producers]
        stable = markers.write_local(producers, r.commit, r.coordinator_epoch)
        # The coordinator's RoutingMarkerWriter reads this back (WriteTxnMarkersResponse).
        return WriteTxnMarkersResponse(dict(stable))

    def _sink_coordinator(
        self, sink_id: str, transactions: Sequence[tuple[str, int, int]], what: str
    ) -> TransactionCoordinator:
        """The sink's coordinator, which must coordinate every transaction it names too."""
        return self._coordinators.for_keys([sink_id, *(t for t, _, _ in transactions)], what)

    def commit_sink_batch(self, body: dict[str, Any]) -> SinkBatchResponse:
        r = CommitSinkBatchRequest.from_doc(body)
        coordinator = self._sink_coordinator(r.sink_id, r.transactions, "commit_sink_batch")
        committed = coordinator.commit_sink_batch(
            r.sink_id, r.batch_id, list(r.transactions), r.run_id
        )
        return SinkBatchResponse(coordinator.last_committed_batch(r.sink_id), bool(committed))

    def abort_sink_batch(self, body: dict[str, Any]) -> SinkBatchResponse:
        r = AbortSinkBatchRequest.from_doc(body)
        coordinator = self._sink_coordinator(r.sink_id, r.transactions, "abort_sink_batch")
        coordinator.abort_sink_batch(r.sink_id, r.batch_id, list(r.transactions))
        return SinkBatchResponse(coordinator.last_committed_batch(r.sink_id))

    # -- replication ---------------------------------------------------------------------
    def _replica_manager(self) -> ReplicaManager:
        replicas = self._replicas()
        if replicas is None:
            raise NotLeaderOrFollowerError(f"broker {self._broker_id} has no replicas open yet")
        return replicas

    def replica_fetch(self, body: dict[str, Any]) -> bytes:
        return self._replica_manager().replica_fetch(ReplicaFetchRequest.from_doc(body))

    def replica_log_start(self, body: dict[str, Any]) -> bytes:
        return self._replica_manager().replica_log_start(ReplicaLogStartRequest.from_doc(body))

    def offsets_for_leader_epoch(self, body: dict[str, Any]) -> OffsetsForLeaderEpochResponse:
        request = OffsetsForLeaderEpochRequest.from_doc(body)
        return self._replica_manager().offsets_for_leader_epoch(request)

    def elect_leaders(self, body: dict[str, Any]) -> ElectLeadersResponse:
        topics = ElectLeadersRequest.from_doc(body).topics
        cluster = self._cluster()
        if not cluster.is_controller():
            controller = cluster.controller()
            where = "none is elected" if controller is None else f"broker {controller.broker_id}"
            raise NotCoordinatorError(
                f"broker {self._broker_id} is not the controller ({where}): the preferred-"
                "leader election runs there"
            )
        return ElectLeadersResponse(dict(cluster.elect_preferred_leaders(topics)))

    # -- operations ----------------------------------------------------------------------
    def metrics(self, body: dict[str, Any]) -> MetricsResponse:
        return MetricsResponse(self._metrics_document(MetricsRequest.from_doc(body)))

    def ping(self, body: dict[str, Any]) -> PingResponse:
        return PingResponse(self._broker_id)
