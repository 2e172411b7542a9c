"""``__consumer_offsets``: where it lives and how its group coordinators write it.

With ZooKeeper it is a replicated internal topic created when a Kafka client first asks
for a group's coordinator (:func:`ensure_offsets_topic`, ``internal_topics``):
``offsets.topic.num.partitions`` partitions of ``offsets.topic.replication.factor``
replicas (-1: min(3, live brokers)), ``min.insync.replicas`` the broker's topic default
capped at the replicas, compacted on ``kind,key``. The embedded broker keeps a local
one-partition topic led by itself at the run's controller epoch
(:func:`embedded_offsets_log`), as it does ``__transaction_state``.

:class:`LeaderOffsetsLog` is the coordinator's ``groups.coordinator.OffsetsLog``: the
transaction coordinator's path (``state_partition.LeaderStatePartition``: the leader
epoch checked under the replica's role lock by the append itself, then acks=all), its
fencing said as NOT_COORDINATOR.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.records import PartitionState, TopicAssignment
from broker_core.errors import CorruptRecordError, NotCoordinatorError, TopicAlreadyExistsError
from broker_core.groups.records import OFFSETS_SCHEMA, OFFSETS_TOPIC, Row
from broker_core.log.store import LogStore
from broker_core.server.config.broker_config import BrokerConfig
from broker_core.server.coordination.internal_topics import (
    ensure_internal_topic,
    replication_factor,
)
from broker_core.server.coordination.state_partition import LeaderStatePartition
from broker_core.server.replication.partition import Partition
from broker_core.txn.state_topic.store import CoordinatorEpochFencedError

# A record must fit in one segment; a commit of many partitions is a few hundred KB.
MAX_RECORD_BYTES = 64 * 1024**2


def offsets_topic_config(segment_bytes: int) -> dict[str, str]:
    """Never deleted by retention: compaction keeps the newest row per (kind, key) and a
    tombstone (an expired or deleted offset or group) removes its key."""
    return {
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "cleanup.policy": "compact",
        "compaction.key.columns": "kind,key",
        "segment.bytes": str(segment_bytes),
        "max.message.bytes": str(min(segment_bytes, MAX_RECORD_BYTES)),
    }


def ensure_offsets_topic(cluster: ClusterMetadata, config: BrokerConfig) -> TopicAssignment:
    """The cluster's ``__consumer_offsets``, created now if it has none; raises what
    ``internal_topics.ensure_internal_topic`` raises."""
    offsets = config.offsets
    factor = replication_factor(offsets.replication_factor, len(cluster.brokers()))
    overrides = offsets_topic_config(offsets.segment_bytes)
    overrides["replication.factor"] = str(factor)
    overrides["min.insync.replicas"] = str(min(config.log_defaults.min_insync_replicas, factor))
    return ensure_internal_topic(
        cluster, OFFSETS_TOPIC, offsets.num_partitions, OFFSETS_SCHEMA, overrides
    )


class LeaderOffsetsLog:
    """``partition`` (a replica of a ``__consumer_offsets`` partition) as its group
    coordinator's log; acks=all answers wait up to ``ack_timeout_s``."""

    def __init__(self, partition: Partition, ack_timeout_s: float) -> None:
        self._state = LeaderStatePartition(partition, ack_timeout_s, OFFSETS_SCHEMA)

    @property
    def name(self) -> str:
        return self._state.name

    @property
    def partition(self) -> Partition:
        return self._state.partition

    def append(self, rows: Sequence[Row], leader_epoch: int) -> None:
        """NotCoordinatorError once the partition is not led at ``leader_epoch`` (checked
        by the write itself); the acks=all wait's retriable errors otherwise."""
        try:
            self._state.append(rows, leader_epoch)
        except CoordinatorEpochFencedError as exc:
            raise NotCoordinatorError(exc.message) from exc

    def rows(self) -> Iterator[tuple[int, Row]]:
        try:
            yield from self._state.rows()
        except CoordinatorEpochFencedError as exc:
            raise NotCoordinatorError(exc.message) from exc


def embedded_offsets_log(
    store: LogStore, broker_id: int, leader_epoch: int, segment_bytes: int
) -> LeaderOffsetsLog:
    """The embedded broker's one-partition ``__consumer_offsets`` (created if absent) led
    by ``broker_id`` at ``leader_epoch`` (the run's controller epoch), one replica.
    CorruptRecordError for a topic of another shape."""
    with contextlib.suppress(TopicAlreadyExistsError):
        store.create_topic(
            OFFSETS_TOPIC, 1, schema=OFFSETS_SCHEMA, config=offsets_topic_config(segment_bytes)
        )
    topic = store.topic(OFFSETS_TOPIC)
    if topic.partitions != 1 or (
        topic.schema is not None and not topic.schema.equals(OFFSETS_SCHEMA)
    ):
        raise CorruptRecordError(
            f"internal topic {OFFSETS_TOPIC!r} has {topic.partitions} partitions and "
            f"schema {topic.schema}; expected 1 partition of {OFFSETS_SCHEMA}"
        )
    partition = Partition(OFFSETS_TOPIC, 0, store.partition(OFFSETS_TOPIC, 0), broker_id)
    partition.apply(PartitionState((broker_id,), broker_id, leader_epoch, (broker_id,)))
    return LeaderOffsetsLog(partition, ack_timeout_s=0.0)
