"""Kafka's Produce API: idempotent (and plain) Kafka producers write through the Kafka
listener, into Kafka-shaped topics (docs/kafka.md "Produce").

Each partition's record batch (exactly one, as Kafka requires from v3) is decoded
column-wise (``kafka.record_batch.decode_batches``: magic 2, CRC-32C checked,
decompressed first if it is gzip, snappy, lz4 or zstd), its rows
put in the topic's own schema (``topic_rows``) and appended as ONE idemlog batch through
the leader's append path the Flight produce takes (``Partition.append_as_leader``, then
``PartitionLog.append`` with the Kafka batch's producer id, epoch and base sequence): the
same validator answers it, so a retried batch is answered with its original offsets and
error NONE, as Kafka answers a duplicate it still has the metadata of; one older than the
window is DUPLICATE_SEQUENCE_NUMBER, a gap OUT_OF_ORDER_SEQUENCE_NUMBER, a fenced epoch
INVALID_PRODUCER_EPOCH, an id never issued UNKNOWN_PRODUCER_ID. acks=-1 waits for the
in-sync replicas (``Partition.wait_replicated``, at the epoch that wrote it) up to the
request's timeout; acks=0 is appended and never answered, as Kafka never answers it (a
failure closes the connection, as on Kafka).

Refused per partition, nothing written: a transactional batch or a request with a
transactional id (UNSUPPORTED_VERSION: transactions are served over Flight only), a
compression type Kafka does not define (UNSUPPORTED_COMPRESSION_TYPE), a topic that cannot
hold Kafka records (INVALID_RECORD, naming its columns), a malformed batch
(CORRUPT_MESSAGE). With ``authorizer.enable`` (docs/kafka.md "What each API requires"):
a topic the caller may not Write is TOPIC_AUTHORIZATION_FAILED in each of its partitions,
a batch with a producer id CLUSTER_AUTHORIZATION_FAILED without IdempotentWrite on the
Cluster, nothing written. A Kafka producer's id carries no producer token (the Flight
path's binding of an id to the principal it was issued to, ``security.producer_token``):
not bound yet on the Kafka listener.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.static.primitive import i32, i64

from broker_core.errors import (
    IdemlogError,
    InvalidRecordError,
    InvalidRequiredAcksError,
    NetworkError,
    SchemaMismatchError,
)
from broker_core.kafka.compression import UnsupportedCompressionError
from broker_core.kafka.record_batch import decode_batches
from broker_core.log.partition_log import AppendResult, PartitionLog
from broker_core.log.store import LogStore
from broker_core.protocol.metrics import AppendOutcome
from broker_core.security.acl import CLUSTER, Operation, Resource, ResourceType
from broker_core.server.kafka.authorize import ALLOW_ALL, KafkaAuthorizer
from broker_core.server.kafka.consume import KafkaTopics
from broker_core.server.kafka.framing import KafkaRequest
from broker_core.server.kafka.messages import NO_THROTTLE, ServedApi, build, kafka_error, nested
from broker_core.server.kafka.topic_rows import topic_rows
from broker_core.server.observability.metrics import Metrics, outcome_of
from broker_core.server.replication.partition import Partition

log = logging.getLogger("idemlog.kafka")

PRODUCE = 0
ACKS_NONE, ACKS_LEADER, ACKS_ALL = 0, 1, -1


class _Refused(Exception):
    """A partition's refusal with a Kafka error idemlog's errors do not have."""

    def __init__(self, error: KafkaErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


@dataclass
class _Answer:
    """One partition's answer; ``replica``/``end``/``epoch`` set while acks=-1 still has to
    wait for the in-sync replicas to reach ``end`` at ``epoch``."""

    topic: str
    index: int
    error: KafkaErrorCode = KafkaErrorCode.none
    message: str | None = None
    base_offset: int = -1
    log_start_offset: int = -1
    replica: Partition | None = None
    end: int = -1
    epoch: int = -1

    def fail(self, error: KafkaErrorCode, message: str) -> None:
        self.error, self.message, self.base_offset, self.replica = error, message, -1, None


class ProduceApi:
    """Produce v3 (the first with record batch v2) to v11 (v12 only changes transactional
    produce, v13 names topics by id), over ``topics`` (the partitions this broker leads),
    ``store()`` (the topics' schemas) and ``metrics`` (each batch's outcome, duplicates
    answered counted as the Flight path counts them), for callers ``authorizer`` allows."""

    def __init__(
        self,
        topics: KafkaTopics,
        store: Callable[[], LogStore | None],
        metrics: Metrics,
        *,
        authorizer: KafkaAuthorizer = ALLOW_ALL,
    ) -> None:
        self._topics = topics
        self._store = store
        self._metrics = metrics
        self._authorizer = authorizer

    def apis(self) -> Sequence[ServedApi]:
        return (ServedApi(PRODUCE, 3, 11, "kafka_produce", self.produce),)

    def produce(self, request: KafkaRequest, response: type[Any]) -> Any:
        """Every partition's batch appended in the request's order, then with acks=-1 each
        waited for until the request's ``timeout``; the answer per partition (None for
        acks=0)."""
        body = request.body
        acks = int(body.acks)
        deadline = time.monotonic() + body.timeout.total_seconds()
        # Each topic checked (and a refusal counted) once per request; IdempotentWrite
        # once, at the first batch that carries a producer id.
        refused = {
            name: self._authorizer.refusal(
                request, Operation.WRITE, Resource(ResourceType.TOPIC, name)
            )
            for name in {topic.name for topic in body.topic_data}
        }
        idempotent = functools.cache(
            lambda: self._authorizer.refusal(request, Operation.IDEMPOTENT_WRITE, CLUSTER)
        )
        answers = [
            self._append(
                topic.name, p, acks, body.transactional_id, refused[topic.name], idempotent
            )
            for topic in body.topic_data
            for p in topic.partition_data
        ]
        for answer in answers:
            if answer.replica is None:
                continue
            try:
                remaining = max(0.0, deadline - time.monotonic())
                answer.replica.wait_replicated(answer.end, remaining, answer.epoch)
            except IdemlogError as exc:
                # Written, not yet replicated: a retry is answered as a duplicate once it is.
                answer.fail(kafka_error(exc), exc.message)
        if acks == ACKS_NONE:
            failed = [a for a in answers if a.error != KafkaErrorCode.none]
            if failed:
                # Kafka closes the connection of an acks=0 request that failed: the one
                # sign its client gets, which then refreshes its metadata.
                first = failed[0]
                raise NetworkError(
                    f"Produce with acks=0 failed for {len(failed)} partition(s), first "
                    f"{first.topic}-{first.index}: {first.error.name} {first.message}"
                )
            return None
        return self._response(response, body, answers)

    def _append(
        self,
        topic: str,
        p: Any,
        acks: int,
        txn_id: str | None,
        refused: IdemlogError | None,
        idempotent: Callable[[], IdemlogError | None],
    ) -> _Answer:
        """``refused``: the topic's refusal (None: Write allowed); ``idempotent()``: the
        refusal of a batch with a producer id."""
        index = int(p.index)
        answer = _Answer(topic, index)
        where = f"Produce to {topic}-{index}"
        producer_id = -1
        try:
            if refused is not None:
                raise _Refused(kafka_error(refused), refused.message)
            if acks not in (ACKS_NONE, ACKS_LEADER, ACKS_ALL):
                raise InvalidRequiredAcksError(f"{where}: acks={acks}, not 0, 1 or -1")
            if txn_id is not None:
                raise _transactions_refused(where, f"transactional id {txn_id!r}")
            # Routing first: a client led elsewhere is told so, whatever it sent.
            self._topics.leader_log(topic, index)
            replica = self._topics.partition(topic, index)
            batches = decode_batches(p.records or b"")
            if len(batches) != 1:
                raise InvalidRecordError(
                    f"{where}: {len(batches)} record batches; a Produce request (v3+) "
                    "carries exactly one per partition"
                )
            (batch,) = batches
            producer_id = batch.producer_id
            if batch.is_transactional or batch.is_control:
                raise _transactions_refused(where, "a transactional batch")
            if producer_id >= 0 and (not_idempotent := idempotent()) is not None:
                raise _Refused(kafka_error(not_idempotent), not_idempotent.message)
            store = self._store()
            schema = store.topic(topic).schema if store is not None else None
            rows = topic_rows(topic, schema, batch.rows, where)
            epoch = replica.leader_epoch

            def write(log_: PartitionLog) -> tuple[AppendResult, int]:
                nonlocal epoch
                epoch = replica.leader_epoch  # under the role lock: the one that writes it
                result = log_.append(
                    rows,
                    producer_id=batch.producer_id,
                    producer_epoch=batch.producer_epoch,
                    base_sequence=batch.base_sequence,
                )
                return result, log_.log_start_offset

            result, start = replica.append_as_leader(write, acks == ACKS_ALL)
        except _Refused as refused:
            log.info("kafka: %s", refused)
            self._metrics.record_append(topic, index, producer_id, AppendOutcome.REJECTED)
            answer.fail(refused.error, str(refused))
            return answer
        except IdemlogError as exc:
            log.debug("kafka: %s: %s", where, exc)
            self._metrics.record_append(topic, index, producer_id, outcome_of(exc))
            answer.fail(_produce_error(exc), exc.message)
            return answer
        except Exception as exc:
            log.exception("kafka: %s failed unexpectedly", where)
            self._metrics.record_append(topic, index, producer_id, AppendOutcome.REJECTED)
            answer.fail(KafkaErrorCode.unknown_server_error, f"{type(exc).__name__}: {exc}")
            return answer
        outcome = AppendOutcome.DUPLICATE if result.duplicate else AppendOutcome.APPENDED
        self._metrics.record_append(topic, index, producer_id, outcome, rows.num_rows, rows.nbytes)
        answer.base_offset, answer.log_start_offset = result.base_offset, start
        if acks == ACKS_ALL and replica.replicated:
            answer.replica, answer.end, answer.epoch = replica, result.last_offset + 1, epoch
        return answer

    @staticmethod
    def _response(response: type[Any], body: Any, answers: list[_Answer]) -> Any:
        topic_cls = nested(response, "TopicProduceResponse")
        partition_cls = nested(response, "PartitionProduceResponse")
        found = iter(answers)
        topics = []
        for topic in body.topic_data:
            partitions = []
            for _ in topic.partition_data:
                a = next(found)
                partitions.append(
                    build(
                        partition_cls,
                        index=i32(a.index),
                        error_code=a.error,
                        base_offset=i64(a.base_offset),
                        log_append_time=None,  # CreateTime: Kafka's -1
                        log_start_offset=i64(a.log_start_offset),
                        record_errors=(),
                        error_message=a.message,
                    )
                )
            topics.append(build(topic_cls, name=topic.name, partition_responses=tuple(partitions)))
        return build(response, responses=tuple(topics), throttle_time=NO_THROTTLE)


def _transactions_refused(where: str, what: str) -> _Refused:
    return _Refused(
        KafkaErrorCode.unsupported_version,
        f"{where}: {what}: Kafka transactions are not served on idemlog's Kafka listener "
        "(idempotent producers are: enable.idempotence without transactional.id); write "
        "transactionally with idemlog's Producer or its Spark sink",
    )


def _produce_error(exc: IdemlogError) -> KafkaErrorCode:
    if isinstance(exc, UnsupportedCompressionError):
        return KafkaErrorCode.unsupported_compression_type
    if isinstance(exc, SchemaMismatchError):
        # The topic's schema was fixed by another writer meanwhile: not what was sent.
        return KafkaErrorCode.invalid_record
    return kafka_error(exc)
