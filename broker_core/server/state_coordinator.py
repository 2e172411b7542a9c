"""The transaction coordinator of a ZooKeeper cluster: the leader of ``__transaction_state``.

The coordinator of a key is the leader of its state partition
(``txn.state_topic.state_partition_of``; one partition for now, docs/design.md §10), so
it moves with that partition's leadership, not with controllership:

* leader at a new epoch (``ReplicaManager.on_role_change``): a coordinator of that epoch
  is built and loads the partition **in the background** (this role's thread); requests
  meanwhile get COORDINATOR_LOAD_IN_PROGRESS (retriable);
* leadership lost, or a newer epoch: the running coordinator is closed at once, on the
  callback (NOT_COORDINATOR from then on), before anything else happens to the replica;
  its appends in flight are refused by the replica itself (``server.state_partition``).

The coordinator epoch is the partition's leader epoch: every state write is fenced by it
and the markers carry it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from broker_core.cluster.metadata import BrokerInfo, ClusterMetadata
from broker_core.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    IdemlogError,
    NotCoordinatorError,
)
from broker_core.server.config import ZK_ROOT
from broker_core.server.partition import Partition, Role
from broker_core.server.replica_manager import ReplicaManager
from broker_core.server.roles import (
    ClusterStableOffsets,
    CoordinatorParts,
    CoordinatorRole,
    abort_timed_out_of,
    expire_idle_of,
)
from broker_core.server.state_migration import migrate_zookeeper_state, raise_to_floor
from broker_core.server.state_partition import LeaderStatePartition
from broker_core.txn.coordinator import MarkerWriter, ProducerIdSource, TransactionCoordinator
from broker_core.txn.expiry import ExpiryPolicy, ExpiryResult
from broker_core.txn.state_store import LogTxnStateStore
from broker_core.txn.state_topic import TXN_STATE_TOPIC
from broker_core.txn.status import CoordinatorStatus

log = logging.getLogger("idemlog.broker")

STATE_PARTITION = 0  # transaction.state.log.num.partitions is 1 for now
LOAD_RETRY_S = 1.0  # after a failed load (e.g. the log unreadable for a moment)


class StateLeaderCoordinatorRole:
    """Runs a :class:`TransactionCoordinator` on broker ``broker_id`` while it leads
    ``__transaction_state-0`` in ``replicas``, at that leadership's epoch; built of
    ``pids``, ``markers`` and ``offsets``; its acks=all state appends wait up to
    ``ack_timeout_s``. Before its first load the previous format's state is upgraded
    from ``zookeeper`` (``server.state_migration``, at most once per cluster)."""

    def __init__(
        self,
        broker_id: int,
        replicas: ReplicaManager,
        *,
        pids: ProducerIdSource,
        markers: MarkerWriter,
        offsets: ClusterStableOffsets,
        max_timeout_ms: int,
        marker_retry_deadline_s: float,
        expiry: ExpiryPolicy,
        ack_timeout_s: float,
        cluster: ClusterMetadata,
        zookeeper: Any,
    ) -> None:
        self._broker_id = broker_id
        self._cluster = cluster
        self._zookeeper = zookeeper
        self._replicas = replicas
        self._offsets = offsets
        self._parts = CoordinatorParts(
            pids, markers, offsets, max_timeout_ms, marker_retry_deadline_s, expiry
        )
        self._ack_timeout_s = ack_timeout_s
        self._cond = threading.Condition()
        # The leadership to serve: (replica, its leader epoch), None while not leader.
        self._wanted: tuple[Partition, int] | None = None
        self._coordinator: TransactionCoordinator | None = None
        self._stopped = False
        self._thread: threading.Thread | None = None

    # -- what the handlers see ---------------------------------------------------------
    def current(self) -> TransactionCoordinator | None:
        """The running coordinator, or None while this broker runs none (not the leader,
        loading, or stood down after a fenced write)."""
        coordinator = self._coordinator
        if coordinator is None or coordinator.status is not CoordinatorStatus.RUNNING:
            return None
        return coordinator

    def loading(self) -> bool:
        """This broker leads the state partition and its coordinator has not finished
        loading (COORDINATOR_LOAD_IN_PROGRESS)."""
        with self._cond:
            return self._wanted is not None and self._coordinator is None

    # -- following the leadership --------------------------------------------------------
    def start(self, *, synchronous: bool = False) -> None:
        """Follow the state partition's leadership from now on (the load is always in the
        background; ``synchronous`` is accepted for the embedded role's signature)."""
        self._replicas.on_role_change(self._on_role_change)
        for partition in self._replicas.partitions():  # opened before we listened
            if partition.role is Role.LEADER:
                self._on_role_change(partition, Role.LEADER)
        self._thread = threading.Thread(
            target=self._run, name="idemlog-state-coordinator", daemon=True
        )
        self._thread.start()

    def _on_role_change(self, partition: Partition, role: Role | None) -> None:
        """On the metadata callback's thread: record the wanted leadership and close a
        coordinator of another epoch at once; never blocks."""
        if (partition.topic, partition.partition) != (TXN_STATE_TOPIC, STATE_PARTITION):
            return
        with self._cond:
            epoch = partition.leader_epoch
            self._wanted = (partition, epoch) if role is Role.LEADER else None
            coordinator = self._coordinator
            if coordinator is not None and (
                self._wanted is None or coordinator.coordinator_epoch != epoch
            ):
                self._coordinator = None
                coordinator.close()  # sets a status and a flag: NOT_COORDINATOR from now
                log.info(
                    "broker %d: coordinator of epoch %d deposed (%s at leader epoch %d)",
                    self._broker_id,
                    coordinator.coordinator_epoch,
                    partition.name,
                    epoch,
                )
            self._cond.notify_all()

    def _needs_build(self) -> bool:
        return self._wanted is not None and self._coordinator is None

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopped or self._needs_build())
                if self._stopped:
                    return
                assert self._wanted is not None
                partition, epoch = self._wanted
            try:
                coordinator = self._build_and_load(partition, epoch)
            except CoordinatorLoadInProgressError as exc:
                log.info("broker %d: %s", self._broker_id, exc.message)  # epoch raised
                self._wait_for_change(partition, epoch)
                continue
            except Exception:
                log.exception(
                    "broker %d: loading %s at leader epoch %d failed; retrying in %.0fs",
                    self._broker_id,
                    partition.name,
                    epoch,
                    LOAD_RETRY_S,
                )
                self._wait_for_change(partition, epoch)
                continue
            with self._cond:
                if self._stopped or self._wanted != (partition, epoch):
                    coordinator.close()  # deposed while it loaded
                    continue
                self._coordinator = coordinator
            log.info(
                "broker %d runs the transaction coordinator of %s (epoch %d)",
                self._broker_id,
                partition.name,
                epoch,
            )

    def _wait_for_change(self, partition: Partition, epoch: int) -> None:
        """Up to LOAD_RETRY_S, ended early by a stop or another leadership."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._stopped or self._wanted != (partition, epoch), LOAD_RETRY_S
            )

    def _build_and_load(self, partition: Partition, epoch: int) -> TransactionCoordinator:
        """Upgrade the previous format if not done (raising the leader epoch to the floor
        first: CoordinatorLoadInProgressError), then a coordinator of ``epoch``, loaded."""
        writer = LeaderStatePartition(partition, self._ack_timeout_s)
        floor = migrate_zookeeper_state(self._zookeeper, ZK_ROOT, writer, epoch)
        if epoch < floor:
            raise_to_floor(self._cluster, self._broker_id, STATE_PARTITION, epoch, floor)
        state = LogTxnStateStore(writer, leader_epoch=epoch)
        # Served once loaded; its leftovers finish on workers of their own, so one
        # partition stuck offline delays only the transactions that touch it.
        return self._parts.start(state, epoch, finish_in_background=True)

    # -- periodic work -------------------------------------------------------------------
    def abort_timed_out(self) -> list[str]:
        """Abort the running coordinator's transactions open past their timeout."""
        return abort_timed_out_of(self.current())

    def expire_idle(self) -> ExpiryResult | None:
        """Remove the running coordinator's ids and sink records idle past their expiry."""
        return expire_idle_of(self.current())

    def stop(self) -> None:
        """Stop following the leadership and close the coordinator if one runs."""
        with self._cond:
            self._stopped = True
            coordinator, self._coordinator = self._coordinator, None
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10.0)
        if coordinator is not None:
            coordinator.close()
        self._offsets.close()


def not_coordinator_error(
    broker_id: int,
    cluster: ClusterMetadata,
    role: CoordinatorRole | StateLeaderCoordinatorRole | None,
) -> IdemlogError:
    """Why broker ``broker_id`` runs no coordinator right now, as the retriable error a
    client acts on: COORDINATOR_LOAD_IN_PROGRESS while it loads, NOT_COORDINATOR naming
    the broker that coordinates (the state partition's leader; the controller in embedded
    mode), COORDINATOR_NOT_AVAILABLE when none is known."""
    if isinstance(role, StateLeaderCoordinatorRole):
        if role.loading():
            return CoordinatorLoadInProgressError(
                f"broker {broker_id} is loading {TXN_STATE_TOPIC}-{STATE_PARTITION}"
            )
        leader = _state_leader(cluster)
    else:
        leader = cluster.controller()
    if leader is not None and leader.broker_id != broker_id:
        return NotCoordinatorError(
            f"broker {broker_id} is not the transaction coordinator: broker "
            f"{leader.broker_id} at {leader.address} is"
        )
    return CoordinatorNotAvailableError(
        f"the transaction coordinator on broker {broker_id} is not running yet"
    )


def _state_leader(cluster: ClusterMetadata) -> BrokerInfo | None:
    try:
        leader = cluster.topic(TXN_STATE_TOPIC).leader(STATE_PARTITION)
    except IdemlogError:
        return None
    return next((b for b in cluster.brokers() if b.broker_id == leader), None)
