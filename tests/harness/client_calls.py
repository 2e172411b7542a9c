"""Client calls only tests make (kept out of ``BrokerClient``, which has no use for them)."""

from __future__ import annotations

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import NetworkError


def answering_address(client: BrokerClient) -> str:
    """The controller's address after a fresh metadata request, else any live broker's:
    where a test sends a raw action (FIND_COORDINATOR) that any broker answers. Raises
    ``NetworkError`` if no known broker answers or the cluster reports none alive."""
    view = client.metadata(refresh=True)
    if view.controller is not None and view.controller in view.brokers:
        return view.brokers[view.controller].address
    if not view.brokers:
        raise NetworkError("the cluster reports no live broker")
    return next(iter(view.brokers.values())).address
