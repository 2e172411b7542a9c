"""The coordinator's MarkerWriter on a broker: markers go to each partition's leader.

Partitions this broker leads get their marker through ``LocalMarkerWriter`` (the local
topic is created first if no batch has reached it yet); the others get one
``WRITE_TXN_MARKERS`` action per leader over Flight. Errors come back typed, so the
coordinator retries the retriable ones (a leader that is down: ``NETWORK_EXCEPTION``).
Each leader answers the last stable offset of every partition it wrote a marker to
(``protocol.requests.WriteTxnMarkersResponse``); :meth:`write_markers`
returns them all in one map, like ``LocalMarkerWriter``.

Test hook: ``IDEMLOG_TEST_FAILPOINT`` (read on every call, so only a process started with
it is affected) makes the broker SIGKILL itself inside :meth:`write_markers`:
``after_prepare`` before the first marker (the PREPARE_* state is already durable),
``after_first_marker`` after the first partition's marker. The kill tests use it to stop
a broker in the middle of ending a transaction; nothing else reads it.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Sequence
from typing import Protocol

from broker_core.client.connections import FlightConnections
from broker_core.cluster.metadata import BrokerInfo, TopicAssignment
from broker_core.errors import (
    IdemlogError,
    InvalidRequestError,
    NetworkError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from broker_core.log.partition_log import PartitionLog
from broker_core.protocol.requests import WriteTxnMarkersRequest, WriteTxnMarkersResponse
from broker_core.protocol.wire import Action, decode_json, encode_json
from broker_core.record.batch import ControlType
from broker_core.txn.markers import MarkerWriter, StableOffsets

log = logging.getLogger("idemlog.markers")

FAILPOINT_ENV = "IDEMLOG_TEST_FAILPOINT"
# A remote marker call's timeout when none is given: the broker passes one longer than the
# acks=all wait at the leader (server.config.marker_call_timeout_ms, 70 s by default).
MARKER_TIMEOUT_S = 70.0


def _failpoint(stage: str) -> None:
    if os.environ.get(FAILPOINT_ENV) == stage:
        log.warning("test failpoint %s: killing this broker (SIGKILL)", stage)
        os.kill(os.getpid(), signal.SIGKILL)


class LedPartitions(Protocol):
    """What the writer needs of the broker's local topics (``LocalTopics``)."""

    def assignment(self, topic: str) -> TopicAssignment: ...

    def leader_log(self, topic: str, partition: int) -> PartitionLog: ...


class RoutingMarkerWriter:
    """Markers for broker ``broker_id``'s coordinator: partitions it leads (``topics``) go
    to ``local`` (a ``LocalMarkerWriter`` on its store), the others to their leader among
    ``brokers()`` (the live brokers, read on each connection).

    A local marker counts as written once ``replicated(topic, partition, end)`` returns:
    every in-sync replica has it (acks=all), so a leader lost right after cannot take a
    transaction the coordinator records as ended with it. A remote call waits up to
    ``call_timeout_s``: longer than that acks=all wait at the leader, so a slow follower
    never makes the call time out and be retried, which would append the marker again.
    """

    def __init__(
        self,
        broker_id: int,
        topics: LedPartitions,
        local: MarkerWriter,
        brokers: Callable[[], Sequence[BrokerInfo]],
        *,
        replicated: Callable[[str, int, int], None] | None = None,
        call_timeout_s: float = MARKER_TIMEOUT_S,
    ) -> None:
        self._broker_id = broker_id
        self._topics = topics
        self._local = local
        self._brokers = brokers
        self._replicated = replicated
        self._call_timeout_s = call_timeout_s
        self._connections = FlightConnections()

    def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Sequence[tuple[str, int]],
    ) -> StableOffsets:
        _failpoint("after_prepare")
        stable: StableOffsets = {}
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for topic, partition in partitions:
            try:
                leader = self._topics.assignment(topic).leader(partition)
            except UnknownTopicOrPartitionError as exc:
                # Deleted with its topic: there is no log left to end the transaction in.
                log.warning(
                    "no marker for producer id %d on %s-%d: %s",
                    producer_id,
                    topic,
                    partition,
                    exc.message,
                )
                continue
            by_leader.setdefault(leader, []).append((topic, partition))
        first = True
        unreachable: IdemlogError | None = None
        for leader in sorted(by_leader):
            group = sorted(by_leader[leader])
            # One partition at a time locally, so the failpoint can stop between two.
            steps = [[tp] for tp in group] if leader == self._broker_id else [group]
            try:
                for step in steps:
                    if leader == self._broker_id:
                        written = self.write_local(
                            producer_id, producer_epoch, commit, coordinator_epoch, step
                        )
                    else:
                        written = self._write_remote(
                            leader, producer_id, producer_epoch, commit, coordinator_epoch, step
                        )
                    stable.update(written)
                    if first:
                        first = False
                        _failpoint("after_first_marker")
            except IdemlogError as exc:
                if not exc.retriable:
                    raise
                # A leader that is down must not hold back the others' readers: their
                # markers are written now, and the whole call is retried (a marker
                # written twice is a no-op) once this error is raised below.
                unreachable = unreachable or exc
        if unreachable is not None:
            raise unreachable
        return stable

    def write_local(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Sequence[tuple[str, int]],
    ) -> StableOffsets:
        """Markers into partitions this broker leads (also WRITE_TXN_MARKERS from a peer),
        returned once every in-sync replica has them, with the last stable offsets then."""
        logs = {tp: self._topics.leader_log(*tp) for tp in partitions}  # leader check
        stable = self._local.write_markers(
            producer_id, producer_epoch, commit, coordinator_epoch, partitions
        )
        if self._replicated is None:
            return stable
        for (topic, partition), log_ in logs.items():
            if (topic, partition) in stable:
                self._replicated(topic, partition, log_.log_end_offset)
                stable[(topic, partition)] = log_.last_stable_offset
        return stable

    def _write_remote(
        self,
        leader: int,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Sequence[tuple[str, int]],
    ) -> StableOffsets:
        request = WriteTxnMarkersRequest(
            producer_id, producer_epoch, commit, coordinator_epoch, tuple(partitions)
        )
        kind = ControlType.COMMIT.name if commit else ControlType.ABORT.name
        answer = self._connections.action(
            self._address(leader),
            Action.WRITE_TXN_MARKERS.value,
            encode_json(request.to_doc()),
            self._call_timeout_s,
            f"{kind} markers for producer_id={producer_id} to broker {leader}",
        )
        what = f"{Action.WRITE_TXN_MARKERS.value} answer of broker {leader}"
        try:
            doc = decode_json(answer, what)
            stable = WriteTxnMarkersResponse.from_doc(doc, what).stable
        except InvalidRequestError as exc:
            # The markers are written but the answer is not ours to read (a broker of
            # another version?): a server error, not the coordinator's bad request.
            raise UnknownServerError(exc.message) from exc
        asked = set(partitions)
        extra = sorted(set(stable) - asked)
        if extra:
            raise UnknownServerError(f"{what}: offsets of partitions not asked for: {extra}")
        return stable

    def _address(self, broker_id: int) -> str:
        info = next((b for b in self._brokers() if b.broker_id == broker_id), None)
        if info is None:
            raise NetworkError(f"broker {broker_id}, leader of a marker's partition, is down")
        # Keyed by address: a broker back on a new port gets a new connection.
        return f"{info.host}:{info.port}"

    def close(self) -> None:
        self._connections.close()
