"""The rows of ``__consumer_offsets`` and the partition that holds a group.

A row is ``(kind, key, value)``, the shape of ``__transaction_state``'s rows, compacted on
``kind, key`` (the newest row per key is kept; a null value is a tombstone):

* ``("offset", [group, topic, partition], {offset, leader_epoch, metadata, commit_ms,
  topic_id})``: a committed offset, with the id of the topic it was committed for;
* ``("group", group, {generation, protocol_type, protocol, leader, state_ms, members})``:
  the group as its last generation was persisted (at SyncGroup's assignment and when it
  became empty), so a new coordinator carries on at that generation.

Keys and values are JSON (member metadata and assignments base64): the coordinator's load
is the only reader, and a row is read once per load.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from broker_core.errors import CorruptRecordError, InvalidRequestError

OFFSETS_TOPIC = "__consumer_offsets"
OFFSET_KIND = "offset"
GROUP_KIND = "group"

Row = tuple[str, str, bytes | None]

OFFSETS_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("value", pa.binary(), nullable=True),  # null: a tombstone
    ]
)


def offsets_partition_of(group_id: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition whose leader coordinates ``group_id``: crc32 of
    the id mod ``partitions``, stable across processes and versions (never Python's
    ``hash``). InvalidRequestError for ``partitions`` < 1."""
    if partitions < 1:
        raise InvalidRequestError(f"{OFFSETS_TOPIC} needs at least 1 partition, not {partitions}")
    return zlib.crc32(group_id.encode("utf-8")) % partitions


@dataclass(frozen=True)
class CommittedOffset:
    """One committed offset; ``topic_id`` is the topic's id when it was committed ("" if
    unknown), so a topic recreated under its name does not inherit it."""

    offset: int
    leader_epoch: int
    metadata: str | None
    commit_ms: int
    topic_id: str


@dataclass(frozen=True)
class PersistedMember:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes


@dataclass(frozen=True)
class PersistedGroup:
    generation: int
    protocol_type: str | None
    protocol: str | None
    leader: str | None
    state_ms: int  # wall-clock ms of its last state change (when it became empty)
    members: tuple[PersistedMember, ...]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def offset_key(group_id: str, topic: str, partition: int) -> str:
    return json.dumps([group_id, topic, partition], separators=(",", ":"))


def offset_row(group_id: str, topic: str, partition: int, committed: CommittedOffset) -> Row:
    value = {
        "offset": committed.offset,
        "leader_epoch": committed.leader_epoch,
        "metadata": committed.metadata,
        "commit_ms": committed.commit_ms,
        "topic_id": committed.topic_id,
    }
    return OFFSET_KIND, offset_key(group_id, topic, partition), json.dumps(value).encode()


def offset_tombstone(group_id: str, topic: str, partition: int) -> Row:
    return OFFSET_KIND, offset_key(group_id, topic, partition), None


def group_row(group_id: str, group: PersistedGroup) -> Row:
    value = {
        "generation": group.generation,
        "protocol_type": group.protocol_type,
        "protocol": group.protocol,
        "leader": group.leader,
        "state_ms": group.state_ms,
        "members": [
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "session_timeout_ms": m.session_timeout_ms,
                "rebalance_timeout_ms": m.rebalance_timeout_ms,
                "protocols": [[name, _b64(meta)] for name, meta in m.protocols],
                "assignment": _b64(m.assignment),
            }
            for m in group.members
        ],
    }
    return GROUP_KIND, group_id, json.dumps(value).encode()


def group_tombstone(group_id: str) -> Row:
    return GROUP_KIND, group_id, None


@dataclass
class LoadedState:
    """What a partition's rows say, newest row per key: the groups and their offsets."""

    groups: dict[str, PersistedGroup]
    offsets: dict[str, dict[tuple[str, int], CommittedOffset]]


def load_rows(rows: Iterable[tuple[int, Row]], partition_name: str) -> LoadedState:
    """Fold ``rows`` (offset, row) in offset order; a tombstone removes its key.
    CorruptRecordError names the partition and offset of a row that does not decode."""
    state = LoadedState({}, {})
    for at, (kind, key, value) in rows:
        try:
            if kind == OFFSET_KIND:
                group_id, topic, partition = json.loads(key)
                offsets = state.offsets.setdefault(group_id, {})
                if value is None:
                    offsets.pop((topic, int(partition)), None)
                    continue
                doc = json.loads(value)
                offsets[(topic, int(partition))] = CommittedOffset(
                    int(doc["offset"]),
                    int(doc["leader_epoch"]),
                    doc["metadata"],
                    int(doc["commit_ms"]),
                    str(doc["topic_id"]),
                )
            elif kind == GROUP_KIND:
                if value is None:
                    state.groups.pop(key, None)
                    continue
                state.groups[key] = _group(json.loads(value))
            else:
                raise ValueError(f"unknown kind {kind!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptRecordError(
                f"{partition_name} offset {at}: row ({kind!r}, {key!r}) does not decode: {exc}"
            ) from exc
    for group_id in [g for g, offsets in state.offsets.items() if not offsets]:
        del state.offsets[group_id]
    return state


def _group(doc: dict[str, object]) -> PersistedGroup:
    members = doc["members"]
    assert isinstance(members, list)
    return PersistedGroup(
        int(str(doc["generation"])),
        None if doc["protocol_type"] is None else str(doc["protocol_type"]),
        None if doc["protocol"] is None else str(doc["protocol"]),
        None if doc["leader"] is None else str(doc["leader"]),
        int(str(doc["state_ms"])),
        tuple(
            PersistedMember(
                str(m["member_id"]),
                str(m["client_id"]),
                str(m["client_host"]),
                int(m["session_timeout_ms"]),
                int(m["rebalance_timeout_ms"]),
                tuple((str(name), _unb64(meta)) for name, meta in m["protocols"]),
                _unb64(m["assignment"]),
            )
            for m in members
        ),
    )
