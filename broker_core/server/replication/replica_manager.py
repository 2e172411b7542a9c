"""The broker's replicas: their roles from the cluster metadata, their fetchers, the ISR.

:class:`ReplicaManager` (Kafka's ReplicaManager) holds a :class:`Partition` for every
partition this broker is a replica of, and follows the cluster metadata
(:meth:`apply`, called by ``LocalTopics.sync`` whenever the topics change):

* leader at a new epoch: the fetcher (if any) is stopped *first*, so nothing appends as a
  follower once it leads; then ``Partition.apply`` makes it leader (the epoch goes into
  the log's epoch cache at the log end);
* follower of a new leader or epoch: the partition stops taking appends (waiters are
  answered NOT_LEADER_OR_FOLLOWER), then a :class:`ReplicaFetcher` for that leader and
  epoch is started; it truncates by epoch before it fetches.

As leader it answers its followers (:meth:`replica_fetch`, :meth:`offsets_for_leader_epoch`,
:meth:`replica_log_start`) and keeps the ISR in ZooKeeper through
``ClusterMetadata.alter_partition``, only while it still leads at the epoch it knows: a
follower that has not caught up within ``replica.lag.time.max.ms`` is dropped (checked
every half of it, at least every second), one that caught up with the high watermark is
added back (at once, on the ISR thread; never on a fetch's thread, which must not wait for
ZooKeeper). A written ISR takes effect when the cluster's topics callback delivers it,
like every other change, so an older view never lands after it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from broker_core.client.connections import FlightConnections
from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.records import BrokerInfo, PartitionState, TopicAssignment
from broker_core.errors import (
    IdemlogError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    StaleBrokerEpochError,
    StorageError,
)
from broker_core.log.partition_log import PartitionLog
from broker_core.log.store import LogStore
from broker_core.protocol.replica import (
    NO_BROKER_EPOCH,
    OffsetsForLeaderEpochRequest,
    OffsetsForLeaderEpochResponse,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    ReplicaLogStartRequest,
    ReplicaLogStartResponse,
)
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.tls import PLAINTEXT_MATERIAL, TlsMaterial
from broker_core.server.config.timeouts import ack_timeout_ms
from broker_core.server.hooks import NO_HOOKS, BrokerHooks
from broker_core.server.replication.partition import Partition, Role
from broker_core.server.replication.replica_fetcher import FetcherConfig, ReplicaFetcher
from broker_core.server.replication.topic_ids import check_topic_id

log = logging.getLogger("idemlog.replica")

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class ReplicationConfig:
    """The broker's ``replica.*`` keys."""

    lag_time_max_ms: int
    fetch: FetcherConfig

    @property
    def ack_timeout_s(self) -> float:
        """How long an acks=all answer waits (``server.config.timeouts.ack_timeout_ms``)."""
        return ack_timeout_ms(self.lag_time_max_ms) / 1000.0


class ReplicaManager:
    """Broker ``broker_id``'s replicas in ``store``, as ``cluster`` assigns them."""

    def __init__(
        self,
        broker_id: int,
        store: LogStore,
        cluster: ClusterMetadata,
        config: ReplicationConfig,
        tls: TlsMaterial = PLAINTEXT_MATERIAL,
        *,
        sasl: SaslCredentials | None = None,
        hooks: BrokerHooks = NO_HOOKS,
    ) -> None:
        self.broker_id = broker_id
        self._hooks = hooks  # test hooks: the product's answers unless started for them
        self._store = store
        self._cluster = cluster
        self.config = config
        self._lock = threading.RLock()  # the maps below; taken by the cluster callback
        self._partitions: dict[TopicPartition, Partition] = {}
        self._fetchers: dict[TopicPartition, ReplicaFetcher] = {}
        # To the leaders: the broker's own TLS and, on a SASL cluster, its own principal.
        self._connections = FlightConnections(tls, sasl=sasl)
        self._expand: set[tuple[str, int, int]] = set()  # (topic, partition, broker) to add
        self._wake = threading.Condition()
        self._closed = False
        self.isr_shrinks = 0
        self.isr_expands = 0
        self._refused_by_stopped = 0  # truncations refused by fetchers since replaced
        # Told of every role change (a new role or epoch) and of a replica forgotten
        # (role None), on the metadata callback's thread with _lock held: listeners
        # only record what changed (the coordinator role follows its state partitions).
        self._role_listeners: list[Callable[[Partition, Role | None], None]] = []
        self._thread = threading.Thread(target=self._isr_loop, name="idemlog-isr", daemon=True)
        self._thread.start()

    def on_role_change(self, listener: Callable[[Partition, Role | None], None]) -> None:
        """Call ``listener(partition, role)`` after each change of a replica's role or
        leader epoch, and with role None when the replica is forgotten; it must not block."""
        with self._lock:
            self._role_listeners.append(listener)

    def _tell(self, partition: Partition, role: Role | None) -> None:
        for listener in self._role_listeners:
            try:
                listener(partition, role)
            except Exception:
                log.exception("%s: a role listener failed", partition.name)

    # -- following the metadata ----------------------------------------------------------
    def apply(self, assignments: Mapping[str, TopicAssignment]) -> None:
        """Take every partition's role from ``assignments`` (the cluster's topics): open
        what this broker replicates, start or stop fetchers, forget deleted topics."""
        with self._lock:
            if self._closed:
                return
            wanted: set[TopicPartition] = set()
            for name, assignment in assignments.items():
                for p, state in assignment.states.items():
                    if self.broker_id not in state.replicas:
                        continue
                    wanted.add((name, p))
                    try:
                        self._apply_one(name, p, state, assignment.topic_id)
                    except IdemlogError as exc:
                        log.error("broker %d cannot follow %s-%d: %s", self.broker_id, name, p, exc)
            for tp in [tp for tp in self._partitions if tp not in wanted]:
                self._forget(tp)

    def _apply_one(self, topic: str, p: int, state: PartitionState, topic_id: str) -> None:
        tp = (topic, p)
        partition = self._partitions.get(tp)
        if partition is not None and topic_id and partition.topic_id != topic_id:
            if partition.topic_id:
                # A copy of the topic's previous incarnation: it never takes a role in
                # this one (LocalTopics.ensure deletes it before this runs).
                self._forget(tp)
                partition = None
            else:
                partition.topic_id = topic_id  # a copy from before ids (LocalTopics.ensure)
        if partition is None:
            stored = self._store.topic(topic)
            if topic_id and stored.topic_id != topic_id:
                raise StorageError(
                    f"broker {self.broker_id}: the local copy of {topic}-{p} is of topic id "
                    f"{stored.topic_id or '(none)'}, not the topic's {topic_id}: not served"
                )
            log_ = self._store.partition(topic, p)
            partition = Partition(
                topic,
                p,
                log_,
                self.broker_id,
                min_insync_replicas=stored.config.min_insync_replicas,
                topic_id=stored.topic_id,
            )
            self._partitions[tp] = partition
        fetcher = self._fetchers.get(tp)
        stale = fetcher is not None and (
            fetcher.leader_id != state.leader or fetcher.leader_epoch != state.leader_epoch
        )
        if fetcher is not None and (stale or state.leader == self.broker_id):
            # Stopped before the role changes: no follower append after it leads.
            fetcher.stop()
            del self._fetchers[tp]
            self._refused_by_stopped += fetcher.truncations_refused
        if state.leader_epoch < partition.leader_epoch:
            return  # a late, older view
        changed = partition.apply(state, self._cluster.broker_epoch())
        if changed is not None:
            self._tell(partition, changed)
        if partition.role is Role.FOLLOWER and tp not in self._fetchers:
            leader = state.leader
            fetcher = ReplicaFetcher(
                partition,
                broker_id=self.broker_id,
                leader_id=leader,
                leader_epoch=state.leader_epoch,
                broker_epoch=self._cluster.broker_epoch,
                address=lambda: self._address(leader),
                connections=self._connections,
                config=self.config.fetch,
            )
            self._fetchers[tp] = fetcher
            fetcher.start()

    def forget_topic(self, topic: str) -> None:
        """Stop every replica of ``topic`` (its fetchers first), before its local copy is
        deleted (a copy of a deleted or replaced topic)."""
        with self._lock:
            for tp in [tp for tp in self._partitions if tp[0] == topic]:
                self._forget(tp)

    def _forget(self, tp: TopicPartition) -> None:
        fetcher = self._fetchers.pop(tp, None)
        if fetcher is not None:
            fetcher.stop()
            self._refused_by_stopped += fetcher.truncations_refused
        partition = self._partitions.pop(tp, None)
        if partition is not None:
            partition.remove()
            self._tell(partition, None)

    def _address(self, broker_id: int) -> str | None:
        info: BrokerInfo | None = next(
            (b for b in self._cluster.brokers() if b.broker_id == broker_id), None
        )
        return None if info is None else info.address

    # -- lookups -------------------------------------------------------------------------
    def partition(self, topic: str, partition: int) -> Partition:
        """This broker's replica of the partition; NotLeaderOrFollowerError if none."""
        with self._lock:
            found = self._partitions.get((topic, partition))
        if found is None:
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} holds no replica of {topic}-{partition} (yet)"
            )
        return found

    def leader_log(self, topic: str, partition: int) -> PartitionLog:
        """The log of a partition this broker leads; NotLeaderOrFollowerError else."""
        return self.partition(topic, partition).check_leader()

    def partitions(self) -> list[Partition]:
        with self._lock:
            return list(self._partitions.values())

    # -- the leader's side of replication ------------------------------------------------
    def _asked(self, topic: str, partition: int, topic_id: str | None) -> Partition:
        """The replica a follower's request names, if the topic id it names is this
        replica's (``server.replication.topic_ids``): a follower holding a copy of a deleted
        topic, or this leader holding one, is never served or copied from across the recreation."""
        found = self.partition(topic, partition)
        check_topic_id(self._cluster, self.broker_id, topic, topic_id, found.topic_id)
        return found

    def replica_fetch(self, request: ReplicaFetchRequest) -> bytes:
        """A follower's fetch, answered (ReplicaFetchResponse.encode())."""
        self._check_broker_epoch(request.replica_id, request.broker_epoch, "replica_fetch")
        partition = self._asked(request.topic, request.partition, request.topic_id)
        partition.check_epoch(request.leader_epoch)
        log_ = partition.log
        if request.fetch_offset > log_.log_end_offset:
            raise OffsetOutOfRangeError(
                f"{partition.name}: fetch offset {request.fetch_offset} of broker "
                f"{request.replica_id} is past the leader's log end {log_.log_end_offset}"
            )
        fetched = partition.follower_fetched(
            request.replica_id, request.fetch_offset, request.broker_epoch
        )
        if fetched:
            self._request_expansion(partition, request.replica_id)
        if request.fetch_offset == log_.log_end_offset:
            partition.wait_for_data(request.fetch_offset, request.max_wait_ms / 1000.0)
            partition.check_epoch(request.leader_epoch)  # an election while it waited
        records = log_.read_raw(request.fetch_offset, request.max_bytes)
        if self._hooks.withhold_replica_fetch():
            records = b""  # test hook: followers fall behind, and its tail diverges
        return ReplicaFetchResponse(
            log_.high_watermark, log_.log_start_offset, log_.log_end_offset, records
        ).encode()

    def replica_log_start(self, request: ReplicaLogStartRequest) -> bytes:
        """Where a follower below this leader's log start starts its log instead, with the
        producer state and leader epoch there (ReplicaLogStartResponse.encode())."""
        self._check_broker_epoch(request.replica_id, request.broker_epoch, "replica_log_start")
        partition = self._asked(request.topic, request.partition, request.topic_id)
        partition.check_epoch(request.leader_epoch)
        start, offset, epoch, snapshot = partition.log.log_start_state()
        log.info(
            "%s: broker %d is below the log start %d: offered the producer state at %d",
            partition.name,
            request.replica_id,
            start,
            offset,
        )
        return ReplicaLogStartResponse(start, offset, epoch, snapshot).encode()

    def offsets_for_leader_epoch(
        self, request: OffsetsForLeaderEpochRequest
    ) -> OffsetsForLeaderEpochResponse:
        """Where ``request.epoch`` ended in this leader's log (KIP-279)."""
        what = "offsets_for_leader_epoch"
        self._check_broker_epoch(request.replica_id, request.broker_epoch, what)
        partition = self._asked(request.topic, request.partition, request.topic_id)
        partition.check_epoch(request.leader_epoch)
        answer = partition.log.end_offset_for(request.epoch)
        return OffsetsForLeaderEpochResponse(answer.epoch, answer.end_offset)

    def _check_broker_epoch(self, broker_id: int, epoch: int, what: str) -> None:
        """Refuse a request from a process of ``broker_id`` older than the one registered
        now as this broker knows it (STALE_BROKER_EPOCH). An epoch newer than the one
        known passes: the registration of a new process reaches this broker's cache a
        moment after the process itself may ask."""
        if epoch == NO_BROKER_EPOCH:
            return  # not sent (a broker before epochs)
        known = next((b.epoch for b in self._cluster.brokers() if b.broker_id == broker_id), None)
        if known is not None and epoch < known:
            raise StaleBrokerEpochError(
                f"{what} from broker {broker_id} at broker epoch {epoch}: its current "
                f"registration has epoch {known}, so this request comes from a process "
                "replaced since"
            )

    def wait_replicated(self, topic: str, partition: int, end_offset: int) -> None:
        """Wait until every in-sync replica has the partition's offsets below
        ``end_offset`` (see ``Partition.wait_replicated`` for what it raises)."""
        found = self.partition(topic, partition)
        found.notify()  # a marker written beside the produce path: wake the followers
        found.wait_replicated(end_offset, self.config.ack_timeout_s)

    # -- the ISR -------------------------------------------------------------------------
    def _request_expansion(self, partition: Partition, broker: int) -> None:
        partition.add_pending_isr(broker)  # counts for the high watermark from now (KIP-497)
        with self._wake:
            self._expand.add((partition.topic, partition.partition, broker))
            self._wake.notify_all()

    def _isr_loop(self) -> None:
        # Lag is checked (and high watermarks checkpointed) at least every second.
        interval_s = min(max(self.config.lag_time_max_ms / 2000.0, 0.05), 1.0)
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._closed or bool(self._expand), interval_s)
                if self._closed:
                    return
                expand, self._expand = self._expand, set()
            for topic, p, broker in sorted(expand):
                self._alter_isr(topic, p, add=broker)
            for partition in self.partitions():
                lagging = partition.lagging_followers(self.config.lag_time_max_ms)
                if lagging:
                    self._alter_isr(partition.topic, partition.partition, remove=lagging)
                try:
                    partition.log.checkpoint_high_watermark()
                except OSError as exc:
                    log.warning(
                        "%s: high watermark checkpoint not written: %s", partition.name, exc
                    )

    def _alter_isr(
        self, topic: str, p: int, *, add: int | None = None, remove: list[int] | None = None
    ) -> None:
        try:
            partition = self.partition(topic, p)
        except NotLeaderOrFollowerError:
            return
        epoch = partition.leader_epoch
        me = self.broker_id
        # The broker epoch of the follower's process that caught up: the ISR admits it.
        admitted = {} if add is None else {add: partition.follower_broker_epoch(add)}
        # ...and its log.dir's directory id, from its registration of that same epoch.
        admitted_dirs = {
            b: next(
                (
                    i.directory_id
                    for i in self._cluster.brokers()
                    if i.broker_id == b and i.epoch == e
                ),
                None,
            )
            for b, e in admitted.items()
        }

        def update(state: PartitionState) -> PartitionState | None:
            if state.leader != me or state.leader_epoch != epoch:
                return None  # no longer ours to change
            isr = list(state.isr)
            if add is not None and add not in isr and add in state.replicas:
                isr.append(add)
            for broker in remove or ():
                if broker in isr and broker != me:
                    isr.remove(broker)
            if tuple(isr) == state.isr:
                return None
            return state.with_isr(tuple(isr), admitted, admitted_dirs)

        try:
            # By name and the id of this replica's topic: a replica of a deleted topic never
            # changes the ISR of one recreated under the name (same leader, same epoch 0).
            written = self._cluster.alter_partition(topic, p, update, partition.topic_id or None)
        except IdemlogError as exc:
            # ZooKeeper away (or the topic gone): the ISR stays as it was, so acks=all
            # answers wait; a pending addition stops counting until it is written.
            log.warning("%s-%d: ISR change not written: %s", topic, p, exc)
            if add is not None:
                partition.drop_pending_isr(add)
            return
        if written is None:
            if add is not None:
                partition.drop_pending_isr(add)
            return
        if add is not None:
            self.isr_expands += 1
        if remove:
            self.isr_shrinks += 1
        # Applied when the cluster's callback delivers it (LocalTopics.sync), in the
        # order of the changes: applying it here could race an older view's delivery.
        log.info(
            "%s-%d: ISR now %s (%s)",
            topic,
            p,
            list(written.isr),
            f"added {add}" if add is not None else f"dropped {remove}, lagging",
        )

    # -- shutdown ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every fetcher and the ISR thread; wake every waiter (they answer
        NOT_LEADER_OR_FOLLOWER). Idempotent."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        with self._lock:
            fetchers, self._fetchers = list(self._fetchers.values()), {}
        for fetcher in fetchers:
            fetcher.stop()
        if self._thread is not threading.current_thread():
            self._thread.join(10.0)
        self._connections.close()

    def _live_fetchers(self) -> list[ReplicaFetcher]:
        with self._lock:
            return list(self._fetchers.values())

    def describe(self) -> dict[str, Any]:
        """Replication metrics: partitions led, under-replicated ones, ISR changes, and
        each follower's lag in offsets (leader's log end minus its fetch offset)."""
        led = [p for p in self.partitions() if p.role is Role.LEADER]
        under = sorted(
            f"{p.name}" for p in led if p.state is not None and len(p.isr) < len(p.state.replicas)
        )
        lag: dict[str, dict[str, int]] = {}
        for p in led:
            end = p.log.log_end_offset
            lag[p.name] = {
                str(b): (end - prog.log_end_offset if prog.log_end_offset >= 0 else end)
                for b, prog in sorted(p.progress().items())
            }
        return {
            "leader_partitions": len(led),
            "follower_partitions": sum(1 for p in self.partitions() if p.role is Role.FOLLOWER),
            "under_replicated_partitions": under,
            "isr_shrinks": self.isr_shrinks,
            "isr_expands": self.isr_expands,
            # A leader at a known epoch ending below this replica's high watermark.
            # Written by this broker as the controller: each one may have lost data.
            "unclean_leader_elections": self._cluster.unclean_leader_elections(),
            "truncations_refused": self._refused_by_stopped
            + sum(f.truncations_refused for f in self._live_fetchers()),
            "follower_lag": lag,
        }
