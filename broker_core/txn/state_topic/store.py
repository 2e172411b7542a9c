"""Durable transaction-coordinator state: where TransactionMetadata and SinkCommitRecords live.

:class:`LogTxnStateStore` implements :class:`TxnStateStore`: records appended to a
partition of the internal topic ``__transaction_state`` through its leader at the
coordinator's leader epoch (``StatePartition``), rows ``(kind, key, value)``; the last
record per key wins when the partition is replayed. The append itself checks the leader
epoch, so a replaced coordinator's write is refused (CoordinatorEpochFencedError). The
previous format's znodes are only read, once, by the upgrade (``txn.state_topic.legacy_zk``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from broker_core.errors import ConcurrentTransactionsError, CorruptRecordError
from broker_core.txn.state_topic.records import (
    SinkBatchRecord,
    SinkCommitRecord,
    TransactionMetadata,
)
from broker_core.txn.state_topic.schema import TXN_STATE_SCHEMA as TXN_STATE_SCHEMA
from broker_core.txn.state_topic.schema import TXN_STATE_TOPIC as TXN_STATE_TOPIC
from broker_core.txn.state_topic.schema import Row, StatePartition

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
    """This coordinator was deposed: its state partition is no longer led at the
    coordinator's leader epoch, so an append (or the load) was refused; or, raised by the
    coordinator, a partition refused its markers with TRANSACTION_COORDINATOR_FENCED (a
    newer coordinator's markers reached it).

    A CONCURRENT_TRANSACTIONS (51) on the wire, so the client retries; the coordinator
    recognises the type and stops serving, and the retry gets NOT_COORDINATOR and finds
    the new one.
    """


# -- the internal topic ----------------------------------------------------------

KIND_TRANSACTION = "transaction"
KIND_SINK = "sink"
# A held-back sink batch's own record (docs/design.md §7); a tombstone removes it.
KIND_SINK_BATCH = "sink_batch"
# The record of an upgrade from the previous format (server.coordination.state_migration): one row,
# key "zookeeper"; the load skips it.
KIND_MIGRATION = "migration"
# Rows of one append of put_transactions: well under max.message.bytes.
_MAX_APPEND_BYTES = 512 * 1024


class LogTxnStateStore:
    """State records in one partition of ``__transaction_state``, written at the
    coordinator's ``leader_epoch`` (its coordinator epoch).

    Each put appends through ``partition`` (:class:`StatePartition`: acks=all, refused
    atomically unless the partition is still led at ``leader_epoch``) and returns once the
    rows are durable on every in-sync replica; a delete appends a tombstone (a null value)
    the same way. A refused append raises CoordinatorEpochFencedError, on which the
    coordinator stands down without applying the change (docs/design.md §10). A torn or
    corrupt tail after a crash is cut by the log's own recovery, so :meth:`load` sees
    every record whose put returned.
    """

    def __init__(self, partition: StatePartition, *, leader_epoch: int) -> None:
        self._partition = partition
        self._leader_epoch = leader_epoch

    @property
    def leader_epoch(self) -> int:
        """The state partition's leader epoch this store writes at."""
        return self._leader_epoch

    def _append_rows(self, rows: Sequence[Row]) -> None:
        self._partition.append(rows, self._leader_epoch)

    def _append(self, kind: str, key: str, value: bytes | None) -> None:
        self._append_rows([(kind, key, value)])

    # The partition's leader epoch fences every write; the coordinator_epoch arguments are
    # the same number (the coordinator's epoch is its state partition's leader epoch).
    def put_transaction(self, meta: TransactionMetadata, *, coordinator_epoch: int = 0) -> None:
        self._append(KIND_TRANSACTION, meta.transactional_id, meta.to_json())

    def put_sink(self, record: SinkCommitRecord, *, coordinator_epoch: int = 0) -> None:
        self._append(KIND_SINK, record.sink_id, record.to_json())

    def delete_transaction(self, transactional_id: str, *, coordinator_epoch: int = 0) -> None:
        self._append(KIND_TRANSACTION, transactional_id, None)

    def put_transactions(
        self, metas: Sequence[TransactionMetadata], *, coordinator_epoch: int = 0
    ) -> None:
        """One append (one fsync, one replication round) for all of them (a few past
        _MAX_APPEND_BYTES)."""
        rows: list[Row] = []
        size = 0
        for meta in metas:
            value = meta.to_json()
            if rows and size + len(value) > _MAX_APPEND_BYTES:
                self._append_rows(rows)
                rows, size = [], 0
            rows.append((KIND_TRANSACTION, meta.transactional_id, value))
            size += len(value)
        if rows:
            self._append_rows(rows)

    def put_sink_batch(self, record: SinkBatchRecord, *, coordinator_epoch: int = 0) -> None:
        self._append(KIND_SINK_BATCH, record.key, record.to_json())

    def delete_sink_batch(self, sink_id: str, batch_id: int, *, coordinator_epoch: int = 0) -> None:
        self._append(KIND_SINK_BATCH, SinkBatchRecord(sink_id, batch_id, []).key, None)

    def load_sink_batches(self) -> list[SinkBatchRecord]:
        found: dict[str, SinkBatchRecord] = {}
        partition = self._partition
        for offset, (kind, key, value) in partition.rows():
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
        partition = self._partition
        for offset, (kind, key, value) in partition.rows():
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
            elif kind in (KIND_SINK_BATCH, KIND_MIGRATION):
                continue  # load_sink_batches reads those; the upgrade's record
            else:
                raise CorruptRecordError(f"{where}: unknown record kind {kind!r}")
        return txns, sinks


def check_key(stored: str, key: str, where: str) -> None:
    if stored != key:
        raise CorruptRecordError(f"{where}: record names {stored!r}, not its key {key!r}")
