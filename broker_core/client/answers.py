"""The client's typed answers to operators' calls: frozen dataclasses, one per shape.

``BrokerClient.describe_topics`` returns :class:`TopicDescription` (its partitions as
:class:`PartitionInfo`, with :class:`PartitionOffsets` when asked for them),
``list_transactions`` returns :class:`TransactionListing`. Every ``idemlog --json``
output is an answer's ``to_json()``, and every text view renders from the same object,
so the two carry the same fields (docs/broker.md, "JSON answers", lists each shape and a
test checks its keys against these classes). A field a broker from before it does not
send gets the value that broker implied (a leader alone in its replicas and ISR).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

JsonDoc = dict[str, Any]


def schema_fields(schema: pa.Schema | None) -> list[str] | None:
    """A schema in Arrow's text form, one ``"name: type"`` per field (None: no schema)."""
    return None if schema is None else [f"{f.name}: {f.type}" for f in schema]


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """A partition's offsets as its leader reported them (``list_offsets``)."""

    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    last_stable_offset: int

    @classmethod
    def from_doc(cls, doc: dict[str, int]) -> PartitionOffsets:
        return cls(
            int(doc["log_start_offset"]),
            int(doc["log_end_offset"]),
            int(doc["high_watermark"]),
            int(doc["last_stable_offset"]),
        )

    def to_json(self) -> JsonDoc:
        return {
            "log_start_offset": self.log_start_offset,
            "log_end_offset": self.log_end_offset,
            "high_watermark": self.high_watermark,
            "last_stable_offset": self.last_stable_offset,
        }


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition of a topic: its leader, replicas, in-sync replicas and leader epoch;
    ``offsets`` when they were asked for and its leader answered, else ``offline`` says
    why not (None when offsets were not asked for)."""

    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_epoch: int
    offsets: PartitionOffsets | None = None
    offline: str | None = None

    @classmethod
    def from_doc(cls, doc: JsonDoc) -> PartitionInfo:
        leader = int(doc["leader"])
        return cls(
            partition=int(doc["partition"]),
            leader=leader,
            # A broker from before replica metadata sends neither: it serves alone.
            replicas=tuple(int(b) for b in doc.get("replicas", [leader])),
            isr=tuple(int(b) for b in doc.get("isr", [leader])),
            leader_epoch=int(doc.get("leader_epoch", 0)),
        )

    def to_json(self) -> JsonDoc:
        return {
            "partition": self.partition,
            "leader": self.leader,
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "leader_epoch": self.leader_epoch,
            "offsets": None if self.offsets is None else self.offsets.to_json(),
            "offline": self.offline,
        }


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A topic: its name, Arrow schema (None: any), configuration overrides,
    partitions in partition order and id (chosen at creation; "" for a topic stored
    before ids, until its store writes one)."""

    name: str
    schema: pa.Schema | None
    config: dict[str, str]
    partitions: tuple[PartitionInfo, ...]
    topic_id: str = ""

    @classmethod
    def from_doc(cls, doc: JsonDoc) -> TopicDescription:
        schema = None
        if doc.get("schema"):
            raw = base64.b64decode(doc["schema"])
            schema = pa.ipc.read_schema(pa.py_buffer(raw))
        return cls(
            name=str(doc["name"]),
            schema=schema,
            config={str(k): str(v) for k, v in (doc.get("config") or {}).items()},
            partitions=tuple(PartitionInfo.from_doc(p) for p in doc["partitions"]),
            topic_id=str(doc.get("topic_id") or ""),
        )

    def to_json(self) -> JsonDoc:
        return {
            "name": self.name,
            "topic_id": self.topic_id,
            "schema": schema_fields(self.schema),
            "config": dict(self.config),
            "partitions": [p.to_json() for p in self.partitions],
        }


@dataclass(frozen=True, slots=True)
class TransactionListing:
    """One row of ``list_transactions``: an open transaction (``state`` ``"ONGOING"``,
    its age, timeout, partitions and writer), or with ``every_id`` any id the coordinator
    keeps (its state and last update; the open transaction's fields then None)."""

    transactional_id: str
    state: str
    state_partition: int
    producer_id: int
    producer_epoch: int
    idle_ms: int
    last_update_ms: int | None = None
    age_ms: int | None = None
    timeout_ms: int | None = None
    partitions: tuple[tuple[str, int], ...] = ()
    sink_id: str | None = None
    sink_run: str | None = None
    sink_batch: int | None = None
    sink_prepared: bool = False

    @classmethod
    def from_doc(cls, doc: JsonDoc) -> TransactionListing:
        def opt_int(key: str) -> int | None:
            value = doc.get(key)
            return None if value is None else int(value)

        return cls(
            transactional_id=str(doc["transactional_id"]),
            state=str(doc.get("state", "ONGOING")),
            state_partition=int(doc.get("state_partition", 0)),
            producer_id=int(doc["producer_id"]),
            producer_epoch=int(doc["producer_epoch"]),
            idle_ms=int(doc["idle_ms"]),
            last_update_ms=opt_int("last_update_ms"),
            age_ms=opt_int("age_ms"),
            timeout_ms=opt_int("timeout_ms"),
            partitions=tuple((str(t), int(p)) for t, p in doc.get("partitions", [])),
            sink_id=doc.get("sink_id") or None,
            sink_run=doc.get("sink_run") or None,
            sink_batch=opt_int("sink_batch"),
            sink_prepared=bool(doc.get("sink_prepared", False)),
        )

    def to_json(self) -> JsonDoc:
        return {
            "transactional_id": self.transactional_id,
            "state": self.state,
            "state_partition": self.state_partition,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "idle_ms": self.idle_ms,
            "last_update_ms": self.last_update_ms,
            "age_ms": self.age_ms,
            "timeout_ms": self.timeout_ms,
            "partitions": [[t, p] for t, p in self.partitions],
            "sink_id": self.sink_id,
            "sink_run": self.sink_run,
            "sink_batch": self.sink_batch,
            "sink_prepared": self.sink_prepared,
        }


@dataclass(frozen=True, slots=True)
class HangingTransaction:
    """A transaction open on a partition that no coordinator knows, idle at least the
    asked time (``find_hanging_transactions``): its producer as the partition's leader
    keeps it, and the partition's offsets, which it holds back at ``txn_start_offset``."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    txn_start_offset: int
    idle_ms: int
    last_stable_offset: int
    log_end_offset: int

    def to_json(self) -> JsonDoc:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "coordinator_epoch": self.coordinator_epoch,
            "txn_start_offset": self.txn_start_offset,
            "idle_ms": self.idle_ms,
            "last_stable_offset": self.last_stable_offset,
            "log_end_offset": self.log_end_offset,
        }
