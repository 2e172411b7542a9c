"""The log store: named topics of N partitions under one data directory.

    <data dir>/<topic>/topic.json      {"version": 1, "name", "partitions", "schema", "config",
                                        "topic_id"?}
    <data dir>/<topic>/<partition>/    one PartitionLog each

``topic_id`` is the id of the cluster's topic these logs are a copy of (absent: written
before ids, or by the store alone). A topic directory is created and deleted whole, so its
partitions' logs share the id; a broker deletes a copy whose id is not the topic's before
it opens it (``server.replication.local_topics``).

The schema (Arrow IPC, base64) is fixed at creation or by the first append, and every
later batch must match it, so readers can always combine a topic's batches into a table.
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from broker_core.errors import (
    CorruptRecordError,
    InvalidPartitionsError,
    InvalidRequestError,
    SchemaMismatchError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from broker_core.fileutil import atomic_write, fsync_directory
from broker_core.log.compaction import check_key_columns
from broker_core.log.config import LogConfig
from broker_core.log.partition_log import PartitionLog
from broker_core.protocol.topics import MAX_PARTITIONS, validate_topic_id, validate_topic_name

TOPIC_FILE = "topic.json"


def describe_schema_difference(expected: pa.Schema, actual: pa.Schema) -> str:
    exp = {f.name: f for f in expected}
    act = {f.name: f for f in actual}
    parts = []
    missing = [n for n in exp if n not in act]
    extra = [n for n in act if n not in exp]
    if missing:
        parts.append(f"missing field(s) {', '.join(missing)}")
    if extra:
        parts.append(f"unexpected field(s) {', '.join(extra)}")
    for n, f in exp.items():
        g = act.get(n)
        if g is not None and (f.type != g.type or f.nullable != g.nullable):
            parts.append(
                f"field {n!r} is {g.type}{'' if g.nullable else ' not null'}, expected "
                f"{f.type}{'' if f.nullable else ' not null'}"
            )
    if not parts and expected.names != actual.names:
        parts.append(f"fields in order {actual.names}, expected {expected.names}")
    return "; ".join(parts) or "schemas differ"


@dataclass
class Topic:
    name: str
    directory: Path
    partitions: int
    config: LogConfig
    overrides: dict[str, object]
    schema: pa.Schema | None
    logs: dict[int, PartitionLog] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    topic_id: str = ""  # the cluster topic's id ("" unknown: before ids, or store-only)

    def check_schema(self, schema: pa.Schema) -> None:
        if self.schema is not None:
            if not self.schema.equals(schema, check_metadata=False):
                raise SchemaMismatchError(
                    f"topic {self.name!r}: {describe_schema_difference(self.schema, schema)}"
                )
            return
        with self.lock:
            if self.schema is None:
                # Before the schema is fixed: a compacted topic refuses one without its key.
                check_key_columns(self.name, self.config, schema)
                self.schema = schema.remove_metadata()
                self.save()
        self.check_schema(schema)

    def save(self) -> None:
        schema = None
        if self.schema is not None:
            schema = base64.b64encode(self.schema.serialize().to_pybytes()).decode()
        doc = {
            "version": 1,
            "name": self.name,
            "partitions": self.partitions,
            "schema": schema,
            "config": self.overrides,
        }
        if self.topic_id:
            doc["topic_id"] = self.topic_id
        atomic_write(self.directory / TOPIC_FILE, json.dumps(doc, indent=2).encode())

    def adopt_id(self, topic_id: str) -> None:
        """Record ``topic_id`` for a copy stored without one (before ids): it is the
        topic's copy, nothing says otherwise. Durable before the return."""
        validate_topic_id(topic_id, f"topic {self.name!r}")
        with self.lock:
            if self.topic_id and self.topic_id != topic_id:
                raise CorruptRecordError(
                    f"{self.directory / TOPIC_FILE}: holds topic id {self.topic_id}, not {topic_id}"
                )
            self.topic_id = topic_id
            self.save()

    @classmethod
    def load(cls, directory: Path, defaults: LogConfig) -> Topic:
        path = directory / TOPIC_FILE
        try:
            doc = json.loads(path.read_bytes())
            name = doc["name"]
            partitions = int(doc["partitions"])
            overrides = dict(doc.get("config") or {})
            topic_id = doc.get("topic_id") or ""
            if topic_id:
                validate_topic_id(topic_id, "topic_id")
            raw_schema = doc.get("schema")
            schema = (
                pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw_schema)))
                if raw_schema
                else None
            )
        except (
            OSError,
            ValueError,
            KeyError,
            TypeError,
            pa.ArrowInvalid,
            InvalidRequestError,
        ) as exc:
            raise CorruptRecordError(f"{path}: unreadable topic metadata ({exc})") from exc
        if name != directory.name or doc.get("version") != 1:
            raise CorruptRecordError(f"{path}: metadata does not describe topic {directory.name}")
        config = defaults.overlaid(overrides)
        return cls(name, directory, partitions, config, overrides, schema, topic_id=topic_id)


class LogStore:
    """Topics under ``data_dir``; partitions are opened (and recovered) on first use."""

    def __init__(
        self,
        data_dir: str | Path,
        config: LogConfig | Mapping[str, object] | None = None,
        *,
        clock: Callable[[], int] | None = None,
        producer_id_known: Callable[[int], bool] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.defaults = config if isinstance(config, LogConfig) else LogConfig.from_mapping(config)
        self._clock = clock
        self._producer_id_known = producer_id_known
        self._lock = threading.RLock()
        self._topics: dict[str, Topic] = {}
        for path in sorted(self.data_dir.iterdir()):
            if (path / TOPIC_FILE).exists():
                topic = Topic.load(path, self.defaults)
                self._topics[topic.name] = topic

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        *,
        schema: pa.Schema | None = None,
        config: Mapping[str, object] | None = None,
        topic_id: str = "",
    ) -> Topic:
        """A new topic directory; ``topic_id``: the cluster topic it is a copy of."""
        validate_topic_name(name)
        if topic_id:
            validate_topic_id(topic_id, f"topic {name!r}")
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise InvalidPartitionsError(f"partitions={partitions!r} must be an integer")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidPartitionsError(
                f"partitions={partitions} must be between 1 and {MAX_PARTITIONS}"
            )
        overrides = dict(config or {})
        log_config = self.defaults.overlaid(overrides)  # validates the overrides
        if schema is not None:
            check_key_columns(name, log_config, schema)
        with self._lock:
            if name in self._topics:
                raise TopicAlreadyExistsError(f"topic {name!r} already exists")
            directory = self.data_dir / name
            if directory.exists():
                raise TopicAlreadyExistsError(
                    f"topic {name!r}: directory {directory} exists without valid metadata"
                )
            directory.mkdir()
            topic = Topic(
                name,
                directory,
                partitions,
                log_config,
                overrides,
                schema.remove_metadata() if schema is not None else None,
                topic_id=topic_id,
            )
            topic.save()
            fsync_directory(self.data_dir)
            self._topics[name] = topic
            return topic

    def topics(self) -> list[str]:
        with self._lock:
            return sorted(self._topics)

    def topic(self, name: str) -> Topic:
        with self._lock:
            topic = self._topics.get(name)
        if topic is None:
            validate_topic_name(name)
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return topic

    def partition(self, name: str, partition: int) -> PartitionLog:
        topic = self.topic(name)
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise UnknownTopicOrPartitionError(f"partition={partition!r} must be an integer")
        if not 0 <= partition < topic.partitions:
            raise UnknownTopicOrPartitionError(
                f"topic {name!r} has partitions 0..{topic.partitions - 1}, not {partition}"
            )
        with topic.lock:
            log = topic.logs.get(partition)
            if log is None:
                log = PartitionLog(
                    topic.directory / str(partition),
                    topic.config,
                    name=f"{name}-{partition}",
                    schema_check=topic.check_schema,
                    clock=self._clock,
                    producer_id_known=self._producer_id_known,
                )
                topic.logs[partition] = log
            return log

    def delete_topic(self, name: str) -> None:
        with self._lock:
            topic = self.topic(name)
            for log in topic.logs.values():
                log.abandon()
            del self._topics[name]
            shutil.rmtree(topic.directory)
            fsync_directory(self.data_dir)

    def open_logs(self) -> list[PartitionLog]:
        with self._lock:
            return [log for t in self._topics.values() for log in t.logs.values()]

    def enforce_retention(self, now_ms: int | None = None) -> int:
        return sum(log.enforce_retention(now_ms) for log in self.open_logs())

    def clean(self, now_ms: int | None = None) -> int:
        """A compaction pass on every open log that is due one (``PartitionLog.clean``);
        returns how many passes ran. A log failing its pass does not stop the others:
        the first error is raised after all were tried."""
        passes, first_error = 0, None
        for log in self.open_logs():
            try:
                passes += log.clean(now_ms) is not None
            except Exception as exc:  # re-raised below, after the others had their pass
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return passes

    def expire_producers(self, now_ms: int | None = None) -> int:
        return sum(len(log.expire_producers(now_ms)) for log in self.open_logs())

    def close(self) -> None:
        with self._lock:
            for log in self.open_logs():
                log.close()
            for topic in self._topics.values():
                topic.logs.clear()

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
