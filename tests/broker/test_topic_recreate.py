"""A topic deleted and recreated under its name is another topic (docs/failure-model.md,
"Topic ids"): its id differs, and what knew the old one is refused, never mixed in."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import IdemlogError, UnknownTopicIdError
from tests.broker.helpers import SCHEMA, rows
from tests.harness.broker import BrokerProcess

ClientFor = Callable[..., BrokerClient]


def test_metadata_and_describe_name_the_id_and_a_recreated_topic_has_another(
    shared_broker: BrokerProcess, client_for: ClientFor
) -> None:
    client = client_for(shared_broker)
    client.create_topic("recreated-ids", 2, schema=SCHEMA)
    first = client.topic_id("recreated-ids")
    (described,) = client.describe_topics(["recreated-ids"])
    assert described.topic_id == first and len(first) == 32
    assert client.metadata().topic_ids["recreated-ids"] == first

    client.delete_topic("recreated-ids")
    client.create_topic("recreated-ids", 2, schema=SCHEMA)
    second = client.topic_id("recreated-ids", refresh=True)
    assert second != first and len(second) == 32


def test_a_request_with_the_old_id_is_refused_with_code_100_naming_both_ids(
    shared_broker: BrokerProcess, client_for: ClientFor
) -> None:
    client = client_for(shared_broker)
    client.create_topic("stale-id", 1, schema=SCHEMA)
    old = client.topic_id("stale-id")
    with client.produce_stream("stale-id", 0, topic_id=old) as stream:
        stream.send(rows(5)).result(10)
    client.delete_topic("stale-id")
    client.create_topic("stale-id", 1, schema=SCHEMA)
    new = client.topic_id("stale-id", refresh=True)
    line = f"topic 'stale-id' was recreated: id {old} is now {new}"

    refusals: list[IdemlogError] = []
    with pytest.raises(UnknownTopicIdError) as fetched:
        client.fetch_once("stale-id", 0, 0, topic_id=old)
    refusals.append(fetched.value)
    with pytest.raises(UnknownTopicIdError) as listed:
        client.list_offsets("stale-id", 0, topic_id=old)
    refusals.append(listed.value)
    with (
        pytest.raises(UnknownTopicIdError) as produced,
        client.produce_stream("stale-id", 0, topic_id=old) as stream,
    ):
        stream.send(rows(5, start=100)).result(10)
    refusals.append(produced.value)
    for error in refusals:
        assert error.code == 100 and not error.retriable
        assert error.message == line
    # Under the new id (and without one, as an older client) the new topic is served,
    # and it holds none of the old rows.
    assert client.list_offsets("stale-id", 0, topic_id=new)["log_end_offset"] == 0
    assert client.read_table("stale-id", 0, topic_id=new) is None
