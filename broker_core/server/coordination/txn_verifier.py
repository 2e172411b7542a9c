"""A partition leader's check with a transactional id's coordinator before it appends a
transactional batch (Kafka's transaction verification, KIP-890 part 1).

The coordinator of the id is the leader of its ``__transaction_state`` partition: this
broker's own (embedded, or a partition it leads) is called directly; another broker's is
asked with ``add_partitions_to_txn`` ``verify_only`` over the broker's inter-broker
connection (ClusterAction on the Cluster). Its answer is only as good as the log's guard
it was asked under (``log.producer_state.VerificationGuard``): the append checks that.
"""

from __future__ import annotations

from collections.abc import Callable

from broker_core.client.connections import FlightConnections
from broker_core.cluster.metadata import ClusterMetadata
from broker_core.errors import (
    CoordinatorNotAvailableError,
    IdemlogError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    ProducerFencedError,
)
from broker_core.protocol.txn_requests import AddPartitionsToTxnRequest
from broker_core.protocol.wire import Action, encode_json
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.tls import PLAINTEXT_MATERIAL, TlsMaterial
from broker_core.server.coordination.coordinators import Coordinators
from broker_core.txn.state_topic.schema import TXN_STATE_TOPIC


class TxnVerifier:
    """Verifies for broker ``broker_id`` through ``coordinators`` (its own) or the state
    partition's leader named by ``cluster()``; a remote call waits ``timeout_s``."""

    def __init__(
        self,
        broker_id: int,
        coordinators: Coordinators,
        cluster: Callable[[], ClusterMetadata],
        *,
        embedded: bool,
        timeout_s: float,
        tls: TlsMaterial = PLAINTEXT_MATERIAL,
        sasl: SaslCredentials | None = None,
    ) -> None:
        self._broker_id = broker_id
        self._coordinators = coordinators
        self._cluster = cluster
        self._embedded = embedded
        self._timeout_s = timeout_s
        self._connections = FlightConnections(tls, sasl=sasl)

    def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> None:
        """Return when (producer_id, producer_epoch) holds ``transactional_id`` and its
        ongoing transaction holds ``topic``-``partition``. Raises the fencing errors as
        the coordinator does, INVALID_TXN_STATE for any other refusal (naming the
        coordinator's reason), and the retriable routing and network errors as they are.
        A fenced producer is INVALID_PRODUCER_EPOCH."""
        what = f"produce to {topic}-{partition}"
        try:
            self._ask(transactional_id, producer_id, producer_epoch, topic, partition)
        except (ProducerFencedError, InvalidProducerEpochError) as exc:
            # A produce answers a fenced producer INVALID_PRODUCER_EPOCH, as Kafka's does.
            raise InvalidProducerEpochError(f"{what}: {exc.message}") from exc
        except IdemlogError as exc:
            if exc.retriable:
                raise
            raise InvalidTxnStateError(
                f"{what}: the transaction of producer id {producer_id} epoch {producer_epoch} "
                f"was not verified with its coordinator: {exc.message}"
            ) from exc

    def _ask(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> None:
        state_partition = self._coordinators.partition_of(transactional_id)
        leader = self._broker_id
        if not self._embedded:
            leader = self._cluster().topic(TXN_STATE_TOPIC).leader(state_partition)
        if leader == self._broker_id:
            self._coordinators.for_partition(state_partition).verify_partitions(
                transactional_id, producer_id, producer_epoch, [(topic, partition)]
            )
            return
        info = next((b for b in self._cluster().brokers() if b.broker_id == leader), None)
        if info is None:
            raise CoordinatorNotAvailableError(
                f"the coordinator of {TXN_STATE_TOPIC}-{state_partition} (broker {leader}) "
                "is not live"
            )
        request = AddPartitionsToTxnRequest(
            transactional_id, producer_id, producer_epoch, ((topic, partition),), verify_only=True
        )
        self._connections.action(
            f"{info.host}:{info.port}",
            Action.ADD_PARTITIONS_TO_TXN.value,
            encode_json(request.to_doc()),
            self._timeout_s,
            f"verification of producer id {producer_id} with broker {leader}",
        )

    def close(self) -> None:
        self._connections.close()
