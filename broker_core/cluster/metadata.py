"""Cluster metadata: which brokers are alive, which one is the controller, where partitions live.

Two implementations of :class:`ClusterMetadata`:

* :class:`~broker_core.cluster.embedded.EmbeddedCluster` -- one broker, always the
  controller once registered, topic assignments in a local JSON file;
* :class:`~broker_core.cluster.zk.ZkCluster` -- brokers register ephemeral znodes, the
  first to create the ephemeral ``controller`` znode is the controller, topics and their
  partitions' state (:class:`PartitionState`: replicas, leader, leader epoch, ISR) live
  in persistent znodes.

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
  unavailable until one of its in-sync replicas comes back with its data directory.

This module holds what both implementations share: the value types and their stored JSON
forms, the protocol, the validation of a new topic, the round-robin assignment and the
notifier that delivers callbacks.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import queue
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import pyarrow as pa

from broker_core.errors import (
    BrokerNotAvailableError,
    CorruptRecordError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    UnknownTopicOrPartitionError,
)
from broker_core.log.config import LOG_CONFIG
from broker_core.protocol.replica import NO_BROKER_EPOCH
from broker_core.protocol.topics import MAX_PARTITIONS, validate_topic_id, validate_topic_name

__all__ = [
    "CONTROL_DOC_VERSION",
    "METADATA_VERSION",
    "NO_BROKER_EPOCH",
    "READABLE_METADATA_VERSIONS",
    "BrokerInfo",
    "CallbackNotifier",
    "ClusterMetadata",
    "PartitionState",
    "TopicAssignment",
    "assign_partitions",
    "validate_new_topic",
]

log = logging.getLogger("idemlog.cluster")

# Topic assignments (and the embedded cluster's file that holds them). Version 2, the one
# written: a topic's partitions map to PartitionState.to_doc(). Version 1: a partition ->
# broker id map, read as that broker the single replica at leader epoch 0.
METADATA_VERSION = 2
READABLE_METADATA_VERSIONS = frozenset({1, METADATA_VERSION})
# The broker registration, controller and controller epoch documents: unchanged since
# version 1, so they stay readable by brokers of either topic version.
CONTROL_DOC_VERSION = 1
MAX_BROKER_ID = 2**31 - 1  # Kafka's broker.id is an int32


@dataclass(frozen=True)
class ControllerFence:
    """A controllership's fence in ZooKeeper: ``epoch`` and the ``path`` of the node that
    keeps it, at the ``version`` this controllership's bump left it. A write made in one
    multi with a ``check`` of ``path`` at ``version`` fails once a newer controller bumped."""

    epoch: int
    path: str
    version: int


@dataclass(frozen=True)
class BrokerInfo:
    """A broker's id and the address its Flight server listens on.

    ``epoch`` (KIP-380's broker epoch) tells one process of the broker from the next: the
    creation zxid of its registration znode, so every registration of a new process (or
    of a new session) has a larger one. Not part of equality: the same broker, address
    and all, whatever it is."""

    broker_id: int
    host: str
    port: int
    epoch: int = field(default=NO_BROKER_EPOCH, compare=False)
    # Its log.dir's directory.id (log/dir_identity.py): which copy of data it serves.
    directory_id: str | None = field(default=None, compare=False)
    # Its Kafka listener's advertised (host, port) (kafka.listener); None: it serves none.
    kafka_listener: tuple[str, int] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_broker_id(self.broker_id)
        if not isinstance(self.host, str) or not self.host:
            raise InvalidConfigError(f"broker {self.broker_id}: host={self.host!r} is empty")
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise InvalidConfigError(f"broker {self.broker_id}: port={self.port!r} is not an int")
        if not 0 <= self.port <= 65535:
            raise InvalidConfigError(f"broker {self.broker_id}: port={self.port} is not 0..65535")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def to_json(self) -> bytes:
        """The registration znode's content: ``{"host", "port", "directory_id",
        "kafka_listener"}`` (the id is the node name, the epoch its czxid)."""
        doc: dict[str, Any] = {"version": CONTROL_DOC_VERSION, "host": self.host}
        doc["port"] = self.port
        if self.directory_id is not None:
            doc["directory_id"] = self.directory_id  # older readers ignore it
        if self.kafka_listener is not None:
            host, port = self.kafka_listener
            doc["kafka_listener"] = {"host": host, "port": port}  # likewise
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(
        cls, broker_id: int, data: bytes, where: str, epoch: int = NO_BROKER_EPOCH
    ) -> BrokerInfo:
        doc = load_json_object(data, where)
        try:
            directory = doc.get("directory_id")
            if directory is not None and not isinstance(directory, str):
                raise InvalidConfigError(f"directory_id={directory!r} is not a string")
            kafka = doc.get("kafka_listener")
            kafka_listener = None
            if kafka is not None:
                if not isinstance(kafka, dict) or not _is_address(kafka):
                    raise InvalidConfigError(f"kafka_listener={kafka!r} is not a host and port")
                kafka_listener = (kafka["host"], kafka["port"])
            return cls(broker_id, doc["host"], doc["port"], epoch, directory, kafka_listener)
        except (KeyError, InvalidConfigError) as exc:
            raise CorruptRecordError(f"{where}: not a broker registration ({exc})") from exc


@dataclass(frozen=True)
class PartitionState:
    """Where a partition lives: Kafka's LeaderAndIsr state of one partition.

    ``replicas`` are broker ids in order, the first the preferred leader; ``leader`` serves
    it, and ``leader_epoch`` (0 at creation) will grow with every leader change; ``isr``
    are the replicas in sync with the leader. Every leader change bumps the epoch; an ISR
    change alone does not (docs/replication.md). ``isr_epochs`` holds, for the ISR members
    whose broker epoch is known, the one they had when admitted (sorted (broker, epoch)
    pairs): a restarted process of a member is not the member (KIP-380). A state written
    before broker epochs has none: its members' epochs are unknown.
    """

    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    isr: tuple[int, ...] = ()
    isr_epochs: tuple[tuple[int, int], ...] = ()
    # Likewise the directory.id each member's log.dir had (log/dir_identity.py): one that
    # comes back with another lost its data and is never elected from the ISR.
    isr_dirs: tuple[tuple[int, str], ...] = ()

    def __post_init__(self) -> None:
        # Only members' entries, sorted: equal states compare equal however built.
        members = set(self.isr) if isinstance(self.isr, tuple) else set()
        for name in ("isr_epochs", "isr_dirs"):
            entries = getattr(self, name)
            kept = tuple(sorted(e for e in entries if e[0] in members))
            if kept != entries:
                object.__setattr__(self, name, kept)

    def recorded_epoch(self, broker_id: int) -> int | None:
        """The broker epoch ``broker_id`` was admitted to the ISR with; None if unknown."""
        return dict(self.isr_epochs).get(broker_id)

    def recorded_dir(self, broker_id: int) -> str | None:
        """The directory id ``broker_id`` was admitted to the ISR with; None if unknown."""
        return dict(self.isr_dirs).get(broker_id)

    def with_isr(
        self,
        isr: tuple[int, ...],
        epochs: Mapping[int, int] | None = None,
        dirs: Mapping[int, str | None] | None = None,
    ) -> PartitionState:
        """This state with ISR ``isr``: the entries of members kept stay, ``epochs`` and
        ``dirs`` add or replace those of others (a member admitted now; NO_BROKER_EPOCH
        or None: unknown)."""
        recorded = dict(self.isr_epochs)
        for b, e in (epochs or {}).items():
            if e == NO_BROKER_EPOCH:
                recorded.pop(b, None)
            else:
                recorded[b] = e
        directories = dict(self.isr_dirs)
        for b, d in (dirs or {}).items():
            if d is None:
                directories.pop(b, None)
            else:
                directories[b] = d
        return replace(
            self,
            isr=isr,
            isr_epochs=tuple(recorded.items()),
            isr_dirs=tuple(directories.items()),
        )

    @classmethod
    def single(cls, broker_id: int) -> PartitionState:
        """A partition on one broker only: its one replica, leader and in-sync replica."""
        return cls((broker_id,), broker_id, 0, (broker_id,))

    def problem(self) -> str | None:
        """What makes this state impossible, or None."""
        ids = [*self.replicas, self.leader, *self.isr]
        if not all(_is_broker_id(b) for b in ids):
            return f"has a broker id that is not an integer >= 0 in {self}"
        if not self.replicas or len(set(self.replicas)) != len(self.replicas):
            return f"replicas {list(self.replicas)} are empty or repeat a broker"
        if len(set(self.isr)) != len(self.isr) or not set(self.isr) <= set(self.replicas):
            return f"isr {list(self.isr)} is not a set of replicas {list(self.replicas)}"
        if self.leader not in self.isr:
            return f"leader {self.leader} is not in the isr {list(self.isr)}"
        if not _is_broker_id(self.leader_epoch):
            return f"leader_epoch {self.leader_epoch!r} is not an integer >= 0"
        if not all(_is_broker_id(e) for _, e in self.isr_epochs):
            return f"isr_epochs {dict(self.isr_epochs)} has an epoch that is not an integer >= 0"
        return None

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "replicas": list(self.replicas),
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "isr": list(self.isr),
        }
        if self.isr_epochs:  # absent: every member's epoch unknown (older brokers ignore it)
            doc["isr_epochs"] = {str(b): e for b, e in self.isr_epochs}
        if self.isr_dirs:
            doc["isr_dirs"] = {str(b): d for b, d in self.isr_dirs}
        return doc

    @classmethod
    def from_doc(cls, doc: object) -> PartitionState:
        """:meth:`to_doc`'s form; a ``ValueError`` naming what is wrong otherwise."""
        if not isinstance(doc, dict):
            raise ValueError(f"{doc!r} is not a JSON object")
        try:
            replicas, isr = doc["replicas"], doc["isr"]
            raw_epochs = doc.get("isr_epochs", {})
            epochs = tuple((int(b), e) for b, e in raw_epochs.items())
            dirs = tuple((int(b), d) for b, d in doc.get("isr_dirs", {}).items())
            if not all(isinstance(d, str) for _, d in dirs):
                raise ValueError("isr_dirs holds a directory id that is not a string")
            state = cls(
                tuple(replicas), doc["leader"], doc["leader_epoch"], tuple(isr), epochs, dirs
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(
                f"{doc!r} lacks replicas, leader, leader_epoch or isr, or has bad isr_epochs "
                "or isr_dirs"
            ) from exc
        if (problem := state.problem()) is not None:
            raise ValueError(problem)
        return state


@dataclass(frozen=True)
class TopicAssignment:
    """A topic's partitions and the brokers each one lives on (replicas fixed at creation).

    ``partitions`` maps each partition to its leader, as before replicas existed;
    ``states`` holds the whole per-partition state. Built with ``partitions`` only, each
    partition is :meth:`PartitionState.single` on its leader. ``topic_id`` is chosen at
    creation (:func:`~broker_core.protocol.topics.new_topic_id`) and never changes; a
    topic recreated under the same name has another. Empty: a topic stored before ids
    existed, until its store writes one (once, conditionally: ``ZkCluster``,
    ``EmbeddedCluster``).
    """

    name: str
    partitions: dict[int, int]  # partition -> leader broker id
    schema: bytes | None  # Arrow IPC schema, or None until the first append fixes it
    config: dict[str, str]  # topic-level overrides of the log configuration
    states: dict[int, PartitionState] = field(default_factory=dict)
    topic_id: str = ""

    def __post_init__(self) -> None:
        if not self.states:
            object.__setattr__(
                self, "states", {p: PartitionState.single(b) for p, b in self.partitions.items()}
            )
        leaders = {p: s.leader for p, s in self.states.items()}
        if leaders != self.partitions:
            raise InvalidRequestError(
                f"topic {self.name!r}: partition leaders {self.partitions} differ from the "
                f"leaders of the partition states {leaders}"
            )

    @classmethod
    def of(
        cls,
        name: str,
        states: Mapping[int, PartitionState],
        schema: bytes | None,
        config: dict[str, str],
        topic_id: str = "",
    ) -> TopicAssignment:
        """An assignment from whole partition states."""
        states = dict(sorted(states.items()))
        leaders = {p: s.leader for p, s in states.items()}
        return cls(name, leaders, schema, config, states, topic_id)

    def leader(self, partition: int) -> int:
        """The broker id that serves ``partition``."""
        broker = None if isinstance(partition, bool) else self.partitions.get(partition)
        if broker is None:
            raise UnknownTopicOrPartitionError(
                f"topic {self.name!r} has partitions 0..{len(self.partitions) - 1}, "
                f"not {partition!r}"
            )
        return broker

    def state(self, partition: int) -> PartitionState:
        """Replicas, leader, leader epoch and ISR of ``partition``."""
        self.leader(partition)  # an unknown partition, named
        return self.states[partition]

    def with_states(self, changes: Mapping[int, PartitionState]) -> TopicAssignment:
        """This assignment with the states of the partitions in ``changes`` replaced."""
        unknown = sorted(set(changes) - set(self.states))
        if unknown:
            raise UnknownTopicOrPartitionError(
                f"topic {self.name!r} has partitions 0..{len(self.states) - 1}, not {unknown}"
            )
        return TopicAssignment.of(
            self.name, {**self.states, **changes}, self.schema, self.config, self.topic_id
        )

    def with_topic_id(self, topic_id: str) -> TopicAssignment:
        """This assignment with ``topic_id`` (an upgrade of one stored without)."""
        validate_topic_id(topic_id, f"topic {self.name!r}")
        return TopicAssignment.of(self.name, self.states, self.schema, self.config, topic_id)

    def partitions_of(self, broker_id: int) -> list[int]:
        """The partitions ``broker_id`` leads."""
        return sorted(p for p, b in self.partitions.items() if b == broker_id)

    def replicas_of(self, broker_id: int) -> list[int]:
        """The partitions ``broker_id`` holds a replica of (leading or following)."""
        return sorted(p for p, s in self.states.items() if broker_id in s.replicas)

    def to_doc(self) -> dict[str, Any]:
        """The stored JSON form (a znode, or an entry of the embedded cluster's file),
        version :data:`METADATA_VERSION`: ``partitions`` maps each partition to its
        :meth:`PartitionState.to_doc`; ``topic_id`` once it has one."""
        doc: dict[str, Any] = {
            "version": METADATA_VERSION,
            "partitions": {str(p): s.to_doc() for p, s in sorted(self.states.items())},
            "schema": None if self.schema is None else base64.b64encode(self.schema).decode(),
            "config": dict(sorted(self.config.items())),
        }
        if self.topic_id:
            doc["topic_id"] = self.topic_id
        return doc

    @classmethod
    def from_doc(cls, name: str, doc: object, where: str) -> TopicAssignment:
        """Parse :meth:`to_doc`'s form, or version 1's (``partitions``: partition ->
        broker id, read as a single replica at leader epoch 0); anything else, a newer
        version included, is a :class:`CorruptRecordError` naming ``where``."""

        def corrupt(problem: str) -> CorruptRecordError:
            return CorruptRecordError(f"{where}: topic {name!r} metadata {problem}")

        if not isinstance(doc, dict):
            raise corrupt("is not a JSON object")
        version = doc.get("version")
        if version not in READABLE_METADATA_VERSIONS:
            raise corrupt(
                f"has version {version!r}; this broker reads versions "
                f"{', '.join(map(str, sorted(READABLE_METADATA_VERSIONS)))} (written by a "
                "newer idemlog?)"
            )
        raw_partitions = doc.get("partitions")
        if not isinstance(raw_partitions, dict) or not raw_partitions:
            raise corrupt("has no partitions")
        states: dict[int, PartitionState] = {}
        for key, entry in raw_partitions.items():
            if not (isinstance(key, str) and key.isdigit()):
                raise corrupt(f"has a bad partition entry {key!r}: {entry!r}")
            if version == 1:
                if not _is_broker_id(entry):
                    raise corrupt(f"has a bad partition entry {key!r}: {entry!r}")
                states[int(key)] = PartitionState.single(entry)
                continue
            try:
                states[int(key)] = PartitionState.from_doc(entry)
            except ValueError as exc:
                raise corrupt(f"has a bad partition entry {key!r}: {exc}") from exc
        if sorted(states) != list(range(len(states))):
            raise corrupt(f"partitions {sorted(states)} are not 0..{len(states) - 1}")
        raw_schema = doc.get("schema")
        schema: bytes | None = None
        if raw_schema is not None:
            if not isinstance(raw_schema, str):
                raise corrupt("has a schema that is not base64 text")
            try:
                schema = base64.b64decode(raw_schema, validate=True)
            except binascii.Error as exc:
                raise corrupt(f"has a schema that is not base64 ({exc})") from exc
        config = doc.get("config", {})
        if not isinstance(config, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in config.items()
        ):
            raise corrupt("has a config that is not a string -> string object")
        topic_id = doc.get("topic_id", "")
        if topic_id != "":
            try:
                validate_topic_id(topic_id, "topic_id")
            except InvalidRequestError as exc:
                raise corrupt(f"has a bad topic_id ({exc.message})") from exc
        return cls.of(name, states, schema, dict(config), topic_id)


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
        """Grows with every controllership; the coordinator it runs fences older ones."""
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


def check_broker_id(broker_id: object) -> int:
    if isinstance(broker_id, bool) or not isinstance(broker_id, int):
        raise InvalidConfigError(f"broker id {broker_id!r} is not an integer")
    if not 0 <= broker_id <= MAX_BROKER_ID:
        raise InvalidConfigError(f"broker id {broker_id} is not in 0..{MAX_BROKER_ID}")
    return broker_id


def validate_new_topic(
    name: object, partitions: object, schema: object, config: object
) -> tuple[str, int, bytes | None, dict[str, str]]:
    """Check a create-topic request the way ``LogStore.create_topic`` would.

    Returns the values normalised: the config as strings, so it reads back identically
    from ZooKeeper, the embedded file and the broker's ``topic.json``.
    """
    topic = validate_topic_name(name)
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise InvalidPartitionsError(f"partitions={partitions!r} must be an integer")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidPartitionsError(
            f"partitions={partitions} must be between 1 and {MAX_PARTITIONS}"
        )
    if schema is not None:
        if not isinstance(schema, (bytes, bytearray, memoryview)):
            raise InvalidRequestError(
                f"topic {topic!r}: schema must be Arrow IPC bytes, got {type(schema).__name__}"
            )
        schema = bytes(schema)
        try:
            pa.ipc.read_schema(pa.py_buffer(schema))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
            raise InvalidRequestError(
                f"topic {topic!r}: schema is not a serialized Arrow schema ({exc})"
            ) from exc
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise InvalidConfigError(
            f"topic {topic!r}: config must be a mapping, got {type(config).__name__}"
        )
    for key, value in config.items():
        if not isinstance(key, str) or not isinstance(value, (str, int, float)):
            raise InvalidConfigError(f"topic {topic!r}: config entry {key!r}={value!r}")
    parsed = LOG_CONFIG.parse(config)  # unknown keys and bad values, named
    if "replication.factor" in config:
        check_min_insync_replicas(topic, int(parsed["replication.factor"]), config)
    overrides = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in config.items()}
    return topic, partitions, schema, overrides


DEFAULT_REPLICATION_FACTOR = -1  # default.replication.factor: the cluster chooses
MAX_DEFAULT_REPLICAS = 3  # what it chooses with enough brokers (Kafka's usual factor)


def replication_factor_of(
    topic: str,
    config: Mapping[str, object],
    live_brokers: int,
    default: int = DEFAULT_REPLICATION_FACTOR,
) -> int:
    """The factor of a new topic: its validated ``replication.factor`` if it has one, else
    ``default`` (``default.replication.factor``), where -1 means min(3, live brokers).
    ``min.insync.replicas`` above it is an InvalidConfigError."""
    key = LOG_CONFIG.key("replication.factor")
    if key.name in config:
        factor = int(key.parse(config[key.name]))
    elif default == DEFAULT_REPLICATION_FACTOR:
        factor = max(1, min(MAX_DEFAULT_REPLICAS, live_brokers))
    else:
        factor = default
    check_min_insync_replicas(topic, factor, config)
    return factor


def check_min_insync_replicas(topic: str, factor: int, config: Mapping[str, object]) -> None:
    """Refuse ``min.insync.replicas`` above the factor: no acks=all batch could pass."""
    key = LOG_CONFIG.key("min.insync.replicas")
    wanted = int(key.parse(config.get(key.name, key.default)))
    if wanted > factor:
        raise InvalidConfigError(
            f"topic {topic!r}: min.insync.replicas={wanted} is larger than its "
            f"replication.factor={factor}: no batch could be acknowledged with acks=all"
        )


def assign_partitions(
    name: str,
    partitions: int,
    broker_ids: Sequence[int],
    replication_factor: int = 1,
    epochs: Mapping[int, int] | None = None,
    dirs: Mapping[int, str | None] | None = None,
) -> dict[int, PartitionState]:
    """Each partition's replicas over ``broker_ids`` sorted, Kafka-style round-robin.

    Partition ``p``'s replicas are the brokers at indexes ``start + p``, ``start + p + 1``,
    ... (mod the number of brokers), the first its leader, so leaders and replicas spread
    evenly. ``start`` is a stable hash (CRC-32, not Python's salted ``hash``) of the name,
    so the first partitions of many small topics do not all land on the lowest broker id.
    A factor above the number of brokers is refused (INVALID_REPLICATION_FACTOR).
    ``epochs``, ``dirs``: the brokers' epochs and directory ids, recorded for the ISR
    members (all replicas).
    """
    live = sorted(set(broker_ids))
    if not live:
        raise BrokerNotAvailableError(
            f"no live broker to assign the {partitions} partition(s) of topic {name!r} to"
        )
    if isinstance(replication_factor, bool) or not isinstance(replication_factor, int):
        raise InvalidReplicationFactorError(
            f"topic {name!r}: replication.factor={replication_factor!r} is not an integer"
        )
    if replication_factor < 1:
        raise InvalidReplicationFactorError(
            f"topic {name!r}: replication.factor={replication_factor} is below 1"
        )
    if replication_factor > len(live):
        raise InvalidReplicationFactorError(
            f"topic {name!r}: replication.factor={replication_factor} is larger than the "
            f"number of live brokers, {len(live)}"
        )
    start = zlib.crc32(name.encode()) % len(live)
    states = {}
    for p in range(partitions):
        replicas = tuple(live[(start + p + j) % len(live)] for j in range(replication_factor))
        known = epochs or {}
        recorded = tuple((b, known[b]) for b in replicas if known.get(b, NO_BROKER_EPOCH) >= 0)
        found = dirs or {}
        directories = tuple((b, d) for b in replicas if (d := found.get(b)) is not None)
        states[p] = PartitionState(replicas, replicas[0], 0, replicas, recorded, directories)
    return states


def check_partition_update(
    topic: str, partition: int, current: PartitionState, new: object
) -> PartitionState:
    """``new``, the state an ``alter_partition`` update returned for ``current``, if it is a
    possible successor: a valid :class:`PartitionState` whose leader epoch did not go back.
    INVALID_REQUEST naming the partition otherwise."""
    where = f"topic {topic!r} partition {partition}"
    if not isinstance(new, PartitionState):
        raise InvalidRequestError(f"{where}: the update returned {new!r}, not a PartitionState")
    if (problem := new.problem()) is not None:
        raise InvalidRequestError(f"{where}: the new state {problem}")
    if new.leader_epoch < current.leader_epoch:
        raise InvalidRequestError(
            f"{where}: the new leader epoch {new.leader_epoch} is below the current "
            f"{current.leader_epoch}"
        )
    return new


def _is_address(doc: dict[str, Any]) -> bool:
    host, port = doc.get("host"), doc.get("port")
    return (
        isinstance(host, str)
        and bool(host)
        and isinstance(port, int)
        and not isinstance(port, bool)
        and 0 < port <= 65535
    )


def _is_broker_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def load_json_object(data: bytes, where: str) -> dict[str, Any]:
    """``data`` parsed as a JSON object, or a :class:`CorruptRecordError` naming ``where``."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptRecordError(f"{where}: not JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise CorruptRecordError(f"{where}: not a JSON object")
    return doc


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
