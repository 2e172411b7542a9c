"""A replica that returns after retention moved the leader's log start past its log end
(issue 24, test 3), with real broker processes on a real ZooKeeper: it resets its log to
the leader's log start with the leader's producer state and epoch there, rejoins the ISR,
ends byte-identical to the others, and once it leads answers retries of old producers as
duplicates and knows the transaction left open across the reset (docs/replication.md,
"A follower below the leader's log start")."""

from __future__ import annotations

import shutil
import signal
import time

import numpy as np
import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.producer import Producer
from broker_core.protocol.requests import ACKS_ALL
from broker_core.protocol.wire import ProduceResponse
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import ids, rows
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.replicated import ReplicatedCluster
from tests.harness.waiting import wait_until

TOPIC = "rejoin"
SEGMENT_BYTES = 64 * 1024
RETENTION_BYTES = 4 * SEGMENT_BYTES
REJOIN_BOUND_S = 60.0  # generous: measured a few seconds on a loaded 2-core machine


def _raw(client: BrokerClient, pid: int, epoch: int, sequences: list[int]) -> list[ProduceResponse]:
    """Batches of 10 rows at ``sequences`` (ids 100_000 * pid-rank + seq ..), acks=all, to
    the partition's current leader; every answer ok."""
    client.refresh_metadata()  # a raw stream goes where the cached view says
    with client.produce_stream(TOPIC, 0, acks=ACKS_ALL) as stream:
        handles = [
            stream.send(
                rows(10, start=1_000_000 + seq),
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=seq,
                transactional=False,
            )
            for seq in sequences
        ]
        answers = [h.result(30) for h in handles]
    assert all(a.ok for a in answers), answers
    return answers


def _table(start: int, n: int) -> pa.Table:
    column = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {"id": column, "key": (column % 7).astype(np.int32), "value": column.astype(str)}
    )


def _segments(cluster: ReplicatedCluster, broker: BrokerProcess) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in cluster.partition_dir(broker, TOPIC, 0).glob("*.log")))


@pytest.mark.parametrize("wiped", [True, False], ids=["disk-wiped", "away-past-retention"])
def test_a_follower_below_the_log_start_resets_rejoins_and_leads_with_the_producer_state(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, wiped: bool
) -> None:
    """The follower's disk is wiped, or it keeps its log that now ends below the leader's
    start (a replica away longer than retention): either way it resets and rejoins."""
    cluster = ReplicatedCluster(
        zk_chroot, broker_factory, extra={"log.retention.check.interval.ms": 200}
    )
    try:
        cluster.create_topic(
            TOPIC,
            1,
            replication_factor=3,
            segment_bytes=SEGMENT_BYTES,
            retention_bytes=RETENTION_BYTES,
            max_message_bytes=SEGMENT_BYTES,
        )
        first = cluster.state(TOPIC, 0)
        assert first.leader == first.replicas[0]
        # The replica a clean stop of the leader hands the partition to: the one wiped.
        fid = first.replicas[1]
        leader, follower = cluster.brokers[first.leader], cluster.brokers[fid]
        client = cluster.client

        # Producers whose batches retention will delete: OLD wholly, LATE but its last.
        old_pid, old_epoch = client.init_producer_id()
        late_pid, late_epoch = client.init_producer_id()
        old = _raw(client, old_pid, old_epoch, [0, 10])
        late_first = _raw(client, late_pid, late_epoch, [0])
        txn = Producer(
            cluster.bootstrap,
            **{"transactional.id": "across-reset", "transaction.timeout.ms": 600_000},
        )
        txn.init_transactions()
        txn.begin_transaction()
        txn.send(TOPIC, _table(5_000_000, 10)).result(30)
        txn.flush()
        open_at = cluster.offsets(leader, TOPIC, 0)["last_stable_offset"]
        assert open_at < cluster.offsets(leader, TOPIC, 0)["log_end_offset"]  # it is open

        follower.kill(signal.SIGKILL)
        old_end = cluster.offsets(leader, TOPIC, 0)["log_end_offset"]
        cluster.wait_state(TOPIC, 0, lambda s: fid not in s.isr, f"broker {fid} out of the ISR")
        if wiped:
            shutil.rmtree(follower.log_dir)  # its disk is replaced by an empty one
            follower.log_dir.mkdir()

        with Producer(cluster.bootstrap, **{"linger.ms": 2, "batch.size": 16 * 1024}) as producer:
            start = 0
            while cluster.offsets(leader, TOPIC, 0)["log_start_offset"] <= old_end:
                futures = [producer.send(TOPIC, _table(start + 200 * i, 200)) for i in range(20)]
                producer.flush()
                for f in futures:
                    f.result(30)
                start += 4_000
                assert start < 400_000, "retention never moved the log start"
        late_last = _raw(client, late_pid, late_epoch, [10])
        before = cluster.offsets(leader, TOPIC, 0)
        assert before["log_start_offset"] > old_end > old[-1].last_offset
        assert before["last_stable_offset"] == open_at  # the transaction is still open
        committed_before = ids(client, TOPIC)

        restarted = time.monotonic()
        follower.restart()
        cluster.wait_state(
            TOPIC, 0, lambda s: fid in s.isr, f"broker {fid} back in the ISR", REJOIN_BOUND_S
        )
        rejoin_s = time.monotonic() - restarted
        print(f"wiped={wiped} rejoin_s={rejoin_s:.2f} log_start={before['log_start_offset']}")
        follower.wait_for_log("reset to start at")
        assert rejoin_s < REJOIN_BOUND_S
        cluster.wait_in_sync(TOPIC, 0)

        leader.stop()  # a clean stop hands the partition to the reset replica
        now = cluster.wait_leader_change(TOPIC, 0, first.leader)
        assert now.leader == fid and now.leader_epoch > first.leader_epoch
        for pid, epoch, sequences, original in (
            (old_pid, old_epoch, [0, 10], old),
            (late_pid, late_epoch, [0], late_first),
            (late_pid, late_epoch, [10], late_last),
        ):
            again = _raw(client, pid, epoch, sequences)
            assert all(a.duplicate for a in again), again
            assert [(a.base_offset, a.last_offset) for a in again] == [
                (a.base_offset, a.last_offset) for a in original
            ]
        after = cluster.offsets(follower, TOPIC, 0)
        assert after["log_end_offset"] == before["log_end_offset"]  # nothing written twice
        assert after["last_stable_offset"] == open_at  # the open transaction is known
        assert ids(client, TOPIC) == committed_before == []  # read_committed stops there

        txn.commit_transaction()
        txn.close()
        committed = ids(client, TOPIC)
        assert committed == ids(client, TOPIC, isolation="read_uncommitted")
        assert committed[-10:] == list(range(1_000_010, 1_000_020))  # LATE's last batch

        leader.restart()
        cluster.wait_in_sync(TOPIC, 0)
        wait_until(  # retention runs on each replica by itself: the same segments in the end
            lambda: len({_segments(cluster, b) for b in cluster.running()}) == 1,
            "every replica's retention at the same log start",
        )
        for broker in cluster.running():
            broker.stop()
        cluster.assert_stopped_replicas_identical(TOPIC, 1)
    finally:
        cluster.close()
