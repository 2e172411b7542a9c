"""The embedded broker's transaction coordinator, and the reader cuts' LSO source.

In embedded mode the single broker is always the controller and the coordinator starts
before the broker serves (``start(synchronous=True)``), so its first request finds it
ready; its state partition is the local ``__transaction_state`` led at the run's
controller epoch (``server.coordination.state_partition``). The embedded broker keeps **one** state
partition whatever ``transaction.state.log.num.partitions`` says: one process leads
every partition, so more would spread nothing and only cost a load, a thread and a cut
per partition (docs/design.md §10). With ZooKeeper each state partition's leader runs
that partition's coordinator instead (``server.coordination.state_coordinator``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from broker_core.client.broker_client import BrokerClient
from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.records import BrokerInfo
from broker_core.log.store import LogStore
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.tls import PLAINTEXT_MATERIAL, TlsMaterial
from broker_core.server.coordination.marker_client import LedPartitions
from broker_core.server.coordination.state_partition import embedded_state_partition
from broker_core.txn.coordinator.coordinator import (
    MarkerWriter,
    ProducerIdSource,
    TransactionCoordinator,
)
from broker_core.txn.coordinator.expiry import ExpiryPolicy, ExpiryResult
from broker_core.txn.state_topic.store import LogTxnStateStore

log = logging.getLogger("idemlog.broker")

ACTIVATION_RETRY_S = 1.0  # after a failed coordinator start (e.g. a marker's broker is down)


class ClusterStableOffsets:
    """Partitions' last stable offsets for the coordinator's reader cuts: local logs read
    in place, the others asked of their leaders (bootstrapped from ``brokers()``)."""

    def __init__(
        self,
        broker_id: int,
        topics: LedPartitions,
        brokers: Callable[[], Sequence[BrokerInfo]],
        tls: TlsMaterial = PLAINTEXT_MATERIAL,
        sasl: SaslCredentials | None = None,
    ) -> None:
        self._broker_id = broker_id
        self._topics = topics
        self._brokers = brokers
        self._tls = tls  # the broker's own protocol and files (docs/security.md)
        self._sasl = sasl  # the broker's own principal on a SASL cluster
        self._lock = threading.Lock()
        self._client: BrokerClient | None = None

    def last_stable_offsets(self, topic: str) -> dict[int, int]:
        assignment = self._topics.assignment(topic)
        ends: dict[int, int] = {}
        for partition, leader in sorted(assignment.partitions.items()):
            if leader == self._broker_id:
                ends[partition] = self._topics.leader_log(topic, partition).last_stable_offset
            else:
                doc = self.client().list_offsets(topic, partition)
                ends[partition] = int(doc["last_stable_offset"])
        return ends

    def client(self) -> BrokerClient:
        """A client of the cluster with this broker's own credentials, made at first use
        (``close`` closes it)."""
        with self._lock:
            if self._client is None:
                bootstrap = ",".join(f"{b.host}:{b.port}" for b in self._brokers())
                self._client = BrokerClient(bootstrap, tls=self._tls, sasl=self._sasl)
            return self._client

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class CoordinatorRole:
    """Runs a :class:`TransactionCoordinator` on the embedded broker ``broker_id`` while
    ``cluster`` says it is the controller (always, once registered), built of ``pids``,
    ``markers`` and ``offsets``; its state is ``store``'s ``__transaction_state``; ids
    and sinks expire by ``expiry``."""

    def __init__(
        self,
        broker_id: int,
        cluster: ClusterMetadata,
        *,
        store: LogStore,
        pids: ProducerIdSource,
        markers: MarkerWriter,
        offsets: ClusterStableOffsets,
        max_timeout_ms: int,
        state_segment_bytes: int | None = None,
        state_delete_retention_ms: int | None = None,
        marker_retry_deadline_s: float,
        expiry: ExpiryPolicy,
    ) -> None:
        self._broker_id = broker_id
        self._cluster = cluster
        self._store = store
        self._state_segment_bytes = state_segment_bytes
        self._state_delete_retention_ms = state_delete_retention_ms
        self._cond = threading.Condition()
        self._wanted = False
        self._dirty = False
        self._stopped = False
        self._coordinator: TransactionCoordinator | None = None
        self._offsets = offsets
        self._parts = CoordinatorParts(
            pids, markers, offsets, max_timeout_ms, marker_retry_deadline_s, expiry
        )
        self._thread: threading.Thread | None = None

    def current(self, state_partition: int = 0) -> TransactionCoordinator | None:
        """The running coordinator (of the one state partition, 0), or None while this
        broker is not (yet) running one."""
        return self._coordinator if state_partition == 0 else None

    def loading(self, state_partition: int) -> bool:
        """Never: the embedded coordinator loads before the broker serves."""
        return False

    def running(self) -> dict[int, TransactionCoordinator]:
        """The running coordinator by state partition: {0: it}, or {} while none runs."""
        coordinator = self._coordinator
        return {} if coordinator is None else {0: coordinator}

    def loading_partitions(self) -> list[int]:
        """None: see :meth:`loading`."""
        return []

    def start(self, *, synchronous: bool) -> None:
        """Follow controllership from now on; ``synchronous``: if this broker is the
        controller, start the coordinator before returning (raising what its start raises)."""
        cluster = self._cluster
        if synchronous and cluster.is_controller():
            self._coordinator = self._build_and_start()
        cluster.on_controller_change(self._on_controller_change)
        self._thread = threading.Thread(
            target=self._run, name="idemlog-coordinator-role", daemon=True
        )
        self._thread.start()
        self._on_controller_change(cluster.is_controller())

    def _on_controller_change(self, is_controller: bool) -> None:
        with self._cond:
            self._wanted = is_controller
            self._dirty = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._dirty or self._stopped)
                if self._stopped:
                    return
                self._dirty = False
                wanted = self._wanted
            if wanted and self._coordinator is None:
                try:
                    self._coordinator = self._build_and_start()
                except Exception:
                    log.exception(
                        "broker %d: starting the transaction coordinator failed; retrying in %.0fs",
                        self._broker_id,
                        ACTIVATION_RETRY_S,
                    )
                    with self._cond:
                        self._dirty = True
                        self._cond.wait_for(lambda: self._stopped, ACTIVATION_RETRY_S)
            elif not wanted and self._coordinator is not None:
                log.info("broker %d is no longer the controller", self._broker_id)
                self._close_coordinator()

    def _build_and_start(self) -> TransactionCoordinator:
        """A coordinator at this run's controller epoch, started (its state loaded): its
        state partition is led by this broker at that epoch, which fences its writes
        (``server.coordination.state_partition``). Raises what the coordinator's start raises."""
        # Read after the controllership was reported: this run's epoch, higher than every
        # earlier run's.
        epoch = self._cluster.controller_epoch()
        partition = embedded_state_partition(
            self._store,
            self._broker_id,
            epoch,
            segment_bytes=self._state_segment_bytes,
            delete_retention_ms=self._state_delete_retention_ms,
        )
        coordinator = self._parts.start(LogTxnStateStore(partition, leader_epoch=epoch), epoch)
        log.info("broker %d runs the transaction coordinator (epoch %d)", self._broker_id, epoch)
        return coordinator

    def abort_timed_out(self) -> list[str]:
        """Abort the running coordinator's transactions open past their timeout."""
        return abort_timed_out_of(self._coordinator)

    def expire_idle(self) -> ExpiryResult | None:
        """Remove the running coordinator's ids and sink records idle past their expiry."""
        return expire_idle_of(self._coordinator)

    def _close_coordinator(self) -> None:
        self._offsets.close()
        coordinator, self._coordinator = self._coordinator, None
        if coordinator is not None:
            try:
                coordinator.close()
            except Exception:
                log.exception("broker %d: closing the coordinator failed", self._broker_id)

    def stop(self) -> None:
        """Stop following controllership and close the coordinator if one runs."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10.0)
        self._close_coordinator()


@dataclass(frozen=True)
class CoordinatorParts:
    """What every coordinator a broker runs is built of, the embedded broker's and a
    cluster's state-partition leader's alike."""

    pids: ProducerIdSource
    markers: MarkerWriter
    offsets: ClusterStableOffsets
    max_timeout_ms: int
    marker_retry_deadline_s: float
    expiry: ExpiryPolicy

    def start(
        self, state: LogTxnStateStore, epoch: int, *, finish_in_background: bool = False
    ) -> TransactionCoordinator:
        """A coordinator of ``epoch`` on ``state``, started; closed again if its start
        raises (and the error raised)."""
        coordinator = TransactionCoordinator(
            state,
            self.pids,
            self.markers,
            max_timeout_ms=self.max_timeout_ms,
            marker_retry_deadline_s=self.marker_retry_deadline_s,
            coordinator_epoch=epoch,
            stable_offsets=self.offsets,
            expiry=self.expiry,
        )
        try:
            coordinator.start(finish_in_background=finish_in_background)
        except BaseException:
            coordinator.close()
            raise
        return coordinator


def abort_timed_out_of(coordinator: TransactionCoordinator | None) -> list[str]:
    """Abort ``coordinator``'s transactions open past their timeout (none while no
    coordinator runs); returns their transactional ids."""
    if coordinator is None:
        return []
    aborted = coordinator.abort_timed_out()
    if aborted:
        log.info("aborted transactions open past their timeout: %s", aborted)
    return aborted


def expire_idle_of(coordinator: TransactionCoordinator | None) -> ExpiryResult | None:
    """Remove ``coordinator``'s ids and sink records idle past their expiry (nothing while
    no coordinator runs)."""
    return None if coordinator is None else coordinator.expire_idle()
