"""A topic deleted and recreated under its name is another topic (docs/failure-model.md,
"Topic ids"): its id differs, and what knew the old one is refused, never mixed in."""

from __future__ import annotations

from collections.abc import Callable

from broker_core.client.broker_client import BrokerClient
from tests.broker.helpers import SCHEMA
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
