"""A coordinator's state store over a local ``__transaction_state`` log with no
replication and no leader epoch check, for a process that is its only writer by
construction: the store tier's tests and the offline coordinator benchmark. A broker's
store appends through its state partition's leader at the coordinator's leader epoch
(``broker_core.server.coordination.state_partition``); this one never refuses a write, so
it is kept out of the shipped package."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from broker_core.log.partition_log import PartitionLog
from broker_core.log.store import LogStore
from broker_core.txn.state_topic.schema import (
    TXN_STATE_SCHEMA,
    Row,
    append_rows,
    open_state_log,
    read_rows,
)
from broker_core.txn.state_topic.store import LogTxnStateStore


class UnfencedStatePartition:
    """A ``StatePartition`` over ``log_`` that appends whatever epoch it is given."""

    def __init__(self, log_: PartitionLog) -> None:
        self._log = log_

    @property
    def name(self) -> str:
        return self._log.name

    def append(self, rows: Sequence[Row], leader_epoch: int) -> None:
        append_rows(self._log, rows, TXN_STATE_SCHEMA)

    def rows(self) -> Iterator[tuple[int, Row]]:
        return read_rows(self._log)


def local_state_store(
    store: LogStore,
    *,
    segment_bytes: int | None = None,
    delete_retention_ms: int | None = None,
) -> LogTxnStateStore:
    """A state store over ``store``'s own ``__transaction_state`` (created, or upgraded
    from schema version 1, by ``open_state_log``), at leader epoch 0."""
    log_ = open_state_log(store, segment_bytes, delete_retention_ms)
    return LogTxnStateStore(UnfencedStatePartition(log_), leader_epoch=0)
