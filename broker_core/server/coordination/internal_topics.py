"""An internal topic of a ZooKeeper cluster, created when the cluster first needs it.

``__transaction_state`` (``txn_state_topic``) and ``__consumer_offsets``
(``offsets_topic``) are created by whichever broker first needs them: any broker may race
to, ZooKeeper's create decides, and the losers read the winner's.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.records import TopicAssignment
from broker_core.errors import (
    CoordinatorNotAvailableError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

MAX_DEFAULT_REPLICAS = 3


def replication_factor(configured: int, live_brokers: int) -> int:
    """``configured``, or for -1 min(3, live brokers) (at least 1)."""
    if configured == -1:
        return max(1, min(MAX_DEFAULT_REPLICAS, live_brokers))
    return configured


def ensure_internal_topic(
    cluster: ClusterMetadata,
    name: str,
    partitions: int,
    schema: pa.Schema,
    overrides: Mapping[str, str],
) -> TopicAssignment:
    """The cluster's topic ``name``, created now (``partitions``, ``schema``,
    ``overrides``) if it has none.

    Raises what ``ClusterMetadata.create_topic`` raises (INVALID_REPLICATION_FACTOR when
    fewer brokers are live than the factor, a ZooKeeper error: retriable), and
    CoordinatorNotAvailableError (retriable) when another broker won the race to create
    it and this broker's view does not show it yet."""
    try:
        return cluster.topic(name)
    except UnknownTopicOrPartitionError:
        pass
    try:
        return cluster.create_topic(
            name, partitions, schema.serialize().to_pybytes(), dict(overrides)
        )
    except TopicAlreadyExistsError:
        try:
            return cluster.topic(name)
        except UnknownTopicOrPartitionError:
            # Another broker created it a moment ago; this broker's view has yet to
            # show it: the caller retries.
            raise CoordinatorNotAvailableError(
                f"{name} was just created by another broker; not visible here yet"
            ) from None
