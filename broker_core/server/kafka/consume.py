"""Kafka's APIs of a consumer over the partitions this broker leads: ListOffsets,
OffsetForLeaderEpoch and Fetch.

Every answer is read at the partition's leader epoch and checked against it after the
read (:meth:`ConsumeApis._at_leader`), so no answer pairs one leader's log with another's
epoch; a client's ``current_leader_epoch`` is fenced first (KIP-320).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.static.primitive import i32, i64

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.errors import IdemlogError, InvalidRecordError
from broker_core.log.config import LogConfig
from broker_core.log.leader_epoch import EpochEndOffset
from broker_core.log.partition_log import PartitionLog, WholeRead
from broker_core.security.acl import Operation
from broker_core.server.kafka.authorize import ALLOW_ALL, KafkaAuthorizer
from broker_core.server.kafka.framing import KafkaRequest
from broker_core.server.kafka.messages import (
    NO_EPOCH,
    NO_THROTTLE,
    ServedApi,
    build,
    kafka_error,
    nested,
)
from broker_core.server.kafka.records import LARGEST, by_timestamp, kafka_records
from broker_core.server.replication.partition import Partition

log = logging.getLogger("idemlog.kafka")

T = TypeVar("T")

FETCH = 1
LIST_OFFSETS = 2
OFFSET_FOR_LEADER_EPOCH = 23

# ListOffsets' special timestamps (Kafka's ListOffsetsRequest).
LATEST = -1
EARLIEST = -2
EARLIEST_LOCAL = -4  # KIP-405: without tiered storage, the earliest
READ_COMMITTED = 1
SCAN_BYTES = 1 << 20  # ListOffsets by timestamp reads the log this much at a time
NO_SESSION = 0  # Fetch: no session created (KIP-227 lets a broker decline them)
# Fetch's long poll over several partitions: the first one's wake-up is waited for, this
# long at most, then every partition is read again, so data arriving on any other one
# answers within it.
MANY_PARTITIONS_WAIT_S = 0.05


@dataclass(frozen=True)
class _Fetched:
    """One partition's Fetch answer: the error, what was read, it as Kafka's records, the
    epoch where the client's log diverged, and whether the stable cut held back rows the
    partition's last stable offset would have given."""

    error: KafkaErrorCode
    read: WholeRead | None = None
    records: bytes = b""
    diverging: EpochEndOffset | None = None
    held: bool = False


class KafkaTopics(Protocol):
    """The partitions this broker leads (``replication.local_topics.StartedTopics``)."""

    def leader_log(
        self, topic: str, partition: int, topic_id: str | None = None
    ) -> PartitionLog: ...

    def partition(self, topic: str, partition: int) -> Partition: ...


class ReadCuts(Protocol):
    """Where read_committed readers stop (``coordination.stable_cuts.StableCuts``)."""

    refresh_s: float

    def ends(self, topic: str, topic_id: str | None) -> Mapping[int, int]: ...


class ConsumeApis:
    """ListOffsets from v1 (v0 answered a list of old offsets) to v10 (v11 adds a
    tiered-storage timestamp this log has no use for), OffsetForLeaderEpoch from v2 (the
    first with current_leader_epoch, KIP-320; Kafka 4 dropped v0 and v1), Fetch from v4
    (the first with isolation_level and aborted transactions) to v16 (v13 on name topics
    by id; v17 adds a follower's directory id, for replicas only), over ``topics`` (the
    partitions this broker leads), ``cluster()`` (topic ids) and ``cuts`` (read_committed
    stops at idemlog's stable cut, so sink batches are read whole). A topic
    ``authorizer`` does not let the caller Describe (ListOffsets, OffsetForLeaderEpoch) or
    Read (Fetch) is TOPIC_AUTHORIZATION_FAILED in each of its partitions, read nothing."""

    def __init__(
        self,
        topics: KafkaTopics,
        cluster: Callable[[], ClusterMetadata],
        cuts: ReadCuts,
        *,
        authorizer: KafkaAuthorizer = ALLOW_ALL,
    ) -> None:
        self._topics = topics
        self._cluster = cluster
        self._cuts = cuts
        self._authorizer = authorizer

    def apis(self) -> Sequence[ServedApi]:
        return (
            ServedApi(LIST_OFFSETS, 1, 10, "kafka_list_offsets", self.list_offsets),
            ServedApi(
                OFFSET_FOR_LEADER_EPOCH,
                2,
                4,
                "kafka_offset_for_leader_epoch",
                self.offset_for_leader_epoch,
            ),
            ServedApi(FETCH, 4, 16, "kafka_fetch", self.fetch),
        )

    def list_offsets(self, request: KafkaRequest, response: type[Any]) -> Any:
        """Per partition this broker leads: the earliest offset (-2, -4: the log start) or
        the latest (-1: the high watermark, or with read_committed the last stable
        offset: no record of an open transaction is counted), with the leader epoch.
        A ``current_leader_epoch`` (v4+) other than the leader's is fenced
        (FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH, KIP-320), and the epoch read
        before the offsets is checked again after them, so an answer never pairs one
        leader's offset with another's epoch. By timestamp (>= 0): the first record whose
        timestamp is at or after it, with that timestamp, or offset -1 when none is
        (read_committed: none past the stable cut); -3 (KIP-734): the record with the
        largest timestamp. A lookup by timestamp reads the partition from its start
        (``SCAN_BYTES`` at a time, column-wise): its cost grows with the partition. A
        partition asked twice is INVALID_REQUEST; another special timestamp
        UNSUPPORTED_VERSION."""
        body = request.body
        committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
        topic_cls = nested(response, "ListOffsetsTopicResponse")
        partition_cls = nested(response, "ListOffsetsPartitionResponse")
        # A partition asked twice is INVALID_REQUEST, each time (Kafka's rule: which of
        # the two asks an answer belongs to could not be told).
        asked_times = Counter(
            (topic.name, asked.partition_index)
            for topic in body.topics
            for asked in topic.partitions
        )
        topics = []
        for topic in body.topics:
            denied = self._authorizer.topic_error(request, Operation.DESCRIBE, topic.name)
            answers = []
            for asked in topic.partitions:
                error: KafkaErrorCode
                if denied != KafkaErrorCode.none:
                    error, offset, epoch, found_at = denied, -1, NO_EPOCH, -1
                elif asked_times[(topic.name, asked.partition_index)] > 1:
                    error, offset, epoch, found_at = (
                        KafkaErrorCode.invalid_request, -1, NO_EPOCH, -1,
                    )  # fmt: skip
                else:
                    error, offset, epoch, found_at = self._offset(
                        topic.name,
                        asked.partition_index,
                        asked.timestamp,
                        getattr(asked, "current_leader_epoch", NO_EPOCH),
                        committed,
                    )
                answers.append(
                    build(
                        partition_cls,
                        partition_index=asked.partition_index,
                        error_code=error,
                        timestamp=i64(found_at),
                        offset=i64(offset),
                        leader_epoch=i32(epoch),
                    )
                )
            topics.append(build(topic_cls, name=topic.name, partitions=tuple(answers)))
        return build(response, throttle_time=NO_THROTTLE, topics=tuple(topics))

    def _offset(
        self, topic: str, index: int, timestamp: int, current_epoch: int, committed: bool
    ) -> tuple[KafkaErrorCode, int, int, int]:
        """(error, offset, leader epoch, the record's timestamp or -1)."""
        if timestamp >= 0 or timestamp == LARGEST:
            return self._by_timestamp(topic, index, timestamp, current_epoch, committed)
        if timestamp not in (LATEST, EARLIEST, EARLIEST_LOCAL):
            return KafkaErrorCode.unsupported_version, -1, NO_EPOCH, -1

        def read(log_: PartitionLog) -> int:
            if timestamp == LATEST:
                return log_.last_stable_offset if committed else log_.high_watermark
            return log_.log_start_offset

        try:
            offset, epoch = self._at_leader(topic, index, current_epoch, read)
            if committed and timestamp == LATEST:
                offset = min(offset, self._cut(topic, None, index))
        except IdemlogError as exc:
            log.debug("kafka: ListOffsets %s-%d: %s", topic, index, exc)
            return kafka_error(exc), -1, NO_EPOCH, -1
        return KafkaErrorCode.none, offset, epoch, -1

    def _by_timestamp(
        self, topic: str, index: int, target: int, current_epoch: int, committed: bool
    ) -> tuple[KafkaErrorCode, int, int, int]:
        def scan(log_: PartitionLog) -> tuple[int, int] | None:
            stop = self._cut(topic, None, index) if committed else None
            start = offset = log_.log_start_offset
            found: tuple[int, int] | None = None
            while True:
                whole = log_.read_whole(
                    offset, max_bytes=SCAN_BYTES, committed=committed, stop_at=stop
                )
                if not whole.batches:
                    return found
                found, final = by_timestamp(whole.batches, target, start, found)
                if final:
                    return found
                offset = whole.batches[-1].header.next_offset

        try:
            found, epoch = self._at_leader(topic, index, current_epoch, scan)
        except IdemlogError as exc:
            log.debug("kafka: ListOffsets %s-%d at %d: %s", topic, index, target, exc)
            return kafka_error(exc), -1, NO_EPOCH, -1
        if found is None:
            return KafkaErrorCode.none, -1, epoch, -1
        return KafkaErrorCode.none, found[0], epoch, found[1]

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
        topic_cls = nested(response, "OffsetForLeaderTopicResult")
        partition_cls = nested(response, "EpochEndOffset")
        topics = []
        for topic in request.body.topics:
            denied = self._authorizer.topic_error(request, Operation.DESCRIBE, topic.topic)
            answers = []
            for asked in topic.partitions:
                error, epoch, end = denied, NO_EPOCH, -1
                end_of = functools.partial(_end_offset_for, int(asked.leader_epoch))
                if denied == KafkaErrorCode.none:  # refused: nothing read
                    try:
                        found, _ = self._at_leader(
                            topic.topic, asked.partition, asked.current_leader_epoch, end_of
                        )
                        epoch, end = found.epoch, found.end_offset
                    except IdemlogError as exc:
                        log.debug("kafka: OffsetForLeaderEpoch %s: %s", topic.topic, exc)
                        error = kafka_error(exc)
                answers.append(
                    build(
                        partition_cls,
                        error_code=error,
                        partition=asked.partition,
                        leader_epoch=i32(epoch),
                        end_offset=i64(end),
                    )
                )
            topics.append(build(topic_cls, topic=topic.topic, partitions=tuple(answers)))
        return build(response, throttle_time=NO_THROTTLE, topics=tuple(topics))

    # -- Fetch ---------------------------------------------------------------------------
    def fetch(self, request: KafkaRequest, response: type[Any]) -> Any:
        """Per partition this broker leads: whole batches from the one holding
        ``fetch_offset`` (``PartitionLog.read_whole``) as Kafka's record batches, up to
        the high watermark, or with read_committed up to the last stable offset lowered
        to idemlog's stable cut (a sink batch whole or not at all), with the aborted
        transactions among them, which the client skips as it does on Kafka.
        Answered once ``min_bytes`` are there or ``max_wait`` elapsed, waiting on the
        partitions' own wake-ups (appends, markers, the high watermark), or, for a
        partition the cut holds back, on the cut's next refresh; at once on an error.
        ``partition_max_bytes`` and ``max_bytes`` count the stored bytes; the first
        batch is returned whatever its size, as Kafka does. Sessionless: every request
        is a full one, answered with session id 0 (KIP-227). A topic that is not
        Kafka-shaped is served in its ``kafka.format`` (JSON records); a Kafka-shaped
        column a record cannot carry is UNSUPPORTED_FOR_MESSAGE_FORMAT."""
        body = request.body
        committed = body.isolation_level == READ_COMMITTED
        asked = self._fetched(body.topics)
        # Checked once per topic, before any read (and counted once, not at each pass).
        denied: dict[str, KafkaErrorCode] = {
            name: error
            for name in {name for name, _, _ in asked if name is not None}
            if (error := self._authorizer.topic_error(request, Operation.READ, name))
            != KafkaErrorCode.none
        }
        deadline = time.monotonic() + body.max_wait.total_seconds()
        while True:
            answers = self._fetch_once(asked, committed, int(body.max_bytes), denied)
            size = sum(len(a.records) for a in answers)
            remaining = deadline - time.monotonic()
            failed = any(a.error != KafkaErrorCode.none or a.diverging is not None for a in answers)
            if size >= int(body.min_bytes) or failed or remaining <= 0 or not asked:
                break
            if any(a.held for a in answers):
                # The cut, not the partition, holds rows back: it moves with other
                # partitions' markers, which wake no waiter here, so look again when
                # a newer cut can be had.
                time.sleep(min(remaining, self._cuts.refresh_s))
            else:
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
        self,
        asked: list[tuple[str | None, str | None, Any]],
        committed: bool,
        max_bytes: int,
        denied: dict[str, KafkaErrorCode],
    ) -> list[_Fetched]:
        """One answer per asked partition, in order; a topic of ``denied`` is its refusal,
        read nothing."""
        answers: list[_Fetched] = []
        left = max_bytes
        for topic, topic_id, p in asked:
            if topic is None:
                answers.append(_Fetched(KafkaErrorCode.unknown_topic_id))
                continue
            if topic in denied:
                answers.append(_Fetched(denied[topic]))
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
                answers.append(_Fetched(error))
                continue
            assert answer.read is not None
            left -= sum(b.header.size for b in answer.read.batches)
            answers.append(answer)
        return answers

    def _fetch_partition(
        self, topic: str, topic_id: str | None, p: Any, committed: bool, max_bytes: int
    ) -> _Fetched:
        offset = int(p.fetch_offset)
        last_fetched = int(getattr(p, "last_fetched_epoch", NO_EPOCH))
        stop: int | None = None
        config: LogConfig | None = None

        def read(log_: PartitionLog) -> tuple[WholeRead, EpochEndOffset | None]:
            nonlocal stop, config
            config = log_.config  # the topic's kafka.format and kafka.key.columns
            if committed:  # asked once the partition is known to be led here
                try:
                    stop = self._cut(topic, topic_id, int(p.partition))
                except IdemlogError as exc:
                    # No cut yet (its coordinators unreachable): nothing is sure to be
                    # whole, so nothing is answered.
                    log.debug("kafka: Fetch %s-%d held back: %s", topic, p.partition, exc)
                    stop = offset
            if last_fetched != NO_EPOCH:
                # KIP-320: the log the client read diverged from this leader's where
                # its last epoch ended before the offset it reached.
                end = log_.end_offset_for(last_fetched)
                if end.epoch < last_fetched or end.end_offset < offset:
                    whole = log_.read_whole(offset, max_bytes=0, committed=committed)
                    return whole, end
            whole = log_.read_whole(offset, max_bytes=max_bytes, committed=committed, stop_at=stop)
            return whole, None

        (whole, diverging), _ = self._at_leader(
            topic,
            int(p.partition),
            int(getattr(p, "current_leader_epoch", NO_EPOCH)),
            read,
            topic_id,
        )
        held = False
        if stop is not None and stop < whole.last_stable_offset:
            # The client is told the cut is where stable data ends, as it is.
            held = not whole.batches and offset < whole.last_stable_offset
            whole = dataclasses.replace(whole, last_stable_offset=max(stop, offset))
        assert config is not None
        records = kafka_records(whole.batches, config)
        return _Fetched(KafkaErrorCode.none, whole, records, diverging, held)

    def _cut(self, topic: str, topic_id: str | None, index: int) -> int:
        """Where a read_committed reader of partition ``index`` stops: idemlog's stable
        cut (``coordination.stable_cuts``); raises when none can be had."""
        if topic_id is None:
            topic_id = self._cluster().topic(topic).topic_id
        return self._cuts.ends(topic, topic_id).get(index, 0)

    def _fetch_response(
        self,
        response: type[Any],
        body: Any,
        answers: list[_Fetched],
    ) -> Any:
        topic_cls = nested(response, "FetchableTopicResponse")
        partition_cls = nested(response, "PartitionData")
        aborted_cls = nested(response, "AbortedTransaction")
        epoch_cls = getattr(sys.modules[response.__module__], "EpochEndOffset", None)
        committed = body.isolation_level == READ_COMMITTED
        found = iter(answers)
        topics = []
        for topic in body.topics:
            partitions = []
            for p in topic.partitions:
                answer = next(found)
                read, diverging = answer.read, answer.diverging
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
                    build(
                        partition_cls,
                        partition_index=p.partition,
                        error_code=answer.error,
                        high_watermark=i64(-1 if read is None else read.high_watermark),
                        last_stable_offset=i64(-1 if read is None else read.last_stable_offset),
                        log_start_offset=i64(-1 if read is None else read.log_start_offset),
                        aborted_transactions=aborted,
                        preferred_read_replica=i32(-1),
                        records=answer.records,
                        **extra,
                    )
                )
            topics.append(
                build(
                    topic_cls,
                    topic=getattr(topic, "topic", None),
                    topic_id=getattr(topic, "topic_id", None),
                    partitions=tuple(partitions),
                )
            )
        return build(
            response,
            throttle_time=NO_THROTTLE,
            error_code=KafkaErrorCode.none,
            session_id=i32(NO_SESSION),
            responses=tuple(topics),
        )


def _end_offset_for(epoch: int, log_: PartitionLog) -> EpochEndOffset:
    return log_.end_offset_for(epoch)
