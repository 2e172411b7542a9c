"""Topic lookups the driver makes while planning a read or a write."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import (
    SchemaMismatchError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

from .options import IdemlogOptions
from .schema import check_compatible


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: int
    schema: pa.Schema | None  # None: created without one and never written


def describe(client: BrokerClient, topic: str) -> TopicInfo | None:
    try:
        docs = client.describe_topics([topic])
    except UnknownTopicOrPartitionError:
        return None
    if not docs:
        return None
    return TopicInfo(topic, len(docs[0].partitions), docs[0].schema)


def require(client: BrokerClient, options: IdemlogOptions) -> TopicInfo:
    """The topic a reader reads; its absence or missing schema is a clear error."""
    info = describe(client, options.topic)
    where = options.brokers or f"the embedded broker at {options.path}"
    if info is None:
        raise UnknownTopicOrPartitionError(
            f"topic {options.topic!r} does not exist on {where} (option 'topic')"
        )
    if info.schema is None:
        raise SchemaMismatchError(
            f"topic {options.topic!r} has no schema yet: nothing was ever written to it"
        )
    return info


def ensure_for_write(client: BrokerClient, options: IdemlogOptions, schema: pa.Schema) -> TopicInfo:
    """The topic a writer writes, created with ``schema`` if missing; a topic of another
    schema is refused before any row is written."""
    info = describe(client, options.topic)
    if info is None:
        try:
            client.create_topic(options.topic, options.partitions, schema=schema)
            return TopicInfo(options.topic, options.partitions, schema)
        except TopicAlreadyExistsError:
            info = describe(client, options.topic)  # another writer created it just now
            assert info is not None
    if info.schema is not None:
        check_compatible(options.topic, info.schema, schema)
    return info
