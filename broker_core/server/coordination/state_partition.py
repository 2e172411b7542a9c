"""The coordinator's writes to ``__transaction_state``, through the leader's replica.

:class:`LeaderStatePartition` is the broker's ``txn.state_topic.schema.StatePartition``: every
append runs inside ``Partition.append_as_leader`` (the role lock, so the check and the
write are one step) and is refused there unless the partition is still led at the
coordinator's leader epoch; then it waits, within that epoch, until every in-sync replica
has it (acks=all). Losing the leadership at any point before the answer -- before the
write or while it waits -- raises CoordinatorEpochFencedError: the coordinator stands
down and never applies the change in memory (docs/design.md §10).

:func:`embedded_state_partition` gives the embedded broker the same path: its one-partition
``__transaction_state`` is a :class:`Partition` led by itself at the controller epoch of
this run (higher than every earlier run's, docs/design.md §10), one replica.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from broker_core.cluster.records import PartitionState
from broker_core.errors import NotLeaderOrFollowerError
from broker_core.log.partition_log import PartitionLog
from broker_core.log.store import LogStore
from broker_core.server.replication.partition import Partition
from broker_core.txn.state_topic.schema import (
    TXN_STATE_SCHEMA,
    TXN_STATE_TOPIC,
    Row,
    append_rows,
    open_state_log,
    read_rows,
)
from broker_core.txn.state_topic.store import CoordinatorEpochFencedError


class LeaderStatePartition:
    """``partition`` (a replica of a ``__transaction_state`` partition) as the
    coordinator's :class:`~broker_core.txn.state_topic.schema.StatePartition`; an acks=all
    answer waits up to ``ack_timeout_s`` (``ReplicationConfig.ack_timeout_s``). ``schema``:
    the rows' (``__consumer_offsets``' rows have the same columns, ``offsets_topic``)."""

    def __init__(
        self, partition: Partition, ack_timeout_s: float, schema: pa.Schema = TXN_STATE_SCHEMA
    ) -> None:
        self._partition = partition
        self._ack_timeout_s = ack_timeout_s
        self._schema = schema

    @property
    def name(self) -> str:
        return self._partition.name

    @property
    def partition(self) -> Partition:
        return self._partition

    def append(self, rows: Sequence[Row], leader_epoch: int) -> None:
        """See ``StatePartition.append``: CoordinatorEpochFencedError once the partition is
        not led at ``leader_epoch`` (nothing written, or written and never acknowledged);
        NotEnoughReplicasError, NotEnoughReplicasAfterAppendError, RequestTimedOutError
        (retriable) from the acks=all wait."""
        partition = self._partition

        def write(log_: PartitionLog) -> int:
            # Under the role lock: no election can come between this check and the write.
            if partition.leader_epoch != leader_epoch:
                raise self._fenced(leader_epoch, "it is led at another epoch")
            append_rows(log_, rows, self._schema)
            return log_.log_end_offset

        try:
            end = partition.append_as_leader(write, acks_all=True)
            partition.wait_replicated(end, self._ack_timeout_s, leader_epoch)
        except NotLeaderOrFollowerError as exc:
            raise self._fenced(leader_epoch, exc.message) from exc

    def _fenced(self, leader_epoch: int, why: str) -> CoordinatorEpochFencedError:
        return CoordinatorEpochFencedError(
            f"{self.name}: the coordinator of leader epoch {leader_epoch} may no longer "
            f"write its state (leader epoch now {self._partition.leader_epoch}): {why}"
        )

    def rows(self) -> Iterator[tuple[int, Row]]:
        """The partition's rows up to its log end as of the call, once every in-sync
        replica has them (a new leader's log end may be above its high watermark, and
        reads stop there): CoordinatorEpochFencedError if the leadership ends first,
        RequestTimedOutError (the load is retried) if they do not catch up in time."""
        partition = self._partition
        epoch = partition.leader_epoch
        try:
            partition.wait_replicated(partition.log.log_end_offset, self._ack_timeout_s, epoch)
        except NotLeaderOrFollowerError as exc:
            raise self._fenced(epoch, exc.message) from exc
        return read_rows(partition.log)


def embedded_state_partition(
    store: LogStore,
    broker_id: int,
    leader_epoch: int,
    *,
    segment_bytes: int | None = None,
    delete_retention_ms: int | None = None,
) -> LeaderStatePartition:
    """The embedded broker's ``__transaction_state`` (created or upgraded by
    ``open_state_log``) as a one-replica partition led by ``broker_id`` at
    ``leader_epoch``, which must not be below the epoch its log last recorded
    (InvalidRequestError: the controller epoch only grows)."""
    log_ = open_state_log(store, segment_bytes, delete_retention_ms)
    partition = Partition(TXN_STATE_TOPIC, 0, log_, broker_id)
    partition.apply(PartitionState((broker_id,), broker_id, leader_epoch, (broker_id,)))
    # One replica: acks=all is answered at once (Partition.wait_replicated).
    return LeaderStatePartition(partition, ack_timeout_s=0.0)
