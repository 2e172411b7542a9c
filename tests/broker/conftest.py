"""Fixtures and helpers for the broker tests: real broker subprocesses and their clients."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.protocol.wire import SinkAttempt
from tests.harness.broker import BrokerFactory, BrokerProcess, broker_factory
from tests.harness.zk_fixtures import zk_chroot, zk_client, zk_server
from tests.store.helpers import SCHEMA, rows

__all__ = [
    "SCHEMA",
    "broker_factory",
    "client_for",
    "ids",
    "prepared_attempt",
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


def prepared_attempt(
    client: BrokerClient,
    attempt: SinkAttempt,
    task: int,
    topic: str,
    batches: dict[int, list[range]],
    *,
    timeout_ms: int | None = None,
) -> tuple[str, int, int]:
    """One sink task attempt as the Spark writer makes it: InitProducerId for
    ``<sink>/<task>``, the id ranges of ``batches[p]`` into partition p in one
    transaction, then prepare with the offsets they got. Its (transactional id, pid,
    epoch), for the driver's commit."""
    tid = f"{attempt.sink_id}/{task}"
    pid, epoch, _ = client.init_sink_producer(tid, timeout_ms, attempt)
    client.add_partitions_to_txn(tid, pid, epoch, [(topic, p) for p in batches])
    ranges = []
    for p, spans in batches.items():
        with client.produce_stream(topic, p) as stream:
            acked, sequence = [], 0
            for span in spans:
                acked.append(
                    stream.send(
                        rows(len(span), start=span.start),
                        producer_id=pid,
                        producer_epoch=epoch,
                        base_sequence=sequence,
                        transactional=True,
                    ).offsets(10)
                )
                sequence += len(span)
        ranges.append((topic, p, acked[0][0], acked[-1][1]))
    client.prepare_sink_txn(tid, pid, epoch, attempt.batch_id, ranges)
    return tid, pid, epoch
