"""What ``BrokerClient``'s calls route by: the cluster view from METADATA and the routing
methods the families of calls (``client.admin_calls``, ``client.txn_calls``) use, which
``BrokerClient`` (``client.broker_client``) implements."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker_core.client.producer_tokens import ProducerTokenBook

# The metadata's broker, named here with the view that holds it (protocol.admin_requests).
from broker_core.protocol.admin_requests import BrokerAddress
from broker_core.protocol.coordinator_keys import CoordinatorAddress, state_partition_of
from broker_core.protocol.requests import Request


@dataclass(frozen=True)
class ClusterView:
    brokers: dict[int, BrokerAddress]
    controller: int | None
    topics: dict[str, list[int]]  # topic -> leader broker id per partition
    # topic -> its id (chosen at creation; a recreated topic has another). A topic stored
    # before ids existed is absent until its store writes one.
    topic_ids: dict[str, str] = field(default_factory=dict)


class Routes(Protocol):
    """The routing a family of calls needs from its client (see ``BrokerClient``)."""

    _bootstrap: list[str]
    _view: ClusterView | None
    producer_tokens: ProducerTokenBook

    def refresh_metadata(self) -> ClusterView: ...

    def metadata(self, refresh: bool = False) -> ClusterView: ...

    def list_offsets(
        self, topic: str, partition: int, *, topic_id: str | None = None
    ) -> dict[str, int]: ...

    def metrics_per_broker(self, top: int = ...) -> list[dict[str, Any]]: ...

    def stable_ends(self, topic: str) -> dict[int, int]: ...

    def _send(self, address: str, request: Request) -> dict[str, Any]: ...

    def _any_broker(self, request: Request) -> dict[str, Any]: ...

    def _leader_action(self, topic: str, partition: int, request: Request) -> dict[str, Any]: ...

    def _controller_action(self, request: Request) -> dict[str, Any]: ...

    def _coordinator_action(self, request: Request, key: str) -> dict[str, Any]: ...

    def _state_partition_action(self, state_partition: int, request: Request) -> dict[str, Any]: ...

    def _fan_out(self, request_of: Callable[[int], Request]) -> dict[int, dict[str, Any]]: ...

    def state_partition_count(self) -> int: ...


class CoordinatorCache:
    """The transaction coordinators a client knows: one address per ``__transaction_state``
    partition, as FIND_COORDINATOR last named it, and the partition count it reported
    (bounded by that count). Thread-safe. A key's entry is found by its state partition
    (``protocol.coordinator_keys.state_partition_of``), so every key of one partition
    shares it, and a failover refreshes only the entry of the partition that moved."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: int | None = None
        self._by_partition: dict[int, str] = {}

    @property
    def partition_count(self) -> int | None:
        """The count the last answer reported, None before any."""
        return self._count

    def partition_of(self, key: str) -> int | None:
        """``key``'s state partition, None while the count is unknown."""
        count = self._count
        return None if count is None else state_partition_of(key, count)

    def address(self, state_partition: int) -> str | None:
        """The cached coordinator of ``state_partition``, None when none is cached."""
        with self._lock:
            return self._by_partition.get(state_partition)

    def learn(self, answer: CoordinatorAddress) -> None:
        """Cache FIND_COORDINATOR's ``answer``; a different partition count (a cluster
        whose topic was re-created) drops every other entry, which it would misroute."""
        with self._lock:
            if self._count != answer.state_partitions:
                self._by_partition.clear()
                self._count = answer.state_partitions
            self._by_partition[answer.state_partition] = answer.address

    def cached(self) -> dict[int, str]:
        """A copy of the entries (for tests and tools)."""
        with self._lock:
            return dict(self._by_partition)
