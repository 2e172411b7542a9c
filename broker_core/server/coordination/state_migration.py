"""Upgrade of a ZooKeeper cluster's coordinator state from the previous format.

Before issue 23 the controller ran the coordinator and kept its state in znodes
(``/idemlog/transactions``, ``/idemlog/sinks``, ``/idemlog/sink_batches``: idemlog 0.1,
read by ``txn.state_topic.legacy_zk``), fenced by the controller epoch, which it also stamped on
markers.
The first coordinator to load each ``__transaction_state`` partition
(:func:`migrate_zookeeper_state`, before it serves) does, for that partition's share of
the ids (the ones whose key maps to it, so each lands with its own coordinator):

1. if the partition holds the upgrade's record (kind ``migration``, key ``zookeeper``),
   nothing is read from ZooKeeper: the log is the state;
2. else every znode of the previous format is copied into the partition (appends at the
   coordinator's leader epoch, acks=all), then the record is appended, naming the
   version, the counts and the **epoch floor**: the controller epoch + 1 (0 when there
   was no state). A crash before the record copies again on the next load (the newest
   row per key wins, and nothing else writes before the record exists).

Markers of the old coordinator carried controller epochs, and partitions refuse markers
of an older coordinator epoch per producer; so a coordinator whose leader epoch is below
the floor raises the partition's leader epoch to the floor (``alter_partition``, fenced by
its own leader epoch) and stands down; the leadership at the floor loads again. The
znodes stay (a downgrade could still read them) and are never written again.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.records import PartitionState
from broker_core.errors import CoordinatorLoadInProgressError, CorruptRecordError
from broker_core.txn.state_topic.legacy_zk import read_legacy_state
from broker_core.txn.state_topic.schema import (
    TXN_STATE_TOPIC,
    Row,
    StatePartition,
    state_partition_of,
)
from broker_core.txn.state_topic.store import (
    KIND_MIGRATION,
    KIND_SINK,
    KIND_SINK_BATCH,
    KIND_TRANSACTION,
)

log = logging.getLogger("idemlog.broker")

MIGRATION_KEY = "zookeeper"
PREVIOUS_FORMAT = "idemlog 0.1 (coordinator state in ZooKeeper znodes)"
_CHUNK_BYTES = 512 * 1024  # rows per append: well under max.message.bytes


def migration_floor(partition: StatePartition) -> int | None:
    """The epoch floor the upgrade's record names, None when the partition has none.
    Raises CorruptRecordError for a record that cannot be read."""
    found: int | None = None
    for offset, (kind, key, value) in partition.rows():
        if kind != KIND_MIGRATION or key != MIGRATION_KEY or value is None:
            continue
        try:
            found = int(json.loads(value)["epoch_floor"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptRecordError(
                f"{partition.name} offset {offset}: unreadable upgrade record: {exc}"
            ) from exc
    return found


def migrate_zookeeper_state(
    zookeeper: Any,
    root: str,
    partition: StatePartition,
    leader_epoch: int,
    shard: tuple[int, int] = (0, 1),
) -> int:
    """Copy the previous format's znodes under ``root`` into ``partition`` (at
    ``leader_epoch``) unless done before; returns the epoch floor. ``shard``: (this
    partition's number, the topic's partition count): only the ids, sinks and sink
    batches whose key maps to this partition (``state_partition_of``; a sink batch by
    its sink id) are copied, so each lands with its own coordinator. Raises the store's
    and the appends' errors (the load is retried and copies again)."""
    floor = migration_floor(partition)
    if floor is not None:
        return floor
    legacy = read_legacy_state(zookeeper, root)
    legacy_rows = bool(legacy)
    number, count = shard

    def ours(key: str) -> bool:
        return state_partition_of(key, count) == number

    txns = {t: m for t, m in legacy.transactions.items() if ours(t)}
    sinks = {s: r for s, r in legacy.sinks.items() if ours(s)}
    batches = [b for b in legacy.sink_batches if ours(b.sink_id)]
    rows: list[Row] = [(KIND_TRANSACTION, t, m.to_json()) for t, m in sorted(txns.items())]
    rows += [(KIND_SINK, s, r.to_json()) for s, r in sorted(sinks.items())]
    rows += [(KIND_SINK_BATCH, b.key, b.to_json()) for b in batches]
    # The floor is the cluster's (the controller epoch), whichever ids this shard holds:
    # any partition's markers of the old coordinator carried it.
    floor = _controller_epoch(zookeeper, root) + 1 if legacy_rows else 0
    chunk: list[Row] = []
    size = 0
    for row in rows:
        value = row[2] or b""
        if chunk and size + len(value) > _CHUNK_BYTES:
            partition.append(chunk, leader_epoch)
            chunk, size = [], 0
        chunk.append(row)
        size += len(value)
    if chunk:
        partition.append(chunk, leader_epoch)
    record = {
        "from": PREVIOUS_FORMAT,
        "epoch_floor": floor,
        "transactions": len(txns),
        "sinks": len(sinks),
        "sink_batches": len(batches),
    }
    partition.append([(KIND_MIGRATION, MIGRATION_KEY, json.dumps(record).encode())], leader_epoch)
    if rows:
        log.warning(
            "upgraded the coordinator state of %s into %s: %d transactional ids, %d sinks, "
            "%d held-back sink batches; coordinator epochs from %d on",
            PREVIOUS_FORMAT,
            partition.name,
            len(txns),
            len(sinks),
            len(batches),
            floor,
        )
    return floor


def _controller_epoch(zookeeper: Any, root: str) -> int:
    try:
        data, _ = zookeeper.get(f"{root}/controller_epoch")
        return int(json.loads(data)["controller_epoch"])
    except Exception as exc:
        raise CorruptRecordError(
            f"cannot read {root}/controller_epoch to upgrade from {PREVIOUS_FORMAT}: {exc}"
        ) from exc


def raise_to_floor(
    cluster: ClusterMetadata, broker_id: int, partition: int, leader_epoch: int, floor: int
) -> None:
    """Raise the state partition's leader epoch from ``leader_epoch`` to ``floor`` while
    ``broker_id`` still leads it at ``leader_epoch`` (nothing otherwise), then raise
    CoordinatorLoadInProgressError: the coordinator of the new epoch loads next."""

    def update(state: PartitionState) -> PartitionState | None:
        if state.leader != broker_id or state.leader_epoch != leader_epoch:
            return None
        return replace(state, leader_epoch=floor)

    cluster.alter_partition(TXN_STATE_TOPIC, partition, update)
    raise CoordinatorLoadInProgressError(
        f"{TXN_STATE_TOPIC}-{partition}: leader epoch {leader_epoch} raised to {floor}, above "
        f"the controller epochs {PREVIOUS_FORMAT} stamped on markers; loading again"
    )
