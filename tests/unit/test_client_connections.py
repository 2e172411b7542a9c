"""The one Flight connection cache, and the broker client's retries of routing errors."""

from __future__ import annotations

import threading

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.client.connections import FlightConnections
from broker_core.errors import (
    ConcurrentTransactionsError,
    InvalidConfigError,
    NetworkError,
    NotCoordinatorError,
    UnknownTopicOrPartitionError,
)

DEAD = "127.0.0.1:1"  # nothing listens on port 1: a connection is refused at once


def test_one_client_per_address_until_reset() -> None:
    connections = FlightConnections()
    try:
        first = connections.get("127.0.0.1:9")
        assert connections.get("127.0.0.1:9") is first
        other = connections.get("127.0.0.1:10")
        assert other is not first
        assert connections.addresses() == ["127.0.0.1:10", "127.0.0.1:9"]
        connections.reset("127.0.0.1:9")
        assert connections.addresses() == ["127.0.0.1:10"]
        assert connections.get("127.0.0.1:9") is not first
        connections.reset("127.0.0.1:11")  # never opened: nothing to do
    finally:
        connections.close()
    assert connections.addresses() == []


def test_concurrent_gets_share_one_client() -> None:
    connections = FlightConnections()
    got: list[object] = []
    start = threading.Barrier(8)

    def get() -> None:
        start.wait()
        got.append(connections.get("127.0.0.1:9"))

    threads = [threading.Thread(target=get) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    connections.close()
    assert len(got) == 8 and all(c is got[0] for c in got)


def _attempts(client: BrokerClient, error: Exception, partition: tuple[str, int] | None) -> int:
    calls: list[str] = []

    def call(address: str) -> None:
        calls.append(address)
        raise error

    with pytest.raises(type(error)):
        client._routed(lambda _retry: DEAD, call, partition)
    return len(calls)


def test_routing_errors_are_retried_up_to_the_limit() -> None:
    with BrokerClient(DEAD, retries=3, retry_backoff_s=0.001) as client:
        # Each retry first refreshes the metadata: no broker answers (NetworkError),
        # which does not end the retries.
        assert _attempts(client, NotCoordinatorError("elsewhere"), None) == 4
        assert _attempts(client, NetworkError("refused"), None) == 4
    with BrokerClient(DEAD, retries=0, retry_backoff_s=0.001) as client:
        assert _attempts(client, NotCoordinatorError("elsewhere"), None) == 1


def test_other_errors_are_the_callers_even_when_retriable() -> None:
    with BrokerClient(DEAD, retries=3, retry_backoff_s=0.001) as client:
        assert ConcurrentTransactionsError("busy").retriable
        assert _attempts(client, ConcurrentTransactionsError("busy"), None) == 1
        # Unknown topic, no partition to check in the metadata: not retried.
        assert _attempts(client, UnknownTopicOrPartitionError("nope"), None) == 1


def test_negative_retry_settings_are_refused_by_name() -> None:
    with pytest.raises(InvalidConfigError, match="retries=-1"):
        BrokerClient(DEAD, retries=-1)
    with pytest.raises(InvalidConfigError, match=r"retry_backoff_s=-0\.5"):
        BrokerClient(DEAD, retry_backoff_s=-0.5)
