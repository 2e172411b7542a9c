"""Coordinator state in a real ZooKeeper: layout, version races, outages, failover."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from broker_core.errors import ConcurrentTransactionsError, UnknownServerError
from broker_core.log.store import LogStore
from broker_core.protocol.wire import SinkAttempt
from broker_core.txn.coordinator import LocalMarkerWriter, TransactionCoordinator
from broker_core.txn.expiry import ExpiryPolicy
from broker_core.txn.markers import ProducerMarkers, StableOffsets, by_partition, restricted
from broker_core.txn.pid_manager import ProducerIdManager, ZkProducerIdBlockSource
from broker_core.txn.state import (
    SinkBatchRecord,
    SinkCommitRecord,
    SinkCommitState,
    TransactionMetadata,
    TransactionState,
)
from broker_core.txn.state_store import CoordinatorEpochFencedError
from broker_core.txn.state_store_zk import ZkTxnStateStore, znode_name
from tests.harness.waiting import wait_until
from tests.harness.zookeeper import ZooKeeperHarness
from tests.store.helpers import SCHEMA, read_ids, rows

S = TransactionState
ROOT = "/idemlog"
PARTITIONS = [("audit", 0), ("payments", 0), ("payments", 1)]


def meta(tid: str, epoch: int = 0, state: TransactionState = S.EMPTY) -> TransactionMetadata:
    parts = {("payments", 0)} if state is not S.EMPTY else set()
    return TransactionMetadata(tid, 17, epoch, 60_000, state, parts, 5, 6 + epoch)


def stored(client: Any, path: str) -> tuple[dict[str, Any], int]:
    data, stat = client.get(path)
    return json.loads(data), stat.version


def test_round_trip_and_node_layout(zk_chroot: ZooKeeperHarness) -> None:
    a = ZkTxnStateStore(zk_chroot.client(), ROOT)
    ids = ["q/0", ".", "..", "ü ß%/x", "plain-id_1"]
    metas = {tid: meta(tid, epoch=i) for i, tid in enumerate(ids)}
    for m in metas.values():
        a.put_transaction(m)
    sink = SinkCommitRecord("q", 9, SinkCommitState.PREPARE, [("q/0", 17, 0)])
    a.put_sink(sink)

    reader = zk_chroot.client()
    names = reader.get_children(f"{ROOT}/transactions")
    assert sorted(names) == sorted(znode_name(t) for t in ids)
    assert {"q%2F0", "%2E", "%2E%2E"} <= set(names)
    doc, version = stored(reader, f"{ROOT}/transactions/q%2F0")
    assert (doc["transactional_id"], doc["state"], version) == ("q/0", "EMPTY", 0)
    assert reader.get_children(f"{ROOT}/sinks") == ["q"]

    b = ZkTxnStateStore(zk_chroot.client(), ROOT)
    assert b.load() == (metas, {"q": sink})
    # Updates by the loading store are version-checked against what it loaded.
    newer = metas["q/0"].copy()
    newer.transition(S.ONGOING, 99)
    newer.partitions = {("payments", 1)}
    b.put_transaction(newer)
    assert stored(reader, f"{ROOT}/transactions/q%2F0")[1] == 1
    assert ZkTxnStateStore(zk_chroot.client(), ROOT).load()[0]["q/0"] == newer


def test_a_coordinator_that_lost_a_version_race_never_overwrites(
    zk_chroot: ZooKeeperHarness,
) -> None:
    reader = zk_chroot.client()
    a = ZkTxnStateStore(zk_chroot.client(), ROOT)
    b = ZkTxnStateStore(zk_chroot.client(), ROOT)
    assert a.load() == b.load() == ({}, {})
    path = f"{ROOT}/transactions/t"

    a.put_transaction(meta("t", 1))
    with pytest.raises(ConcurrentTransactionsError) as info:
        b.put_transaction(meta("t", 2))  # both saw it absent: create race
    assert info.value.retriable and info.value.code == 51
    assert path in info.value.message and "saw it absent" in info.value.message
    assert stored(reader, path)[0]["producer_epoch"] == 1

    b.load()
    b.put_transaction(meta("t", 3))
    with pytest.raises(ConcurrentTransactionsError, match="saw it at version 0"):
        a.put_transaction(meta("t", 4))  # a's version is stale now
    assert stored(reader, path) == (json.loads(meta("t", 3).to_json()), 1)

    a.put_sink(SinkCommitRecord("s", 1, "COMPLETE", []))
    with pytest.raises(ConcurrentTransactionsError, match="sink 's'"):
        b.put_sink(SinkCommitRecord("s", 2, "COMPLETE", []))
    assert stored(reader, f"{ROOT}/sinks/s")[0]["batch_id"] == 1


def test_a_put_waits_for_zookeeper_to_come_back(
    zk_chroot: ZooKeeperHarness, caplog: pytest.LogCaptureFixture
) -> None:
    store = ZkTxnStateStore(zk_chroot.client(), ROOT, retry_deadline_s=60.0)
    store.put_transaction(meta("t", 0))
    done = threading.Event()
    errors: list[BaseException] = []

    def put() -> None:
        try:
            store.put_transaction(meta("t", 1))
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)
        done.set()

    caplog.set_level("WARNING", logger="idemlog.txn")
    zk_chroot.stop_server()
    worker = threading.Thread(target=put)
    worker.start()
    wait_until(
        lambda: any("ZooKeeper unavailable" in r.getMessage() for r in caplog.records),
        "the put to report ZooKeeper unavailable",
        timeout=20.0,
    )
    assert not done.is_set()
    zk_chroot.start_server()
    assert done.wait(30)
    assert errors == []
    loaded = ZkTxnStateStore(zk_chroot.client(), ROOT).load()[0]
    assert loaded["t"].producer_epoch == 1


class CrashingMarkers:
    """While ``crashing``: write the first partition's marker, then die."""

    def __init__(self, store: LogStore) -> None:
        self.inner = LocalMarkerWriter(store)
        self.crashing = True

    def write_markers(
        self, producers: Sequence[ProducerMarkers], commit: bool, coordinator_epoch: int
    ) -> StableOffsets:
        if not self.crashing:
            return self.inner.write_markers(producers, commit, coordinator_epoch)
        first = sorted(by_partition(producers))[:1]
        self.inner.write_markers(restricted(producers, first), commit, coordinator_epoch)
        raise UnknownServerError("simulated coordinator death while writing markers")


def test_coordinator_failover_finishes_prepared_work(
    zk_chroot: ZooKeeperHarness, tmp_path: Path
) -> None:
    store = LogStore(tmp_path / "data")
    store.create_topic("payments", 2, schema=SCHEMA)
    store.create_topic("audit", 1, schema=SCHEMA)
    client_a, client_b, reader = zk_chroot.client(), zk_chroot.client(), zk_chroot.client()

    markers_a = CrashingMarkers(store)
    a = TransactionCoordinator(
        ZkTxnStateStore(client_a, ROOT),
        ProducerIdManager(0, ZkProducerIdBlockSource(client_a)),
        markers_a,
        coordinator_epoch=0,
    )
    a.start()

    def write(tid: str, first: int, sink_batch: int | None = None) -> tuple[str, int, int]:
        """A transaction over PARTITIONS: a plain producer's, or a prepared sink attempt."""
        if sink_batch is None:
            pid, epoch = a.init_producer_id(tid)
        else:
            attempt = SinkAttempt(tid.split("/")[0], "run-1", sink_batch)
            pid, epoch, _ = a.init_sink_producer(tid, None, attempt)
        a.add_partitions(tid, pid, epoch, PARTITIONS)
        ranges = []
        for i, tp in enumerate(PARTITIONS):
            appended = store.partition(*tp).append(
                rows(2, first + 10 * i),
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=0,
                transactional=True,
            )
            ranges.append((*tp, appended.base_offset, appended.last_offset))
        if sink_batch is not None:
            a.prepare_sink_txn(tid, pid, epoch, sink_batch, ranges)
        return tid, pid, epoch

    etl = write("etl", 0)
    sink_txns = [write("q/0", 100, sink_batch=7), write("q/1", 200, sink_batch=7)]
    with pytest.raises(UnknownServerError):
        a.end_txn(*etl, commit=True)
    with pytest.raises(UnknownServerError):
        a.commit_sink_batch("q", 7, sink_txns)
    etl_path = f"{ROOT}/transactions/etl"
    assert stored(reader, etl_path)[0]["state"] == "PREPARE_COMMIT"
    assert stored(reader, f"{ROOT}/sinks/q")[0]["state"] == "PREPARE"
    assert read_ids(store.partition("payments", 1)) == []  # no COMMIT marker there yet

    # A is gone as far as the cluster is concerned; B takes over with a higher epoch.
    b = TransactionCoordinator(
        ZkTxnStateStore(client_b, ROOT),
        ProducerIdManager(1, ZkProducerIdBlockSource(client_b)),
        LocalMarkerWriter(store),
        coordinator_epoch=1,
    )
    b.start()
    for tid in ("etl", "q/0", "q/1"):
        assert stored(reader, f"{ROOT}/transactions/{znode_name(tid)}")[0]["state"] == (
            "COMPLETE_COMMIT"
        )
    assert stored(reader, f"{ROOT}/sinks/q")[0]["state"] == "COMPLETE"
    assert b.last_committed_batch("q") == 7
    for i, tp in enumerate(PARTITIONS):
        log = store.partition(*tp)
        expected = [base + 10 * i + k for base in (0, 100, 200) for k in (0, 1)]
        assert sorted(read_ids(log)) == expected
        assert log.last_stable_offset == log.log_end_offset
        entry = log.state.get(etl[1])
        assert entry is not None and entry.coordinator_epoch == 1  # B wrote the markers
    # The producer's retry, now answered by B: the next transaction's epoch (KIP-890).
    assert b.end_txn(*etl, commit=True) == (etl[1], etl[2] + 1)
    assert b.init_producer_id("etl") == (etl[1], etl[2] + 2)

    # A, not knowing it was replaced, cannot overwrite what B decided.
    markers_a.crashing = False
    before = stored(reader, etl_path)
    with pytest.raises(ConcurrentTransactionsError, match="changed by another coordinator"):
        a.end_txn(*etl, commit=True)
    assert stored(reader, etl_path) == before


def test_many_transactions_and_the_sink_batches_records(zk_chroot: ZooKeeperHarness) -> None:
    """put_transactions stores every record (writes side by side, each fenced as
    put_transaction); a held-back sink batch's record is created once, loaded, deleted."""
    a = ZkTxnStateStore(zk_chroot.client(), ROOT)
    metas = [meta(f"q/{i}", epoch=1) for i in range(12)]
    a.put_transactions(metas, coordinator_epoch=3)
    b = ZkTxnStateStore(zk_chroot.client(), ROOT)
    assert b.load()[0] == {m.transactional_id: m for m in metas}
    # A store that saw epoch 3's writes refuses an older coordinator's, none written.
    with pytest.raises(CoordinatorEpochFencedError):
        b.put_transactions([meta(f"q/{i}", epoch=2) for i in range(12)], coordinator_epoch=2)
    assert ZkTxnStateStore(zk_chroot.client(), ROOT).load()[0]["q/0"].producer_epoch == 1

    batch = SinkBatchRecord("q/x", 7, [("payments", 0, 10, 19), ("payments", 1, 3, 8)])
    a.put_sink_batch(batch, coordinator_epoch=3)
    a.put_sink_batch(batch, coordinator_epoch=3)  # again: a no-op
    reader = zk_chroot.client()
    assert reader.get_children(f"{ROOT}/sink_batches/{znode_name('q/x')}") == ["7"]
    assert ZkTxnStateStore(zk_chroot.client(), ROOT).load_sink_batches() == [batch]
    a.delete_sink_batch("q/x", 7, coordinator_epoch=3)
    a.delete_sink_batch("q/x", 7, coordinator_epoch=3)  # gone already: fine
    assert ZkTxnStateStore(zk_chroot.client(), ROOT).load_sink_batches() == []
    a.close()
    b.close()


# -- expiry: deletes (docs/design.md §5, "Expiry") ---------------------------------------


def test_a_delete_removes_the_node_only_at_the_version_this_store_saw(
    zk_chroot: ZooKeeperHarness,
) -> None:
    reader = zk_chroot.client()
    a = ZkTxnStateStore(zk_chroot.client(), ROOT)
    b = ZkTxnStateStore(zk_chroot.client(), ROOT)
    a.put_transaction(meta("gone", 1))
    a.put_transaction(meta("raced", 1))
    a.put_sink(SinkCommitRecord("s", 1, "COMPLETE", []))
    a.delete_transaction("gone")
    a.delete_sink("s")
    assert reader.get_children(f"{ROOT}/transactions") == ["raced"]
    assert reader.get_children(f"{ROOT}/sinks") == []
    assert a.load() == ({"raced": meta("raced", 1)}, {})

    # Another coordinator changed "raced" since a saw it: a's delete is refused.
    b.load()
    b.put_transaction(meta("raced", 2))
    with pytest.raises(ConcurrentTransactionsError, match="saw version 0") as refused:
        a.delete_transaction("raced")
    assert refused.value.retriable and f"{ROOT}/transactions/raced" in refused.value.message
    assert stored(reader, f"{ROOT}/transactions/raced")[0]["producer_epoch"] == 2
    # A store that never saw a node does not delete it blindly.
    with pytest.raises(ConcurrentTransactionsError, match="never saw the node"):
        ZkTxnStateStore(zk_chroot.client(), ROOT).delete_transaction("raced")
    # A newer coordinator's node is refused as fenced, naming both epochs.
    b.put_transaction(meta("raced", 3), coordinator_epoch=5)
    with pytest.raises(CoordinatorEpochFencedError, match="coordinator epoch 5"):
        b.delete_transaction("raced", coordinator_epoch=4)
    b.delete_transaction("raced", coordinator_epoch=5)
    assert reader.get_children(f"{ROOT}/transactions") == []


def test_expired_ids_znodes_are_deleted_and_stay_gone_for_the_next_coordinator(
    zk_chroot: ZooKeeperHarness, tmp_path: Path
) -> None:
    store = LogStore(tmp_path / "data")
    store.create_topic("payments", 2, schema=SCHEMA)
    client = zk_chroot.client()
    reader = zk_chroot.client()
    now = [1_000_000]
    policy = ExpiryPolicy(id_expiration_ms=60_000)

    def coordinator(epoch: int) -> TransactionCoordinator:
        c = TransactionCoordinator(
            ZkTxnStateStore(client, ROOT),
            ProducerIdManager(epoch, ZkProducerIdBlockSource(client)),
            LocalMarkerWriter(store),
            coordinator_epoch=epoch,
            clock=lambda: now[0],
            expiry=policy,
        )
        c.start()
        return c

    a = coordinator(1)
    job = "batch-00112233445566778899aabbccddeeff"
    txns = []
    for tid in (f"{job}/0", f"{job}/1"):
        pid, epoch, _ = a.init_sink_producer(tid, None, SinkAttempt(job, job[6:], 0))
        a.prepare_sink_txn(tid, pid, epoch, 0, [])
        txns.append((tid, pid, epoch))
    assert a.commit_sink_batch(job, 0, txns, job[6:]) is True
    a.init_producer_id("kept")
    now[0] += 30_000
    a.init_producer_id("kept")  # used since: stays
    now[0] += 30_001
    result = a.expire_idle()
    assert result.transactional_ids == [f"{job}/0", f"{job}/1"] and result.sinks == [job]
    assert reader.get_children(f"{ROOT}/transactions") == ["kept"]
    assert reader.get_children(f"{ROOT}/sinks") == []
    a.close()
    b = coordinator(2)  # the next controller loads what is left
    assert [r["transactional_id"] for r in b.list_transactions(every_id=True)] == ["kept"]
    assert b.describe()["transactional_ids"] == 1 and b.describe()["sinks"] == 0


def test_a_replaced_coordinators_expiry_pass_removes_nothing_and_stops(
    zk_chroot: ZooKeeperHarness, tmp_path: Path
) -> None:
    """Coordinator a (epoch 1) was replaced by b (epoch 2), which used id "a-0". a's
    pass reaches "a-0" first: its DEAD write is refused as fenced, a stands down and its
    pass stops; none of the ids b keeps is removed."""
    store = LogStore(tmp_path / "data")
    reader = zk_chroot.client()
    now = [1_000_000]
    policy = ExpiryPolicy(id_expiration_ms=60_000)

    def coordinator(epoch: int) -> TransactionCoordinator:
        client = zk_chroot.client()
        c = TransactionCoordinator(
            ZkTxnStateStore(client, ROOT),
            ProducerIdManager(epoch, ZkProducerIdBlockSource(client)),
            LocalMarkerWriter(store),
            coordinator_epoch=epoch,
            clock=lambda: now[0],
            expiry=policy,
        )
        c.start()
        return c

    a = coordinator(1)
    for tid in ("a-0", "a-1", "a-2"):
        a.init_producer_id(tid)
    b = coordinator(2)
    now[0] += 60_001
    b.init_producer_id("a-0")  # b's write, at epoch 2 (a still holds version 0)
    assert a.expire_idle().transactional_ids == []
    assert a.status.name == "CLOSED"
    assert sorted(reader.get_children(f"{ROOT}/transactions")) == ["a-0", "a-1", "a-2"]
    assert stored(reader, f"{ROOT}/transactions/a-0")[0]["state"] == "EMPTY"
    assert b.expire_idle().transactional_ids == ["a-1", "a-2"]  # b's own pass does
    assert reader.get_children(f"{ROOT}/transactions") == ["a-0"]
