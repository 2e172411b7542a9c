"""The controller's extra role: running the transaction coordinator while it is controller.

In embedded mode the single broker is always the controller and the coordinator starts
before the broker serves (``start(synchronous=True)``), so its first request finds it
ready. With ZooKeeper, controllership comes and goes with the ``/controller`` znode; the
callbacks only record what is wanted and one thread makes it so, because a coordinator's
start finishes interrupted commits by sending markers to other brokers, which must not
block ZooKeeper's event thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from broker_core.client.broker_client import BrokerClient
from broker_core.cluster.metadata import BrokerInfo, ClusterMetadata
from broker_core.errors import NotCoordinatorError
from broker_core.log.store import LogStore
from broker_core.server.config import ZK_ROOT
from broker_core.server.marker_client import LedPartitions
from broker_core.txn.coordinator import MarkerWriter, ProducerIdSource, TransactionCoordinator
from broker_core.txn.expiry import ExpiryPolicy, ExpiryResult
from broker_core.txn.state_store import LogTxnStateStore, TxnStateStore
from broker_core.txn.state_store_zk import ZkEpochFence, ZkTxnStateStore

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
    ) -> None:
        self._broker_id = broker_id
        self._topics = topics
        self._brokers = brokers
        self._lock = threading.Lock()
        self._client: BrokerClient | None = None

    def last_stable_offsets(self, topic: str) -> dict[int, int]:
        assignment = self._topics.assignment(topic)
        ends: dict[int, int] = {}
        for partition, leader in sorted(assignment.partitions.items()):
            if leader == self._broker_id:
                ends[partition] = self._topics.leader_log(topic, partition).last_stable_offset
            else:
                doc = self._remote().list_offsets(topic, partition)
                ends[partition] = int(doc["last_stable_offset"])
        return ends

    def _remote(self) -> BrokerClient:
        with self._lock:
            if self._client is None:
                bootstrap = ",".join(f"{b.host}:{b.port}" for b in self._brokers())
                self._client = BrokerClient(bootstrap)
            return self._client

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class CoordinatorRole:
    """Runs a :class:`TransactionCoordinator` on broker ``broker_id`` while ``cluster``
    says it is the controller, built of ``pids``, ``markers`` and ``offsets``; its state
    is kept in ZooKeeper under ``ZK_ROOT`` when ``zookeeper`` (a started KazooClient) is
    given, else in ``store``'s ``__transaction_state`` topic (embedded mode); ids and
    sinks expire by ``expiry``."""

    def __init__(
        self,
        broker_id: int,
        cluster: ClusterMetadata,
        *,
        store: LogStore,
        zookeeper: Any | None,
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
        self._zookeeper = zookeeper
        self._pids = pids
        self._markers = markers
        self._max_timeout_ms = max_timeout_ms
        self._state_segment_bytes = state_segment_bytes
        self._state_delete_retention_ms = state_delete_retention_ms
        self._marker_retry_deadline_s = marker_retry_deadline_s
        self._expiry = expiry
        self._cond = threading.Condition()
        self._wanted = False
        self._dirty = False
        self._stopped = False
        self._coordinator: TransactionCoordinator | None = None
        # The coordinator's ZooKeeper state store: its connection listener is removed when
        # the coordinator stops, or every controllership would leave one behind.
        self._zk_store: ZkTxnStateStore | None = None
        self._offsets = offsets
        self._thread: threading.Thread | None = None

    def current(self) -> TransactionCoordinator | None:
        """The running coordinator, or None while this broker is not (yet) running one."""
        return self._coordinator

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
        """A coordinator at this controllership's epoch, started (its state loaded).

        With ZooKeeper its store is fenced by the controller epoch node at the version
        this controllership's bump left it: every state write is a multi that checks it,
        so once another broker is elected (and bumps it) nothing this coordinator still
        has in flight can land. Raises NotCoordinatorError when this broker is no longer
        the controller, and what the coordinator's start raises."""
        state_store: TxnStateStore
        zk_store: ZkTxnStateStore | None = None
        if self._zookeeper is None:
            state_store = LogTxnStateStore(
                self._store,
                segment_bytes=self._state_segment_bytes,
                delete_retention_ms=self._state_delete_retention_ms,
            )
            # Read after the controllership was reported: this controllership's epoch.
            epoch = self._cluster.controller_epoch()
        else:
            # Epoch and version read together, after the controllership was reported:
            # higher than every coordinator's before, whose writes the version fences.
            cluster_fence = self._cluster.controller_fence()
            if cluster_fence is None:
                raise NotCoordinatorError(
                    f"broker {self._broker_id} is no longer the controller: not starting "
                    "the transaction coordinator"
                )
            epoch = cluster_fence.epoch
            fence = ZkEpochFence(cluster_fence.path, cluster_fence.version, epoch)
            state_store = zk_store = ZkTxnStateStore(self._zookeeper, ZK_ROOT, fence=fence)
        coordinator = TransactionCoordinator(
            state_store,
            self._pids,
            self._markers,
            max_timeout_ms=self._max_timeout_ms,
            marker_retry_deadline_s=self._marker_retry_deadline_s,
            coordinator_epoch=epoch,
            stable_offsets=self._offsets,
            expiry=self._expiry,
        )
        try:
            coordinator.start()
        except BaseException:
            coordinator.close()
            if zk_store is not None:
                zk_store.close()
            raise
        self._zk_store = zk_store
        log.info("broker %d runs the transaction coordinator (epoch %d)", self._broker_id, epoch)
        return coordinator

    def abort_timed_out(self) -> list[str]:
        """Abort the running coordinator's transactions open past their timeout (none
        while no coordinator runs); returns their transactional ids."""
        coordinator = self._coordinator
        if coordinator is None:
            return []
        aborted = coordinator.abort_timed_out()
        if aborted:
            log.info("aborted transactions open past their timeout: %s", aborted)
        return aborted

    def expire_idle(self) -> ExpiryResult | None:
        """Remove the running coordinator's transactional ids and sink records idle past
        their expiry (nothing while no coordinator runs)."""
        coordinator = self._coordinator
        return None if coordinator is None else coordinator.expire_idle()

    def _close_coordinator(self) -> None:
        self._offsets.close()
        coordinator, self._coordinator = self._coordinator, None
        zk_store, self._zk_store = self._zk_store, None
        if coordinator is not None:
            try:
                coordinator.close()
            except Exception:
                log.exception("broker %d: closing the coordinator failed", self._broker_id)
        if zk_store is not None:
            zk_store.close()

    def stop(self) -> None:
        """Stop following controllership and close the coordinator if one runs."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10.0)
        self._close_coordinator()
