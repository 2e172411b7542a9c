"""Clients on shared connections share the coordinators they learned
(``FlightConnections.coordinators``), against a real broker process: a second client of
the same bootstrap does not ask FIND_COORDINATOR again, a stale shared entry is corrected
by the request that fails on it, and the caches are bounded."""

from __future__ import annotations

import socket

from broker_core.client.broker_client import BrokerClient
from broker_core.client.connections import MAX_COORDINATOR_CACHES, FlightConnections
from broker_core.protocol.coordinator_keys import CoordinatorAddress
from tests.broker.helpers import TEST_BROKER_CONFIG
from tests.harness.broker import BrokerFactory


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed on exit: nothing listens there


def test_clients_of_one_bootstrap_share_what_find_coordinator_answered(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory(TEST_BROKER_CONFIG)
    shared = FlightConnections()
    try:
        first = BrokerClient(broker.address, connections=shared)
        first.sink_heartbeat("sink", "run")  # asks FIND_COORDINATOR, then beats
        learned = first.coordinators.cached()
        assert learned == {0: broker.address}
        second = BrokerClient(broker.address, connections=shared)
        assert second.coordinators.cached() == learned  # nothing to ask
        with BrokerClient(broker.address) as own:  # connections of its own: a cache too
            assert own.coordinators.cached() == {}
        other = BrokerClient(f"localhost:{broker.address.split(':')[1]}", connections=shared)
        assert other.coordinators.cached() == {}  # another bootstrap list
    finally:
        shared.close()


def test_a_stale_shared_entry_is_asked_again_and_corrected(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(TEST_BROKER_CONFIG)
    shared = FlightConnections()
    try:
        client = BrokerClient(broker.address, connections=shared, retry_backoff_s=0.01)
        dead = _dead_port()
        # What a coordinator that has since moved (or a broker gone) leaves behind.
        client.coordinators.learn(CoordinatorAddress(1, "127.0.0.1", dead))
        assert client.coordinators.cached() == {0: f"127.0.0.1:{dead}"}
        client.sink_heartbeat("sink", "run")  # fails on the dead address, asks, succeeds
        again = BrokerClient(broker.address, connections=shared)
        assert again.coordinators.cached() == {0: broker.address}
    finally:
        shared.close()


def test_at_most_max_coordinator_caches_bootstrap_lists_are_kept() -> None:
    shared = FlightConnections()
    first = shared.coordinators(["127.0.0.1:1"])
    assert shared.coordinators(["127.0.0.1:1"]) is first
    for port in range(2, MAX_COORDINATOR_CACHES + 2):
        shared.coordinators([f"127.0.0.1:{port}"])
    assert len(shared._coordinators) == MAX_COORDINATOR_CACHES
    assert shared.coordinators(["127.0.0.1:1"]) is not first  # the oldest was dropped
