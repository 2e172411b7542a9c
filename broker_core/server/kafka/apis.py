"""The Kafka APIs this broker serves, at which versions, and their handlers.

:data:`SERVED` is what ApiVersions advertises and what the listener decodes: an API or a
version outside it is never advertised, so a client never sends it (one that does is
disconnected, as Kafka does, but for ApiVersions itself, answered at v0 with
UNSUPPORTED_VERSION and the list, so the client can pick). The handlers answer from the
cluster metadata (Metadata) and the partitions this broker leads (ListOffsets,
OffsetForLeaderEpoch, Fetch); an idemlog error becomes the Kafka error with the same
number (``broker_core/errors.py`` uses Kafka's numbers where Kafka has the error).

Responses are built for the version asked from the fields that version has: kio's
classes for each version differ only in which fields exist, so one handler serves them
all (:func:`_build`).
"""

from __future__ import annotations

import datetime
import functools
import logging
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, Protocol, TypeVar

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.static.primitive import i16, i32, i64

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.records import BrokerInfo, TopicAssignment
from broker_core.errors import (
    IdemlogError,
    InvalidRecordError,
    InvalidRequestError,
    InvalidTopicError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
)
from broker_core.log.leader_epoch import EpochEndOffset
from broker_core.log.partition_log import PartitionLog, WholeRead
from broker_core.protocol.topics import INTERNAL_TOPIC_PREFIX, validate_topic_name
from broker_core.server.kafka.framing import KafkaRequest, UnsupportedVersion
from broker_core.server.kafka.records import kafka_records
from broker_core.server.replication.partition import Partition

log = logging.getLogger("idemlog.kafka")
T = TypeVar("T")

PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
API_VERSIONS = 18
OFFSET_FOR_LEADER_EPOCH = 23

# api key -> its request kind in the metrics (observability/metrics.py's).
METRIC_KINDS: Mapping[int, str] = {
    PRODUCE: "kafka_produce",
    FETCH: "kafka_fetch",
    API_VERSIONS: "kafka_api_versions",
    METADATA: "kafka_metadata",
    LIST_OFFSETS: "kafka_list_offsets",
    OFFSET_FOR_LEADER_EPOCH: "kafka_offset_for_leader_epoch",
}
# api key -> (min, max) version served. Metadata from v1 (v0's empty list meant "every
# topic"; Kafka 4 dropped it), ListOffsets from v1 (v0 answered a list of old offsets)
# to v10 (v11 adds a tiered-storage timestamp this log has no use for), OffsetForLeaderEpoch
# from v2 (the first with current_leader_epoch, KIP-320; Kafka 4 dropped v0 and v1),
# Fetch from v4 (the first with isolation_level and aborted transactions) to v16 (v13 on
# name topics by id; v17 adds a follower's directory id, for replicas only). Produce
# v3-v9 is listed but refused (:meth:`KafkaApis.produce`): librdkafka reads record batch
# v2 only from a broker that lists Produce v3 and Fetch v4.
SERVED: Mapping[int, tuple[int, int]] = {
    PRODUCE: (3, 9),
    FETCH: (4, 16),
    API_VERSIONS: (0, 4),
    METADATA: (1, 13),
    LIST_OFFSETS: (1, 10),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),
}

# ListOffsets' special timestamps (Kafka's ListOffsetsRequest).
LATEST = -1
EARLIEST = -2
EARLIEST_LOCAL = -4  # KIP-405: without tiered storage, the earliest
READ_COMMITTED = 1
NO_EPOCH = -1
_NO_TOPIC_ID = uuid.UUID(int=0)
_NO_OPERATIONS = i32(-(2**31))  # authorized operations not asked for
_NO_THROTTLE = datetime.timedelta(0)
NO_SESSION = 0  # Fetch: no session created (KIP-227 lets a broker decline them)
# Fetch's long poll over several partitions: the first one's wake-up is waited for, this
# long at most, then every partition is read again, so data arriving on any other one
# answers within it.
MANY_PARTITIONS_WAIT_S = 0.05


class KafkaTopics(Protocol):
    """The partitions this broker leads (``replication.local_topics.StartedTopics``)."""

    def leader_log(
        self, topic: str, partition: int, topic_id: str | None = None
    ) -> PartitionLog: ...

    def partition(self, topic: str, partition: int) -> Partition: ...


def kafka_error(exc: IdemlogError) -> KafkaErrorCode:
    """The Kafka error of ``exc``: its own number when Kafka has it, else
    UNKNOWN_SERVER_ERROR (idemlog's own codes, 10000 and up, mean nothing to a client)."""
    try:
        return KafkaErrorCode(exc.error_code.code)
    except ValueError:
        return KafkaErrorCode.unknown_server_error


def _build(cls: type[Any], **values: Any) -> Any:
    """``cls`` (a kio class of one version) from the ``values`` it has fields for."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def _nested(response: type[Any], name: str) -> type[Any]:
    """The nested class ``name`` of the same version as ``response``."""
    found: type[Any] = getattr(sys.modules[response.__module__], name)
    return found


class KafkaApis:
    """The handlers of broker ``broker_id``: ``topics`` the partitions it leads,
    ``cluster()`` the cluster metadata (raises NotLeaderOrFollowerError before the broker
    joined)."""

    def __init__(
        self,
        broker_id: int,
        topics: KafkaTopics,
        cluster: Callable[[], ClusterMetadata],
    ) -> None:
        self._broker_id = broker_id
        self._topics = topics
        self._cluster = cluster
        self._handlers: dict[int, Callable[[KafkaRequest, type[Any]], Any]] = {
            API_VERSIONS: self.api_versions,
            METADATA: self.metadata,
            LIST_OFFSETS: self.list_offsets,
            OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
            FETCH: self.fetch,
            PRODUCE: self.produce,
        }

    def handle(self, request: KafkaRequest) -> Any:
        """The response to ``request`` (a kio response of the request's version), or None
        for none (a Produce with acks=0, which Kafka never answers)."""
        response = load_response_schema(request.api_key, request.api_version)
        return self._handlers[request.api_key](request, response)

    # -- ApiVersions ---------------------------------------------------------------------
    def api_versions(self, request: KafkaRequest, response: type[Any]) -> Any:
        return self._api_versions(response, KafkaErrorCode.none)

    def unsupported_api_versions(self, refused: UnsupportedVersion) -> Any:
        """ApiVersions at a version not served: answered at v0 with UNSUPPORTED_VERSION
        and the versions served, from which the client picks (KIP-511)."""
        log.info("kafka: ApiVersions v%d asked; answered at v0", refused.api_version)
        return self._api_versions(
            load_response_schema(API_VERSIONS, 0), KafkaErrorCode.unsupported_version
        )

    def _api_versions(self, response: type[Any], error: KafkaErrorCode) -> Any:
        version = _nested(response, "ApiVersion")
        keys = tuple(
            version(api_key=i16(key), min_version=i16(low), max_version=i16(high))
            for key, (low, high) in sorted(SERVED.items())
        )
        return _build(response, error_code=error, api_keys=keys, throttle_time=_NO_THROTTLE)

    # -- Metadata ------------------------------------------------------------------------
    def metadata(self, request: KafkaRequest, response: type[Any]) -> Any:
        """The brokers that serve a Kafka listener and the topics asked (null: every topic
        but the broker's internal ones, which hold no Kafka records). A topic never
        created is UNKNOWN_TOPIC_OR_PARTITION (topics are not created by asking), a name
        no topic can have INVALID_TOPIC_EXCEPTION; a partition whose leader is down or
        serves no Kafka listener has leader -1 and LEADER_NOT_AVAILABLE, so the client
        asks again."""
        cluster = self._cluster()
        live = {b.broker_id: b for b in cluster.brokers()}
        kafka_brokers = {b: info for b, info in live.items() if info.kafka_listener is not None}
        assignments = cluster.topics()
        asked = request.body.topics
        if asked is None:
            entries: list[tuple[str | None, TopicAssignment | None, IdemlogError | None]] = [
                (name, a, None)
                for name, a in sorted(assignments.items())
                if not name.startswith(INTERNAL_TOPIC_PREFIX)
            ]
        else:
            entries = [self._find_topic(t, assignments) for t in asked]
        broker_cls = _nested(response, "MetadataResponseBroker")
        brokers = tuple(_broker(broker_cls, info) for _, info in sorted(kafka_brokers.items()))
        controller = cluster.controller()
        controller_id = -1
        if controller is not None and controller.broker_id in kafka_brokers:
            controller_id = controller.broker_id
        topics = tuple(
            self._topic(response, name, a, error, set(live), set(kafka_brokers))
            for name, a, error in entries
        )
        return _build(
            response,
            throttle_time=_NO_THROTTLE,
            brokers=brokers,
            cluster_id=None,
            controller_id=i32(controller_id),
            topics=topics,
            error_code=KafkaErrorCode.none,
        )

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
        topic_cls = _nested(response, "MetadataResponseTopic")
        if assignment is None:
            assert error is not None
            return _build(
                topic_cls,
                error_code=kafka_error(error),
                name=name,
                topic_id=_NO_TOPIC_ID,
                is_internal=False,
                partitions=(),
                topic_authorized_operations=_NO_OPERATIONS,
            )
        partition_cls = _nested(response, "MetadataResponsePartition")
        partitions = []
        for index, state in sorted(assignment.states.items()):
            servable = state.leader in live and state.leader in kafka_brokers
            partitions.append(
                _build(
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
        return _build(
            topic_cls,
            error_code=KafkaErrorCode.none,
            name=assignment.name,
            topic_id=topic_id,
            is_internal=False,
            partitions=tuple(partitions),
            topic_authorized_operations=_NO_OPERATIONS,
        )

    # -- ListOffsets ---------------------------------------------------------------------
    def list_offsets(self, request: KafkaRequest, response: type[Any]) -> Any:
        """Per partition this broker leads: the earliest offset (-2, -4: the log start) or
        the latest (-1: the high watermark, or with read_committed the last stable
        offset: no record of an open transaction is counted), with the leader epoch.
        A ``current_leader_epoch`` (v4+) other than the leader's is fenced
        (FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH, KIP-320), and the epoch read
        before the offsets is checked again after them, so an answer never pairs one
        leader's offset with another's epoch. A lookup by timestamp is not served yet:
        UNSUPPORTED_VERSION for that partition; a partition asked twice is
        INVALID_REQUEST."""
        body = request.body
        committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
        topic_cls = _nested(response, "ListOffsetsTopicResponse")
        partition_cls = _nested(response, "ListOffsetsPartitionResponse")
        # A partition asked twice is INVALID_REQUEST, each time (Kafka's rule: which of
        # the two asks an answer belongs to could not be told).
        asked_times = Counter(
            (topic.name, asked.partition_index)
            for topic in body.topics
            for asked in topic.partitions
        )
        topics = []
        for topic in body.topics:
            answers = []
            for asked in topic.partitions:
                if asked_times[(topic.name, asked.partition_index)] > 1:
                    error, offset, epoch = KafkaErrorCode.invalid_request, -1, NO_EPOCH
                else:
                    error, offset, epoch = self._offset(
                        topic.name,
                        asked.partition_index,
                        asked.timestamp,
                        getattr(asked, "current_leader_epoch", NO_EPOCH),
                        committed,
                    )
                answers.append(
                    _build(
                        partition_cls,
                        partition_index=asked.partition_index,
                        error_code=error,
                        timestamp=i64(-1),
                        offset=i64(offset),
                        leader_epoch=i32(epoch),
                    )
                )
            topics.append(_build(topic_cls, name=topic.name, partitions=tuple(answers)))
        return _build(response, throttle_time=_NO_THROTTLE, topics=tuple(topics))

    def _offset(
        self, topic: str, index: int, timestamp: int, current_epoch: int, committed: bool
    ) -> tuple[KafkaErrorCode, int, int]:
        if timestamp not in (LATEST, EARLIEST, EARLIEST_LOCAL):
            return KafkaErrorCode.unsupported_version, -1, NO_EPOCH

        def read(log_: PartitionLog) -> int:
            if timestamp == LATEST:
                return log_.last_stable_offset if committed else log_.high_watermark
            return log_.log_start_offset

        try:
            offset, epoch = self._at_leader(topic, index, current_epoch, read)
        except IdemlogError as exc:
            log.debug("kafka: ListOffsets %s-%d: %s", topic, index, exc)
            return kafka_error(exc), -1, NO_EPOCH
        return KafkaErrorCode.none, offset, epoch

    def _at_leader(
        self,
        topic: str,
        index: int,
        current_epoch: int,
        read: Callable[[PartitionLog], T],
        topic_id: str | None = None,
    ) -> tuple[T, int]:
        """``read(log)`` of a partition this broker leads, and the leader epoch it was
        read at: the client's ``current_leader_epoch`` (NO_EPOCH: none) is fenced first
        (KIP-320), and the epoch read before ``read`` is checked again after it, so the
        answer never pairs one leader's log with another's epoch. Raises what the
        partition raises: NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH,
        UNKNOWN_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION."""
        log_ = self._topics.leader_log(topic, index, topic_id)
        partition = self._topics.partition(topic, index)
        epoch = partition.leader_epoch
        if current_epoch != NO_EPOCH:
            partition.check_epoch(current_epoch)
        value = read(log_)
        partition.check_epoch(epoch)  # still the leader, at the epoch answered
        return value, epoch

    # -- OffsetForLeaderEpoch ------------------------------------------------------------
    def offset_for_leader_epoch(self, request: KafkaRequest, response: type[Any]) -> Any:
        """Per partition this broker leads: where the asked ``leader_epoch`` ended in its
        log (KIP-101/KIP-279, the leader epoch cache: the latest epoch ends at the log
        end; an epoch between two known ends where the next began; one above every
        known epoch, or a log without any, is undefined: -1 and -1), so a client can
        tell whether the log it read was truncated by an election. Fenced by
        ``current_leader_epoch`` as ListOffsets is."""
        topic_cls = _nested(response, "OffsetForLeaderTopicResult")
        partition_cls = _nested(response, "EpochEndOffset")
        topics = []
        for topic in request.body.topics:
            answers = []
            for asked in topic.partitions:
                error, epoch, end = KafkaErrorCode.none, NO_EPOCH, -1
                end_of = functools.partial(_end_offset_for, int(asked.leader_epoch))
                try:
                    found, _ = self._at_leader(
                        topic.topic, asked.partition, asked.current_leader_epoch, end_of
                    )
                    epoch, end = found.epoch, found.end_offset
                except IdemlogError as exc:
                    log.debug("kafka: OffsetForLeaderEpoch %s: %s", topic.topic, exc)
                    error = kafka_error(exc)
                answers.append(
                    _build(
                        partition_cls,
                        error_code=error,
                        partition=asked.partition,
                        leader_epoch=i32(epoch),
                        end_offset=i64(end),
                    )
                )
            topics.append(_build(topic_cls, topic=topic.topic, partitions=tuple(answers)))
        return _build(response, throttle_time=_NO_THROTTLE, topics=tuple(topics))

    # -- Produce -------------------------------------------------------------------------
    def produce(self, request: KafkaRequest, response: type[Any]) -> Any:
        """Refused, each partition INVALID_REQUEST with a message (v8+) saying what to
        write with, until Kafka clients' idempotent produce is served: listed in
        ApiVersions only because librdkafka reads record batch v2 from no broker that
        does not list Produce v3. Nothing is written; acks=0 is not answered, as Kafka
        answers no acks=0 request."""
        body = request.body
        if body.acks == 0:
            log.info("kafka: Produce (acks=0) refused unanswered: not served yet")
            return None
        topic_cls = _nested(response, "TopicProduceResponse")
        partition_cls = _nested(response, "PartitionProduceResponse")
        message = (
            "Produce is not served on idemlog's Kafka listener yet: write with idemlog's "
            "Producer (broker_core.producer) or its Spark sink"
        )
        topics = tuple(
            _build(
                topic_cls,
                name=topic.name,
                partition_responses=tuple(
                    _build(
                        partition_cls,
                        index=p.index,
                        error_code=KafkaErrorCode.invalid_request,
                        base_offset=i64(-1),
                        log_append_time=None,
                        log_start_offset=i64(-1),
                        record_errors=(),
                        error_message=message,
                    )
                    for p in topic.partition_data
                ),
            )
            for topic in body.topic_data
        )
        return _build(response, responses=topics, throttle_time=_NO_THROTTLE)

    # -- Fetch ---------------------------------------------------------------------------
    def fetch(self, request: KafkaRequest, response: type[Any]) -> Any:
        """Per partition this broker leads: whole batches from the one holding
        ``fetch_offset`` (``PartitionLog.read_whole``) as Kafka's record batches, up to
        the high watermark, or with read_committed up to the last stable offset with the
        aborted transactions among them, which the client skips as it does on Kafka.
        Answered once ``min_bytes`` are there or ``max_wait`` elapsed, waiting on the
        partitions' own wake-ups (appends, markers, the high watermark), or at once on
        an error. ``partition_max_bytes`` and ``max_bytes`` count the stored bytes; the
        first batch is returned whatever its size, as Kafka does. Sessionless: every
        request is a full one, answered with session id 0 (KIP-227). A partition of a
        topic that is not Kafka-shaped is UNSUPPORTED_FOR_MESSAGE_FORMAT."""
        body = request.body
        committed = body.isolation_level == READ_COMMITTED
        asked = self._fetched(body.topics)
        deadline = time.monotonic() + body.max_wait.total_seconds()
        while True:
            answers = self._fetch_once(asked, committed, int(body.max_bytes))
            size = sum(len(records) for _, _, records, _ in answers)
            remaining = deadline - time.monotonic()
            failed = any(
                error != KafkaErrorCode.none or diverging is not None
                for error, _, _, diverging in answers
            )
            if size >= int(body.min_bytes) or failed or remaining <= 0 or not asked:
                break
            self._wait_for_data(asked, committed, remaining)
        return self._fetch_response(response, body, answers)

    def _fetched(self, topics: Any) -> list[tuple[str | None, str | None, Any]]:
        """(name, id, asked partition) per partition asked: v13+ names topics by id only,
        resolved from the cluster metadata (None: no topic has the id)."""
        by_id: dict[str, str] | None = None
        asked: list[tuple[str | None, str | None, Any]] = []
        for t in topics:
            name: str | None = getattr(t, "topic", None)
            topic_id: str | None = None
            if hasattr(t, "topic_id"):
                if by_id is None:
                    by_id = {a.topic_id: a.name for a in self._cluster().topics().values()}
                topic_id = t.topic_id.hex if t.topic_id is not None else ""
                name = by_id.get(topic_id)
            asked.extend((name, topic_id, p) for p in t.partitions)
        return asked

    def _wait_for_data(
        self, asked: list[tuple[str | None, str | None, Any]], committed: bool, wait: float
    ) -> None:
        if len(asked) > 1:
            wait = min(wait, MANY_PARTITIONS_WAIT_S)
        for topic, _, p in asked:
            if topic is None:
                continue
            try:
                partition = self._topics.partition(topic, int(p.partition))
            except IdemlogError:
                continue  # answered with its error at the next pass
            partition.wait_for_readable(int(p.fetch_offset), committed, wait)
            return

    def _fetch_once(
        self, asked: list[tuple[str | None, str | None, Any]], committed: bool, max_bytes: int
    ) -> list[tuple[KafkaErrorCode, WholeRead | None, bytes, Any]]:
        """(error, read, records, diverging epoch) per asked partition, in order."""
        answers: list[tuple[KafkaErrorCode, WholeRead | None, bytes, Any]] = []
        left = max_bytes
        for topic, topic_id, p in asked:
            if topic is None:
                answers.append((KafkaErrorCode.unknown_topic_id, None, b"", None))
                continue
            limit = min(int(p.partition_max_bytes), left)
            try:
                answer = self._fetch_partition(topic, topic_id, p, committed, limit)
            except IdemlogError as exc:
                log.debug("kafka: Fetch %s-%d: %s", topic, p.partition, exc)
                error = (
                    KafkaErrorCode.unsupported_for_message_format
                    if isinstance(exc, InvalidRecordError)
                    else kafka_error(exc)
                )
                answers.append((error, None, b"", None))
                continue
            read, records, diverging = answer
            left -= sum(b.header.size for b in read.batches)
            answers.append((KafkaErrorCode.none, read, records, diverging))
        return answers

    def _fetch_partition(
        self, topic: str, topic_id: str | None, p: Any, committed: bool, max_bytes: int
    ) -> tuple[WholeRead, bytes, EpochEndOffset | None]:
        offset = int(p.fetch_offset)
        last_fetched = int(getattr(p, "last_fetched_epoch", NO_EPOCH))

        def read(log_: PartitionLog) -> tuple[WholeRead, EpochEndOffset | None]:
            if last_fetched != NO_EPOCH:
                # KIP-320: the log the client read diverged from this leader's where
                # its last epoch ended before the offset it reached.
                end = log_.end_offset_for(last_fetched)
                if end.epoch < last_fetched or end.end_offset < offset:
                    return log_.read_whole(offset, max_bytes=0, committed=committed), end
            return log_.read_whole(offset, max_bytes=max_bytes, committed=committed), None

        (whole, diverging), _ = self._at_leader(
            topic,
            int(p.partition),
            int(getattr(p, "current_leader_epoch", NO_EPOCH)),
            read,
            topic_id,
        )
        return whole, kafka_records(whole.batches), diverging

    def _fetch_response(
        self,
        response: type[Any],
        body: Any,
        answers: list[tuple[KafkaErrorCode, WholeRead | None, bytes, Any]],
    ) -> Any:
        topic_cls = _nested(response, "FetchableTopicResponse")
        partition_cls = _nested(response, "PartitionData")
        aborted_cls = _nested(response, "AbortedTransaction")
        epoch_cls = getattr(sys.modules[response.__module__], "EpochEndOffset", None)
        committed = body.isolation_level == READ_COMMITTED
        found = iter(answers)
        topics = []
        for topic in body.topics:
            partitions = []
            for p in topic.partitions:
                error, read, records, diverging = next(found)
                extra: dict[str, Any] = {}
                if diverging is not None and epoch_cls is not None:
                    extra["diverging_epoch"] = epoch_cls(
                        epoch=i32(diverging.epoch), end_offset=i64(diverging.end_offset)
                    )
                aborted = None
                if read is not None and committed:
                    aborted = tuple(
                        aborted_cls(producer_id=i64(pid), first_offset=i64(first))
                        for pid, first in read.aborted
                    )
                partitions.append(
                    _build(
                        partition_cls,
                        partition_index=p.partition,
                        error_code=error,
                        high_watermark=i64(-1 if read is None else read.high_watermark),
                        last_stable_offset=i64(-1 if read is None else read.last_stable_offset),
                        log_start_offset=i64(-1 if read is None else read.log_start_offset),
                        aborted_transactions=aborted,
                        preferred_read_replica=i32(-1),
                        records=records,
                        **extra,
                    )
                )
            topics.append(
                _build(
                    topic_cls,
                    topic=getattr(topic, "topic", None),
                    topic_id=getattr(topic, "topic_id", None),
                    partitions=tuple(partitions),
                )
            )
        return _build(
            response,
            throttle_time=_NO_THROTTLE,
            error_code=KafkaErrorCode.none,
            session_id=i32(NO_SESSION),
            responses=tuple(topics),
        )


def _end_offset_for(epoch: int, log_: PartitionLog) -> EpochEndOffset:
    return log_.end_offset_for(epoch)


def _broker(cls: type[Any], info: BrokerInfo) -> Any:
    assert info.kafka_listener is not None
    host, port = info.kafka_listener
    return _build(cls, node_id=i32(info.broker_id), host=host, port=i32(port), rack=None)
