"""A broker reachable at another address than the one it binds (NAT, a proxy, a
container's port mapping): ``listener.advertised.host/port``, Kafka's advertised.listeners.

The broker binds every interface on one port; a user-space TCP proxy on another port
stands for the NAT in front of it, and the broker advertises the proxy. A client given
the proxy as its bootstrap is told the proxy by the metadata, and produces, commits and
reads through it; a client that reached the bound port directly is told the proxy too.
"""

from __future__ import annotations

import socket

import numpy as np
import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import InvalidConfigError
from broker_core.producer import Producer
from broker_core.server.config.broker_config import BrokerConfig
from tests.harness.broker import BrokerFactory
from tests.harness.tcp_proxy import TcpProxy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_clients_reach_the_broker_through_the_address_it_advertises(
    broker_factory: BrokerFactory,
) -> None:
    bound = _free_port()
    with TcpProxy(f"127.0.0.1:{bound}") as nat:
        broker = broker_factory(
            {
                "listener.host": "0.0.0.0",
                "listener.port": bound,
                "listener.advertised.host": "127.0.0.1",
                "listener.advertised.port": nat.port,
            }
        )
        # The LISTENING line names what clients are to use.
        assert broker.address == nat.address

        with BrokerClient(f"127.0.0.1:{bound}") as direct:
            (info,) = direct.metadata().brokers.values()
            assert info.address == nat.address

        ids = np.arange(1000, dtype=np.int64)
        with BrokerClient(nat.address) as client:
            client.create_topic("orders", 2)
            producer = Producer(nat.address, **{"transactional.id": "through-nat"})
            try:
                producer.init_transactions()
                producer.begin_transaction()
                producer.send("orders", pa.table({"id": ids, "key": ids % 7}), key="key")
                producer.commit_transaction()
            finally:
                producer.close()
            tables = [client.read_table("orders", p) for p in range(2)]
        got = np.sort(np.concatenate([t.column("id").to_numpy() for t in tables if t]))
        assert got.tolist() == ids.tolist()
        # It all went through the proxy: requests in, answers and rows out.
        assert nat.connections >= 1
        assert nat.bytes_to_target > ids.nbytes
        assert nat.bytes_from_target > ids.nbytes


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_wildcard_bind_needs_an_advertised_host(host: str) -> None:
    with pytest.raises(InvalidConfigError, match=r"listener\.advertised\.host"):
        BrokerConfig.from_mapping({"listener.host": host})
    config = BrokerConfig.from_mapping(
        {"listener.host": host, "listener.advertised.host": "broker-1.example"}
    )
    assert (config.listener_host, config.advertised_host, config.advertised_port) == (
        host,
        "broker-1.example",
        0,
    )


def test_without_advertised_keys_the_bind_address_is_advertised() -> None:
    config = BrokerConfig.from_mapping({"listener.host": "broker-0.internal"})
    assert (config.advertised_host, config.advertised_port) == ("broker-0.internal", 0)
