"""DoAction handlers: one function per ``protocol.Action``, JSON body in, JSON document out.

Every body is decoded by its typed request (``broker_core.protocol.*_requests``), so a
missing or mistyped field is an ``INVALID_REQUEST`` naming the action and the field. What
each action takes and answers is described once, in docs/protocol.md ("Everything else:
DoAction" and "Between brokers").

Without a transactional id, InitProducerId is served by any broker from its own leased
producer-id block (as Kafka does); everything transactional goes to the coordinator of
its key's ``__transaction_state`` partition, the partition's leader (``NOT_COORDINATOR``
elsewhere, retriable; ``server.coordinators``).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import pyarrow as pa

from broker_core.cluster.metadata import (
    BrokerInfo,
    ClusterMetadata,
    PartitionState,
    TopicAssignment,
    validate_new_topic,
)
from broker_core.errors import (
    CoordinatorNotAvailableError,
    InvalidRequestError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
    UnknownTopicOrPartitionError,
)
from broker_core.log.compaction import check_key_columns
from broker_core.log.partition_log import PartitionLog
from broker_core.log.results import HangingAbort
from broker_core.log.store import LogStore
from broker_core.protocol.admin_requests import (
    AbortHangingTransactionRequest,
    AbortHangingTransactionResponse,
    AbortTransactionRequest,
    CreateTopicRequest,
    DeleteTopicRequest,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTopicsRequest,
    FindCoordinatorRequest,
    ListOffsetsRequest,
    ListTransactionsRequest,
    MetadataRequest,
    PingResponse,
    merge_listings,
)
from broker_core.protocol.coordinator_keys import CoordinatorAddress
from broker_core.protocol.metrics import MetricsRequest
from broker_core.protocol.replica import (
    ElectLeadersRequest,
    OffsetsForLeaderEpochRequest,
    ReplicaFetchRequest,
    ReplicaLogStartRequest,
)
from broker_core.protocol.stable_cut import TrackedBatchesRequest
from broker_core.protocol.topics import validate_user_topic_name
from broker_core.protocol.txn_requests import (
    AbortSinkBatchRequest,
    AbortSinkRunRequest,
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
from broker_core.server.authorization import UNCHECKED, Permit
from broker_core.server.config import BrokerConfig
from broker_core.server.coordinators import EMBEDDED_STATE_PARTITIONS, Coordinators
from broker_core.server.replica_manager import ReplicaManager
from broker_core.server.txn_state_topic import ensure_state_topic
from broker_core.txn.coordinator import TransactionCoordinator
from broker_core.txn.markers import ProducerMarkers, StableOffsets
from broker_core.txn.pid_manager import ProducerIdManager
from broker_core.txn.state_topic import TXN_STATE_TOPIC, state_partition_of

Handler = Callable[[dict[str, Any]], dict[str, Any]]


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


def _broker_doc(info: BrokerInfo) -> dict[str, Any]:
    return {"broker_id": info.broker_id, "host": info.host, "port": info.port}


class ActionHandlers:
    """The DoAction table of one broker.

    Its collaborators come in through the constructor; the ones that exist only once the
    broker has started (the cluster, the marker writer, the coordinator) are callables
    asked at each request. ``cluster`` and ``coordinator`` raise the retriable error that
    says where to go instead; ``markers``, ``pids`` and ``store`` may answer None before
    the start.
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
        """The answer of one action (bytes for the binary ones, ``binary``);
        ``InvalidRequestError`` for an unknown action or a malformed body, else whatever
        the action raises (typed ``IdemlogError``). ``permit``: what the caller passed of
        its ACL checks (``server.authorization``), for the actions that act only on what
        it may (an abort of a run)."""
        action = self.known(action_type)
        if action is Action.ABORT_SINK_RUN:
            return self.abort_sink_run(body, permit)
        if action is Action.INIT_PRODUCER_ID:
            return self.init_producer_id(body, permit)
        binary = self.binary.get(action)
        if binary is not None:
            return binary(body)
        return self.table[action](body)

    # -- topics --------------------------------------------------------------------------
    def create_topic(self, body: dict[str, Any]) -> dict[str, Any]:
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
        return {
            "name": name,
            "partitions": [assignment.partitions[p] for p in sorted(assignment.partitions)],
        }

    def delete_topic(self, body: dict[str, Any]) -> dict[str, Any]:
        name = DeleteTopicRequest.from_doc(body).name
        self._topics.assignment(name)  # unknown -> UNKNOWN_TOPIC_OR_PARTITION
        self._cluster().delete_topic(name)
        self._topics.delete(name)
        return {}

    def describe_topics(self, body: dict[str, Any]) -> dict[str, Any]:
        names = DescribeTopicsRequest.from_doc(body).names
        if names is None:
            assignments = list(self._cluster().topics().values())
        else:
            assignments = [self._topics.assignment(n) for n in names]
        store = self._store()
        topics = []
        for a in sorted(assignments, key=lambda a: a.name):
            schema = a.schema
            if schema is None and store is not None:
                # The first append fixes a schema-less topic's schema in the leader's store.
                try:
                    local = store.topic(a.name).schema
                except UnknownTopicOrPartitionError:
                    local = None  # this broker leads none of its partitions
                if local is not None:
                    schema = local.serialize().to_pybytes()
            topics.append(
                {
                    "name": a.name,
                    "topic_id": a.topic_id,
                    "partitions": [_partition_doc(p, a.state(p)) for p in sorted(a.partitions)],
                    "schema": None if schema is None else base64.b64encode(schema).decode(),
                    "config": dict(a.config),
                }
            )
        return {"topics": topics}

    def list_offsets(self, body: dict[str, Any]) -> dict[str, Any]:
        request = ListOffsetsRequest.from_doc(body)
        log = self._topics.leader_log(request.topic, request.partition, request.topic_id)
        return {
            "topic": request.topic,
            "partition": request.partition,
            "log_start_offset": log.log_start_offset,
            "log_end_offset": log.log_end_offset,
            "high_watermark": log.high_watermark,
            "last_stable_offset": log.last_stable_offset,
        }

    def metadata(self, body: dict[str, Any]) -> dict[str, Any]:
        names = MetadataRequest.from_doc(body).topics
        cluster = self._cluster()
        assignments = cluster.topics()
        if names is not None:
            assignments = {n: assignments[n] for n in names if n in assignments}
        controller = cluster.controller()
        return {
            "brokers": [
                _broker_doc(b) for b in sorted(cluster.brokers(), key=lambda b: b.broker_id)
            ],
            "controller": None if controller is None else controller.broker_id,
            "topics": {
                name: [a.partitions[p] for p in sorted(a.partitions)]
                for name, a in sorted(assignments.items())
            },
            "topic_ids": {
                name: a.topic_id for name, a in sorted(assignments.items()) if a.topic_id
            },
        }

    def find_coordinator(self, body: dict[str, Any]) -> dict[str, Any]:
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
            return CoordinatorAddress(leader.broker_id, leader.host, leader.port, 0, 1).to_doc()
        topic = ensure_state_topic(cluster, self._config)
        count = len(topic.partitions)
        partition = self._asked_partition(request, count)
        leader_id = topic.leader(partition)
        found = next((b for b in cluster.brokers() if b.broker_id == leader_id), None)
        if found is None:
            raise CoordinatorNotAvailableError(
                f"{TXN_STATE_TOPIC}-{partition} has no live leader (broker {leader_id})"
            )
        return CoordinatorAddress(
            found.broker_id, found.host, found.port, partition, count
        ).to_doc()

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
    def init_producer_id(self, body: dict[str, Any], permit: Permit = UNCHECKED) -> dict[str, Any]:
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
            return InitProducerIdResponse(pid, 0, producer_token=token).to_doc()
        coordinator = self._coordinators.for_key(txn_id)
        if request.sink is not None:
            pid, epoch, status = coordinator.init_sink_producer(txn_id, timeout_ms, request.sink)
            return InitProducerIdResponse(pid, epoch, status).to_doc()
        pid, epoch = coordinator.init_producer_id(txn_id, timeout_ms)
        return InitProducerIdResponse(pid, epoch).to_doc()

    def prepare_sink_txn(self, body: dict[str, Any]) -> dict[str, Any]:
        r = PrepareSinkTxnRequest.from_doc(body)
        self._check_topic_ids([t for t, _p, _f, _l in r.ranges], r.topic_ids)
        self._coordinators.for_key(r.transactional_id).prepare_sink_txn(
            r.transactional_id, r.producer_id, r.producer_epoch, r.batch_id, list(r.ranges)
        )
        return {}

    def sink_heartbeat(self, body: dict[str, Any]) -> dict[str, Any]:
        request = SinkHeartbeatRequest.from_doc(body)
        self._coordinators.for_key(request.sink_id).sink_heartbeat(request.sink_id, request.run_id)
        return {}

    def abort_sink_run(self, body: dict[str, Any], permit: Permit = UNCHECKED) -> dict[str, Any]:
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
        return {"aborted": aborted, "state_partitions": sorted(answering)}

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

    def stable_ends(self, body: dict[str, Any]) -> dict[str, Any]:
        r = StableEndsRequest.from_doc(body)
        coordinator = self._one_cut_coordinator(r.state_partition, "stable_ends")
        return StableEndsResponse(dict(coordinator.stable_ends(r.topic))).to_doc()

    def tracked_batches(self, body: dict[str, Any]) -> dict[str, Any]:
        r = TrackedBatchesRequest.from_doc(body)
        coordinator = self._one_cut_coordinator(r.state_partition, "tracked_batches")
        return coordinator.tracked_batches(r.topic, r.since).to_doc()

    def list_transactions(self, body: dict[str, Any]) -> dict[str, Any]:
        r = ListTransactionsRequest.from_doc(body)
        answering = self._coordinators.answering(r.state_partition)
        parts = {
            p: c.list_transactions(r.min_age_ms, every_id=r.every_id) for p, c in answering.items()
        }
        return {
            "transactions": merge_listings(parts, r.every_id),
            "state_partitions": sorted(answering),
        }

    def abort_transaction(self, body: dict[str, Any]) -> dict[str, Any]:
        txn_id = AbortTransactionRequest.from_doc(body).transactional_id
        return {"aborted": self._coordinators.for_key(txn_id).abort_transaction(txn_id)}

    def describe_producers(self, body: dict[str, Any]) -> dict[str, Any]:
        r = DescribeProducersRequest.from_doc(body)
        log = self._topics.leader_log(r.topic, r.partition)
        producers = tuple(log.describe_producers())
        return DescribeProducersResponse(
            r.topic, r.partition, producers, log.log_end_offset, log.last_stable_offset
        ).to_doc()

    def abort_hanging_transaction(self, body: dict[str, Any]) -> dict[str, Any]:
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
        ).to_doc()

    def add_partitions_to_txn(self, body: dict[str, Any]) -> dict[str, Any]:
        r = AddPartitionsToTxnRequest.from_doc(body)
        for topic, partition in r.partitions:
            self._topics.assignment(topic).leader(partition)  # exists?
        self._check_topic_ids([t for t, _p in r.partitions], r.topic_ids)
        coordinator = self._coordinators.for_key(r.transactional_id)
        if r.verify_only:
            coordinator.verify_partitions(
                r.transactional_id, r.producer_id, r.producer_epoch, list(r.partitions)
            )
            return {}
        coordinator.add_partitions(
            r.transactional_id, r.producer_id, r.producer_epoch, list(r.partitions)
        )
        return {}

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

    def end_txn(self, body: dict[str, Any]) -> dict[str, Any]:
        r = EndTxnRequest.from_doc(body)
        pid, epoch = self._coordinators.for_key(r.transactional_id).end_txn(
            r.transactional_id, r.producer_id, r.producer_epoch, r.commit
        )
        return EndTxnResponse(pid, epoch).to_doc()

    def write_txn_markers(self, body: dict[str, Any]) -> dict[str, Any]:
        r = WriteTxnMarkersRequest.from_doc(body)
        markers = self._markers()
        assert markers is not None
        producers = [ProducerMarkers(pid, epoch, tps) for pid, epoch, tps in r.producers]
        stable = markers.write_local(producers, r.commit, r.coordinator_epoch)
        # The coordinator's RoutingMarkerWriter reads this back (WriteTxnMarkersResponse).
        return WriteTxnMarkersResponse(dict(stable)).to_doc()

    def _sink_coordinator(
        self, sink_id: str, transactions: Sequence[tuple[str, int, int]], what: str
    ) -> TransactionCoordinator:
        """The sink's coordinator, which must coordinate every transaction it names too."""
        return self._coordinators.for_keys([sink_id, *(t for t, _, _ in transactions)], what)

    def commit_sink_batch(self, body: dict[str, Any]) -> dict[str, Any]:
        r = CommitSinkBatchRequest.from_doc(body)
        coordinator = self._sink_coordinator(r.sink_id, r.transactions, "commit_sink_batch")
        committed = coordinator.commit_sink_batch(
            r.sink_id, r.batch_id, list(r.transactions), r.run_id
        )
        return SinkBatchResponse(
            coordinator.last_committed_batch(r.sink_id), bool(committed)
        ).to_doc()

    def abort_sink_batch(self, body: dict[str, Any]) -> dict[str, Any]:
        r = AbortSinkBatchRequest.from_doc(body)
        coordinator = self._sink_coordinator(r.sink_id, r.transactions, "abort_sink_batch")
        coordinator.abort_sink_batch(r.sink_id, r.batch_id, list(r.transactions))
        return SinkBatchResponse(coordinator.last_committed_batch(r.sink_id)).to_doc()

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

    def offsets_for_leader_epoch(self, body: dict[str, Any]) -> dict[str, Any]:
        request = OffsetsForLeaderEpochRequest.from_doc(body)
        return self._replica_manager().offsets_for_leader_epoch(request)

    def elect_leaders(self, body: dict[str, Any]) -> dict[str, Any]:
        topics = ElectLeadersRequest.from_doc(body).topics
        cluster = self._cluster()
        if not cluster.is_controller():
            controller = cluster.controller()
            where = "none is elected" if controller is None else f"broker {controller.broker_id}"
            raise NotCoordinatorError(
                f"broker {self._broker_id} is not the controller ({where}): the preferred-"
                "leader election runs there"
            )
        moved = cluster.elect_preferred_leaders(topics)
        return {"moved": {t: {str(p): b for p, b in m.items()} for t, m in moved.items()}}

    # -- operations ----------------------------------------------------------------------
    def metrics(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._metrics_document(MetricsRequest.from_doc(body))

    def ping(self, body: dict[str, Any]) -> dict[str, Any]:
        return PingResponse(self._broker_id).to_doc()


def _partition_doc(partition: int, state: PartitionState) -> dict[str, Any]:
    """One partition of ``describe_topics``: ``partition`` and ``leader`` as ever, then the
    replica metadata (fields only added, so older clients read it unchanged)."""
    return {
        "partition": partition,
        "leader": state.leader,
        "replicas": list(state.replicas),
        "isr": list(state.isr),
        "leader_epoch": state.leader_epoch,
    }
