"""``__transaction_state`` as a replicated internal topic of a ZooKeeper cluster.

The topic is created when the cluster first needs it (:func:`ensure_state_topic`,
``internal_topics``) with
``transaction.state.log.num.partitions`` partitions of ``transaction.state.log.replication.factor``
replicas (-1: min(3, live brokers)), ``min.insync.replicas`` =
min(``transaction.state.log.min.isr``, replicas), compacted on ``kind,key`` with the
segment size and tombstone retention of the broker's ``transaction.state.log.*`` keys.
The embedded broker keeps its local one-partition topic (``server.coordination.state_partition``).
"""

from __future__ import annotations

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.records import TopicAssignment
from broker_core.server.config.broker_config import BrokerConfig
from broker_core.server.coordination.internal_topics import (
    ensure_internal_topic,
    replication_factor,
)
from broker_core.txn.state_topic.schema import TXN_STATE_SCHEMA, TXN_STATE_TOPIC, state_topic_config


def state_topic_overrides(config: BrokerConfig, live_brokers: int) -> dict[str, str]:
    """The topic configuration ``__transaction_state`` is created with when
    ``live_brokers`` brokers are registered."""
    factor = replication_factor(config.transaction_state_log_replication_factor, live_brokers)
    overrides = state_topic_config(
        config.transaction_state_log_segment_bytes,
        config.transaction_state_log_delete_retention_ms,
    )
    overrides["replication.factor"] = factor
    overrides["min.insync.replicas"] = min(config.transaction_state_log_min_isr, factor)
    return {key: str(value) for key, value in overrides.items()}


def ensure_state_topic(cluster: ClusterMetadata, config: BrokerConfig) -> TopicAssignment:
    """The cluster's ``__transaction_state``, created now if it has none; raises what
    ``internal_topics.ensure_internal_topic`` raises."""
    return ensure_internal_topic(
        cluster,
        TXN_STATE_TOPIC,
        config.transaction_state_log_num_partitions,
        TXN_STATE_SCHEMA,
        state_topic_overrides(config, len(cluster.brokers())),
    )
