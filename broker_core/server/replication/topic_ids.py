"""The broker's check of a request's topic id (docs/protocol.md, "Topic ids").

A request naming a partition may carry the id its sender knows the topic by. It is
served only if that id is the topic's now and, where a local replica serves it, the id
of that replica's log. Which side is stale decides the answer:

* the sender's (the topic was deleted, maybe recreated, since it learned the id):
  ``UNKNOWN_TOPIC_ID``, not retriable: asking again under that id cannot succeed;
* this broker's: its cached metadata is re-read from the store before anything is
  refused, and a local copy of the topic's previous incarnation (not yet replaced) answers
  ``NOT_LEADER_OR_FOLLOWER``, retriable: the metadata callback replaces the copy.

A request without an id (an older client) is served as before, except from a local copy
the cached metadata already shows to be of a previous incarnation.
"""

from __future__ import annotations

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.errors import (
    NotLeaderOrFollowerError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
)


def check_topic_id(
    cluster: ClusterMetadata, broker_id: int, topic: str, asked: str | None, held: str = ""
) -> None:
    """Refuse a request naming ``topic`` by id ``asked`` unless that is the topic's id
    now and, when ``held`` (the id of the local replica that would serve it) is known,
    that replica's. Raises UnknownTopicIdError (the sender is stale),
    NotLeaderOrFollowerError (this broker's copy is), RequestTimedOutError (the store is
    away while this broker's view had to be re-read)."""
    try:
        current = cluster.topic(topic).topic_id
    except UnknownTopicOrPartitionError:
        current = ""
    if asked is None:
        # An older client: at least never served from a copy this broker already knows
        # to be of the topic's previous incarnation (no store read for it, though).
        if held and current and held != current:
            raise _stale_copy(broker_id, topic, held, current)
        return
    if current != asked:
        # The cache may be the older view (a client ahead of this broker): read the store.
        try:
            current = cluster.read_topic(topic).topic_id
        except UnknownTopicOrPartitionError:
            current = ""
        if current != asked:
            raise UnknownTopicIdError.recreated(topic, asked, current)
    if held and held != asked:
        raise _stale_copy(broker_id, topic, held, asked)


def _stale_copy(broker_id: int, topic: str, held: str, current: str) -> NotLeaderOrFollowerError:
    return NotLeaderOrFollowerError(
        f"broker {broker_id}: its copy of topic {topic!r} is of id {held}, the topic's "
        f"previous incarnation; it is being replaced by a copy of id {current}"
    )
