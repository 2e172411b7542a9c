"""The cluster's records and their stored JSON forms.

What a cluster stores, whichever keeps it (ZooKeeper's nodes, the embedded cluster's file):
a broker's registration (:class:`BrokerInfo`), a partition's LeaderAndIsr state
(:class:`PartitionState`) and a topic's assignment of partitions to brokers
(:class:`TopicAssignment`), each with the checks that keep it possible, its JSON document
and the versions of those documents a broker reads (docs/replication.md, Assignment).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from broker_core.errors import (
    CorruptRecordError,
    InvalidConfigError,
    InvalidRequestError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.replica import NO_BROKER_EPOCH
from broker_core.protocol.topics import validate_topic_id

__all__ = [
    "CONTROL_DOC_VERSION",
    "METADATA_VERSION",
    "READABLE_METADATA_VERSIONS",
    "BrokerInfo",
    "PartitionState",
    "TopicAssignment",
    "check_broker_id",
    "check_partition_update",
    "load_json_object",
]

# Topic assignments (and the embedded cluster's file that holds them). Version 2, the one
# written: a topic's partitions map to PartitionState.to_doc(). Version 1: a partition ->
# broker id map, read as that broker the single replica at leader epoch 0.
METADATA_VERSION = 2
READABLE_METADATA_VERSIONS = frozenset({1, METADATA_VERSION})
# The broker registration, controller and controller epoch documents: still version 1 (the
# registration's later directory_id is optional, ignored by older readers), so they stay
# readable by brokers of either topic version.
CONTROL_DOC_VERSION = 1
MAX_BROKER_ID = 2**31 - 1  # Kafka's broker.id is an int32


@dataclass(frozen=True)
class BrokerInfo:
    """A broker's id and the address clients and other brokers reach its Flight server
    at (``listener.advertised.*``, else where it listens).

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
        """The registration znode's content: ``{"version", "host", "port", "directory_id"}``
        (the id is the node name, the epoch its czxid)."""
        doc: dict[str, Any] = {"version": CONTROL_DOC_VERSION, "host": self.host}
        doc["port"] = self.port
        if self.directory_id is not None:
            doc["directory_id"] = self.directory_id  # older readers ignore it
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
            return cls(broker_id, doc["host"], doc["port"], epoch, directory)
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


def check_broker_id(broker_id: object) -> int:
    if isinstance(broker_id, bool) or not isinstance(broker_id, int):
        raise InvalidConfigError(f"broker id {broker_id!r} is not an integer")
    if not 0 <= broker_id <= MAX_BROKER_ID:
        raise InvalidConfigError(f"broker id {broker_id} is not in 0..{MAX_BROKER_ID}")
    return broker_id


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
