"""A partition leader bounced inside its ZooKeeper session onto an empty disk (issue 35),
with real broker processes, a real ZooKeeper and real signals: the new process's
registration has a new broker epoch (its czxid), the controller treats it as the old
process's failure, leadership moves to an in-sync replica at a higher leader epoch before
the new process may lead, and no acknowledged row or committed transaction is lost
(docs/failure-model.md, "A broker restarted inside its session on an empty disk")."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import threading
import time
import zlib
from concurrent.futures import Future

import numpy as np
import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.cluster.records import PartitionState
from broker_core.errors import IdemlogError
from broker_core.producer import Producer, SendResult
from broker_core.protocol.wire import Action
from broker_core.server.config.broker_config import ZK_ROOT
from testkit.zookeeper import ZooKeeperHarness
from tests.harness.broker import BrokerFactory
from tests.harness.replicated import ReplicatedCluster
from tests.harness.waiting import wait_until

SESSION_MS = 6000  # the session a supervisor's restart lands inside
# A name whose partition 0 is led by broker 2 (assign_partitions starts at crc32 % 3), so
# the victim is not the controller (broker 1, started first), which the test pauses.
TOPIC = next(f"bounced{i}" for i in range(100) if zlib.crc32(f"bounced{i}".encode()) % 3 == 1)
KEYS = 97
TXN_BASE = 10_000_000  # the transactional producer's ids
FAST = {"linger.ms": 2, "retry.backoff.ms": 20, "delivery.timeout.ms": 120_000}


def _table(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "key": ids % KEYS, "value": ids.astype(np.float64)})


def _read(client: BrokerClient) -> tuple[list[int], list[int]]:
    """Every committed (id, key) of the partition in offset order."""
    ids: list[int] = []
    keys: list[int] = []
    for _meta, batch in client.fetch(TOPIC, 0, isolation="read_committed"):
        ids.extend(batch.column("id").to_pylist())
        keys.extend(batch.column("key").to_pylist())
    return ids, keys


class Writers:
    """An acks=all idempotent producer and a transactional one writing ``TOPIC`` steadily;
    what each had acknowledged (committed) is recorded."""

    def __init__(self, bootstrap: str) -> None:
        self.acked: list[int] = []
        self.committed: list[int] = []
        self.failed: list[BaseException] = []
        self.txn_errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._idempotent = Producer(bootstrap, **FAST, **{"batch.size": 64 * 1024})
        self._bootstrap = bootstrap
        self._threads = [
            threading.Thread(target=self._send_idempotent, daemon=True),
            threading.Thread(target=self._send_transactions, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return len(self.acked), len(self.committed)

    def _on_done(self, ids: list[int], future: Future[list[SendResult]]) -> None:
        error = future.exception()
        with self._lock:
            if error is None:
                self.acked.extend(ids)
            else:
                self.failed.append(error)

    def _send_idempotent(self) -> None:
        start = 0
        while not self._stop.is_set():
            future = self._idempotent.send(TOPIC, _table(start, 100))
            future.add_done_callback(
                functools.partial(self._on_done, list(range(start, start + 100)))
            )
            start += 100
            self._stop.wait(0.005)

    def _send_transactions(self) -> None:
        start = TXN_BASE
        config = {**FAST, "transactional.id": "bouncer", "transaction.timeout.ms": 60_000}
        producer = Producer(self._bootstrap, **config)
        try:
            producer.init_transactions()
            while not self._stop.is_set():
                producer.begin_transaction()
                producer.send(TOPIC, _table(start, 50))
                try:
                    producer.commit_transaction()
                except Exception as exc:  # recorded: its ids count as not committed
                    self.txn_errors.append(exc)
                    producer.close()
                    producer = Producer(self._bootstrap, **config)
                    producer.init_transactions()  # aborts what the failed one left open
                else:
                    with self._lock:
                        self.committed.extend(range(start, start + 50))
                start += 50
                self._stop.wait(0.02)
        finally:
            producer.close()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        self._idempotent.flush()
        self._idempotent.close()


@pytest.mark.parametrize("delay_s", [0.5, 1.2, 2.0])
def test_a_leader_restarted_inside_its_session_on_an_empty_disk_loses_nothing(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, delay_s: float
) -> None:
    cluster = ReplicatedCluster(
        zk_chroot, broker_factory, extra={"zookeeper.session.timeout.ms": SESSION_MS}
    )
    zk = zk_chroot.client()
    writers: Writers | None = None
    try:
        cluster.create_topic(TOPIC, 1, replication_factor=3, min_insync_replicas=2)
        writers = Writers(cluster.bootstrap)
        wait_until(lambda: writers.counts()[0] >= 3_000 and writers.counts()[1] >= 300, "writes")
        before = cluster.state(TOPIC, 0)
        vid = before.leader
        victim = cluster.brokers[vid]
        path = f"{ZK_ROOT}/brokers/ids/{vid}"
        old = zk.exists(path)
        assert old is not None

        victim.kill(signal.SIGKILL)
        killed = time.monotonic()
        shutil.rmtree(victim.log_dir)  # the new process starts on an empty disk
        victim.log_dir.mkdir()
        time.sleep(delay_s)  # the supervisor's restart delay: the fault, not a wait
        still = zk.exists(path)
        assert still is not None and still.czxid == old.czxid, "the old session had expired"
        mark = len(victim.log_text())
        victim.spawn()
        assert zk.exists(path).czxid == old.czxid, "restarted after the old session expired"
        restarted = time.monotonic() - killed

        # The controller sees the old registration go and the new one come in one look:
        # paused (SIGSTOP, within its own session) across both, as a loaded controller
        # whose watch is served late. Only the broker epoch tells it the process changed.
        meta = cluster.client.action(cluster.brokers[1].address, Action.METADATA, {})
        controller = cluster.brokers[int(meta["controller"])]
        assert controller is not victim
        time.sleep(max(0.0, killed + SESSION_MS / 1000 - 1.5 - time.monotonic()))  # the fault
        os.kill(controller.pid, signal.SIGSTOP)
        try:
            paused = zk.exists(path)
            assert paused is not None and paused.czxid == old.czxid, "expired before the pause"
            wait_until(
                lambda: (n := zk.exists(path)) is not None and n.czxid != old.czxid,
                "the new process's registration",
                timeout=15,
            )
        finally:
            os.kill(controller.pid, signal.SIGCONT)
        others = [b for i, b in cluster.brokers.items() if i != vid]

        def moved_everywhere() -> PartitionState | None:
            try:
                states = {cluster.state(TOPIC, 0, b) for b in others}
            except IdemlogError:
                return None
            (state, *rest) = states
            ok = not rest and state.leader != vid and state.leader_epoch > before.leader_epoch
            return state if ok else None

        moved = wait_until(moved_everywhere, "leadership moved at a higher epoch", timeout=60)
        moved_s = time.monotonic() - killed
        victim.start_wait()
        new = zk.exists(path)
        assert new is not None and new.czxid > old.czxid  # a new broker epoch
        assert moved.leader in before.isr
        # The new process never led: it stood by, then followed at the new epoch.
        after_restart = victim.log_text()[mark:]
        assert f"{TOPIC}-0: leader at leader epoch" not in after_restart
        acked_then = writers.counts()[0]
        wait_until(lambda: writers.counts()[0] >= acked_then + 3_000, "the producer to go on")
        cluster.wait_in_sync(TOPIC, 0, timeout=60)  # not stuck: the empty replica caught up
        writers.close()
        ids, keys = _read(cluster.client)
        acked, committed = writers.acked, writers.committed
        assert not writers.failed, writers.failed[:3]
        assert len(ids) == len(set(ids)), "a row written twice"
        lost = set(acked) - set(ids)
        assert not lost, f"{len(lost)} acknowledged rows lost, e.g. {sorted(lost)[:5]}"
        lost_txn = set(committed) - set(ids)
        assert not lost_txn, f"{len(lost_txn)} committed transactional rows lost"
        by_key: dict[int, list[int]] = {}
        for i, k in zip(ids, keys, strict=True):
            by_key.setdefault(k, []).append(i)
        for k, seq in by_key.items():
            own = [i for i in seq if i < TXN_BASE]
            txn = [i for i in seq if i >= TXN_BASE]
            assert own == sorted(own) and txn == sorted(txn), f"key {k} out of order"
        print(
            f"delay={delay_s}s restarted_after={restarted:.2f}s leadership_moved_after="
            f"{moved_s:.2f}s epoch {before.leader_epoch}->{moved.leader_epoch} "
            f"leader {before.leader}->{moved.leader} acked={len(acked)} "
            f"committed_txn_rows={len(committed)} read={len(ids)} "
            f"txn_commit_errors={len(writers.txn_errors)}"
        )
    finally:
        if writers is not None:
            writers._stop.set()
        cluster.close()


def _led_by_broker_2(prefix: str) -> str:
    """A topic name whose single partition lands on broker 2 (crc32 % 3 == 1)."""
    return next(f"{prefix}{i}" for i in range(100) if zlib.crc32(f"{prefix}{i}".encode()) % 3 == 1)


def test_the_only_in_sync_replica_back_on_an_empty_disk_stays_offline_unless_unclean(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    """Replication factor 1 on broker 2, SIGKILLed, its log.dir wiped, restarted: its
    new directory.id is not the one the ISR recorded, so the partition stays offline with
    one ERROR line naming it; the topic with unclean.leader.election.enable comes back
    empty, the loss logged as DATA LOSS and counted by the controller."""
    cluster = ReplicatedCluster(zk_chroot, broker_factory)
    clean, dirty = _led_by_broker_2("kept"), _led_by_broker_2("given")
    try:
        cluster.create_topic(clean, 1, replication_factor=1)
        cluster.create_topic(dirty, 1, replication_factor=1, unclean_leader_election_enable="true")
        with Producer(cluster.bootstrap, **FAST) as producer:
            for topic in (clean, dirty):
                producer.send(topic, _table(0, 1_000)).result(30)
        before = {t: cluster.state(t, 0) for t in (clean, dirty)}
        assert {s.leader for s in before.values()} == {2}
        meta = cluster.client.action(cluster.brokers[1].address, Action.METADATA, {})
        controller = cluster.brokers[int(meta["controller"])]
        victim = cluster.brokers[2]
        assert controller is not victim
        unclean_before = cluster.replication(controller)["unclean_leader_elections"]

        victim.kill(signal.SIGKILL)
        shutil.rmtree(victim.log_dir)  # a new, empty disk
        victim.log_dir.mkdir()
        victim.restart()

        controller.wait_for_log(
            f"partition {clean}-0 is offline: its in-sync replicas [2] came back with another "
            "log.dir directory.id",
            timeout=30,
        )
        back = cluster.wait_state(
            dirty, 0, lambda s: s.leader_epoch > before[dirty].leader_epoch, "the unclean leader"
        )
        assert back.leader == 2
        controller.wait_for_log(f"partition {dirty}-0: DATA LOSS: unclean leader election")
        assert cluster.replication(controller)["unclean_leader_elections"] == unclean_before + 1
        # The offline partition: unchanged state, and nobody serves it (the new process
        # stands by: the ISR admitted its predecessor).
        assert cluster.state(clean, 0) == before[clean]
        with pytest.raises(IdemlogError, match=r"does not lead|NOT_LEADER"):
            list(cluster.client.fetch(clean, 0))
        victim.wait_for_log(f"{clean}-0: named leader at epoch 0 by a state that admitted")
        # The unclean one serves what it has (nothing) and takes writes again.
        assert _read_topic(cluster.client, dirty) == []
        with Producer(cluster.bootstrap, **FAST) as producer:
            producer.send(dirty, _table(5_000, 10)).result(30)
        assert _read_topic(cluster.client, dirty) == list(range(5_000, 5_010))
        errors = [
            line
            for line in controller.log_text().splitlines()
            if f"partition {clean}-0 is offline" in line and " ERROR " in line
        ]
        print(f"offline_errors={len(errors)} unclean_elections={unclean_before + 1}")
    finally:
        cluster.close()


def _read_topic(client: BrokerClient, topic: str) -> list[int]:
    ids: list[int] = []
    for _meta, batch in client.fetch(topic, 0, isolation="read_committed"):
        ids.extend(batch.column("id").to_pylist())
    return ids
