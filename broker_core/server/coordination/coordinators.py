"""Which of a broker's transaction coordinators answers a request (docs/design.md §10).

A request that names a key (a transactional id or a sink id) is served only by the
coordinator of the key's state partition (``protocol.coordinator_keys.state_partition_of``)
and only while this broker runs it: elsewhere it is refused with the retriable error that
says where to go (NOT_COORDINATOR naming the partition's leader,
COORDINATOR_LOAD_IN_PROGRESS while this broker loads it, COORDINATOR_NOT_AVAILABLE while
none is known). It is never served by another partition's coordinator: that one's state
does not hold the key, and its epoch does not fence the key's writes. A key-less request
names one state partition (a client fanning out) or none: then every coordinator running
here answers, and the answer says which partitions it covers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    IdemlogError,
    InvalidRequestError,
    NotCoordinatorError,
)
from broker_core.protocol.metrics import merge_transactions
from broker_core.txn.coordinator.coordinator import TransactionCoordinator
from broker_core.txn.state_topic.schema import TXN_STATE_TOPIC, state_partition_of

EMBEDDED_STATE_PARTITIONS = 1  # server.coordination.roles: one process, nothing to spread


class CoordinatorRoles(Protocol):
    """What a broker's coordinator role says of its coordinators (``roles.CoordinatorRole``
    embedded, ``state_coordinator.StateLeaderCoordinatorRole`` with ZooKeeper)."""

    def current(self, state_partition: int) -> TransactionCoordinator | None: ...

    def loading(self, state_partition: int) -> bool: ...

    def running(self) -> dict[int, TransactionCoordinator]: ...

    def loading_partitions(self) -> list[int]: ...


class Coordinators:
    """The coordinators of broker ``broker_id`` as ``role`` runs them, routed by state
    partition; ``cluster`` names the partitions' leaders (the controller embedded)."""

    def __init__(
        self,
        broker_id: int,
        role: Callable[[], CoordinatorRoles | None],
        cluster: Callable[[], ClusterMetadata],
        *,
        embedded: bool,
    ) -> None:
        self._broker_id = broker_id
        self._role = role
        self._cluster = cluster
        self._embedded = embedded

    def partition_count(self) -> int:
        """``__transaction_state``'s partition count (fixed when the topic was created);
        COORDINATOR_NOT_AVAILABLE (retriable) before the cluster has the topic."""
        if self._embedded:
            return EMBEDDED_STATE_PARTITIONS
        try:
            return len(self._cluster().topic(TXN_STATE_TOPIC).partitions)
        except IdemlogError as exc:
            raise CoordinatorNotAvailableError(
                f"{TXN_STATE_TOPIC} is not known on broker {self._broker_id} yet: {exc.message}"
            ) from exc

    def partition_of(self, key: str) -> int:
        """The state partition that coordinates ``key``."""
        return state_partition_of(key, self.partition_count())

    def for_key(self, key: str) -> TransactionCoordinator:
        """The running coordinator of ``key``'s state partition; the retriable routing
        error of :meth:`for_partition` when this broker does not run it."""
        return self.for_partition(self.partition_of(key))

    def for_keys(self, keys: list[str], what: str) -> TransactionCoordinator:
        """The coordinator of ``keys[0]``, once every key maps to the same state partition
        (a sink's commit names its task ids ``<sink>/<n>``, all with their sink); raises
        InvalidRequestError naming the key that maps elsewhere."""
        partition = self.partition_of(keys[0])
        for key in keys[1:]:
            other = self.partition_of(key)
            if other != partition:
                raise InvalidRequestError(
                    f"{what}: {key!r} is coordinated by {TXN_STATE_TOPIC}-{other}, not by "
                    f"{TXN_STATE_TOPIC}-{partition} of {keys[0]!r}: a sink's transactional "
                    "ids must start with '<sink id>/'"
                )
        return self.for_partition(partition)

    def for_partition(self, state_partition: int) -> TransactionCoordinator:
        """The running coordinator of ``state_partition`` on this broker. Raises
        InvalidRequestError for a partition the topic does not have, else (retriable)
        COORDINATOR_LOAD_IN_PROGRESS while it loads here, NOT_COORDINATOR naming the
        broker that leads it, COORDINATOR_NOT_AVAILABLE while none is known."""
        count = self.partition_count()
        if not 0 <= state_partition < count:
            raise InvalidRequestError(
                f"state partition {state_partition}: {TXN_STATE_TOPIC} has {count} partitions"
            )
        role = self._role()
        coordinator = None if role is None else role.current(state_partition)
        if coordinator is not None:
            return coordinator
        raise self._not_coordinator(role, state_partition)

    def answering(self, state_partition: int | None) -> dict[int, TransactionCoordinator]:
        """The coordinators a key-less request is answered by: the one of
        ``state_partition``, or (None) every one of the partitions this broker leads,
        which must all be loaded (COORDINATOR_LOAD_IN_PROGRESS naming one still loading:
        an answer that left it out would look whole). Raises as :meth:`for_partition`,
        and its error for partition 0 when this broker leads none."""
        if state_partition is not None:
            return {state_partition: self.for_partition(state_partition)}
        role = self._role()
        loading = [] if role is None else role.loading_partitions()
        if loading:
            raise self._not_coordinator(role, loading[0])
        running = {} if role is None else role.running()
        if running:
            return running
        raise self._not_coordinator(role, 0)

    def describe(self) -> dict[str, Any] | None:
        """The running coordinators' state for the metrics (None when none runs here):
        one coordinator's description, or several merged, with ``state_partitions``."""
        role = self._role()
        running = {} if role is None else role.running()
        if not running:
            return None
        return merge_transactions({p: c.describe() for p, c in running.items()})

    def _not_coordinator(self, role: CoordinatorRoles | None, state_partition: int) -> IdemlogError:
        name = f"{TXN_STATE_TOPIC}-{state_partition}"
        if role is not None and role.loading(state_partition):
            return CoordinatorLoadInProgressError(f"broker {self._broker_id} is loading {name}")
        cluster = self._cluster()
        if self._embedded:
            leader_id = None if (c := cluster.controller()) is None else c.broker_id
        else:
            try:
                leader_id = cluster.topic(TXN_STATE_TOPIC).leader(state_partition)
            except IdemlogError:
                leader_id = None
        leader = next((b for b in cluster.brokers() if b.broker_id == leader_id), None)
        if leader is not None and leader.broker_id != self._broker_id:
            return NotCoordinatorError(
                f"broker {self._broker_id} is not the transaction coordinator of {name}: "
                f"broker {leader.broker_id} at {leader.address} is"
            )
        return CoordinatorNotAvailableError(
            f"the transaction coordinator of {name} on broker {self._broker_id} is not running yet"
        )
