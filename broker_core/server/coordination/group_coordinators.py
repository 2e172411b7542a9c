"""The group coordinators of a broker: the leaders of ``__consumer_offsets``' partitions.

The coordinator of a group is the leader of its partition
(``groups.records.offsets_partition_of``: crc32 of the group id mod the partition count),
so groups are spread over the brokers and each coordinator moves with its partition's
leadership, as the transaction coordinators move with ``__transaction_state``'s
(``state_coordinator``):

* leader of partition N at a new epoch (``ReplicaManager.on_role_change``): a
  coordinator of that epoch loads N in the background (N's own thread); requests for N's
  groups get COORDINATOR_LOAD_IN_PROGRESS meanwhile;
* leadership of N lost, or a newer epoch: N's coordinator is closed at once, on the
  callback (NOT_COORDINATOR from then on; its waiting JoinGroups and SyncGroups are
  answered so); an append already past that point is refused by the replica itself, at
  the epoch it checks under its role lock (``offsets_topic.LeaderOffsetsLog``), which also
  closes the coordinator.

The embedded broker has one partition, led by itself at the run's controller epoch,
loaded before it serves. One thread ticks every running coordinator's timers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.records import BrokerInfo
from broker_core.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    IdemlogError,
    NotCoordinatorError,
    UnknownTopicOrPartitionError,
)
from broker_core.groups.coordinator import GroupConfig, GroupCoordinator
from broker_core.groups.records import OFFSETS_TOPIC, offsets_partition_of
from broker_core.log.store import LogStore
from broker_core.server.config.broker_config import BrokerConfig
from broker_core.server.coordination.offsets_topic import (
    LeaderOffsetsLog,
    embedded_offsets_log,
    ensure_offsets_topic,
)
from broker_core.server.replication.partition import Partition, Role
from broker_core.server.replication.replica_manager import ReplicaManager

log = logging.getLogger("idemlog.broker")

TICK_S = 0.1  # how often sessions and rebalance deadlines are checked
LOAD_RETRY_S = 1.0  # after a failed load


class GroupPartitionSlot:
    """Runs the :class:`GroupCoordinator` of ``__consumer_offsets-<index>`` while this
    broker leads it, at that leadership's epoch."""

    def __init__(self, broker_id: int, index: int, config: GroupConfig, ack_timeout_s: float):
        self._broker_id = broker_id
        self.index = index
        self._config = config
        self._ack_timeout_s = ack_timeout_s
        self._cond = threading.Condition()
        self._wanted: tuple[Partition, int] | None = None
        self._coordinator: GroupCoordinator | None = None
        self._stopped = False
        self._thread = threading.Thread(
            target=self._run, name=f"idemlog-group-coordinator-{index}", daemon=True
        )

    def current(self) -> GroupCoordinator | None:
        coordinator = self._coordinator
        return None if coordinator is None or coordinator.closed else coordinator

    def loading(self) -> bool:
        with self._cond:
            return self._wanted is not None and self._coordinator is None

    def start(self) -> None:
        self._thread.start()

    def on_role_change(self, partition: Partition, role: Role | None) -> None:
        """On the metadata callback's thread: never blocks."""
        with self._cond:
            epoch = partition.leader_epoch
            self._wanted = (partition, epoch) if role is Role.LEADER else None
            coordinator = self._coordinator
            if coordinator is not None and (
                self._wanted is None or coordinator.leader_epoch != epoch
            ):
                self._coordinator = None
                coordinator.close()
                log.info(
                    "broker %d: group coordinator of %s (epoch %d) closed at leader epoch %d",
                    self._broker_id,
                    partition.name,
                    coordinator.leader_epoch,
                    epoch,
                )
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: (
                        self._stopped or (self._wanted is not None and self._coordinator is None)
                    )
                )
                if self._stopped:
                    return
                assert self._wanted is not None
                partition, epoch = self._wanted
            try:
                coordinator = GroupCoordinator(
                    LeaderOffsetsLog(partition, self._ack_timeout_s), epoch, self._config
                )
                coordinator.load()
            except Exception:
                log.exception(
                    "broker %d: loading %s at leader epoch %d failed; retrying in %.0fs",
                    self._broker_id,
                    partition.name,
                    epoch,
                    LOAD_RETRY_S,
                )
                self._wait_for_change((partition, epoch))
                continue
            with self._cond:
                if self._stopped or self._wanted != (partition, epoch):
                    coordinator.close()  # deposed while it loaded
                    continue
                self._coordinator = coordinator
            log.info(
                "broker %d runs the group coordinator of %s (epoch %d)",
                self._broker_id,
                partition.name,
                epoch,
            )

    def _wait_for_change(self, wanted: tuple[Partition, int]) -> None:
        """Up to LOAD_RETRY_S, ended early by a stop or another leadership."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopped or self._wanted != wanted, LOAD_RETRY_S)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            coordinator, self._coordinator = self._coordinator, None
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(10.0)
        if coordinator is not None:
            coordinator.close()


class GroupCoordinators:
    """Broker ``broker_id``'s group coordinators, routed by group id; ``cluster`` names
    the partitions' leaders. Built before the cluster is joined; :meth:`start_embedded`
    or :meth:`start_replicated` starts following the partitions."""

    def __init__(
        self,
        broker_id: int,
        config: BrokerConfig,
        cluster: Callable[[], ClusterMetadata],
    ) -> None:
        self._broker_id = broker_id
        self._config = config
        self._cluster = cluster
        self._lock = threading.Lock()
        self._slots: dict[int, GroupPartitionSlot] = {}
        self._embedded: GroupCoordinator | None = None
        self._stopped = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="idemlog-group-ticks", daemon=True)
        self._ack_timeout_s = 0.0

    # -- starting ------------------------------------------------------------------------
    def start_embedded(self, store: LogStore, leader_epoch: int) -> None:
        """Load the local one-partition ``__consumer_offsets`` at ``leader_epoch`` now."""
        log_ = embedded_offsets_log(
            store, self._broker_id, leader_epoch, self._config.offsets.segment_bytes
        )
        coordinator = GroupCoordinator(log_, leader_epoch, self._config.offsets.groups)
        coordinator.load()
        self._embedded = coordinator
        self._ticker.start()

    def start_replicated(self, replicas: ReplicaManager, ack_timeout_s: float) -> None:
        """Follow the leadership of ``__consumer_offsets``' partitions from now on."""
        self._ack_timeout_s = ack_timeout_s
        replicas.on_role_change(self._on_role_change)
        for partition in replicas.partitions():  # opened before we listened
            if partition.role is Role.LEADER:
                self._on_role_change(partition, Role.LEADER)
        self._ticker.start()

    def _on_role_change(self, partition: Partition, role: Role | None) -> None:
        if partition.topic != OFFSETS_TOPIC:
            return
        with self._lock:
            if self._stopped.is_set():
                return
            slot = self._slots.get(partition.partition)
            if slot is None:
                if role is not Role.LEADER:
                    return
                slot = GroupPartitionSlot(
                    self._broker_id,
                    partition.partition,
                    self._config.offsets.groups,
                    self._ack_timeout_s,
                )
                self._slots[partition.partition] = slot
                slot.start()
        slot.on_role_change(partition, role)

    # -- what the handlers see -----------------------------------------------------------
    def find(self, group_id: str) -> BrokerInfo:
        """The broker whose Kafka listener coordinates ``group_id`` (``__consumer_offsets``
        created now if the cluster has none). COORDINATOR_NOT_AVAILABLE (retriable) while
        the partition has no live leader serving a Kafka listener, or the topic cannot be
        created yet."""
        cluster = self._cluster()
        live = {b.broker_id: b for b in cluster.brokers()}
        if self._embedded is not None:
            return live[self._broker_id]
        try:
            assignment = ensure_offsets_topic(cluster, self._config)
        except IdemlogError as exc:
            raise CoordinatorNotAvailableError(
                f"{OFFSETS_TOPIC} is not available: {exc.message}"
            ) from exc
        index = offsets_partition_of(group_id, len(assignment.partitions))
        leader = assignment.states[index].leader if index in assignment.states else -1
        info = live.get(leader)
        if info is None or info.kafka_listener is None:
            raise CoordinatorNotAvailableError(
                f"{OFFSETS_TOPIC}-{index} (group {group_id!r}) has no live leader with a "
                "Kafka listener"
            )
        return info

    def coordinator_for(self, group_id: str) -> GroupCoordinator:
        """The running coordinator of ``group_id``'s partition on this broker. Raises
        NOT_COORDINATOR (another broker, or none yet: the client asks FindCoordinator
        again), COORDINATOR_LOAD_IN_PROGRESS while this broker loads it."""
        if self._embedded is not None:
            if self._embedded.closed:
                raise NotCoordinatorError(f"broker {self._broker_id} is stopping")
            return self._embedded
        try:
            count = len(self._cluster().topic(OFFSETS_TOPIC).partitions)
        except UnknownTopicOrPartitionError as exc:
            raise NotCoordinatorError(f"{OFFSETS_TOPIC} does not exist yet") from exc
        index = offsets_partition_of(group_id, count)
        slot = self._slots.get(index)
        coordinator = None if slot is None else slot.current()
        if coordinator is not None:
            return coordinator
        if slot is not None and slot.loading():
            raise CoordinatorLoadInProgressError(
                f"broker {self._broker_id} is loading {OFFSETS_TOPIC}-{index}"
            )
        raise NotCoordinatorError(
            f"broker {self._broker_id} does not coordinate {OFFSETS_TOPIC}-{index} "
            f"(group {group_id!r})"
        )

    def running(self) -> list[GroupCoordinator]:
        if self._embedded is not None:
            return [] if self._embedded.closed else [self._embedded]
        found = [slot.current() for _, slot in sorted(self._slots.items())]
        return [c for c in found if c is not None]

    # -- timers and the end --------------------------------------------------------------
    def _tick(self) -> None:
        while not self._stopped.wait(TICK_S):
            for coordinator in self.running():
                try:
                    coordinator.tick()
                except IdemlogError as exc:  # a fenced append closed it; others retry
                    log.warning("%s: group timers: %s", coordinator.name, exc)

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            slots = list(self._slots.values())
        for slot in slots:
            slot.stop()
        if self._embedded is not None:
            self._embedded.close()
        if self._ticker.is_alive():
            self._ticker.join(5.0)
