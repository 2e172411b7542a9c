"""Cluster metadata of a single broker without ZooKeeper (``zookeeper.connect`` unset).

The broker is the whole cluster: once registered it is the only live broker and the
controller, and every partition of every topic is assigned to it (so there is no leader
to elect or move; :meth:`EmbeddedCluster.alter_partition` still rewrites a state).
Topic assignments are kept in one JSON file, replaced atomically on every change::

    {"version": 2, "broker_id": B, "controller_epoch": E,
     "topics": {"<name>": <TopicAssignment.to_doc()>, ...}}

A version 1 file (topics in their version 1 form) is still read, and written back as
version 2 at the next change (every start is one: the controller epoch). A topic stored
without a ``topic_id`` (before ids) gets one when the file is loaded, written back at once.

``controller_epoch`` is incremented (durably) each time the broker registers, i.e. at every
start: the transaction coordinator of each run leads its state partition at that epoch
(``server.coordination.roles``), higher than any run's before, so markers of an earlier
run's coordinator can never pass for this one's. (With ZooKeeper each coordinator's epoch
is its state partition's leader epoch, which grows with every leader change likewise.)

The file names the broker id it was written by: a data directory moved under another
``broker.id`` is refused rather than served with assignments naming a broker that no
longer exists.

Callbacks run on a notifier thread in the order of the changes, as with ZooKeeper; a
change is durable before its callbacks run, and ``close`` returns after they have.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from broker_core.cluster.metadata import (
    CallbackNotifier,
    ClusterMetadata,
    ControllerFence,
    TopicView,
)
from broker_core.cluster.records import (
    METADATA_VERSION,
    READABLE_METADATA_VERSIONS,
    BrokerInfo,
    PartitionState,
    TopicAssignment,
    check_broker_id,
    check_partition_update,
    load_json_object,
)
from broker_core.cluster.topic_creation import (
    assign_partitions,
    replication_factor_of,
    validate_new_topic,
)
from broker_core.errors import (
    CorruptRecordError,
    InvalidConfigError,
    InvalidRequestError,
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from broker_core.fileutil import atomic_write
from broker_core.protocol.replica import NO_BROKER_EPOCH
from broker_core.protocol.topics import new_topic_id, validate_topic_name

CLOSE_TIMEOUT_S = 30.0  # how long close() waits for the callbacks to finish


class EmbeddedCluster(TopicView):
    """One file-backed broker that is always the controller (see the module docstring)."""

    def __init__(self, broker: BrokerInfo, path: Path) -> None:
        self._broker = broker
        self._path = Path(path)
        self._lock = threading.Lock()
        self._registered = False
        self._closed = False
        self._controller_callbacks: list[Callable[[bool], None]] = []
        self._topics_callbacks: list[Callable[[], None]] = []
        self._controller_epoch = 0  # read by _load; 0: never registered
        self._topics = self._load()
        self._notifier = CallbackNotifier("idemlog-cluster-callbacks")

    @property
    def path(self) -> Path:
        return self._path

    # -- brokers and controller ------------------------------------------------------------

    def register(self, broker: BrokerInfo) -> None:
        """Make ``broker`` live (and the controller). It may update the host and port
        given at construction (e.g. once the server has bound port 0), not the id."""
        with self._lock:
            self._check_open()
            if broker.broker_id != self._broker.broker_id:
                raise InvalidConfigError(
                    f"cannot register broker id {broker.broker_id}: this embedded cluster "
                    f"belongs to broker id {self._broker.broker_id} ({self._path})"
                )
            self._broker = broker
            if not self._registered:
                # Durable before anyone hears of the controllership it numbers.
                self._save(self._topics, self._controller_epoch + 1)
                self._controller_epoch += 1
                self._registered = True
                self._notifier.post(list(self._controller_callbacks), True)

    def broker_epoch(self) -> int:
        """NO_BROKER_EPOCH: one broker, its partitions have no other replica to guard."""
        return NO_BROKER_EPOCH

    def unclean_leader_elections(self) -> int:
        return 0  # one broker: no other replica to elect

    def brokers(self) -> list[BrokerInfo]:
        with self._lock:
            return [self._broker] if self._registered and not self._closed else []

    def controller(self) -> BrokerInfo | None:
        with self._lock:
            return self._broker if self._registered and not self._closed else None

    def is_controller(self) -> bool:
        with self._lock:
            return self._registered and not self._closed

    def controller_epoch(self) -> int:
        """This run's epoch once registered; the previous run's before."""
        with self._lock:
            return self._controller_epoch

    def controller_fence(self) -> ControllerFence | None:
        """None: one broker, no other controller to fence (its coordinator's state is in
        its own log)."""
        return None

    def on_controller_change(self, callback: Callable[[bool], None]) -> None:
        """``callback(True)`` on registration, ``callback(False)`` on close. Added while
        already registered, it is called with ``True`` first, so it never misses the gain."""
        with self._lock:
            self._controller_callbacks.append(callback)
            if self._registered and not self._closed:
                self._notifier.post([callback], True)

    # -- topics ----------------------------------------------------------------------------

    def create_topic(
        self, name: str, partitions: int, schema: bytes | None, config: dict[str, str]
    ) -> TopicAssignment:
        name, partitions, schema, overrides = validate_new_topic(name, partitions, schema, config)
        with self._lock:
            self._check_open()
            if name in self._topics:
                raise TopicAlreadyExistsError(f"topic {name!r} already exists")
            states = assign_partitions(
                name,
                partitions,
                [self._broker.broker_id],
                replication_factor_of(name, overrides, 1),
            )
            assignment = TopicAssignment.of(name, states, schema, overrides, new_topic_id())
            topics = {**self._topics, name: assignment}
            self._save(topics, self._controller_epoch)
            self._topics = topics
            self._notifier.post(list(self._topics_callbacks))
        return assignment

    def delete_topic(self, name: str) -> None:
        with self._lock:
            self._check_open()
            if name not in self._topics:
                validate_topic_name(name)
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            topics = {n: t for n, t in self._topics.items() if n != name}
            self._save(topics, self._controller_epoch)
            self._topics = topics
            self._notifier.post(list(self._topics_callbacks))

    def read_topic(self, name: str) -> TopicAssignment:
        """The topic as the file has it: the cache is the file (one writer)."""
        return self.topic(name)

    def alter_partition(
        self,
        topic: str,
        partition: int,
        update: Callable[[PartitionState], PartitionState | None],
        topic_id: str | None = None,
    ) -> PartitionState | None:
        """Read-modify-write of one partition's state, under the lock (no conflicts here).

        ``update(current)`` returns the new state or None (nothing written, None returned).
        The new state must pass :meth:`PartitionState.problem` and keep or raise the leader
        epoch (INVALID_REQUEST otherwise). It is durable in the file, and in
        :meth:`topics`, before the return; the topic-change callbacks fire if it changed.
        Raises UnknownTopicOrPartitionError when the topic or partition does not exist.
        """
        with self._lock:
            self._check_open()
            current = self._topics.get(topic)
            if current is None:
                validate_topic_name(topic)
                raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
            state = current.state(partition)
            if topic_id and current.topic_id and current.topic_id != topic_id:
                return None  # another incarnation of the topic: not the caller's to change
            proposed = update(state)
            if proposed is None:
                return None
            new = check_partition_update(topic, partition, state, proposed)
            if new != state:
                topics = {**self._topics, topic: current.with_states({partition: new})}
                self._save(topics, self._controller_epoch)
                self._topics = topics
                self._notifier.post(list(self._topics_callbacks))
            return new

    def elect_preferred_leaders(
        self, topics: Sequence[str] | None = None
    ) -> dict[str, dict[int, int]]:
        """Nothing to move: the one broker leads every partition. Returns {}."""
        return {}

    def move_leadership_away(self, broker_id: int) -> int:
        """Nowhere to move to: the one broker leads every partition. Returns 0."""
        return 0

    def close(self) -> None:
        """Stop being live and the controller (callbacks get ``False``); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._registered:
                self._notifier.post(list(self._controller_callbacks), False)
        self._notifier.close(CLOSE_TIMEOUT_S)

    # -- the file --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidRequestError(f"the cluster metadata of {self._path} is closed")

    def _load(self) -> dict[str, TopicAssignment]:
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CorruptRecordError(f"{self._path}: unreadable cluster metadata ({exc})") from exc
        where = str(self._path)
        doc = load_json_object(data, where)
        if doc.get("version") not in READABLE_METADATA_VERSIONS:
            raise CorruptRecordError(
                f"{where}: cluster metadata version {doc.get('version')!r}; this broker reads "
                f"versions {', '.join(map(str, sorted(READABLE_METADATA_VERSIONS)))} "
                "(written by a newer idemlog?)"
            )
        try:
            stored_id = check_broker_id(doc.get("broker_id"))
        except InvalidConfigError as exc:
            raise CorruptRecordError(f"{where}: {exc}") from exc
        if stored_id != self._broker.broker_id:
            raise InvalidConfigError(
                f"broker.id={self._broker.broker_id} does not match broker id {stored_id} "
                f"stored in {where}: its topics' partitions are assigned to broker "
                f"{stored_id}; start with broker.id={stored_id} or use another data directory"
            )
        epoch = doc.get("controller_epoch", 0)  # absent in files from before it was kept
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise CorruptRecordError(f"{where}: controller_epoch={epoch!r} is not an integer >= 0")
        self._controller_epoch = epoch
        raw_topics = doc.get("topics")
        if not isinstance(raw_topics, dict):
            raise CorruptRecordError(f"{where}: 'topics' is not a JSON object")
        topics: dict[str, TopicAssignment] = {}
        for name, topic_doc in raw_topics.items():
            try:
                validate_topic_name(name)
            except InvalidTopicError as exc:
                raise CorruptRecordError(f"{where}: {exc}") from exc
            topics[name] = TopicAssignment.from_doc(name, topic_doc, where)
        upgraded = {n: t.with_topic_id(new_topic_id()) for n, t in topics.items() if not t.topic_id}
        if upgraded:
            # Durable before anything serves or stores these ids: a later start must not
            # pick others (a replica's stored id that differs deletes its copy).
            topics = {**topics, **upgraded}
            self._save(topics, epoch)
        return topics

    def _save(self, topics: dict[str, TopicAssignment], controller_epoch: int) -> None:
        doc = {
            "version": METADATA_VERSION,
            "broker_id": self._broker.broker_id,
            "controller_epoch": controller_epoch,
            "topics": {name: topics[name].to_doc() for name in sorted(topics)},
        }
        self._path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self._path, json.dumps(doc, indent=2).encode())


if TYPE_CHECKING:

    def _implements_the_protocol(cluster: EmbeddedCluster) -> ClusterMetadata:
        return cluster  # mypy checks that EmbeddedCluster has every method of ClusterMetadata
