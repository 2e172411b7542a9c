"""What ``BrokerClient``'s calls route by: the cluster view from METADATA and the routing
methods the families of calls (``client.admin_calls``, ``client.txn_calls``) use, which
``BrokerClient`` (``client.broker_client``) implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from broker_core.protocol.requests import Request


@dataclass(frozen=True)
class BrokerAddress:
    broker_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ClusterView:
    brokers: dict[int, BrokerAddress]
    controller: int | None
    topics: dict[str, list[int]]  # topic -> leader broker id per partition


class Routes(Protocol):
    """The routing a family of calls needs from its client (see ``BrokerClient``)."""

    _bootstrap: list[str]
    _view: ClusterView | None

    def refresh_metadata(self) -> ClusterView: ...

    def metadata(self, refresh: bool = False) -> ClusterView: ...

    def list_offsets(self, topic: str, partition: int) -> dict[str, int]: ...

    def metrics_per_broker(self) -> list[dict[str, Any]]: ...

    def stable_ends(self, topic: str) -> dict[int, int]: ...

    def _send(self, address: str, request: Request) -> dict[str, Any]: ...

    def _any_broker(self, request: Request) -> dict[str, Any]: ...

    def _leader_action(self, topic: str, partition: int, request: Request) -> dict[str, Any]: ...

    def _controller_action(self, request: Request) -> dict[str, Any]: ...

    def _coordinator_action(self, request: Request) -> dict[str, Any]: ...
