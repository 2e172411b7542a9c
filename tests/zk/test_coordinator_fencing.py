"""A deposed coordinator's writes fail inside ZooKeeper (docs/failure-model.md, the row
"controller paused"): two coordinators, each on its own broker's ZooKeeper session and
controllership (the real election, ``ZkCluster``), over real logs.

The hook that holds a write in flight is :class:`HoldingClient`, a wrapper of the old
coordinator's kazoo client: its next multi waits, before it is sent, until the test has
let another broker take over.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kazoo.exceptions import BadVersionError

from broker_core.cluster.metadata import BrokerInfo
from broker_core.cluster.zk import ZkCluster
from broker_core.errors import ConcurrentTransactionsError, InvalidRequestError, NotCoordinatorError
from broker_core.log.store import LogStore
from broker_core.protocol.wire import SinkAttempt
from broker_core.txn.coordinator import CoordinatorStatus, LocalMarkerWriter, TransactionCoordinator
from broker_core.txn.pid_manager import ProducerIdManager, ZkProducerIdBlockSource
from broker_core.txn.state import SinkCommitRecord, SinkCommitState, TransactionState
from broker_core.txn.state_store import CoordinatorEpochFencedError
from broker_core.txn.state_store_zk import ZkEpochFence, ZkTxnStateStore, znode_name
from tests.harness.waiting import wait_until
from tests.harness.zookeeper import ZooKeeperHarness
from tests.store.helpers import SCHEMA, read_ids, rows

ROOT = "/idemlog"
TOPIC = "payments"
SINK = "q"
HOLD_S = 30.0  # how long a held multi waits for its release at most (a failing test)
LATER_MS = 3_600_000  # the old coordinator's timeout pass runs "an hour later"


class _HeldTransaction:
    def __init__(self, owner: HoldingClient, inner: Any) -> None:
        self._owner = owner
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def commit_async(self) -> Any:
        owner = self._owner
        hold = owner.armed.is_set()
        if hold:
            owner.armed.clear()
            owner.held.set()
            if not owner.release.wait(HOLD_S):
                raise AssertionError("the held multi was never released")
        result = self._inner.commit_async()
        if hold:
            owner.sent.append(result)
        return result


class HoldingClient:
    """A kazoo client (delegating everything) whose next multi after :attr:`armed` is set
    waits for :attr:`release` before it is sent; :attr:`held` tells it is waiting, and
    :attr:`sent` collects the async result of the multi once it was sent."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.armed = threading.Event()
        self.held = threading.Event()
        self.release = threading.Event()
        self.sent: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def transaction(self) -> _HeldTransaction:
        return _HeldTransaction(self, self._client.transaction())


@dataclass
class Controller:
    """One broker's ZooKeeper session and cluster view, and its coordinator once elected."""

    client: Any
    cluster: ZkCluster
    coordinator: TransactionCoordinator | None = None
    state: ZkTxnStateStore | None = None

    def start_coordinator(
        self, logs: LogStore, client: Any | None = None
    ) -> TransactionCoordinator:
        """A coordinator wired as ``server/roles.py`` does: this controllership's epoch,
        its store fenced by the controller epoch node at this controllership's version."""
        fence = self.cluster.controller_fence()
        assert fence is not None, "not the controller"
        self.state = ZkTxnStateStore(
            client or self.client,
            ROOT,
            fence=ZkEpochFence(fence.path, fence.version, fence.epoch),
        )
        self.coordinator = TransactionCoordinator(
            self.state,
            ProducerIdManager(fence.epoch, ZkProducerIdBlockSource(self.client)),
            LocalMarkerWriter(logs),
            coordinator_epoch=fence.epoch,
        )
        self.coordinator.start()
        return self.coordinator


@pytest.fixture
def controllers(zk_chroot: ZooKeeperHarness) -> Iterator[tuple[Controller, Controller]]:
    made = []
    for broker_id in (1, 2):
        client = zk_chroot.client()
        cluster = ZkCluster(client, ROOT, default_replication_factor=1)
        cluster.register(BrokerInfo(broker_id, "10.0.0.1", 9000 + broker_id))
        made.append(Controller(client, cluster))
    old, new = made
    assert old.cluster.is_controller() and not new.cluster.is_controller()
    yield old, new
    for c in made:
        if c.coordinator is not None:
            c.coordinator.close()
        if c.state is not None:
            c.state.close()
        c.cluster.close()


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[LogStore]:
    store = LogStore(tmp_path / "data")
    store.create_topic(TOPIC, 2, schema=SCHEMA)
    yield store
    store.close()


def prepared_batch(
    coordinator: TransactionCoordinator, logs: LogStore, batch: int, run: str = "run-1"
) -> list[tuple[str, int, int]]:
    """Batch ``batch`` of the sink: one prepared attempt per partition, 2 rows each (ids
    1000*batch + 100*partition + 0..1)."""
    txns = []
    for p in (0, 1):
        tid = f"{SINK}/{p}"
        pid, epoch, _ = coordinator.init_sink_producer(tid, 60_000, SinkAttempt(SINK, run, batch))
        coordinator.add_partitions(tid, pid, epoch, [(TOPIC, p)])
        appended = logs.partition(TOPIC, p).append(
            rows(2, 1000 * batch + 100 * p),
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            transactional=True,
        )
        ranges = [(TOPIC, p, appended.base_offset, appended.last_offset)]
        coordinator.prepare_sink_txn(tid, pid, epoch, batch, ranges)
        txns.append((tid, pid, epoch))
    return txns


def expected(batches: list[int], p: int) -> list[int]:
    return [1000 * b + 100 * p + k for b in batches for k in (0, 1)]


def nodes(client: Any) -> dict[str, tuple[bytes, int]]:
    """The sink's and its transactions' znodes: data and version."""
    paths = [f"{ROOT}/sinks/{SINK}"] + [
        f"{ROOT}/transactions/{znode_name(f'{SINK}/{p}')}" for p in (0, 1)
    ]
    found = {}
    for path in paths:
        if client.exists(path) is not None:
            data, stat = client.get(path)
            found[path] = (bytes(data), stat.version)
    return found


def take_over(zk: ZooKeeperHarness, old: Controller, new: Controller, logs: LogStore) -> None:
    """``old``'s session expires (a pause past it) and is held expired while ``new`` wins
    the election, bumps the controller epoch and starts its coordinator (which loads)."""
    with zk.session_expired(old.client):
        wait_until(new.cluster.is_controller, "broker 2 to take control")
        new.start_coordinator(logs)
    assert new.coordinator is not None and old.coordinator is not None
    assert new.coordinator.coordinator_epoch > old.coordinator.coordinator_epoch


def assert_committed_once(logs: LogStore, batches: list[int]) -> None:
    for p in (0, 1):
        log = logs.partition(TOPIC, p)
        assert read_ids(log) == expected(batches, p)
        assert log.last_stable_offset == log.log_end_offset


def test_a_write_held_across_a_takeover_is_refused_and_the_new_coordinator_commits(
    zk_chroot: ZooKeeperHarness, controllers: tuple[Controller, Controller], logs: LogStore
) -> None:
    old, new = controllers
    holding = HoldingClient(old.client)
    a = old.start_coordinator(logs, client=holding)
    txns = prepared_batch(a, logs, 7)

    # A's timeout pass (as if the driver went quiet) starts aborting the prepared batch;
    # its first state write, PREPARE_ABORT of q/0, is held before it is sent.
    holding.armed.set()
    aborted: list[list[str]] = []
    errors: list[BaseException] = []

    def timeout_pass() -> None:
        try:
            aborted.append(a.abort_timed_out(int(time.time() * 1000) + LATER_MS))
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    worker = threading.Thread(target=timeout_pass, name="old-timeout-pass")
    worker.start()
    assert holding.held.wait(HOLD_S), "A's write was not held"

    # Broker 2 takes over and loads; the driver's commit reaches it and commits the batch.
    take_over(zk_chroot, old, new, logs)
    b = new.coordinator
    assert b is not None
    assert b.commit_sink_batch(SINK, 7, txns) is True
    assert_committed_once(logs, [7])
    reader = zk_chroot.client()
    decided = nodes(reader)
    ends = [logs.partition(TOPIC, p).log_end_offset for p in (0, 1)]

    # A's held write is sent now, after the takeover: ZooKeeper refuses the whole multi on
    # the controller epoch check, and A stands down without writing a marker.
    holding.release.set()
    worker.join(HOLD_S)
    assert not worker.is_alive() and errors == []
    assert len(holding.sent) == 1, "the held multi was never sent"
    checked, _written = holding.sent[0].get(HOLD_S)
    assert isinstance(checked, BadVersionError)  # the check of controller_epoch failed
    assert aborted == [[]]  # nothing was aborted
    assert a.status is CoordinatorStatus.CLOSED
    with pytest.raises(NotCoordinatorError):
        a.commit_sink_batch(SINK, 7, txns)
    assert nodes(reader) == decided
    assert [logs.partition(TOPIC, p).log_end_offset for p in (0, 1)] == ends
    assert_committed_once(logs, [7])
    for path in decided:
        assert json.loads(decided[path][0])["coordinator_epoch"] == b.coordinator_epoch

    # The next batch commits through B, and every partition is stable to its end.
    assert b.commit_sink_batch(SINK, 8, prepared_batch(b, logs, 8)) is True
    assert_committed_once(logs, [7, 8])


def test_the_old_coordinators_timeout_pass_after_a_takeover_aborts_nothing(
    zk_chroot: ZooKeeperHarness, controllers: tuple[Controller, Controller], logs: LogStore
) -> None:
    old, new = controllers
    a = old.start_coordinator(logs)
    txns = prepared_batch(a, logs, 3)
    take_over(zk_chroot, old, new, logs)
    reader = zk_chroot.client()
    before = nodes(reader)
    ends = [logs.partition(TOPIC, p).log_end_offset for p in (0, 1)]

    # A resumes not knowing: every transaction is past its timeout by its clock.
    assert a.abort_timed_out(int(time.time() * 1000) + LATER_MS) == []
    assert a.status is CoordinatorStatus.CLOSED
    assert nodes(reader) == before  # no PREPARE_ABORT landed
    assert [logs.partition(TOPIC, p).log_end_offset for p in (0, 1)] == ends  # no marker
    b = new.coordinator
    assert b is not None
    assert b.commit_sink_batch(SINK, 3, txns) is True
    assert_committed_once(logs, [3])


def test_a_newer_coordinator_that_lost_a_version_race_to_an_older_writer_recovers(
    zk_chroot: ZooKeeperHarness, controllers: tuple[Controller, Controller], logs: LogStore
) -> None:
    old, new = controllers
    a = old.start_coordinator(logs)
    pid, epoch = a.init_producer_id("app")
    a.add_partitions("app", pid, epoch, [(TOPIC, 0)])
    logs.partition(TOPIC, 0).append(
        rows(2, 0), producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True
    )
    old_epoch = a.coordinator_epoch
    take_over(zk_chroot, old, new, logs)
    b = new.coordinator
    assert b is not None

    # An older writer without the fence (a broker of the previous release, in a rolling
    # upgrade) rewrites the id after B loaded it: B's version of the node is stale.
    unfenced = ZkTxnStateStore(zk_chroot.client(), ROOT)
    unfenced.load()
    meta = unfenced.load()[0]["app"]
    assert meta.state is TransactionState.ONGOING
    meta.last_update_ms += 1
    unfenced.put_transaction(meta, coordinator_epoch=old_epoch)

    # B's write loses the race once (retriable, B keeps serving) and re-reads the node...
    with pytest.raises(ConcurrentTransactionsError, match="a retry goes on from the node") as lost:
        b.end_txn("app", pid, epoch, commit=True)
    assert not isinstance(lost.value, CoordinatorEpochFencedError) and lost.value.retriable
    assert b.status is CoordinatorStatus.RUNNING
    # ... so the client's retry goes on from the current version instead of failing forever
    # (answered with the next transaction's epoch: each ends at its own, KIP-890).
    assert b.end_txn("app", pid, epoch, commit=True) == (pid, epoch + 1)
    log = logs.partition(TOPIC, 0)
    assert read_ids(log) == [0, 1] and log.last_stable_offset == log.log_end_offset
    node = json.loads(zk_chroot.client().get(f"{ROOT}/transactions/app")[0])
    assert (node["state"], node["coordinator_epoch"]) == ("COMPLETE_COMMIT", b.coordinator_epoch)
    assert b.init_producer_id("app") == (pid, epoch + 2)
    unfenced.close()


def test_a_fenced_store_writes_only_at_its_epoch(zk_chroot: ZooKeeperHarness) -> None:
    client = zk_chroot.client()
    client.create(f"{ROOT}/controller_epoch", b'{"controller_epoch":4}', makepath=True)
    fence = ZkEpochFence(f"{ROOT}/controller_epoch", 0, 4)
    store = ZkTxnStateStore(client, ROOT, fence=fence)
    with pytest.raises(InvalidRequestError, match="coordinator_epoch=3"):
        store.put_sink(_record(1), coordinator_epoch=3)
    store.put_sink(_record(1), coordinator_epoch=4)  # creates the missing parents too
    client.set(f"{ROOT}/controller_epoch", b'{"controller_epoch":5}')  # a newer controller
    with pytest.raises(CoordinatorEpochFencedError, match="no longer at version 0"):
        store.put_sink(_record(2), coordinator_epoch=4)
    assert json.loads(client.get(f"{ROOT}/sinks/{SINK}")[0])["batch_id"] == 1
    for bad in ({"path": "x"}, {"version": -1}, {"coordinator_epoch": True}):
        with pytest.raises(InvalidRequestError, match="epoch fence"):
            ZkEpochFence(**{"path": "/e", "version": 0, "coordinator_epoch": 1, **bad})
    # Closed (its controllership lost): a write stops at once, sent or not.
    unfenced = ZkTxnStateStore(client, ROOT)
    unfenced.close()
    with pytest.raises(NotCoordinatorError, match="state store was closed"):
        unfenced.put_sink(_record(3))
    store.close()


def _record(batch: int) -> SinkCommitRecord:
    return SinkCommitRecord(SINK, batch, SinkCommitState.COMPLETE, [])


def test_a_write_queued_before_close_precedes_the_next_stores_load_at_the_same_epoch(
    zk_chroot: ZooKeeperHarness,
) -> None:
    # A broker that loses control and regains it in the same session keeps its epoch and
    # fence: the old store's last write must be ordered before the new store's load.
    client = zk_chroot.client()
    client.create(f"{ROOT}/controller_epoch", b'{"controller_epoch":1}', makepath=True)
    fence = ZkEpochFence(f"{ROOT}/controller_epoch", 0, 1)
    holding = HoldingClient(client)
    old = ZkTxnStateStore(holding, ROOT, fence=fence)
    old.put_sink(_record(1), coordinator_epoch=1)
    holding.armed.set()
    writer = threading.Thread(
        target=old.put_sink, args=(_record(2),), kwargs={"coordinator_epoch": 1}
    )
    writer.start()
    assert holding.held.wait(HOLD_S)
    closed = threading.Event()
    closer = threading.Thread(target=lambda: (old.close(), closed.set()))
    closer.start()
    assert not closed.wait(0.5)  # close() waits for the write being queued
    holding.release.set()
    writer.join(HOLD_S)
    closer.join(HOLD_S)
    assert closed.is_set() and len(holding.sent) == 1
    new = ZkTxnStateStore(client, ROOT, fence=fence)
    assert new.load()[1][SINK].batch_id == 2  # the old store's write is seen
    with pytest.raises(NotCoordinatorError, match="state store was closed"):
        old.put_sink(_record(3), coordinator_epoch=1)
    new.close()
