"""Fixtures of the broker tests: a module-wide broker process and a factory of its clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker_core.client.broker_client import BrokerClient
from tests.broker.helpers import TEST_BROKER_CONFIG
from tests.harness.broker import BrokerFactory, BrokerProcess


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One embedded broker for a whole module (tests use distinct topic names)."""
    factory = BrokerFactory(tmp_path_factory.mktemp("shared-broker"))
    try:
        yield factory(TEST_BROKER_CONFIG, name="shared")
    finally:
        factory.close()


@pytest.fixture
def client_for() -> Iterator[Callable[..., BrokerClient]]:
    """``client_for(broker, **options)``: a BrokerClient bootstrapped from it, closed at
    teardown."""
    clients: list[BrokerClient] = []

    def make(broker: BrokerProcess, **options: Any) -> BrokerClient:
        options.setdefault("timeout_s", 20.0)
        client = BrokerClient(broker.address, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
