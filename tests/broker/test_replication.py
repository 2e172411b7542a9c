"""Replication and leader failover with real broker processes on a real ZooKeeper.

Three brokers (``tests/harness/replicated.py``), topics with ``replication.factor=3``.
Each test says what it proves and asserts that its fault happened (the leader changed,
the epoch grew, the follower left and rejoined the ISR, a tail was truncated) before it
checks the data: every acknowledged row read back exactly once from the current leader,
and the replicas' logs byte-identical once they are in sync.
"""

from __future__ import annotations

import functools
import signal
import threading
import time
from concurrent.futures import Future

import numpy as np
import pyarrow as pa
import pytest

from broker_core.cli.main import main as cli_main
from broker_core.client.broker_client import BrokerClient
from broker_core.producer import Producer, SendResult
from broker_core.protocol.requests import ACKS_ALL, ACKS_LEADER
from broker_core.protocol.wire import ProduceResponse
from testkit.broker_failpoints import ENV, WITHHOLD_REPLICA_FETCH
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import rows
from tests.harness.broker import TEST_HOOKS, BrokerFactory
from tests.harness.replicated import ReplicatedCluster
from tests.harness.waiting import wait_until

FAST = {"linger.ms": 2, "retry.backoff.ms": 20}


def _table(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "key": ids % 97, "value": ids.astype(np.float64)})


def _read_ids(client: BrokerClient, topic: str, partitions: int) -> list[int]:
    """Every committed id of the topic, as the current leaders serve it."""
    ids: list[int] = []
    for p in range(partitions):
        for _meta, batch in client.fetch(topic, p, isolation="read_committed"):
            ids.extend(batch.column("id").to_pylist())
    return ids


def _stop_all_and_compare(cluster: ReplicatedCluster, topic: str, partitions: int) -> None:
    """Stop every broker cleanly, then check that the replicas came out identical."""
    for broker in cluster.running():
        broker.stop()
    cluster.assert_stopped_replicas_identical(topic, partitions)


def test_followers_copy_the_leader_byte_for_byte(replicated_cluster: ReplicatedCluster) -> None:
    """Idempotent and transactional writes with acks=all: the followers' logs, producer
    state snapshots and epoch checkpoints come out identical to the leader's."""
    replicated_cluster.create_topic("copied", 2, replication_factor=3)
    with Producer(replicated_cluster.bootstrap, **FAST) as producer:
        futures = [producer.send("copied", _table(i * 500, 500), key="key") for i in range(20)]
        producer.flush()
        for f in futures:
            f.result(30)
    with Producer(
        replicated_cluster.bootstrap, **FAST, **{"transactional.id": "copier"}
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("copied", _table(10_000, 1_000), key="key")
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send("copied", _table(20_000, 1_000), key="key")
        producer.abort_transaction()
    ids = _read_ids(replicated_cluster.client, "copied", 2)
    assert sorted(ids) == list(range(11_000))
    for p in range(2):
        replicated_cluster.wait_in_sync("copied", p)
    _stop_all_and_compare(replicated_cluster, "copied", 2)


def test_leader_sigkilled_under_a_pipelined_producer(replicated_cluster: ReplicatedCluster) -> None:
    """SIGKILL of the leader while an idempotent producer keeps sending: the controller
    elects an in-sync follower at a higher epoch once the leader's session expires, the
    producer resends what was not acknowledged, and every acknowledged row is there once."""
    replicated_cluster.create_topic("failover", 1, replication_factor=3)
    before = replicated_cluster.state("failover", 0)
    acked: list[int] = []
    failed: list[BaseException] = []
    stop = threading.Event()
    killed_at: list[float] = []
    first_ack_after_kill: list[float] = []
    lock = threading.Lock()

    def on_done(ids: list[int], queued: float, future: Future[list[SendResult]]) -> None:
        error = future.exception()
        with lock:
            if error is not None:
                failed.append(error)
                return
            acked.extend(ids)
            # Writes resumed: the first batch queued after the kill is acknowledged.
            if killed_at and queued > killed_at[0] and not first_ack_after_kill:
                first_ack_after_kill.append(time.monotonic())

    config = {**FAST, "delivery.timeout.ms": 60_000, "batch.size": 64 * 1024}
    with Producer(replicated_cluster.bootstrap, **config) as producer:

        def send_steadily() -> None:
            start = 0
            while not stop.is_set():
                queued = time.monotonic()
                future = producer.send("failover", _table(start, 100), key="key")
                ids = list(range(start, start + 100))
                future.add_done_callback(functools.partial(on_done, ids, queued))
                start += 100
                stop.wait(0.002)  # a steady stream, not a flood

        sender = threading.Thread(target=send_steadily, daemon=True)
        sender.start()
        wait_until(lambda: len(acked) >= 2_000, "the producer to get going")
        victim = replicated_cluster.brokers[before.leader]
        killed_at.append(time.monotonic())
        victim.kill(signal.SIGKILL)
        after = replicated_cluster.wait_leader_change("failover", 0, before.leader)
        wait_until(lambda: bool(first_ack_after_kill), "an acknowledgement after the kill")
        with lock:
            acked_then = len(acked)
        wait_until(lambda: len(acked) >= acked_then + 2_000, "the producer to go on")
        stop.set()
        sender.join(10)
        producer.flush()
    assert not failed, failed[:3]
    assert after.leader_epoch > before.leader_epoch and after.leader in before.isr
    assert before.leader not in after.isr
    ids = _read_ids(replicated_cluster.client, "failover", 1)
    assert len(ids) == len(set(ids)), "a row written twice"
    missing = set(acked) - set(ids)
    assert not missing, f"{len(missing)} acknowledged rows lost, e.g. {sorted(missing)[:5]}"
    resumed_s = first_ack_after_kill[0] - killed_at[0]
    print(f"writes resumed {resumed_s:.2f}s after the leader's SIGKILL")
    # The old leader comes back as a follower and catches up.
    victim.restart()
    replicated_cluster.wait_in_sync("failover", 0)


def test_a_lagging_follower_leaves_the_isr_and_rejoins(
    replicated_cluster: ReplicatedCluster,
) -> None:
    """A follower killed while the others take writes (acks=all): it leaves the ISR and the
    writes go on; back, it copies what it missed, rejoins, and is byte-identical."""
    replicated_cluster.create_topic("lagging", 1, replication_factor=3)
    state = replicated_cluster.state("lagging", 0)
    fid = next(b for b in state.replicas if b != state.leader)
    follower = replicated_cluster.brokers[fid]
    follower.kill(signal.SIGKILL)
    replicated_cluster.wait_state(
        "lagging", 0, lambda s: fid not in s.isr, f"broker {fid} out of the ISR"
    )
    with Producer(replicated_cluster.bootstrap, **FAST) as producer:
        futures = [producer.send("lagging", _table(i * 200, 200), key="key") for i in range(30)]
        producer.flush()
        for f in futures:
            f.result(30)
    follower.restart()
    replicated_cluster.wait_state(
        "lagging", 0, lambda s: fid in s.isr, f"broker {fid} back in the ISR"
    )
    replicated_cluster.wait_in_sync("lagging", 0)
    assert sorted(_read_ids(replicated_cluster.client, "lagging", 1)) == list(range(6_000))
    leader = replicated_cluster.brokers[replicated_cluster.state("lagging", 0).leader]
    assert replicated_cluster.replication(leader)["isr_expands"] >= 1
    _stop_all_and_compare(replicated_cluster, "lagging", 1)


def _send_raw(
    client: BrokerClient, topic: str, pid: int, epoch: int, batches: range, acks: int
) -> None:
    """Raw batches (no retries: each must be answered ok, none a duplicate) to the
    current leader."""
    answers = _answers(client, topic, pid, epoch, batches, acks)
    assert not any(a.duplicate for a in answers), answers


def test_a_diverged_follower_truncates_by_epoch_and_converges(
    zk_chroot: ZooKeeperHarness,
    broker_factory: BrokerFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The preferred leader is restarted with a test hook that withholds its batches from
    its followers and made leader again (the preferred-leader election). It acknowledges
    batches with acks=1 alone, then is SIGKILLed: an in-sync follower is elected at a
    higher epoch and takes other writes. The old leader comes back, cuts its diverged tail
    by leader epoch (KIP-101/279) and ends byte-identical with the others."""
    cluster = ReplicatedCluster(
        zk_chroot,
        broker_factory,
        extra={"replica.lag.time.max.ms": 120_000, "transaction.marker.retry.deadline.ms": 300_000},
    )
    try:
        cluster.create_topic("diverged", 1, replication_factor=3)
        first = cluster.state("diverged", 0)
        preferred = first.replicas[0]
        victim = cluster.brokers[preferred]
        client = cluster.client
        pid, epoch = client.init_producer_id()
        _send_raw(client, "diverged", pid, epoch, range(0, 5), ACKS_ALL)
        cluster.wait_in_sync("diverged", 0)
        victim.stop()  # a clean shutdown hands the leadership over first
        moved = cluster.wait_leader_change("diverged", 0, preferred)
        victim.config.update(TEST_HOOKS)  # started for the test hook, explicitly
        victim.restart(env={ENV: WITHHOLD_REPLICA_FETCH})
        cluster.wait_in_sync("diverged", 0)
        args = ["topics", "elect-leaders", "--bootstrap", cluster.bootstrap, "--topic", "diverged"]
        assert cli_main(args) == 0  # the preferred-leader election, from the command line
        out = capsys.readouterr().out
        assert "moved the leadership of 1 partitions" in out, out
        assert f"diverged-0: leader {preferred}" in out, out
        back = cluster.wait_state("diverged", 0, lambda s: s.leader == preferred, "preferred back")
        assert back.leader_epoch > moved.leader_epoch > first.leader_epoch
        _send_raw(client, "diverged", pid, epoch, range(5, 8), ACKS_LEADER)  # alone
        tail = cluster.offsets(victim, "diverged", 0)
        assert tail["log_end_offset"] == 80 and tail["high_watermark"] == 50
        victim.kill(signal.SIGKILL)
        elected = cluster.wait_leader_change("diverged", 0, preferred)
        assert elected.leader_epoch > back.leader_epoch
        pid2, epoch2 = client.init_producer_id()
        _send_raw(client, "diverged", pid2, epoch2, range(100, 104), ACKS_ALL)
        victim.restart()
        victim.wait_for_log("truncated from 80 to 50")
        cluster.wait_in_sync("diverged", 0)
        ids = _read_ids(client, "diverged", 1)
        assert ids == list(range(50)) + list(range(1000, 1040)), "the acks=1 tail is gone"
        batches = cluster.batches(victim, "diverged", 0)
        assert [e for _o, e in batches][-1] == elected.leader_epoch
        _stop_all_and_compare(cluster, "diverged", 1)
    finally:
        cluster.close()


def test_acks_all_is_refused_below_min_insync_replicas(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    """min.insync.replicas=2 with both followers dead: acks=all is refused
    (NOT_ENOUGH_REPLICAS, retriable, nothing written); acks=1 is still served."""
    cluster = ReplicatedCluster(zk_chroot, broker_factory)
    try:
        cluster.create_topic("guarded", 1, replication_factor=3, min_insync_replicas=2)
        state = cluster.state("guarded", 0)
        for b in state.replicas:
            if b != state.leader:
                cluster.brokers[b].kill(signal.SIGKILL)
        cluster.wait_state("guarded", 0, lambda s: s.isr == (state.leader,), "the ISR shrunk")
        client = cluster.client
        pid, epoch = client.init_producer_id()
        with client.produce_stream("guarded", 0, acks=ACKS_ALL) as stream:
            answer = stream.send(
                rows(10),
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=0,
                transactional=False,
            ).result(30)
        assert answer.error_code == 19, answer  # NOT_ENOUGH_REPLICAS
        assert "min.insync.replicas=2" in answer.error_message
        assert cluster.offsets(cluster.brokers[state.leader], "guarded", 0)["log_end_offset"] == 0
        _send_raw(client, "guarded", pid, epoch, range(0, 2), ACKS_LEADER)
        assert _read_ids(client, "guarded", 1) == list(range(20))
    finally:
        cluster.close()


def test_a_retry_after_failover_is_answered_as_a_duplicate_with_its_offsets(
    replicated_cluster: ReplicatedCluster,
) -> None:
    """The producer state travels in the log: batches acknowledged by a leader that is then
    SIGKILLed, sent again (same producer id, epoch and sequences) to the elected follower,
    are answered as duplicates with their original offsets, and written nowhere twice."""
    replicated_cluster.create_topic("retried", 1, replication_factor=3)
    before = replicated_cluster.state("retried", 0)
    client = replicated_cluster.client
    pid, epoch = client.init_producer_id()
    first = _answers(client, "retried", pid, epoch, range(0, 4))
    assert not any(a.duplicate for a in first)
    replicated_cluster.brokers[before.leader].kill(signal.SIGKILL)
    after = replicated_cluster.wait_leader_change("retried", 0, before.leader)
    assert after.leader_epoch > before.leader_epoch
    again = _answers(client, "retried", pid, epoch, range(0, 4))
    assert all(a.duplicate for a in again), again
    assert [(a.base_offset, a.last_offset) for a in again] == [
        (a.base_offset, a.last_offset) for a in first
    ]
    more = _answers(client, "retried", pid, epoch, range(4, 6))  # the sequence goes on
    assert [a.base_offset for a in more] == [40, 50]
    assert _read_ids(client, "retried", 1) == list(range(60))


def _answers(
    client: BrokerClient, topic: str, pid: int, epoch: int, batches: range, acks: int = ACKS_ALL
) -> list[ProduceResponse]:
    """Batch i holds ids i*10 .. i*10+9 at sequence i*10; every answer ok."""
    client.refresh_metadata()  # a raw stream goes where the cached view says
    with client.produce_stream(topic, 0, acks=acks) as stream:
        handles = [
            stream.send(
                rows(10, start=i * 10),
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=i * 10,
                transactional=False,
            )
            for i in batches
        ]
        answers = [h.result(30) for h in handles]
    assert all(a.ok for a in answers), answers
    return answers
