"""``BrokerClient``'s routing of coordinator calls with several ``__transaction_state``
partitions: one cached coordinator per state partition, each keyed call to its key's,
only the failed partition's entry refreshed, key-less calls fanned out to every one and
failing whole (naming the partition) when one is unavailable.

One class under test (``BrokerClient``); the brokers are a table answering ``_send``."""

from __future__ import annotations

from typing import Any

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.client.routes import CoordinatorCache
from broker_core.errors import (
    CoordinatorNotAvailableError,
    InvalidRequestError,
    NotCoordinatorError,
)
from broker_core.protocol.admin_requests import (
    FindCoordinatorRequest,
    ListOffsetsRequest,
    ListTransactionsRequest,
    MetadataRequest,
)
from broker_core.protocol.coordinator_keys import CoordinatorAddress, state_partition_of
from broker_core.protocol.requests import Request
from broker_core.protocol.stable_cut import TrackedBatches, TrackedBatchesRequest
from broker_core.protocol.txn_requests import SinkHeartbeatRequest

COUNT = 3


class Brokers:
    """Three brokers ``h<n>:1``; ``leaders``: state partition -> the broker that leads it."""

    def __init__(self) -> None:
        self.leaders = {0: 1, 1: 2, 2: 3}
        self.finds: list[int] = []  # the state partition each FIND_COORDINATOR answered
        self.calls: list[tuple[str, Request]] = []
        self.down: set[int] = set()  # state partitions with no coordinator
        self.batches: dict[int, list[list[tuple[int, int, int]]]] = {}

    def send(self, address: str, request: Request) -> dict[str, Any]:
        if isinstance(request, MetadataRequest):
            brokers = [{"broker_id": b, "host": f"h{b}", "port": 1} for b in (1, 2, 3)]
            return {"brokers": brokers, "controller": 1, "topics": {"t": [1, 2]}}
        if isinstance(request, FindCoordinatorRequest):
            p = request.state_partition
            if p is None:
                p = state_partition_of(request.transactional_id or "", COUNT)
            self.finds.append(p)
            b = self.leaders[p]
            return CoordinatorAddress(b, f"h{b}", 1, p, COUNT).to_doc()
        if isinstance(request, ListOffsetsRequest):
            return {"last_stable_offset": 100, "log_end_offset": 100}
        self.calls.append((address, request))
        p = self._partition(request)
        if p in self.down:
            raise CoordinatorNotAvailableError(f"partition {p} has no live leader")
        if address != f"h{self.leaders[p]}:1":
            raise NotCoordinatorError(f"{address} does not lead state partition {p}")
        if isinstance(request, ListTransactionsRequest):
            rows = [
                {
                    "transactional_id": f"id-{p}",
                    "producer_id": p,
                    "producer_epoch": 0,
                    "age_ms": 10 * p,
                    "idle_ms": 0,
                }
            ]
            return {"transactions": rows, "state_partitions": [p]}
        if isinstance(request, TrackedBatchesRequest):
            return TrackedBatches("inc", 0, -1, {}, self.batches.get(p, [])).to_doc()
        return {}

    @staticmethod
    def _partition(request: Request) -> int:
        if isinstance(request, SinkHeartbeatRequest):
            return state_partition_of(request.sink_id, COUNT)
        partition = getattr(request, "state_partition", None)
        assert partition is not None, request
        return int(partition)


@pytest.fixture
def brokers(monkeypatch: pytest.MonkeyPatch) -> tuple[Brokers, BrokerClient]:
    table = Brokers()
    client = BrokerClient("h1:1", retries=3, retry_backoff_s=0.0)
    monkeypatch.setattr(client, "_send", table.send)
    return table, client


def _sinks() -> dict[int, str]:
    """A sink id for each state partition."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < COUNT:
        found.setdefault(state_partition_of(f"sink-{n}", COUNT), f"sink-{n}")
        n += 1
    return found


def test_each_key_goes_to_its_partitions_coordinator_found_once(
    brokers: tuple[Brokers, BrokerClient],
) -> None:
    table, client = brokers
    sinks = _sinks()
    for _ in range(3):
        for p, sink in sinks.items():
            client.sink_heartbeat(sink, "run")
            assert table.calls[-1][0] == f"h{table.leaders[p]}:1"
    assert sorted(table.finds) == [0, 1, 2]  # one FIND_COORDINATOR per partition, cached
    assert client.coordinators.cached() == {p: f"h{b}:1" for p, b in table.leaders.items()}


def test_not_coordinator_refreshes_only_that_partitions_entry(
    brokers: tuple[Brokers, BrokerClient],
) -> None:
    table, client = brokers
    sinks = _sinks()
    for sink in sinks.values():
        client.sink_heartbeat(sink, "run")
    table.finds.clear()
    table.leaders[1] = 3  # partition 1's leadership moved (a failover)
    client.sink_heartbeat(sinks[1], "run")
    assert [a for a, _ in table.calls[-2:]] == ["h2:1", "h3:1"]  # refused, then rerouted
    assert table.finds == [1]
    assert client.coordinators.cached() == {0: "h1:1", 1: "h3:1", 2: "h3:1"}
    for p in (0, 2):  # the others still go where they went, without asking again
        client.sink_heartbeat(sinks[p], "run")
    assert table.finds == [1]


def test_a_key_less_listing_asks_every_partition_and_merges(
    brokers: tuple[Brokers, BrokerClient],
) -> None:
    table, client = brokers
    rows = client.list_transactions()
    asked = sorted(
        (a, r.state_partition) for a, r in table.calls if isinstance(r, ListTransactionsRequest)
    )
    assert asked == [("h1:1", 0), ("h2:1", 1), ("h3:1", 2)]
    assert [(r.transactional_id, r.state_partition) for r in rows] == [
        ("id-2", 2),  # oldest first across partitions
        ("id-1", 1),
        ("id-0", 0),
    ]


def test_a_key_less_call_fails_whole_naming_an_unavailable_partition(
    brokers: tuple[Brokers, BrokerClient],
) -> None:
    table, client = brokers
    table.down.add(1)
    with pytest.raises(CoordinatorNotAvailableError, match=r"__transaction_state-1") as info:
        client.list_transactions()
    assert info.value.retriable
    with pytest.raises(CoordinatorNotAvailableError, match=r"__transaction_state-1"):
        client.stable_ends("t")  # a reader's cut is never built from a subset


def test_a_readers_cut_combines_every_partitions_batches(
    brokers: tuple[Brokers, BrokerClient],
) -> None:
    table, client = brokers
    # Partition 2's coordinator tracks a batch across both topic partitions, cut by the
    # LSO (100) in partition 0: the reader stops before it in both.
    table.batches[2] = [[(0, 90, 110), (1, 50, 60)]]
    assert client.stable_ends("t") == {0: 90, 1: 50}
    asked = {r.state_partition for _, r in table.calls if isinstance(r, TrackedBatchesRequest)}
    assert asked == {0, 1, 2}


def test_the_cache_drops_its_entries_when_the_count_changes() -> None:
    cache = CoordinatorCache()
    assert cache.partition_count is None and cache.partition_of("k") is None
    cache.learn(CoordinatorAddress(1, "h1", 1, 0, 2))
    cache.learn(CoordinatorAddress(2, "h2", 1, 1, 2))
    assert cache.cached() == {0: "h1:1", 1: "h2:1"}
    cache.learn(CoordinatorAddress(3, "h3", 1, 2, 4))  # a re-created topic: 4 partitions
    assert cache.cached() == {2: "h3:1"} and cache.partition_count == 4
    assert cache.partition_of("k") == state_partition_of("k", 4)


def test_a_find_coordinator_answer_out_of_range_is_refused() -> None:
    doc = CoordinatorAddress(1, "h", 1, 0, 2).to_doc() | {"state_partition": 2}
    with pytest.raises(InvalidRequestError, match="state partition 2 of 2"):
        CoordinatorAddress.from_doc(doc)
    with pytest.raises(InvalidRequestError, match="'state_partition'"):
        FindCoordinatorRequest.from_doc({"state_partition": -1})
    with pytest.raises(InvalidRequestError, match="not both"):
        FindCoordinatorRequest.from_doc({"state_partition": 1, "transactional_id": "x"})
