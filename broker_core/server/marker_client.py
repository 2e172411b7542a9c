"""The coordinator's MarkerWriter on a broker: markers go to each partition's leader.

Partitions this broker leads get their marker through ``LocalMarkerWriter`` (the local
topic is created first if no batch has reached it yet); the others get one
``WRITE_TXN_MARKERS`` action per leader over Flight. Errors come back typed, so the
coordinator retries the retriable ones (a leader that is down: ``NETWORK_EXCEPTION``).
Each leader answers the last stable offset of every partition it wrote a marker to, as
``{"last_stable_offsets": [{"topic", "partition", "lso"}, ..]}``; :meth:`write_markers`
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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow.flight as flight

from broker_core.client.connections import FlightConnections
from broker_core.errors import (
    InvalidRequestError,
    NetworkError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.wire import Action, decode_json, encode_json, field, parse_error_message
from broker_core.record.batch import ControlType
from broker_core.txn.coordinator import LocalMarkerWriter
from broker_core.txn.markers import StableOffsets

if TYPE_CHECKING:
    from broker_core.server.broker import Broker

log = logging.getLogger("idemlog.markers")

FAILPOINT_ENV = "IDEMLOG_TEST_FAILPOINT"
MARKER_TIMEOUT_S = 10.0
STABLE_OFFSETS_FIELD = "last_stable_offsets"


def stable_offsets_doc(stable: StableOffsets) -> list[dict[str, Any]]:
    """The wire form of a marker writer's answer (the WRITE_TXN_MARKERS response)."""
    return [
        {"topic": topic, "partition": partition, "lso": lso}
        for (topic, partition), lso in sorted(stable.items())
    ]


def parse_stable_offsets(doc: dict[str, Any], what: str) -> StableOffsets:
    """The map back from a WRITE_TXN_MARKERS response; InvalidRequestError naming a bad field."""
    raw = field(doc, STABLE_OFFSETS_FIELD, list, what)
    stable: StableOffsets = {}
    for i, item in enumerate(raw):
        where = f"{what}: {STABLE_OFFSETS_FIELD}[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequestError(f"{where} must be an object, got {item!r}")
        topic = field(item, "topic", str, where)
        partition = field(item, "partition", int, where)
        lso = field(item, "lso", int, where)
        if lso < 0:
            raise InvalidRequestError(f"{where}: field 'lso' must be >= 0, got {lso}")
        stable[(topic, partition)] = lso
    return stable


def _failpoint(stage: str) -> None:
    if os.environ.get(FAILPOINT_ENV) == stage:
        log.warning("test failpoint %s: killing this broker (SIGKILL)", stage)
        os.kill(os.getpid(), signal.SIGKILL)


class RoutingMarkerWriter:
    def __init__(self, broker: Broker) -> None:
        self._broker = broker
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
                leader = self._broker.topics.assignment(topic).leader(partition)
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
        for leader in sorted(by_leader):
            group = sorted(by_leader[leader])
            # One partition at a time locally, so the failpoint can stop between two.
            steps = [[tp] for tp in group] if leader == self._broker.broker_id else [group]
            for step in steps:
                if leader == self._broker.broker_id:
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
        return stable

    def write_local(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Sequence[tuple[str, int]],
    ) -> StableOffsets:
        """Markers into partitions this broker leads (also WRITE_TXN_MARKERS from a peer)."""
        store = self._broker.store
        assert store is not None
        for topic, partition in partitions:
            self._broker.topics.leader_log(topic, partition)  # leader check, local topic created
        return LocalMarkerWriter(store).write_markers(
            producer_id, producer_epoch, commit, coordinator_epoch, partitions
        )

    def _write_remote(
        self,
        leader: int,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Sequence[tuple[str, int]],
    ) -> StableOffsets:
        body = encode_json(
            {
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "commit": commit,
                "coordinator_epoch": coordinator_epoch,
                "partitions": [[t, p] for t, p in partitions],
            }
        )
        address = self._address(leader)
        client = self._connections.get(address)
        options = flight.FlightCallOptions(timeout=MARKER_TIMEOUT_S)
        action = flight.Action(Action.WRITE_TXN_MARKERS.value, body)
        try:
            results = list(client.do_action(action, options))
        except flight.FlightError as exc:
            self._connections.reset(address)
            typed = parse_error_message(str(exc))
            if typed is not None:
                raise typed from exc
            raise NetworkError(
                f"{ControlType.COMMIT.name if commit else ControlType.ABORT.name} markers for "
                f"producer_id={producer_id} to broker {leader} failed: {exc}"
            ) from exc
        what = f"{Action.WRITE_TXN_MARKERS.value} answer of broker {leader}"
        try:
            if len(results) != 1:
                raise InvalidRequestError(f"{what}: {len(results)} results, not 1")
            stable = parse_stable_offsets(decode_json(results[0].body.to_pybytes(), what), what)
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
        cluster = self._broker.cluster
        assert cluster is not None
        info = next((b for b in cluster.brokers() if b.broker_id == broker_id), None)
        if info is None:
            raise NetworkError(f"broker {broker_id}, leader of a marker's partition, is down")
        # Keyed by address: a broker back on a new port gets a new connection.
        return f"{info.host}:{info.port}"

    def close(self) -> None:
        self._connections.close()
