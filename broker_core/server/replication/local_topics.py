"""A broker's local copies of the partitions it replicates, kept in step with the cluster.

The cluster metadata says which brokers hold each partition and which one leads it; the
broker's own ``LogStore`` holds the data. A topic is created locally the first time this
broker needs one of its partitions (schema and config from the assignment), its
partitions are opened (recovered) at start and whenever the topics change, their roles
(leader or follower) handed to the ``ReplicaManager``, and its files go when the cluster
deletes the topic while this broker watches, or when the topic's id is not the one stored
with the copy (deleted and recreated while this broker did not watch). A topic found on
disk that the cluster does not know is never deleted on a guess: an embedded broker
adopts it into its metadata (a data directory written by the store alone), a ZooKeeper
broker leaves it alone and warns.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

import pyarrow as pa

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.records import TopicAssignment
from broker_core.errors import (
    IdemlogError,
    InvalidTopicError,
    NotLeaderOrFollowerError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from broker_core.log.partition_log import PartitionLog
from broker_core.log.store import LogStore, Topic
from broker_core.protocol.topics import INTERNAL_TOPIC_PREFIX
from broker_core.server.replication.partition import Partition
from broker_core.server.replication.replica_manager import ReplicaManager
from broker_core.server.replication.topic_ids import check_topic_id

log = logging.getLogger("idemlog.broker")
# A sync opening (and so recovering) partitions for longer than this logs its progress
# at most this often, and its end: a long recovery at start is seen, a quick one is not.
RECOVERY_REPORT_S = 5.0


class LocalTopics:
    """The partitions broker ``broker_id`` replicates, in ``store``, as ``cluster`` assigns
    them; ``replicas`` takes their roles.

    ``embedded``: strays on disk are adopted into ``cluster`` (else only reported).
    ``serving()`` says whether new partitions may still be opened (False once the broker
    stops); ``forget_topic(name)`` drops a deleted topic's metrics.
    """

    def __init__(
        self,
        broker_id: int,
        store: LogStore,
        cluster: ClusterMetadata,
        replicas: ReplicaManager,
        *,
        embedded: bool,
        serving: Callable[[], bool],
        forget_topic: Callable[[str], None],
    ) -> None:
        self._id = broker_id
        self._store = store
        self._cluster = cluster
        self._replicas = replicas
        self._embedded = embedded
        self._serving = serving
        self._forget_topic = forget_topic
        # Creating, deleting, opening topics and closing the store; re-entered by cluster
        # callbacks that run inside create_topic (embedded mode).
        self._lock = threading.RLock()
        self._seen: set[str] = set()  # the cluster's topics, as last seen
        self.replaced_copies = 0  # copies of a replaced topic deleted (tests and logs)

    def assignment(self, topic: str) -> TopicAssignment:
        if topic.startswith(INTERNAL_TOPIC_PREFIX):
            raise InvalidTopicError(f"topic {topic!r} is internal to the broker")
        return self._cluster.topic(topic)

    def leader_log(self, topic: str, partition: int, topic_id: str | None = None) -> PartitionLog:
        """The local log of a partition this broker leads, created on first use.

        NotLeaderOrFollowerError (retriable) when another broker leads it, or this one has
        not taken the leadership the metadata gives it yet. ``topic_id``: the id the
        request names the topic by (None: any), checked as ``server.replication.topic_ids`` says:
        UnknownTopicIdError when it is not the topic's.
        """
        if topic_id is not None:
            # First: a topic deleted since the sender learned its id is UNKNOWN_TOPIC_ID
            # ("was deleted"), not the retriable UNKNOWN_TOPIC_OR_PARTITION.
            self.check_topic_id(topic, topic_id)
        found = self._leader_log(topic, partition)
        held = self._replicas.partition(topic, partition).topic_id
        check_topic_id(self._cluster, self._id, topic, topic_id, held)
        return found

    def check_topic_id(self, topic: str, topic_id: str | None) -> None:
        """A request naming ``topic`` by ``topic_id`` without a local replica serving it
        (a transaction's partitions, at the coordinator): the id must be the topic's."""
        if topic_id is not None and topic.startswith(INTERNAL_TOPIC_PREFIX):
            raise InvalidTopicError(f"topic {topic!r} is internal to the broker")
        check_topic_id(self._cluster, self._id, topic, topic_id)

    def _leader_log(self, topic: str, partition: int) -> PartitionLog:
        assignment = self.assignment(topic)
        leader = assignment.leader(partition)
        if leader != self._id:
            raise NotLeaderOrFollowerError(
                f"broker {self._id} does not lead {topic}-{partition}: broker {leader} does"
            )
        try:
            return self._replicas.leader_log(topic, partition)
        except NotLeaderOrFollowerError:
            self.sync()  # a topic created a moment ago: open it now
            return self._replicas.leader_log(topic, partition)

    def partition(self, topic: str, partition: int) -> Partition:
        """This broker's replica of the partition (leader or follower)."""
        return self._replicas.partition(topic, partition)

    def ensure(self, assignment: TopicAssignment) -> Topic:
        """The local topic of ``assignment``, created if this broker has none yet."""
        store = self._store
        with self._lock:
            try:
                topic = store.topic(assignment.name)
                topic = self._check_id(topic, assignment)
            except UnknownTopicOrPartitionError:
                schema = (
                    pa.ipc.read_schema(pa.py_buffer(assignment.schema))
                    if assignment.schema is not None
                    else None
                )
                log.info("broker %d creates its partitions of %s", self._id, assignment.name)
                return store.create_topic(
                    assignment.name,
                    len(assignment.partitions),
                    schema=schema,
                    config=assignment.config,
                    topic_id=assignment.topic_id,
                )
        if topic.partitions != len(assignment.partitions):
            # A topic deleted while this broker was down and created again differently:
            # serving the old files under the new assignment would mix two topics.
            raise StorageError(
                f"broker {self._id}: the local copy of topic {assignment.name!r} in "
                f"{topic.directory} has {topic.partitions} partitions, the cluster's has "
                f"{len(assignment.partitions)}; move the old directory away"
            )
        return topic

    def _check_id(self, topic: Topic, assignment: TopicAssignment) -> Topic:
        """``topic``, the local copy, if it is a copy of ``assignment``'s topic: one from
        before ids adopts the topic's id; one of another id (the topic was deleted and
        recreated while this broker did not see it: paused, cut off, or down) is deleted,
        its replicas stopped first, and UnknownTopicOrPartitionError raised so that the
        caller creates the new copy. Called with the lock held."""
        wanted = assignment.topic_id
        if not wanted or topic.topic_id == wanted:
            return topic
        if not topic.topic_id:
            topic.adopt_id(wanted)
            log.info("broker %d: its copy of topic %s is of id %s", self._id, topic.name, wanted)
            return topic
        log.warning(
            "broker %d deletes its copy of topic %s: it is of topic id %s, but the topic "
            "was deleted and recreated (now id %s)",
            *(self._id, topic.name, topic.topic_id, wanted),
        )
        self._replicas.forget_topic(topic.name)  # nothing serves or copies it from now
        self._store.delete_topic(topic.name)
        self._forget_topic(topic.name)
        self.replaced_copies += 1
        raise UnknownTopicOrPartitionError(f"topic {topic.name!r}: the local copy was replaced")

    def sync(self) -> None:
        """Open the partitions this broker replicates and give them their roles; follow
        deletions; adopt or report strays."""
        store, cluster = self._store, self._cluster
        try:
            assignments = cluster.topics()
        except IdemlogError as exc:
            log.warning("broker %d cannot read the topics: %s", self._id, exc)
            return
        with self._lock:
            if not self._serving():
                return  # the store is closing: open nothing new
            for name in store.topics():
                if name.startswith(INTERNAL_TOPIC_PREFIX) or name in assignments:
                    continue
                if name in self._seen:
                    log.info("broker %d deletes its copy of deleted topic %s", self._id, name)
                    self._replicas.apply(assignments)  # its fetchers stop first
                    store.delete_topic(name)
                    self._forget_topic(name)
                elif self._embedded:
                    assignments[name] = self._adopt(store.topic(name))
                else:
                    log.warning(
                        "broker %d has topic %s on disk but the cluster does not: not served",
                        self._id,
                        name,
                    )
            self._seen = set(assignments)
            total = sum(len(a.replicas_of(self._id)) for a in assignments.values())
            opened, started = 0, time.monotonic()
            next_report = started + RECOVERY_REPORT_S
            for assignment in assignments.values():
                mine = assignment.replicas_of(self._id)
                if not mine:
                    continue
                try:
                    self.ensure(assignment)
                    for partition in mine:
                        store.partition(assignment.name, partition)  # recovers it now
                        opened += 1
                        now = time.monotonic()
                        if now >= next_report:
                            next_report = now + RECOVERY_REPORT_S
                            log.info(
                                "broker %d opening its partitions: %d/%d (%s-%d) after %.1f s",
                                *(self._id, opened, total, assignment.name, partition),
                                now - started,
                            )
                except IdemlogError as exc:
                    log.error("broker %d cannot open %s: %s", self._id, assignment.name, exc)
            took = time.monotonic() - started
            if took >= RECOVERY_REPORT_S:
                log.info("broker %d opened its %d partitions in %.1f s", self._id, total, took)
            self._replicas.apply(assignments)

    def _adopt(self, topic: Topic) -> TopicAssignment:
        log.warning(
            "broker %d adopts topic %s found in %s into its cluster metadata",
            self._id,
            topic.name,
            topic.directory.parent,
        )
        schema = None if topic.schema is None else topic.schema.serialize().to_pybytes()
        config = {k: str(v) for k, v in topic.overrides.items()}
        return self._cluster.create_topic(topic.name, topic.partitions, schema, config)

    def delete(self, name: str) -> None:
        """Delete the local copy of topic ``name`` (if any) and its metrics."""
        with self._lock:
            self._replicas.apply({n: a for n, a in self._cluster.topics().items() if n != name})
            with contextlib.suppress(UnknownTopicOrPartitionError):
                self._store.delete_topic(name)
            self._forget_topic(name)

    def logs(self) -> list[tuple[str, int, PartitionLog]]:
        """(topic, partition, log) of every open local partition, internal topics aside."""
        store = self._store
        result: list[tuple[str, int, PartitionLog]] = []
        for name in store.topics():
            if name.startswith(INTERNAL_TOPIC_PREFIX):
                continue
            try:
                topic = store.topic(name)
            except UnknownTopicOrPartitionError:
                continue  # deleted meanwhile
            result.extend((name, p, log_) for p, log_ in sorted(topic.logs.items()))
        return result

    def close_store(self) -> None:
        """Stop the replicas (fetchers, ISR changes), then close the store (snapshots,
        clean-shutdown markers); nothing opens meanwhile."""
        with self._lock:
            self._replicas.close()
            self._store.close()


class StartedTopics:
    """A broker's ``LocalTopics`` for the request handlers and the Flight server, which
    are built before it: the server's bound port goes into the cluster registration that
    ``LocalTopics`` needs. Each call reaches the current one through ``get``, which raises
    the retriable NotLeaderOrFollowerError before the broker opened it (requests wait at
    the broker's gate anyway)."""

    def __init__(self, get: Callable[[], LocalTopics]) -> None:
        self._get = get

    def assignment(self, topic: str) -> TopicAssignment:
        return self._get().assignment(topic)

    def leader_log(self, topic: str, partition: int, topic_id: str | None = None) -> PartitionLog:
        return self._get().leader_log(topic, partition, topic_id)

    def check_topic_id(self, topic: str, topic_id: str | None) -> None:
        self._get().check_topic_id(topic, topic_id)

    def partition(self, topic: str, partition: int) -> Partition:
        return self._get().partition(topic, partition)

    def ensure(self, assignment: TopicAssignment) -> object:
        return self._get().ensure(assignment)

    def delete(self, name: str) -> None:
        self._get().delete(name)
