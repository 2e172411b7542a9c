"""The transaction coordinators of a ZooKeeper cluster: the leaders of ``__transaction_state``.

The coordinator of a key is the leader of its state partition
(``protocol.coordinator_keys.state_partition_of``: crc32 of the key's sink prefix mod the
topic's partition count, docs/design.md §10), so coordination is spread over the brokers
and each coordinator moves with its own partition's leadership, not with controllership.
A broker runs one :class:`TransactionCoordinator` per state partition it leads (a
:class:`StatePartitionCoordinator` each, at most the topic's partition count), and:

* leader of partition N at a new epoch (``ReplicaManager.on_role_change``): a coordinator
  of that epoch is built and loads partition N **in the background** (that partition's
  own thread, so one slow load delays no other partition); requests for keys of N
  meanwhile get COORDINATOR_LOAD_IN_PROGRESS (retriable);
* leadership of N lost, or a newer epoch: N's running coordinator is closed at once, on
  the callback (NOT_COORDINATOR from then on), right after the replica's role changed and
  before its fetcher starts; its appends in flight are refused by the replica itself
  (``server.coordination.state_partition``). The other partitions' coordinators are untouched.

Each coordinator's epoch is its own partition's leader epoch: every state write is
fenced by it and the markers carry it (partitions fence markers per producer id, and one
producer id has one coordinator, so several coordinators never fence each other).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.errors import CoordinatorLoadInProgressError
from broker_core.server.config.broker_config import ZK_ROOT
from broker_core.server.coordination.roles import (
    ClusterStableOffsets,
    CoordinatorParts,
    abort_timed_out_of,
    expire_idle_of,
)
from broker_core.server.coordination.state_migration import migrate_zookeeper_state, raise_to_floor
from broker_core.server.coordination.state_partition import LeaderStatePartition
from broker_core.server.replication.partition import Partition, Role
from broker_core.server.replication.replica_manager import ReplicaManager
from broker_core.txn.coordinator.coordinator import (
    MarkerWriter,
    ProducerIdSource,
    TransactionCoordinator,
)
from broker_core.txn.coordinator.expiry import ExpiryPolicy, ExpiryResult
from broker_core.txn.coordinator.lifecycle import CoordinatorStatus
from broker_core.txn.state_topic.schema import TXN_STATE_TOPIC
from broker_core.txn.state_topic.store import LogTxnStateStore

log = logging.getLogger("idemlog.broker")

LOAD_RETRY_S = 1.0  # after a failed load (e.g. the log unreadable for a moment)


class StatePartitionCoordinator:
    """Runs a :class:`TransactionCoordinator` on broker ``broker_id`` while it leads
    ``__transaction_state-<state_partition>``, at that leadership's epoch, built of
    ``parts``; its acks=all state appends wait up to ``ack_timeout_s``. Before its first
    load the previous format's state of this partition's ids is upgraded from
    ``zookeeper`` (``server.coordination.state_migration``, at most once per partition)."""

    def __init__(
        self,
        broker_id: int,
        state_partition: int,
        parts: CoordinatorParts,
        *,
        ack_timeout_s: float,
        cluster: ClusterMetadata,
        zookeeper: Any,
    ) -> None:
        self._broker_id = broker_id
        self.state_partition = state_partition
        self._cluster = cluster
        self._zookeeper = zookeeper
        self._parts = parts
        self._ack_timeout_s = ack_timeout_s
        self._cond = threading.Condition()
        # The leadership to serve: (replica, its leader epoch), None while not leader.
        self._wanted: tuple[Partition, int] | None = None
        self._coordinator: TransactionCoordinator | None = None
        self._stopped = False
        self._thread = threading.Thread(
            target=self._run, name=f"idemlog-state-coordinator-{state_partition}", daemon=True
        )

    # -- what the handlers see ---------------------------------------------------------
    def current(self) -> TransactionCoordinator | None:
        """The running coordinator, or None while this broker runs none for this
        partition (not the leader, loading, or stood down after a fenced write)."""
        coordinator = self._coordinator
        if coordinator is None or coordinator.status is not CoordinatorStatus.RUNNING:
            return None
        return coordinator

    def loading(self) -> bool:
        """This broker leads the partition and its coordinator has not finished loading
        (COORDINATOR_LOAD_IN_PROGRESS)."""
        with self._cond:
            return self._wanted is not None and self._coordinator is None

    # -- following the leadership --------------------------------------------------------
    def start(self) -> None:
        """Start the partition's loading thread (it waits for a leadership)."""
        self._thread.start()

    def on_role_change(self, partition: Partition, role: Role | None) -> None:
        """On the metadata callback's thread: record the wanted leadership and close a
        coordinator of another epoch at once; never blocks."""
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
        count = len(self._cluster.topic(TXN_STATE_TOPIC).partitions)
        floor = migrate_zookeeper_state(
            self._zookeeper, ZK_ROOT, writer, epoch, (self.state_partition, count)
        )
        if epoch < floor:
            raise_to_floor(self._cluster, self._broker_id, self.state_partition, epoch, floor)
        state = LogTxnStateStore(writer, leader_epoch=epoch)
        # Served once loaded; its leftovers finish on workers of their own, so one
        # partition stuck offline delays only the transactions that touch it.
        return self._parts.start(state, epoch, finish_in_background=True)

    def stop(self) -> None:
        """Stop following the leadership and close the coordinator if one runs."""
        with self._cond:
            self._stopped = True
            coordinator, self._coordinator = self._coordinator, None
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(10.0)
        if coordinator is not None:
            coordinator.close()


class StateLeaderCoordinatorRole:
    """The coordinators of broker ``broker_id``: one :class:`StatePartitionCoordinator`
    per ``__transaction_state`` partition it has led since it started (made on its first
    leadership, so at most the topic's partition count), built of ``pids``, ``markers``
    and ``offsets``; see the module docstring."""

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
        self._lock = threading.Lock()
        self._slots: dict[int, StatePartitionCoordinator] = {}
        self._stopped = False

    # -- what the handlers see ---------------------------------------------------------
    def current(self, state_partition: int) -> TransactionCoordinator | None:
        """The running coordinator of ``state_partition``, None while none runs here."""
        slot = self._slots.get(state_partition)
        return None if slot is None else slot.current()

    def loading(self, state_partition: int) -> bool:
        """This broker leads ``state_partition`` and is loading it."""
        slot = self._slots.get(state_partition)
        return slot is not None and slot.loading()

    def running(self) -> dict[int, TransactionCoordinator]:
        """Every running coordinator of this broker, by state partition."""
        found = {p: slot.current() for p, slot in sorted(self._slots.items())}
        return {p: c for p, c in found.items() if c is not None}

    def loading_partitions(self) -> list[int]:
        """The state partitions this broker leads and is still loading."""
        return [p for p, slot in sorted(self._slots.items()) if slot.loading()]

    # -- following the leadership --------------------------------------------------------
    def start(self, *, synchronous: bool = False) -> None:
        """Follow the state partitions' leadership from now on (loads are always in the
        background; ``synchronous`` is accepted for the embedded role's signature)."""
        self._replicas.on_role_change(self._on_role_change)
        for partition in self._replicas.partitions():  # opened before we listened
            if partition.role is Role.LEADER:
                self._on_role_change(partition, Role.LEADER)

    def _on_role_change(self, partition: Partition, role: Role | None) -> None:
        if partition.topic != TXN_STATE_TOPIC:
            return
        with self._lock:
            if self._stopped:
                return
            slot = self._slots.get(partition.partition)
            if slot is None:
                if role is not Role.LEADER:
                    return  # never led here: nothing to close
                slot = StatePartitionCoordinator(
                    self._broker_id,
                    partition.partition,
                    self._parts,
                    ack_timeout_s=self._ack_timeout_s,
                    cluster=self._cluster,
                    zookeeper=self._zookeeper,
                )
                self._slots[partition.partition] = slot
                slot.start()
        slot.on_role_change(partition, role)

    # -- periodic work -------------------------------------------------------------------
    def abort_timed_out(self) -> list[str]:
        """Abort the running coordinators' transactions open past their timeout."""
        return [t for c in self.running().values() for t in abort_timed_out_of(c)]

    def expire_idle(self) -> ExpiryResult | None:
        """Remove the running coordinators' ids and sink records idle past their expiry."""
        results = [expire_idle_of(c) for c in self.running().values()]
        done = [r for r in results if r is not None]
        if not done:
            return None
        return ExpiryResult(
            [t for r in done for t in r.transactional_ids], [s for r in done for s in r.sinks]
        )

    def stop(self) -> None:
        """Stop following the leadership and close every coordinator that runs."""
        with self._lock:
            self._stopped = True
            slots = list(self._slots.values())
        for slot in slots:
            slot.stop()
        self._offsets.close()
