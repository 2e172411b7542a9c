"""The internal topic ``__transaction_state``: its schema versions and the upgrade between them.

Version 1 (before transactional ids expired) held rows ``(kind, key, value not null)``.
Version 2 lets ``value`` be null: such a row is a **tombstone**, the key was removed
(docs/storage.md, "The transaction state topic"). Its key columns are ``kind, key``, the
contract of a compacted topic (a row whose other columns are all null is a tombstone).

:func:`migrate_state_topic` upgrades a version-1 topic on open, so that a crash at any
step leaves exactly one readable state:

1. copy the newest row per key into ``__transaction_state.migrating`` (new schema), then
   append a completion row and fsync: from then on that topic is the truth;
2. delete ``__transaction_state``;
3. create it with the new schema and copy the rows back (fsync);
4. delete ``__transaction_state.migrating``.

On open, a complete ``.migrating`` topic resumes at step 2 (whatever step 3 had written is
deleted and written again); an incomplete one is deleted and the upgrade starts over from
the untouched version-1 topic. Nothing else reads ``.migrating``.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import pyarrow as pa

from broker_core.errors import (
    CorruptRecordError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from broker_core.fileutil import fsync_directory
from broker_core.log.partition_log import IsolationLevel, PartitionLog
from broker_core.log.store import LogStore
from broker_core.protocol.coordinator_keys import TXN_STATE_TOPIC as TXN_STATE_TOPIC
from broker_core.protocol.coordinator_keys import state_partition_of as state_partition_of

log = logging.getLogger("idemlog.txn")

MIGRATION_TOPIC = TXN_STATE_TOPIC + ".migrating"
TXN_STATE_SCHEMA_V1 = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("value", pa.binary(), nullable=False),
    ]
)
# Version 2: a null value is a tombstone (the key was removed).
TXN_STATE_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("value", pa.binary(), nullable=True),
    ]
)
# Retention never deletes coordinator state; compaction bounds it instead: the newest row
# per (kind, key) is kept, a tombstone (an expired id or sink) removes its key after
# delete.retention.ms (docs/storage.md, "Compaction"). Segments of Kafka's
# transaction.state.log.segment.bytes (100 MiB), so that closed segments get cleaned.
TOPIC_CONFIG: dict[str, object] = {
    "retention.ms": -1,
    "retention.bytes": -1,
    "cleanup.policy": "compact",
    "compaction.key.columns": "kind,key",
    "segment.bytes": 100 * 1024 * 1024,
}


def state_topic_config(
    segment_bytes: int | None = None, delete_retention_ms: int | None = None
) -> dict[str, object]:
    """:data:`TOPIC_CONFIG` with the broker's transaction.state.log.segment.bytes and
    transaction.state.log.delete.retention.ms, for a topic created now."""
    config = dict(TOPIC_CONFIG)
    if segment_bytes is not None:
        config["segment.bytes"] = segment_bytes
        # A record must fit in one segment; state records are a few KB.
        config["max.message.bytes"] = min(segment_bytes, 64 * 1024**2)
    if delete_retention_ms is not None:
        config["delete.retention.ms"] = delete_retention_ms
    return config


# The last row of a complete .migrating topic; never a kind of the state itself.
_DONE_KIND = "migration"
_DONE_KEY = "complete"
_READ_BYTES = 4 * 1024 * 1024

Row = tuple[str, str, bytes | None]


def read_rows(partition: PartitionLog) -> Iterator[tuple[int, Row]]:
    """Every row of ``partition`` with its offset, in offset order, read a chunk at a time."""
    offset = partition.log_start_offset
    while True:
        # To the high watermark: a leader's load first waits until every in-sync replica
        # has its log end (server.coordination.state_partition), so that is the whole state.
        result = partition.read(
            offset,
            isolation=IsolationLevel.READ_UNCOMMITTED,
            max_bytes=_READ_BYTES,
        )
        for batch in result.batches:
            columns = [batch.records.column(n).to_pylist() for n in ("kind", "key", "value")]
            for i, row in enumerate(zip(*columns, strict=True)):
                yield batch.base_offset + i, row
        if result.next_offset == offset:
            return
        offset = result.next_offset


def append_rows(partition: PartitionLog, rows: Sequence[Row], schema: pa.Schema) -> None:
    """Append ``rows`` as one batch (nothing if empty) and fsync the partition."""
    if rows:
        kinds, keys, values = zip(*rows, strict=True)
        partition.append(
            pa.record_batch(
                [pa.array(kinds), pa.array(keys), pa.array(values, pa.binary())], schema=schema
            )
        )
    partition.flush()


def _newest_per_key(rows: Iterable[tuple[int, Row]]) -> list[Row]:
    newest: dict[tuple[str, str], Row] = {}
    for _, row in rows:
        newest.pop((row[0], row[1]), None)  # re-inserted: the order is the newest rows'
        newest[(row[0], row[1])] = row
    return [row for row in newest.values() if row[2] is not None]


def _drop(store: LogStore, name: str) -> None:
    """Delete topic ``name`` and whatever a crash left of its directory."""
    with contextlib.suppress(UnknownTopicOrPartitionError):
        store.delete_topic(name)
    directory = store.data_dir / name
    if directory.exists():  # a crash inside an earlier delete or create
        shutil.rmtree(directory)
        fsync_directory(store.data_dir)


def _schema(store: LogStore, name: str) -> pa.Schema | None:
    return store.topic(name).schema if name in store.topics() else None


def migrate_state_topic(store: LogStore, config: dict[str, object] | None = None) -> bool:
    """Upgrade (or finish upgrading) a version-1 ``__transaction_state``; True if it did.
    The upgraded topic is created with ``config`` (default :data:`TOPIC_CONFIG`).

    Raises CorruptRecordError for a topic of neither version, and the store's errors (the
    upgrade then resumes on the next open)."""
    migrating = _complete_migration_rows(store)
    if migrating is None:
        schema = _schema(store, TXN_STATE_TOPIC)
        if schema is None or schema.equals(TXN_STATE_SCHEMA):
            return False
        if not schema.equals(TXN_STATE_SCHEMA_V1):
            raise CorruptRecordError(
                f"internal topic {TXN_STATE_TOPIC!r} has schema {schema}, which is neither "
                f"version 1 ({TXN_STATE_SCHEMA_V1}) nor version 2 ({TXN_STATE_SCHEMA})"
            )
        rows = _newest_per_key(read_rows(store.partition(TXN_STATE_TOPIC, 0)))
        log.info(
            "upgrading %s from schema version 1 to 2 (nullable value: tombstones): %d keys",
            TXN_STATE_TOPIC,
            len(rows),
        )
        store.create_topic(MIGRATION_TOPIC, 1, schema=TXN_STATE_SCHEMA, config=TOPIC_CONFIG)
        # Step 1: the rows, then the completion row, each durable before the next step.
        append_rows(store.partition(MIGRATION_TOPIC, 0), rows, TXN_STATE_SCHEMA)
        append_rows(
            store.partition(MIGRATION_TOPIC, 0),
            [(_DONE_KIND, _DONE_KEY, str(len(rows)).encode())],
            TXN_STATE_SCHEMA,
        )
        migrating = rows
    else:
        log.info("resuming the upgrade of %s from %s", TXN_STATE_TOPIC, MIGRATION_TOPIC)
    _drop(store, TXN_STATE_TOPIC)  # step 2
    store.create_topic(TXN_STATE_TOPIC, 1, schema=TXN_STATE_SCHEMA, config=config or TOPIC_CONFIG)
    append_rows(store.partition(TXN_STATE_TOPIC, 0), migrating, TXN_STATE_SCHEMA)  # step 3
    _drop(store, MIGRATION_TOPIC)  # step 4
    log.info("upgraded %s to schema version 2", TXN_STATE_TOPIC)
    return True


def _complete_migration_rows(store: LogStore) -> list[Row] | None:
    """The rows of a complete ``.migrating`` topic; None (after deleting it) when there is
    none or it is incomplete (a crash in step 1: the version-1 topic is untouched)."""
    if MIGRATION_TOPIC not in store.topics():
        _drop(store, MIGRATION_TOPIC)  # a directory a crash left before its metadata
        return None
    rows = [row for _, row in read_rows(store.partition(MIGRATION_TOPIC, 0))]
    if rows and rows[-1][:2] == (_DONE_KIND, _DONE_KEY):
        expected = int(rows[-1][2] or b"-1")
        if expected != len(rows) - 1:
            raise CorruptRecordError(
                f"{MIGRATION_TOPIC}: completion row says {expected} rows, found {len(rows) - 1}"
            )
        return rows[:-1]
    _drop(store, MIGRATION_TOPIC)
    return None


# -- one partition of the state, as the coordinator writes and loads it --------------------


class StatePartition(Protocol):
    """One partition of ``__transaction_state`` as its coordinator sees it.

    The broker's implementation (``server.coordination.state_partition``) appends through the
    leader's replica: an append is refused, atomically with the write, unless the partition is
    still led at the writer's leader epoch, and returns only once every in-sync replica
    has the rows (acks=all). This module only knows the Protocol (txn never imports
    server), like ``MarkerWriter``.
    """

    @property
    def name(self) -> str:
        """``__transaction_state-<n>``, for messages."""

    def append(self, rows: Sequence[Row], leader_epoch: int) -> None:
        """``rows`` as one batch, durable on every in-sync replica before it returns.

        Raises CoordinatorEpochFencedError (``txn.state_topic.store``) when the partition is no
        longer led at ``leader_epoch``, whether before the write or while waiting for the
        replicas (the rows may then be cut by the new leader: never acknowledged), and the
        retriable NOT_ENOUGH_REPLICAS / REQUEST_TIMED_OUT errors of an acks=all produce.
        """

    def rows(self) -> Iterator[tuple[int, Row]]:
        """Every row of the partition with its offset, in offset order (its load)."""


def open_state_log(
    store: LogStore,
    segment_bytes: int | None = None,
    delete_retention_ms: int | None = None,
) -> PartitionLog:
    """The local log of the one-partition ``__transaction_state`` of ``store``, created
    (with :func:`state_topic_config`) if absent, upgraded from schema version 1 first.

    Raises CorruptRecordError for a topic of another shape or schema."""
    config = state_topic_config(segment_bytes, delete_retention_ms)
    migrate_state_topic(store, config)
    with contextlib.suppress(TopicAlreadyExistsError):
        store.create_topic(TXN_STATE_TOPIC, 1, schema=TXN_STATE_SCHEMA, config=config)
    topic = store.topic(TXN_STATE_TOPIC)
    if topic.partitions != 1 or (
        topic.schema is not None and not topic.schema.equals(TXN_STATE_SCHEMA)
    ):
        raise CorruptRecordError(
            f"internal topic {TXN_STATE_TOPIC!r} has {topic.partitions} partitions and "
            f"schema {topic.schema}; expected 1 partition of {TXN_STATE_SCHEMA}"
        )
    return store.partition(TXN_STATE_TOPIC, 0)
