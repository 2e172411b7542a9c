"""The one Flight connection cache, and the broker client's retries of routing errors
(an any-broker call's against a real broker process)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow.flight as flight
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.client.connections import FlightConnections
from broker_core.client.routes import ClusterView
from broker_core.errors import (
    ConcurrentTransactionsError,
    InvalidConfigError,
    NetworkError,
    NotCoordinatorError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.admin_requests import BrokerAddress, MetadataRequest
from broker_core.protocol.requests import Request
from tests.broker.helpers import TEST_BROKER_CONFIG
from tests.harness.broker import BrokerFactory
from tests.harness.tcp_proxy import TcpProxy
from tests.harness.waiting import wait_until

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


def _dead_controller_view(live: str) -> ClusterView:
    """What every survivor answers METADATA with while a SIGKILLed controller's ZooKeeper
    session has not expired: broker 1 (``DEAD``) still listed, and still the controller;
    broker 2 the live one."""
    host, _, port = live.rpartition(":")
    brokers = {1: BrokerAddress(1, "127.0.0.1", 1), 2: BrokerAddress(2, host, int(port))}
    return ClusterView(brokers, controller=1, topics={})


def _record_sends(client: BrokerClient, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The address of each request ``client`` sends from now on (sent as before)."""
    tried: list[str] = []
    send = client._send

    def recorded(address: str, request: Request) -> dict[str, object]:
        tried.append(address)
        return send(address, request)

    monkeypatch.setattr(client, "_send", recorded)
    return tried


def test_an_any_broker_retry_goes_past_a_dead_controller_to_a_live_broker(
    broker_factory: BrokerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI's flake: a stream's topic check (DescribeTopics) after the SIGKILL of the broker
    that was also the controller. Every retry went back to the controller the metadata
    still named, and the call failed; the retry after the refused connection goes to the
    next known broker instead."""
    live = broker_factory(TEST_BROKER_CONFIG)
    with BrokerClient(live.address) as setup:
        setup.create_topic("described", 2)
    view = _dead_controller_view(live.address)
    with BrokerClient(f"{DEAD},{live.address}", retries=3, retry_backoff_s=0.001) as client:
        client._view = view
        monkeypatch.setattr(client, "refresh_metadata", lambda: view)  # the window, held
        tried = _record_sends(client, monkeypatch)
        (described,) = client.describe_topics(["described"])
        assert len(described.partitions) == 2
        assert tried == [DEAD, live.address]
        # FIND_COORDINATOR and a producer id without a transactional id too.
        del tried[:]
        assert client.state_partition_count() == 1
        assert client.init_producer_id()[1] == 0
        assert tried == [DEAD, live.address, DEAD, live.address]


def test_an_any_broker_retry_comes_back_to_a_controller_that_failed_for_a_moment(
    broker_factory: BrokerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retries go round the known brokers, the controller first: a controller whose
    connection broke once (a cut link, a restart) is asked again after the others failed,
    and at once after an answer with another routing error; it is not left out for the
    rest of the call."""
    live = broker_factory(TEST_BROKER_CONFIG)
    host, _, port = live.address.rpartition(":")
    second = "127.0.0.1:2"  # nothing listens there either
    view = ClusterView(
        {
            1: BrokerAddress(1, host, int(port)),
            2: BrokerAddress(2, "127.0.0.1", 2),
            3: BrokerAddress(3, "127.0.0.1", 1),
        },
        controller=1,
        topics={},
    )
    with BrokerClient(live.address, retries=5, retry_backoff_s=0.001) as client:
        client._view = view
        monkeypatch.setattr(client, "refresh_metadata", lambda: view)
        tried = _record_sends(client, monkeypatch)
        send = client._send
        refusals: dict[str, list[Exception]] = {}  # address -> its next answers, injected

        def refusing(address: str, request: Request) -> dict[str, object]:
            if refusals.get(address):
                tried.append(address)
                raise refusals[address].pop(0)
            return send(address, request)

        monkeypatch.setattr(client, "_send", refusing)
        refusals[live.address] = [NetworkError("connection reset")]
        client.describe_topics()
        assert tried == [live.address, second, DEAD, live.address]

        del tried[:]
        refusals[live.address] = [NetworkError("connection reset")]
        refusals[second] = [NotCoordinatorError("moved")]  # it answers, with a routing error
        client.describe_topics()
        assert tried == [live.address, second, live.address]


def _refusing_once(
    send: Callable[[str, Request], dict[str, Any]], address: str, tried: list[str]
) -> Callable[[str, Request], dict[str, Any]]:
    """``send``, but its next call to ``address`` fails as a broken connection."""
    refused: list[str] = []

    def refusing(to: str, request: Request) -> dict[str, Any]:
        if to == address and not refused:
            refused.append(to)
            tried.append(to)
            raise NetworkError("connection reset")
        return send(to, request)

    return refusing


@contextlib.contextmanager
def _silent_peer() -> Iterator[str]:
    """An address whose port accepts connections and never answers: what a SIGSTOPped
    broker is to a client (the kernel completes the handshake, nothing reads)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


def test_a_metadata_refresh_waits_for_a_silent_broker_once_not_in_every_refresh(
    broker_factory: BrokerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster whose first broker is paused still lists it first in every METADATA
    answer until its ZooKeeper session expires. Each refresh asked it first and waited out
    the call's timeout; now a broker whose last refresh call failed is asked last, so the
    silent one costs one timeout, and is asked again only when the others fail."""
    live = broker_factory(TEST_BROKER_CONFIG)
    with (
        _silent_peer() as silent,
        BrokerClient(f"{silent},{live.address}", timeout_s=0.5, retries=0) as client,
    ):
        host, _, port = silent.rpartition(":")
        tried: list[str] = []
        send = client._send

        def as_a_cluster(address: str, request: Request) -> dict[str, Any]:
            # The live broker's real answer, with the paused broker listed first, as
            # every member of such a cluster answers.
            tried.append(address)
            doc = send(address, request)
            if request.ACTION == MetadataRequest.ACTION:
                paused = {"broker_id": 99, "host": host, "port": int(port)}
                doc = {**doc, "brokers": [paused, *doc["brokers"]]}
            return doc

        monkeypatch.setattr(client, "_send", as_a_cluster)
        view = client.refresh_metadata()
        assert tried == [silent, live.address]  # the timeout happened, once
        assert next(iter(view.brokers)) == 99
        del tried[:]
        for _ in range(3):
            client.refresh_metadata()
        assert tried == [live.address] * 3

        # The live broker fails one refresh: the silent one is asked after it, not never.
        del tried[:]
        monkeypatch.setattr(client, "_send", _refusing_once(as_a_cluster, live.address, tried))
        with pytest.raises(NetworkError):
            client.refresh_metadata()
        assert tried == [live.address, silent]


class _HoldingServer(flight.FlightServerBase):  # type: ignore[misc]
    """Answers every action at once but ``hold``, which waits for ``release``; records
    each call's peer (the client's address and port: its connection)."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.release = threading.Event()
        self.peers: dict[str, list[str]] = {"hold": [], "ping": []}

    def do_action(
        self, context: flight.ServerCallContext, action: flight.Action
    ) -> Iterator[bytes]:
        self.peers[action.type].append(context.peer())
        if action.type == "hold":
            self.release.wait(30)
        return iter([b"ok"])


def test_a_timed_out_calls_channel_is_closed_before_the_retry() -> None:
    """Issue 36: the request of a call that timed out stays on its connection (a stalled
    link delivers it late); the connection is closed before the caller retries, and the
    retry goes on a fresh one; a stream's channel to the same broker, in use meanwhile,
    stays open. Through a TCP proxy that sees the client hang up."""
    server = _HoldingServer()
    connections = FlightConnections()
    try:
        with TcpProxy(f"127.0.0.1:{server.port}") as proxy:
            quick = flight.FlightCallOptions(timeout=10)
            # A stream's channel, held as a produce stream holds it (connected by a call).
            streams = connections.get(proxy.address)
            assert list(streams.do_action(flight.Action("ping", b""), quick))
            assert connections.call_action(proxy.address, flight.Action("ping", b""), quick)
            with pytest.raises(flight.FlightTimedOutError):
                connections.call_action(
                    proxy.address, flight.Action("hold", b""), flight.FlightCallOptions(timeout=0.5)
                )
            wait_until(lambda: proxy.client_hangups == 1, "the timed-out call's connection closed")
            # The retry: on a new connection, from another port.
            assert connections.call_action(proxy.address, flight.Action("ping", b""), quick)
            assert proxy.connections == 3 and proxy.client_hangups == 1
            stream_peer, action_peer, retry_peer = server.peers["ping"]
            assert server.peers["hold"] == [action_peer]
            assert len({stream_peer, action_peer, retry_peer}) == 3
            assert list(streams.do_action(flight.Action("ping", b""), quick))  # still open
    finally:
        server.release.set()
        connections.close()
        server.shutdown()


def test_close_never_closes_a_channel_a_call_is_counted_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker stopping closes its replica fetchers' connections while a fetcher may be
    between taking its channel and calling on it: the call runs on that channel (once
    closed, a Flight client raises ArrowInvalid: "FlightClient is closed"), which is
    closed when the call returns; the cache stays usable."""
    server = _HoldingServer()
    connections = FlightConnections()
    counted = connections._counted
    closed_at_count: list[bool] = []

    def close_right_after_counting(key: Any, client: flight.FlightClient) -> bool:
        ok = counted(key, client)
        if ok and not closed_at_count:
            connections.close()  # the stop, between the count and the call
            closed_at_count.append(True)
        return ok

    monkeypatch.setattr(connections, "_counted", close_right_after_counting)
    try:
        with TcpProxy(f"127.0.0.1:{server.port}") as proxy:
            quick = flight.FlightCallOptions(timeout=10)
            results = connections.call_action(proxy.address, flight.Action("ping", b""), quick)
            assert closed_at_count == [True]
            assert [r.body.to_pybytes() for r in results] == [b"ok"]
            assert connections.addresses() == []
            wait_until(lambda: proxy.client_hangups == 1, "its channel closed after the call")
            assert connections.call_action(proxy.address, flight.Action("ping", b""), quick)
            assert proxy.connections == 2
    finally:
        server.release.set()
        connections.close()
        server.shutdown()
