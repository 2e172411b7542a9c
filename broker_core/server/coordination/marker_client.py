"""The coordinator's MarkerWriter on a broker: markers go to each partition's leader.

Partitions this broker leads get their markers through ``LocalMarkerWriter`` (the local
topic is created first if no batch has reached it yet); the others get one
``WRITE_TXN_MARKERS`` action per leader over Flight, carrying every producer's markers
for that leader's partitions, the calls to different leaders at once. Errors come back typed, so the
coordinator retries the retriable ones (a leader that is down: ``NETWORK_EXCEPTION``).
Each leader answers the last stable offset of every partition it wrote a marker to
(``protocol.txn_requests.WriteTxnMarkersResponse``); :meth:`write_markers`
returns them all in one map, like ``LocalMarkerWriter``.

Test hooks (``server.hooks``, the product's answers unless the broker was started with
``test.hooks.class``): :meth:`write_markers` calls ``before_markers`` before the first
marker (the PREPARE_* state is already durable) and, if ``first_marker_alone`` says so,
writes the first partition's marker alone, then calls ``after_first_marker``. The kill
tests' hooks SIGKILL the broker there, to stop it in the middle of ending a transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from broker_core.client.connections import FlightConnections
from broker_core.cluster.records import BrokerInfo, TopicAssignment
from broker_core.errors import (
    IdemlogError,
    InvalidRequestError,
    NetworkError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from broker_core.log.partition_log import HangingAbort, MarkerResult, PartitionLog
from broker_core.protocol.txn_requests import WriteTxnMarkersRequest, WriteTxnMarkersResponse
from broker_core.protocol.wire import Action, decode_json, encode_json
from broker_core.record.batch import ControlType
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.tls import PLAINTEXT_MATERIAL, TlsMaterial
from broker_core.server.hooks import NO_HOOKS, BrokerHooks
from broker_core.txn.coordinator.markers import (
    MarkerWriter,
    ProducerMarkers,
    StableOffsets,
    by_partition,
    restricted,
)

log = logging.getLogger("idemlog.markers")

# A remote marker call's timeout when none is given: the broker passes one longer than the
# acks=all wait at the leader (server.config.timeouts.marker_call_timeout_ms, 70 s by default).
MARKER_TIMEOUT_S = 70.0
MARKER_CALL_THREADS = 8


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
        tls: TlsMaterial = PLAINTEXT_MATERIAL,
        sasl: SaslCredentials | None = None,
        hooks: BrokerHooks = NO_HOOKS,
    ) -> None:
        self._broker_id = broker_id
        self._hooks = hooks  # test hooks: the product's answers unless started for them
        self._topics = topics
        self._local = local
        self._brokers = brokers
        self._replicated = replicated
        self._call_timeout_s = call_timeout_s
        # To the leaders: the broker's own TLS and, on a SASL cluster, its own principal.
        self._connections = FlightConnections(tls, sasl=sasl)
        # Remote leaders' calls, side by side (a few brokers: a few threads).
        self._pool = ThreadPoolExecutor(MARKER_CALL_THREADS, thread_name_prefix="marker-calls")

    def write_markers(
        self, producers: Sequence[ProducerMarkers], commit: bool, coordinator_epoch: int
    ) -> StableOffsets:
        self._hooks.before_markers()
        by_leader: dict[int, set[tuple[str, int]]] = {}
        for topic, partition in sorted(by_partition(producers)):
            try:
                leader = self._topics.assignment(topic).leader(partition)
            except UnknownTopicOrPartitionError as exc:
                # Deleted with its topic: there is no log left to end the transaction in.
                log.warning("no markers on %s-%d: %s", topic, partition, exc.message)
                continue
            by_leader.setdefault(leader, set()).add((topic, partition))
        if by_leader and self._hooks.first_marker_alone():
            # The test hook: the first leader's first partition alone, then the hook (the
            # kill tests' SIGKILL). After one that returns, all are written below: that
            # first marker again too, a no-op.
            first = min(by_leader)
            self._write_to(
                first, restricted(producers, [min(by_leader[first])]), commit, coordinator_epoch
            )
            self._hooks.after_first_marker()
        # One call per leader, all at once (this broker's own partitions on this thread).
        local = by_leader.pop(self._broker_id, set())
        futures = {
            leader: self._pool.submit(
                self._write_to, leader, restricted(producers, tps), commit, coordinator_epoch
            )
            for leader, tps in sorted(by_leader.items())
        }
        stable: StableOffsets = {}
        errors: list[IdemlogError] = []
        try:
            if local:
                stable.update(
                    self.write_local(restricted(producers, local), commit, coordinator_epoch)
                )
        except IdemlogError as exc:
            errors.append(exc)
        for leader in sorted(futures):
            try:
                stable.update(futures[leader].result())
            except IdemlogError as exc:
                errors.append(exc)
        if errors:
            # A leader that is down did not hold back the others' readers: their markers
            # are written, and the whole call is retried (a marker written twice is a
            # no-op) once this raises; a non-retriable error is the one raised.
            raise next((e for e in errors if not e.retriable), errors[0])
        return stable

    def _write_to(
        self, leader: int, producers: Sequence[ProducerMarkers], commit: bool, epoch: int
    ) -> StableOffsets:
        if leader == self._broker_id:
            return self.write_local(producers, commit, epoch)
        return self._write_remote(leader, producers, commit, epoch)

    def write_local(
        self, producers: Sequence[ProducerMarkers], commit: bool, coordinator_epoch: int
    ) -> StableOffsets:
        """Markers into partitions this broker leads (also WRITE_TXN_MARKERS from a peer),
        one append per partition, returned once every in-sync replica has them, with the
        last stable offsets then."""
        logs = {tp: self._topics.leader_log(*tp) for tp in by_partition(producers)}
        stable = self._local.write_markers(producers, commit, coordinator_epoch)
        if self._replicated is None:
            return stable
        # The followers fetch every partition meanwhile: the waits overlap.
        for (topic, partition), log_ in logs.items():
            if (topic, partition) in stable:
                self._replicated(topic, partition, log_.log_end_offset)
                stable[(topic, partition)] = log_.last_stable_offset
        return stable

    def abort_hanging(
        self,
        topic: str,
        partition: int,
        producer_id: int | None,
        producer_epoch: int | None,
        start_offset: int | None,
    ) -> HangingAbort:
        """An operator's abort of a hanging transaction on a partition this broker leads
        (``PartitionLog.abort_open_transaction``: fenced by a producer epoch bump),
        returned, like a coordinator's marker, once every in-sync replica has it."""
        log_ = self._topics.leader_log(topic, partition)
        done = log_.abort_open_transaction(producer_id, producer_epoch, start_offset)
        if self._replicated is None:
            return done
        self._replicated(topic, partition, done.marker.offset + 1)
        marker = MarkerResult(done.marker.offset, log_.last_stable_offset)
        return HangingAbort(done.producer_id, done.txn_start_offset, done.marker_epoch, marker)

    def _write_remote(
        self,
        leader: int,
        producers: Sequence[ProducerMarkers],
        commit: bool,
        coordinator_epoch: int,
    ) -> StableOffsets:
        request = WriteTxnMarkersRequest(
            tuple((m.producer_id, m.producer_epoch, m.partitions) for m in producers),
            commit,
            coordinator_epoch,
        )
        kind = ControlType.COMMIT.name if commit else ControlType.ABORT.name
        pids = [m.producer_id for m in producers]
        answer = self._connections.action(
            self._address(leader),
            Action.WRITE_TXN_MARKERS.value,
            encode_json(request.to_doc()),
            self._call_timeout_s,
            f"{kind} markers for producer ids {pids[:5]}{'...' if len(pids) > 5 else ''} "
            f"to broker {leader}",
        )
        what = f"{Action.WRITE_TXN_MARKERS.value} answer of broker {leader}"
        try:
            doc = decode_json(answer, what)
            stable = WriteTxnMarkersResponse.from_doc(doc, what).stable
        except InvalidRequestError as exc:
            # The markers are written but the answer is not ours to read (a broker of
            # another version?): a server error, not the coordinator's bad request.
            raise UnknownServerError(exc.message) from exc
        asked = set(by_partition(producers))
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
        self._pool.shutdown(wait=True)
        self._connections.close()
