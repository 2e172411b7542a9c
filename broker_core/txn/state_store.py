"""Durable transaction-coordinator state: where TransactionMetadata and SinkCommitRecords live.

Two stores implement :class:`TxnStateStore`:

* :class:`LogTxnStateStore` (embedded mode): records appended to the internal topic
  ``__transaction_state`` of the broker's own LogStore, one partition, rows
  ``(kind, key, value)``; the last record per key wins when the topic is replayed.
* ``ZkTxnStateStore`` (cluster mode, ``txn.state_store_zk``): one znode per
  transactional id and per sink, every write fenced by the controller epoch inside the
  write itself.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Protocol

from broker_core.errors import (
    ConcurrentTransactionsError,
    CorruptRecordError,
    TopicAlreadyExistsError,
)
from broker_core.log.partition_log import PartitionLog
from broker_core.log.store import LogStore
from broker_core.txn.state import SinkBatchRecord, SinkCommitRecord, TransactionMetadata
from broker_core.txn.state_topic import TXN_STATE_SCHEMA as TXN_STATE_SCHEMA
from broker_core.txn.state_topic import TXN_STATE_TOPIC as TXN_STATE_TOPIC
from broker_core.txn.state_topic import (
    append_rows,
    migrate_state_topic,
    read_rows,
    state_topic_config,
)

log = logging.getLogger("idemlog.txn")

TxnState = tuple[dict[str, TransactionMetadata], dict[str, SinkCommitRecord]]


class TxnStateStore(Protocol):
    def load(self) -> TxnState: ...

    def put_transaction(self, meta: TransactionMetadata, *, coordinator_epoch: int = 0) -> None:
        """Durable before it returns; ``coordinator_epoch`` is the writing coordinator's."""

    def put_sink(self, record: SinkCommitRecord, *, coordinator_epoch: int = 0) -> None:
        """Durable before it returns; ``coordinator_epoch`` is the writing coordinator's."""

    def delete_transaction(self, transactional_id: str, *, coordinator_epoch: int = 0) -> None:
        """Remove the id's record (an expired id), durably; a later load lacks it."""

    def put_transactions(
        self, metas: Sequence[TransactionMetadata], *, coordinator_epoch: int = 0
    ) -> None:
        """Every record durable before it returns (in as few writes as the store allows);
        on an error some may be stored, each whole."""

    def put_sink_batch(self, record: SinkBatchRecord, *, coordinator_epoch: int = 0) -> None:
        """Durable before it returns; a batch's ranges never change (docs/design.md §7)."""

    def delete_sink_batch(self, sink_id: str, batch_id: int, *, coordinator_epoch: int = 0) -> None:
        """The batch's record gone (durably) before it returns; absent is fine."""

    def load_sink_batches(self) -> list[SinkBatchRecord]:
        """Every stored SinkBatchRecord; call after :meth:`load`."""

    def delete_sink(self, sink_id: str, *, coordinator_epoch: int = 0) -> None:
        """Remove the sink's record (an expired sink), durably; a later load lacks it."""


class CoordinatorEpochFencedError(ConcurrentTransactionsError):
    """A coordinator of a higher epoch has taken over: it wrote the state this one was
    about to overwrite (or, raised by the coordinator, a partition refused this one's
    markers with TRANSACTION_COORDINATOR_FENCED).

    Still a CONCURRENT_TRANSACTIONS (51) on the wire, as the stores have always answered a
    lost race, so the client retries; the coordinator recognises the type and stops
    serving, and the retry gets NOT_COORDINATOR and finds the new one.
    """


# -- embedded: the internal topic ----------------------------------------------------------

KIND_TRANSACTION = "transaction"
KIND_SINK = "sink"
# A held-back sink batch's own record (docs/design.md §7); a tombstone removes it.
KIND_SINK_BATCH = "sink_batch"
# Rows of one append of put_transactions: well under max.message.bytes.
_MAX_APPEND_BYTES = 512 * 1024


class LogTxnStateStore:
    """State records in the internal topic ``__transaction_state`` of ``store``.

    Each put appends one row and fsyncs the partition before returning; a delete appends
    a tombstone (a null value) the same way. A torn or corrupt tail after a crash is cut
    by the log's own recovery, so :meth:`load` sees every record whose put returned. A
    topic of schema version 1 is upgraded on construction (``txn.state_topic``).
    """

    def __init__(
        self,
        store: LogStore,
        *,
        segment_bytes: int | None = None,
        delete_retention_ms: int | None = None,
    ) -> None:
        self._store = store
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

    def _log(self) -> PartitionLog:
        return self._store.partition(TXN_STATE_TOPIC, 0)

    def _append(self, kind: str, key: str, value: bytes | None) -> None:
        append_rows(self._log(), [(kind, key, value)], TXN_STATE_SCHEMA)

    # One broker, one coordinator at a time: no older coordinator can write here.
    def put_transaction(self, meta: TransactionMetadata, *, coordinator_epoch: int = 0) -> None:
        self._append(KIND_TRANSACTION, meta.transactional_id, meta.to_json())

    def put_sink(self, record: SinkCommitRecord, *, coordinator_epoch: int = 0) -> None:
        self._append(KIND_SINK, record.sink_id, record.to_json())

    def delete_transaction(self, transactional_id: str, *, coordinator_epoch: int = 0) -> None:
        self._append(KIND_TRANSACTION, transactional_id, None)

    def put_transactions(
        self, metas: Sequence[TransactionMetadata], *, coordinator_epoch: int = 0
    ) -> None:
        """One append and one fsync for all of them (a few past _MAX_APPEND_BYTES)."""
        rows: list[tuple[str, str, bytes | None]] = []
        size = 0
        for meta in metas:
            value = meta.to_json()
            if rows and size + len(value) > _MAX_APPEND_BYTES:
                append_rows(self._log(), rows, TXN_STATE_SCHEMA)
                rows, size = [], 0
            rows.append((KIND_TRANSACTION, meta.transactional_id, value))
            size += len(value)
        append_rows(self._log(), rows, TXN_STATE_SCHEMA)

    def put_sink_batch(self, record: SinkBatchRecord, *, coordinator_epoch: int = 0) -> None:
        self._append(KIND_SINK_BATCH, record.key, record.to_json())

    def delete_sink_batch(self, sink_id: str, batch_id: int, *, coordinator_epoch: int = 0) -> None:
        self._append(KIND_SINK_BATCH, SinkBatchRecord(sink_id, batch_id, []).key, None)

    def load_sink_batches(self) -> list[SinkBatchRecord]:
        found: dict[str, SinkBatchRecord] = {}
        partition = self._log()
        for offset, (kind, key, value) in read_rows(partition):
            if kind != KIND_SINK_BATCH:
                continue
            if value is None:
                found.pop(key, None)
                continue
            where = f"{partition.name} offset {offset} (key {key!r})"
            record = SinkBatchRecord.from_json(value, where)
            check_key(record.key, key, where)
            found[key] = record
        return list(found.values())

    def delete_sink(self, sink_id: str, *, coordinator_epoch: int = 0) -> None:
        self._append(KIND_SINK, sink_id, None)

    def load(self) -> TxnState:
        """The newest record per key; a key whose newest row is a tombstone is absent."""
        txns: dict[str, TransactionMetadata] = {}
        sinks: dict[str, SinkCommitRecord] = {}
        partition = self._log()
        for offset, (kind, key, value) in read_rows(partition):
            where = f"{partition.name} offset {offset} (key {key!r})"
            if kind == KIND_TRANSACTION:
                if value is None:
                    txns.pop(key, None)
                    continue
                meta = TransactionMetadata.from_json(value, where)
                check_key(meta.transactional_id, key, where)
                txns[key] = meta
            elif kind == KIND_SINK:
                if value is None:
                    sinks.pop(key, None)
                    continue
                record = SinkCommitRecord.from_json(value, where)
                check_key(record.sink_id, key, where)
                sinks[key] = record
            elif kind == KIND_SINK_BATCH:
                continue  # load_sink_batches reads those
            else:
                raise CorruptRecordError(f"{where}: unknown record kind {kind!r}")
        return txns, sinks


def check_key(stored: str, key: str, where: str) -> None:
    if stored != key:
        raise CorruptRecordError(f"{where}: record names {stored!r}, not its key {key!r}")
