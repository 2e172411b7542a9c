"""Fixtures and helpers for the broker tests: real broker subprocesses and their clients."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker_core.client import BrokerClient
from tests.harness.broker import BrokerFactory, BrokerProcess, broker_factory
from tests.harness.zk_fixtures import zk_chroot, zk_client, zk_server
from tests.store.helpers import SCHEMA, rows

__all__ = [
    "SCHEMA",
    "broker_factory",
    "client_for",
    "ids",
    "rows",
    "shared_broker",
    "wait_until",
    "zk_chroot",
    "zk_client",
    "zk_server",
]

# Small limits, so the tests can hit them with small batches.
TEST_BROKER_CONFIG: dict[str, object] = {
    "max.request.bytes": 256 * 1024,
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 100,
}


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


def ids(
    client: BrokerClient, topic: str, partition: int = 0, isolation: str = "read_committed"
) -> list[int]:
    """Every id readable from the partition, in offset order."""
    result: list[int] = []
    for _meta, batch in client.fetch(topic, partition, isolation=isolation):
        result.extend(batch.column("id").to_pylist())
    return result


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Poll ``condition`` (a request to another process) until true, within a deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)  # polling interval of state held by another process
