"""Kafka's InitProducerId for idempotent producers: a fresh producer id at epoch 0 from
the broker's producer id manager (blocks from ZooKeeper, or the embedded broker's file),
as the Flight InitProducerId gives an idempotent producer (docs/kafka.md).

Kafka's coordinator answers an idempotent producer (no transactional id) with a new id
whatever ``producer_id``/``producer_epoch`` it sends (KIP-360's fields serve
transactional ids only): so is it answered here; an empty transactional id is
INVALID_REQUEST, as Kafka answers it. A transactional id is refused with
UNSUPPORTED_VERSION, the code of a feature a broker does not have (the response carries
no message: the broker logs why); transactions are served over Flight.

With ``authorizer.enable``, as the Flight InitProducerId: IdempotentWrite on the Cluster
without a transactional id (CLUSTER_AUTHORIZATION_FAILED), Write on it with one
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED, checked before it is refused as unsupported, as
Kafka checks first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.static.primitive import i16, i64

from broker_core.errors import IdemlogError
from broker_core.producer_ids.manager import ProducerIdManager
from broker_core.server.kafka.authorize import ALLOW_ALL, KafkaAuthorizer
from broker_core.server.kafka.framing import KafkaRequest
from broker_core.server.kafka.messages import NO_THROTTLE, ServedApi, build, kafka_error

log = logging.getLogger("idemlog.kafka")

INIT_PRODUCER_ID = 22
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1


class InitProducerIdApi:
    """InitProducerId v0 to v5 (v6 adds KIP-939's two-phase commit, transactional only),
    issuing ids from ``pids()`` (the broker's manager; None before it is open) to callers
    ``authorizer`` allows."""

    def __init__(
        self,
        pids: Callable[[], ProducerIdManager | None],
        *,
        authorizer: KafkaAuthorizer = ALLOW_ALL,
    ) -> None:
        self._pids = pids
        self._authorizer = authorizer

    def apis(self) -> Sequence[ServedApi]:
        return (ServedApi(INIT_PRODUCER_ID, 0, 5, "kafka_init_producer_id", self.init_producer_id),)

    def init_producer_id(self, request: KafkaRequest, response: type[Any]) -> Any:
        txn_id = request.body.transactional_id
        if txn_id == "":  # Kafka's coordinator: neither idempotent nor a transactional id
            return _answer(response, KafkaErrorCode.invalid_request)
        refused = self._authorizer.producer_error(request, txn_id)
        if refused != KafkaErrorCode.none:
            return _answer(response, refused)
        if txn_id is not None:
            log.info(
                "kafka: InitProducerId for transactional id %r from %s refused "
                "(UNSUPPORTED_VERSION): Kafka transactions are not served on the Kafka "
                "listener; idempotent producers are (no transactional.id)",
                txn_id,
                request.client_id,
            )
            return _answer(response, KafkaErrorCode.unsupported_version)
        pids = self._pids()
        if pids is None:  # not open yet: the gate waits for the start, so only a race
            return _answer(response, KafkaErrorCode.coordinator_load_in_progress)
        try:
            producer_id = pids.generate_producer_id()
        except IdemlogError as exc:
            log.warning("kafka: InitProducerId failed: %s", exc)
            # A block not leased yet is Kafka's COORDINATOR_LOAD_IN_PROGRESS: asked again.
            error = (
                KafkaErrorCode.coordinator_load_in_progress if exc.retriable else kafka_error(exc)
            )
            return _answer(response, error)
        return _answer(response, KafkaErrorCode.none, producer_id, 0)


def _answer(
    response: type[Any],
    error: KafkaErrorCode,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
) -> Any:
    return build(
        response,
        throttle_time=NO_THROTTLE,
        error_code=error,
        producer_id=i64(producer_id),
        producer_epoch=i16(producer_epoch),
    )
