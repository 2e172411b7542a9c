"""One local replica of a partition and its role in it: Kafka's ``Partition``.

A broker holds a :class:`Partition` for every partition it is a replica of. The cluster
metadata (``PartitionState``: replicas, leader, leader epoch, ISR) decides its role:

* **LEADER**: it takes appends (only while leader, checked atomically with the append),
  serves reads, answers its followers' fetches and keeps their progress: each follower's
  log end (its fetch offset) and when it was last caught up. From those it advances the
  high watermark to the smallest log end of the in-sync replicas, and wakes the produce
  requests with ``acks=all`` and the marker writes waiting for it;
* **FOLLOWER**: a ``ReplicaFetcher`` copies the leader's log into it; appends and reads
  are refused with ``NOT_LEADER_OR_FOLLOWER`` (retriable: the client refreshes its
  metadata and goes to the leader);
* **NONE**: just opened, not yet told its role; or named leader by a state written for
  a predecessor of this process: the ISR admitted this broker at another broker epoch
  (``PartitionState.isr_epochs``), so this process may lack what it acknowledged (it
  may have started on an empty disk). It stands by, serving nothing, until the
  controller, which sees the new epoch, writes a state for it (KIP-380);
* **REMOVED**: dropped (its topic deleted, or replaced by one recreated under the name):
  refuses everything like a follower, for good.

Transitions (``_TRANSITIONS``) follow the leader epoch: a partition becomes leader or
follower again only for a newer epoch, or a change within one (the ISR). Losing the
leadership wakes every waiter, which answers ``NOT_LEADER_OR_FOLLOWER``: a batch written
here but not yet on the in-sync replicas is not acknowledged, and the new leader's
truncation may remove it, so the producer's retry goes to the new leader (answered as a
duplicate with the original offsets if it got there).

The in-sync set used for the high watermark is the *maximal* one (KIP-497): a follower
being added counts from the moment the expansion is asked (before ZooKeeper has it), and
one being removed counts until ZooKeeper has the smaller set. So the watermark never
passes an offset that some replica the controller could elect lacks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from broker_core.cluster.records import PartitionState
from broker_core.errors import (
    FencedLeaderEpochError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    UnknownLeaderEpochError,
)
from broker_core.log.partition_log import PartitionLog
from broker_core.protocol.replica import NO_BROKER_EPOCH

log = logging.getLogger("idemlog.replica")

T = TypeVar("T")
UNKNOWN_OFFSET = -1  # a follower's log end before its first fetch from this leader


class Role(Enum):
    NONE = "none"
    LEADER = "leader"
    FOLLOWER = "follower"
    REMOVED = "removed"  # the replica was dropped (topic deleted or replaced): for good


_TRANSITIONS: dict[Role, frozenset[Role]] = {
    Role.NONE: frozenset({Role.NONE, Role.LEADER, Role.FOLLOWER, Role.REMOVED}),
    Role.LEADER: frozenset({Role.LEADER, Role.FOLLOWER, Role.NONE, Role.REMOVED}),
    Role.FOLLOWER: frozenset({Role.LEADER, Role.FOLLOWER, Role.NONE, Role.REMOVED}),
    Role.REMOVED: frozenset(),
}


@dataclass
class FollowerProgress:
    """What the leader knows of one follower: its log end at its last fetch and when it
    was last caught up with the leader's log end (Kafka's lastCaughtUpTimeMs)."""

    log_end_offset: int = UNKNOWN_OFFSET
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    leader_end_at_last_fetch: int = UNKNOWN_OFFSET
    broker_epoch: int = NO_BROKER_EPOCH  # of the follower's process at its last fetch


class Partition:
    """Broker ``broker_id``'s replica of ``topic``-``partition``, with its ``log``, a
    copy of the topic whose id is ``topic_id``.

    ``clock()`` is in ms (tests pass their own). Thread-safe: roles change on the cluster
    callback thread, appends on produce threads, fetches on Flight threads.
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        log_: PartitionLog,
        broker_id: int,
        *,
        min_insync_replicas: int = 1,
        clock: Callable[[], int] | None = None,
        topic_id: str = "",
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.log = log_
        # The id of the topic this log is a copy of (stored with it, ``LogStore``): fixed
        # for the life of this object, except that a copy from before ids ("") adopts the
        # topic's once. Requests naming another id are refused (``server.replication.topic_ids``).
        self.topic_id = topic_id
        self.broker_id = broker_id
        self.min_insync_replicas = min_insync_replicas
        self._clock = clock or (lambda: int(time.monotonic() * 1000))
        # Appends and role changes: an append checks the role and writes under it, so
        # nothing is written once this replica has become a follower.
        self._role_lock = threading.RLock()
        # Progress, the ISR, the high watermark: waiters (acks=all, long-polling
        # fetches) wait on it. Order: _role_lock, then _cond, then the log's own lock.
        self._cond = threading.Condition()
        self.role = Role.NONE
        self.state: PartitionState | None = None
        self._followers: dict[int, FollowerProgress] = {}
        self._isr: frozenset[int] = frozenset()
        self._pending_isr: frozenset[int] = frozenset()  # asked to add, not yet in ZooKeeper
        self._changes = 0  # bumped on every role/epoch change: waiters see it
        self._readers = 0  # fetch streams still sending rows that point into the log

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def replicated(self) -> bool:
        """More than one replica: the high watermark is tracked, not the log end."""
        return self.state is not None and len(self.state.replicas) > 1

    @property
    def leader_epoch(self) -> int:
        return -1 if self.state is None else self.state.leader_epoch

    @property
    def isr(self) -> frozenset[int]:
        """The in-sync replicas this leader counts for the high watermark (maximal ISR)."""
        with self._cond:
            return self._isr | self._pending_isr

    # -- roles ---------------------------------------------------------------------------
    def apply(self, state: PartitionState, broker_epoch: int = NO_BROKER_EPOCH) -> Role | None:
        """Take ``state`` from the cluster metadata; returns the new role if it changed
        (or the epoch did), None when only the ISR or nothing changed. ``broker_epoch``:
        this process's (NO_BROKER_EPOCH: none, embedded, or not registered now); named
        leader by a state that admitted this broker at another, it stands by (NONE)."""
        with self._role_lock:
            old = self.state
            role = Role.LEADER if state.leader == self.broker_id else Role.FOLLOWER
            recorded = state.recorded_epoch(self.broker_id)
            if role is Role.LEADER and recorded not in (None, broker_epoch):
                role = Role.NONE
            if old is not None and state.leader_epoch < old.leader_epoch:
                return None  # an older view delivered late: never go back
            changed = old is None or role is not self.role or state.leader_epoch != old.leader_epoch
            if changed and role not in _TRANSITIONS[self.role]:
                raise RuntimeError(f"{self.name}: cannot go {self.role} -> {role}")
            if len(state.replicas) > 1 and self.state is None:
                # A replicated log's high watermark is tracked from here on: after a
                # restart, from its checkpoint (never past the log end), else the start.
                saved = self.log.checkpointed_high_watermark or 0
                start, end = self.log.log_start_offset, self.log.log_end_offset
                self.log.update_high_watermark(min(max(saved, start), end))
            with self._cond:
                self.state = state
                self._isr = frozenset(state.isr)
                self._pending_isr -= self._isr
                if changed:
                    self._changes += 1
                    if role is Role.LEADER:
                        # Epoch first, durably, so every later append carries it.
                        self.log.become_leader(state.leader_epoch)
                        now = self._clock()
                        self._followers = {
                            b: FollowerProgress(last_caught_up_ms=now if b in state.isr else 0)
                            for b in state.replicas
                            if b != self.broker_id
                        }
                        self._pending_isr = frozenset()
                    else:
                        self._followers = {}
                        self._pending_isr = frozenset()
                    self.role = role
                    if role is Role.NONE:
                        log.warning(
                            "%s: named leader at epoch %d by a state that admitted broker "
                            "%d at broker epoch %s, not this process's %s: standing by until "
                            "the controller writes a new state",
                            self.name,
                            state.leader_epoch,
                            self.broker_id,
                            recorded,
                            broker_epoch,
                        )
                if role is Role.LEADER:
                    self._advance_high_watermark_locked()
                self._cond.notify_all()
            if changed:
                log.info(
                    "%s: %s at leader epoch %d (leader %d, isr %s)",
                    self.name,
                    role.value,
                    state.leader_epoch,
                    state.leader,
                    sorted(state.isr),
                )
                return role
            return None

    def remove(self) -> None:
        """The replica is dropped (its topic deleted, or replaced by a recreated one):
        nothing appends to it from now on, and waiting answers are woken (a produce
        stream opened before answers NOT_LEADER_OR_FOLLOWER, and its producer's next
        stream learns what became of the topic)."""
        with self._role_lock, self._cond:
            self.role = Role.REMOVED
            self._changes += 1
            self._followers = {}
            self._cond.notify_all()
        log.info("%s: replica removed", self.name)

    def check_leader(self) -> PartitionLog:
        """The log, if this replica leads; NotLeaderOrFollowerError (retriable) else."""
        if self.role is not Role.LEADER:
            raise self._not_leader()
        return self.log

    def _not_leader(self) -> NotLeaderOrFollowerError:
        if self.role is Role.REMOVED:
            return NotLeaderOrFollowerError(
                f"broker {self.broker_id} no longer holds {self.name}: the topic was deleted "
                "or replaced"
            )
        leader = None if self.state is None else self.state.leader
        return NotLeaderOrFollowerError(
            f"broker {self.broker_id} does not lead {self.name}: broker {leader} does "
            f"(leader epoch {self.leader_epoch})"
        )

    def check_epoch(self, epoch: int) -> None:
        """Fence a follower's request made at leader epoch ``epoch`` (KIP-320)."""
        if self.role is not Role.LEADER:
            raise self._not_leader()
        mine = self.leader_epoch
        if epoch < mine:
            raise FencedLeaderEpochError(
                f"{self.name}: leader epoch {epoch} is older than the current {mine}"
            )
        if epoch > mine:
            raise UnknownLeaderEpochError(
                f"{self.name}: leader epoch {epoch} is newer than broker {self.broker_id}'s "
                f"{mine}: it has not learned of the election yet"
            )

    # -- the leader's write path ---------------------------------------------------------
    def append_as_leader(self, append: Callable[[PartitionLog], T], acks_all: bool) -> T:
        """Run ``append(log)`` while this replica leads (checked atomically with it).

        With ``acks_all`` a replicated partition whose ISR is below
        ``min.insync.replicas`` refuses first (NOT_ENOUGH_REPLICAS, nothing written).
        """
        with self._role_lock:
            log_ = self.check_leader()
            if acks_all and self.replicated:
                isr = self.isr
                if len(isr) < self.min_insync_replicas:
                    raise NotEnoughReplicasError(
                        f"{self.name}: {len(isr)} in-sync replica(s) {sorted(isr)}, "
                        f"min.insync.replicas={self.min_insync_replicas}"
                    )
            result = append(log_)
        with self._cond:
            self._advance_high_watermark_locked()  # alone in the ISR: at once
            self._cond.notify_all()  # long-polling followers and Kafka consumers
        return result

    def wait_replicated(
        self, end_offset: int, timeout_s: float, leader_epoch: int | None = None
    ) -> None:
        """Return once the high watermark reached ``end_offset`` (every in-sync replica
        has everything before it): the acks=all answer. ``leader_epoch``: the epoch the
        offsets were written at (default: the current one).

        Raises NotLeaderOrFollowerError at once when this replica no longer leads at that
        epoch (a pipelined stream's answers may come to a batch only after an election:
        its offsets may hold another leader's batches by then), or when it stops leading
        meanwhile; RequestTimedOutError after ``timeout_s`` (both retriable: a producer
        resends and is answered as a duplicate once the batch is in), and
        NotEnoughReplicasAfterAppendError when the ISR shrank below
        ``min.insync.replicas`` before it was replicated.
        """
        if not self.replicated:
            return
        with self._cond:
            if self.role is not Role.LEADER or leader_epoch not in (None, self.leader_epoch):
                raise self._not_leader()
            changes = self._changes

            def settled() -> bool:
                return self._changes != changes or self.log.high_watermark >= end_offset

            if not self._cond.wait_for(settled, timeout_s):
                raise RequestTimedOutError(
                    f"{self.name}: offsets below {end_offset} not on every in-sync replica "
                    f"{sorted(self._isr | self._pending_isr)} within {timeout_s:g}s "
                    f"(high watermark {self.log.high_watermark})"
                )
            if self._changes != changes or self.role is not Role.LEADER:
                raise self._not_leader()
            isr = self._isr | self._pending_isr
            if len(isr) < self.min_insync_replicas:
                raise NotEnoughReplicasAfterAppendError(
                    f"{self.name}: written up to {end_offset}, but only {sorted(isr)} are in "
                    f"sync, min.insync.replicas={self.min_insync_replicas}"
                )

    # -- followers' fetches (leader side) ------------------------------------------------
    def follower_fetched(
        self, replica_id: int, fetch_offset: int, broker_epoch: int = NO_BROKER_EPOCH
    ) -> bool:
        """Record follower ``replica_id``'s fetch at ``fetch_offset`` (its log end), made
        by its process of ``broker_epoch``, and advance the high watermark; True if it
        should join the ISR now."""
        now = self._clock()
        with self._cond:
            progress = self._followers.get(replica_id)
            if progress is None:
                raise NotLeaderOrFollowerError(
                    f"broker {replica_id} is not a replica of {self.name} "
                    f"(replicas {[] if self.state is None else list(self.state.replicas)})"
                )
            leader_end = self.log.log_end_offset
            if fetch_offset >= leader_end:
                progress.last_caught_up_ms = now
            elif fetch_offset >= progress.leader_end_at_last_fetch >= 0:
                # It has what the leader had at its previous fetch: caught up as of then.
                progress.last_caught_up_ms = max(progress.last_caught_up_ms, progress.last_fetch_ms)
            progress.log_end_offset = fetch_offset
            progress.last_fetch_ms = now
            progress.broker_epoch = broker_epoch
            progress.leader_end_at_last_fetch = leader_end
            self._advance_high_watermark_locked()
            self._cond.notify_all()
            in_sync = replica_id in self._isr or replica_id in self._pending_isr
            if in_sync:
                return False
            # Caught up to the high watermark, and within this leader's epoch (KIP-101:
            # its copy of the current epoch is the leader's).
            epoch_start = self.log.epochs.start_offset_of(self.leader_epoch) or 0
            return fetch_offset >= self.log.high_watermark and fetch_offset >= epoch_start

    def follower_broker_epoch(self, replica_id: int) -> int:
        """The broker epoch ``replica_id``'s last fetch came with (NO_BROKER_EPOCH: none)."""
        with self._cond:
            progress = self._followers.get(replica_id)
            return NO_BROKER_EPOCH if progress is None else progress.broker_epoch

    def add_pending_isr(self, replica_id: int) -> None:
        """Count ``replica_id`` as in sync from now on, before ZooKeeper has it."""
        with self._cond:
            self._pending_isr |= {replica_id}

    def drop_pending_isr(self, replica_id: int) -> None:
        with self._cond:
            self._pending_isr -= {replica_id}

    def wait_for_data(self, offset: int, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the log to grow past ``offset`` (a follower's long
        poll), or for a role change."""
        if timeout_s <= 0:
            return
        with self._cond:
            changes = self._changes
            self._cond.wait_for(
                lambda: self.log.log_end_offset > offset or self._changes != changes, timeout_s
            )

    def wait_for_readable(self, offset: int, committed: bool, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a consumer's read at ``offset`` to find data: the
        last stable offset (``committed``) or the high watermark past it (a Kafka Fetch's
        ``max_wait_ms``), or for a role change. Woken by appends, markers (``notify``) and
        followers' fetches that move the high watermark."""
        if timeout_s <= 0:
            return
        log_ = self.log

        def readable() -> bool:
            end = log_.last_stable_offset if committed else log_.high_watermark
            return end > offset or self._changes != changes

        with self._cond:
            changes = self._changes
            self._cond.wait_for(readable, timeout_s)

    def lagging_followers(self, max_lag_ms: int) -> list[int]:
        """In-sync followers not caught up for ``max_lag_ms``: to drop from the ISR."""
        now = self._clock()
        with self._cond:
            if self.role is not Role.LEADER:
                return []
            return sorted(
                b
                for b, p in self._followers.items()
                if b in self._isr and now - p.last_caught_up_ms > max_lag_ms
            )

    # -- readers and truncation -----------------------------------------------------------
    def reader_started(self) -> None:
        """A fetch stream is about to send rows that point into the log's memory map."""
        with self._cond:
            self._readers += 1

    def reader_done(self) -> None:
        with self._cond:
            self._readers -= 1
            self._cond.notify_all()

    def wait_for_readers(self, timeout_s: float) -> bool:
        """Wait until no fetch stream holds rows of the log (before a truncation below
        the high watermark, which would shrink the file under them); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._readers == 0, timeout_s)

    def progress(self) -> dict[int, FollowerProgress]:
        """A copy of each follower's progress (metrics)."""
        with self._cond:
            return {b: FollowerProgress(**vars(p)) for b, p in self._followers.items()}

    def notify(self) -> None:
        """Wake the waiters (a marker appended, the ISR changed)."""
        with self._cond:
            if self.role is Role.LEADER:
                self._advance_high_watermark_locked()
            self._cond.notify_all()

    def _advance_high_watermark_locked(self) -> None:
        if not self.replicated or self.role is not Role.LEADER:
            return
        ends = [self.log.log_end_offset]
        for broker in self._isr | self._pending_isr:
            if broker == self.broker_id:
                continue
            progress = self._followers.get(broker)
            if progress is None or progress.log_end_offset == UNKNOWN_OFFSET:
                return  # an in-sync follower not heard from since this leader began
            ends.append(progress.log_end_offset)
        hw = min(ends)
        if hw > self.log.high_watermark:
            self.log.update_high_watermark(hw)
