"""The cluster metadata: what a broker needs to know about the cluster, and asks of it.

:class:`ClusterMetadata` is the protocol: which brokers are alive, which one is the
controller, which topics exist and where their partitions live (the records of
:mod:`broker_core.cluster.records`), and the changes a broker makes to them. Two
implementations:

* :class:`~broker_core.cluster.embedded.EmbeddedCluster` -- one broker, always the
  controller once registered, topic assignments in a local JSON file;
* :class:`~broker_core.cluster.zk.ZkCluster` -- brokers register ephemeral znodes, the
  first to create the ephemeral ``controller`` znode is the controller, topics and their
  partitions' state (:class:`~broker_core.cluster.records.PartitionState`: replicas,
  leader, leader epoch, ISR) live in persistent znodes.

A partition's replicas are fixed when its topic is created; its leader, leader epoch and
ISR change (docs/replication.md): through :meth:`ClusterMetadata.alter_partition` (a
leader shrinking or expanding its ISR), the ZooKeeper controller's elections when brokers
come and go (:mod:`broker_core.cluster.zk_leaders`, decisions in
:mod:`broker_core.cluster.election`), a preferred-leader rebalance and a clean shutdown's
:meth:`ClusterMetadata.move_leadership_away`. What survives what:

* a broker's registration (``brokers/ids/<id>``) and its controllership live exactly as
  long as its ZooKeeper session: a crash, or a session expiry, removes them; a dropped
  connection that reconnects within the session timeout does not;
* topic assignments (``topics/<name>``) are persistent: they survive every broker and
  every session. A dead broker's partitions move to another in-sync replica if one is
  live; a partition with no other replica (replication factor 1), or none in sync, stays
  unavailable until one of its in-sync replicas comes back with its data directory, or,
  with the topic's ``unclean.leader.election.enable``, a live out-of-sync replica leads.

Both implementations answer the same way through what this module also holds: the
:class:`TopicView` of the topics they cache and the :class:`CallbackNotifier` that
delivers their change callbacks.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from broker_core.cluster.records import BrokerInfo, PartitionState, TopicAssignment
from broker_core.errors import UnknownTopicOrPartitionError
from broker_core.protocol.topics import validate_topic_name

__all__ = ["CallbackNotifier", "ClusterMetadata", "ControllerFence", "TopicView"]

log = logging.getLogger("idemlog.cluster")


@dataclass(frozen=True)
class ControllerFence:
    """A controllership's fence in ZooKeeper: ``epoch`` and the ``path`` of the node that
    keeps it, at the ``version`` this controllership's bump left it. A write made in one
    multi with a ``check`` of ``path`` at ``version`` fails once a newer controller bumped."""

    epoch: int
    path: str
    version: int


class ClusterMetadata(Protocol):
    """What a broker needs to know about the cluster (docs/architecture.md)."""

    def register(self, broker: BrokerInfo) -> None: ...
    def broker_epoch(self) -> int:
        """This broker's epoch (its current registration's), NO_BROKER_EPOCH while not
        registered or where there is none (embedded: one process, no ISR to guard)."""
        ...

    def brokers(self) -> list[BrokerInfo]: ...
    def unclean_leader_elections(self) -> int:
        """Unclean leader elections this broker wrote as the controller (metrics)."""
        ...

    def controller(self) -> BrokerInfo | None: ...
    def is_controller(self) -> bool: ...
    def controller_epoch(self) -> int:
        """Grows with every controllership. The embedded broker's transaction coordinator
        leads its state partition at it; a ZooKeeper cluster's coordinators follow their
        state partitions' leader epochs instead (``server.coordination``)."""
        ...

    def controller_fence(self) -> ControllerFence | None:
        """While this broker is the controller of a ZooKeeper cluster, its fence; else None."""
        ...

    def on_controller_change(self, callback: Callable[[bool], None]) -> None: ...
    def create_topic(
        self, name: str, partitions: int, schema: bytes | None, config: dict[str, str]
    ) -> TopicAssignment: ...
    def delete_topic(self, name: str) -> None: ...
    def topics(self) -> dict[str, TopicAssignment]: ...
    def topic(self, name: str) -> TopicAssignment: ...
    def read_topic(self, name: str) -> TopicAssignment:
        """The topic as the store has it now, not as the cache last saw it (a request
        naming a topic id the cache does not know is checked against it before it is
        refused). UnknownTopicOrPartitionError when gone; RequestTimedOutError when the
        store is unavailable."""
        ...

    def on_topics_change(self, callback: Callable[[], None]) -> None: ...
    def alter_partition(
        self,
        topic: str,
        partition: int,
        update: Callable[[PartitionState], PartitionState | None],
        topic_id: str | None = None,
    ) -> PartitionState | None:
        """Read-modify-write of one partition's state: ``update(current)`` returns the new
        state, or None to write nothing (None is then returned). Conditional on the stored
        version and retried on a conflicting write, so ``update`` may run more than once and
        must depend only on the state it is given. ``topic_id``: the id of the topic the
        caller means; a topic of another id under the name (recreated) is not changed
        (None returned), checked on the state read for the conditional write. The new
        state is validated (INVALID_REQUEST if impossible, or if its leader epoch goes
        back). Returns the state now stored, already in :meth:`topics`; topic-change
        callbacks fire. Raises RequestTimedOutError (retriable) when the store is
        unavailable, UnknownTopicOrPartitionError when the topic or partition does not
        exist."""
        ...

    def elect_preferred_leaders(
        self, topics: Sequence[str] | None = None
    ) -> dict[str, dict[int, int]]:
        """On the controller: each partition (of ``topics``, default all) whose preferred
        replica is live, in sync and not leading is led by it, epoch + 1. Returns
        {topic: {partition: new leader}} of those moved. INVALID_REQUEST off the controller."""
        ...

    def move_leadership_away(self, broker_id: int) -> int:
        """A clean shutdown's first step: every partition ``broker_id`` leads whose ISR has
        another live member is led by that member, ISR without ``broker_id``, epoch + 1.
        Returns how many moved."""
        ...

    def close(self) -> None: ...


class CallbackNotifier:
    """Runs subscriber callbacks one at a time on its own thread, in the order of the changes.

    Both implementations deliver through one, so a callback never runs under a lock or on
    a kazoo thread, may block (stopping a coordinator takes time) and may call back in.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.Queue[tuple[list[Callable[..., None]], tuple[bool, ...]] | None]
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def post(self, callbacks: list[Callable[..., None]], *args: bool) -> None:
        if callbacks:
            self._queue.put((callbacks, args))

    def close(self, timeout: float) -> None:
        """Deliver what is queued, then stop; waits unless called from a callback."""
        self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            callbacks, args = item
            for callback in callbacks:
                try:
                    callback(*args)
                except Exception:
                    # One subscriber's failure must not keep the others from the news.
                    log.exception("cluster metadata callback %r failed", callback)


class TopicView:
    """The read side both cluster implementations share: a locked dict of assignments
    and the callbacks that fire when it changes."""

    _lock: threading.Lock
    _topics: dict[str, TopicAssignment]
    _topics_callbacks: list[Callable[[], None]]

    def topics(self) -> dict[str, TopicAssignment]:
        with self._lock:
            return dict(self._topics)

    def topic(self, name: str) -> TopicAssignment:
        with self._lock:
            assignment = self._topics.get(name)
        if assignment is None:
            validate_topic_name(name)
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return assignment

    def on_topics_change(self, callback: Callable[[], None]) -> None:
        """``callback()`` on the notifier thread whenever :meth:`topics` changes."""
        with self._lock:
            self._topics_callbacks.append(callback)
