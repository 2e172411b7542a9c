"""Topic lookups the driver makes while planning a read or a write."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pyarrow as pa

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import (
    SchemaMismatchError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

from .errors import topic_recreated
from .options import IdemlogOptions
from .schema import check_compatible


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: int
    schema: pa.Schema | None  # None: created without one and never written
    # The id the topic had when the driver looked (a recreated topic has another): what a
    # reader's ranges and a sink's tasks send, so the broker refuses them on a recreated
    # topic. "": a topic stored before ids, unchecked.
    topic_id: str = ""

    @property
    def pinned_id(self) -> str | None:
        """The id requests carry (None: the topic has none yet, so nothing is checked)."""
        return self.topic_id or None


def describe(client: BrokerClient, topic: str) -> TopicInfo | None:
    try:
        docs = client.describe_topics([topic])
    except UnknownTopicOrPartitionError:
        return None
    if not docs:
        return None
    return TopicInfo(topic, len(docs[0].partitions), docs[0].schema, docs[0].topic_id)


def require(client: BrokerClient, options: IdemlogOptions) -> TopicInfo:
    """The topic a reader reads; its absence or missing schema is a clear error, and so
    is another id than the option ``topicId`` pins (UnknownTopicIdError: recreated)."""
    info = describe(client, options.topic)
    where = options.brokers or f"the embedded broker at {options.path}"
    if info is None:
        raise UnknownTopicOrPartitionError(
            f"topic {options.topic!r} does not exist on {where} (option 'topic')"
        )
    if options.topic_id and info.topic_id != options.topic_id:
        raise topic_recreated(
            options.topic, options.topic_id, info.topic_id, "option 'topicId' pinned it"
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
        with contextlib.suppress(TopicAlreadyExistsError):  # another writer created it now
            client.create_topic(options.topic, options.partitions, schema=schema)
        # Described again for its id, which the broker chose.
        info = describe(client, options.topic)
        if info is None:
            raise UnknownTopicOrPartitionError(
                f"topic {options.topic!r} was deleted while this write created it"
            )
    if info.schema is not None:
        check_compatible(options.topic, info.schema, schema)
    return info
