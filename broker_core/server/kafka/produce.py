"""Kafka's Produce API: listed, and refused until Kafka clients' idempotent produce is
served (docs/kafka.md)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.static.primitive import i64

from broker_core.server.kafka.framing import KafkaRequest
from broker_core.server.kafka.messages import NO_THROTTLE, ServedApi, build, nested

log = logging.getLogger("idemlog.kafka")

PRODUCE = 0


class ProduceApi:
    """Produce v3-v9, listed but refused: librdkafka reads record batch v2 only from a
    broker that lists Produce v3 and Fetch v4."""

    def apis(self) -> Sequence[ServedApi]:
        return (ServedApi(PRODUCE, 3, 9, "kafka_produce", self.produce),)

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
        topic_cls = nested(response, "TopicProduceResponse")
        partition_cls = nested(response, "PartitionProduceResponse")
        message = (
            "Produce is not served on idemlog's Kafka listener yet: write with idemlog's "
            "Producer (broker_core.producer) or its Spark sink"
        )
        topics = tuple(
            build(
                topic_cls,
                name=topic.name,
                partition_responses=tuple(
                    build(
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
        return build(response, responses=topics, throttle_time=NO_THROTTLE)
