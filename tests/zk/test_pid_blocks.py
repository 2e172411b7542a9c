"""Producer-id blocks leased through a real ZooKeeper (docs/design.md §5, §9 scenario 11)."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import pytest

from broker_core.errors import ProducerIdAllocationError, ProducerIdSpaceExhaustedError
from broker_core.producer_ids.manager import (
    LATEST_PRODUCER_ID_BLOCK_PATH,
    MAX_PRODUCER_ID,
    PRODUCER_ID_BLOCK_SIZE,
    CorruptProducerIdBlockRecordError,
    ProducerIdBlock,
    ProducerIdManager,
    ZkProducerIdBlockSource,
)
from testkit.zookeeper import ClientFactory, ZooKeeperHarness
from tests.harness.waiting import wait_until

PATH = LATEST_PRODUCER_ID_BLOCK_PATH


def triples(blocks: list[ProducerIdBlock]) -> list[tuple[int, int, int]]:
    return [(b.broker_id, b.start, b.end) for b in blocks]


def stored(client: Any) -> tuple[ProducerIdBlock, int]:
    data, stat = client.get(PATH)
    return ProducerIdBlock.from_record(data, PATH), stat.version


def unavailable_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "idemlog.pid"
        and "ZooKeeper unavailable" in r.getMessage()
        and "retrying producer id block allocation in" in r.getMessage()
    ]


# -- scenario 11 -----------------------------------------------------------------------------


def test_scenario_11_brokers_alternate_blocks(zk_chroot: ZooKeeperHarness) -> None:
    a = ZkProducerIdBlockSource(zk_chroot.client())
    b = ZkProducerIdBlockSource(zk_chroot.client())

    got = [a.next_block(1), b.next_block(2), a.next_block(1), b.next_block(2)]

    assert triples(got) == [(1, 0, 999), (2, 1000, 1999), (1, 2000, 2999), (2, 3000, 3999)]
    # The node lives under this test's chroot and holds Kafka's record, byte for byte.
    with zk_chroot.admin_client() as admin:
        data, stat = admin.get(zk_chroot.chroot + PATH)
    assert data == b'{"version":1,"broker":2,"block_start":"3000","block_end":"3999"}'
    assert stat.version == 3  # one create, three conditional sets
    assert a.conflict_retries == b.conflict_retries == 0


def test_scenario_11_block_past_max_producer_id_is_refused(zk_client: ClientFactory) -> None:
    client = zk_client()
    # Pre-seed the node so that exactly one more block fits below 2^63-1.
    seed = ProducerIdBlock(5, MAX_PRODUCER_ID - 2000, MAX_PRODUCER_ID - 1001)
    client.create(PATH, seed.to_record())
    source = ZkProducerIdBlockSource(client)

    last = source.next_block(1)
    assert (last.start, last.end) == (MAX_PRODUCER_ID - PRODUCER_ID_BLOCK_SIZE, MAX_PRODUCER_ID - 1)
    assert last.start == 2**63 - 1 - 1000

    with pytest.raises(ProducerIdSpaceExhaustedError) as excinfo:
        source.next_block(1)
    assert excinfo.value.retriable is False
    assert str(MAX_PRODUCER_ID) in str(excinfo.value)  # the would-be start, 2^63-1
    # Nothing was written: the record still names the last block.
    assert stored(client) == (last, 1)


# -- concurrency and conflicts ---------------------------------------------------------------


def test_two_brokers_1000_concurrent_leases_are_disjoint_and_contiguous(
    zk_client: ClientFactory,
) -> None:
    sources = {broker: ZkProducerIdBlockSource(zk_client()) for broker in (1, 2)}
    threads_per_broker, leases_per_thread = 2, 250  # 2 brokers x 2 x 250 = 1000 leases
    start = threading.Barrier(2 * threads_per_broker)
    results: dict[str, list[ProducerIdBlock]] = {}
    errors: list[BaseException] = []

    def lease(name: str, broker: int) -> None:
        try:
            start.wait(timeout=30)
            results[name] = [sources[broker].next_block(broker) for _ in range(leases_per_thread)]
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=lease, args=(f"broker{b}-t{i}", b))
        for b in sources
        for i in range(threads_per_broker)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "lease threads hung"
    assert errors == []

    for name, blocks in results.items():
        broker = int(name[len("broker")])
        assert all(b.broker_id == broker for b in blocks)
        starts = [b.start for b in blocks]
        assert starts == sorted(starts), "one thread's blocks must move forward"
    every = sorted((b for blocks in results.values() for b in blocks), key=lambda b: b.start)
    assert len(every) == 1000
    # Contiguous from 0, no gap and no overlap: block i is exactly i*1000 .. i*1000+999.
    assert [(b.start, b.end) for b in every] == [(i * 1000, i * 1000 + 999) for i in range(1000)]
    assert stored(sources[1]._client) == (every[-1], 999)


class InterferingSource(ZkProducerIdBlockSource):
    """Lets another broker lease a block between this source's read and its first write."""

    def __init__(self, client: Any, intruder: ZkProducerIdBlockSource) -> None:
        super().__init__(client)
        self.intruder = intruder
        self.intruded: list[ProducerIdBlock] = []

    def _write_record(self, block: ProducerIdBlock, version: int | None, deadline: float) -> None:
        if not self.intruded:
            self.intruded.append(self.intruder.next_block(9))
        super()._write_record(block, version, deadline)


def test_conflicting_set_is_retried_after_re_reading(zk_client: ClientFactory) -> None:
    ZkProducerIdBlockSource(zk_client()).next_block(1)  # 0..999: the node exists
    source = InterferingSource(zk_client(), intruder=ZkProducerIdBlockSource(zk_client()))

    block = source.next_block(2)

    assert triples(source.intruded) == [(9, 1000, 1999)]
    assert source.conflict_retries == 1  # BadVersion, then re-read and retry
    assert (block.broker_id, block.start, block.end) == (2, 2000, 2999)
    assert stored(source._client) == (block, 2)


def test_conflicting_create_of_the_first_block_is_retried(zk_client: ClientFactory) -> None:
    source = InterferingSource(zk_client(), intruder=ZkProducerIdBlockSource(zk_client()))

    block = source.next_block(2)

    assert triples(source.intruded) == [(9, 0, 999)]
    assert source.conflict_retries == 1  # NodeExists, then re-read and retry
    assert (block.start, block.end) == (1000, 1999)


def test_corrupt_node_is_refused_naming_the_node(zk_chroot: ZooKeeperHarness) -> None:
    client = zk_chroot.client()
    client.create(PATH, b'{"version":1,"broker":1,"block_start":0,"block_end":999}')

    with pytest.raises(CorruptProducerIdBlockRecordError) as excinfo:
        ZkProducerIdBlockSource(client).next_block(1)

    assert zk_chroot.chroot + PATH in str(excinfo.value)
    assert excinfo.value.retriable is False


# -- ZooKeeper trouble -----------------------------------------------------------------------


class ExpiringSource(ZkProducerIdBlockSource):
    """Has its session expired between its read and its first write."""

    def __init__(self, client: Any, harness: ZooKeeperHarness) -> None:
        super().__init__(client, initial_backoff_s=0.05)
        self.harness = harness
        self.expired = False

    def _write_record(self, block: ProducerIdBlock, version: int | None, deadline: float) -> None:
        if self.expired:
            super()._write_record(block, version, deadline)
            return
        self.expired = True
        with self.harness.session_expired(self._client):
            super()._write_record(block, version, deadline)


def test_session_expiry_during_lease_waits_for_the_new_session(
    zk_chroot: ZooKeeperHarness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="idemlog.pid")
    client = zk_chroot.client()
    ZkProducerIdBlockSource(client).next_block(1)  # 0..999
    old_session = client.client_id[0]
    source = ExpiringSource(client, zk_chroot)

    block = source.next_block(1)

    assert source.expired
    assert client.client_id[0] != old_session, "the session was not really replaced"
    assert source.unavailable_retries >= 1
    lines = unavailable_lines(caplog)
    assert lines and "(attempt 1)" in lines[0], caplog.text
    # The write in the expired session never happened: the lease continues where it was.
    assert (block.start, block.end) == (1000, 1999)
    assert stored(client) == (block, 1)


def test_dropped_connection_keeps_the_session_and_the_sequence(zk_chroot: ZooKeeperHarness) -> None:
    client = zk_chroot.client()
    source = ZkProducerIdBlockSource(client)
    first = source.next_block(1)
    session = client.client_id[0]

    zk_chroot.drop_connection(client)

    assert client.client_id[0] == session
    second = source.next_block(1)
    assert (first.start, second.start) == (0, 1000)


def test_server_down_current_block_still_served_then_lease_resumes(
    zk_chroot: ZooKeeperHarness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="idemlog.pid")
    client = zk_chroot.client()
    source = ZkProducerIdBlockSource(
        client, retry_deadline_s=60.0, initial_backoff_s=0.05, max_backoff_s=0.25
    )
    manager = ProducerIdManager(1, source)
    assert [manager.generate_producer_id() for _ in range(899)] == list(range(899))

    zk_chroot.stop_server()

    # Id 899 makes 90% of the block used and starts the prefetch, which cannot reach
    # ZooKeeper; the rest of the block is still handed out without waiting for it.
    began = time.monotonic()
    assert [manager.generate_producer_id() for _ in range(101)] == list(range(899, 1000))
    assert time.monotonic() - began < 2.0
    wait_until(lambda: source.unavailable_retries >= 2, "the prefetch to retry", timeout=10.0)

    # The block is used up: the next id waits for ZooKeeper.
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def next_id() -> None:
        try:
            outcome["id"] = manager.generate_producer_id()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=next_id, daemon=True).start()
    assert not done.wait(0.3), f"got {outcome} while ZooKeeper was down"

    zk_chroot.start_server()

    assert done.wait(30), "no id after ZooKeeper came back"
    assert outcome == {"id": 1000}
    assert manager.current_block == ProducerIdBlock(1, 1000, 1999)
    assert stored(client)[0] == ProducerIdBlock(1, 1000, 1999)
    assert len(unavailable_lines(caplog)) >= 2, caplog.text


def test_server_down_past_the_deadline_raises_retriable_error(zk_chroot: ZooKeeperHarness) -> None:
    client = zk_chroot.client()
    source = ZkProducerIdBlockSource(client, retry_deadline_s=1.0, initial_backoff_s=0.05)
    assert source.next_block(1).start == 0

    zk_chroot.stop_server()
    began = time.monotonic()
    with pytest.raises(ProducerIdAllocationError) as excinfo:
        source.next_block(1)
    elapsed = time.monotonic() - began

    assert excinfo.value.retriable is True
    assert excinfo.value.code == 10002
    assert "ZooKeeper unavailable" in str(excinfo.value)
    assert 0.9 <= elapsed < 5.0
    # A manager with no block left surfaces the same retriable error to its caller.
    with pytest.raises(ProducerIdAllocationError) as from_manager:
        ProducerIdManager(1, source).generate_producer_id()
    assert from_manager.value.retriable is True

    zk_chroot.start_server()
    zk_chroot.wait_connected(client)
    # Nothing was leased while ZooKeeper was down.
    assert source.next_block(1).start == 1000


def test_record_is_json_with_decimal_string_bounds(zk_client: ClientFactory) -> None:
    client = zk_client()
    ZkProducerIdBlockSource(client).next_block(42)
    data, _ = client.get(PATH)
    assert json.loads(data) == {
        "version": 1,
        "broker": 42,
        "block_start": "0",
        "block_end": "999",
    }
