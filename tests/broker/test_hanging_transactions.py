"""Hanging transactions (issue 35; Kafka's KIP-664 tools) on three real broker processes and
a real ZooKeeper: a transaction open on a partition that no coordinator knows holds the
partition's last stable offset; ``idemlog transactions find-hanging`` lists it (and not a
transaction its coordinator knows), ``idemlog transactions abort --topic --partition``
ends it with an ABORT marker one producer epoch up, the last stable offset reaches the log
end (on a new leader too, after the old one is SIGKILLed), and the producer that left it is
fenced on that partition.

The hanging transaction is made as Kafka's arose before transaction verification
(KIP-890): transactional rows written under a producer id no coordinator maps to that
partition (here an idempotent producer id), which a broker since issue 36 accepts only
with the test hook ``unverified_txn_produce`` armed: data written before that change.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import IdemlogError, InvalidProducerEpochError, ProducerFencedError
from testkit.broker_failpoints import ENV, UNVERIFIED_TXN_PRODUCE
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import ids, rows
from tests.harness.broker import TEST_HOOKS, BrokerFactory
from tests.harness.replicated import ReplicatedCluster
from tests.harness.waiting import wait_until

TOPIC = "hang"
IDLE_MS = 1500  # find-hanging's threshold in the test: the hanging producer idles past it


def idemlog(cluster: ReplicatedCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker_core.cli.main", "transactions", *args,
         "--bootstrap", cluster.bootstrap],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def find_hanging(cluster: ReplicatedCluster, *args: str) -> list[dict[str, int]]:
    done = idemlog(cluster, "find-hanging", "--json", *args)
    assert done.returncode == 0, done.stderr
    found: list[dict[str, int]] = json.loads(done.stdout)
    return found


def send(
    client: BrokerClient,
    partition: int,
    start: int,
    pid: int,
    epoch: int,
    seq: int,
    txn: bool,
    tid: str | None = None,
) -> None:
    with client.produce_stream(TOPIC, partition, transactional_id=tid) as stream:
        stream.send(rows(3, start=start), producer_id=pid, producer_epoch=epoch,
                    base_sequence=seq, transactional=txn).offsets(10)  # fmt: skip


def test_a_hanging_transaction_is_found_aborted_and_its_producer_fenced(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    cluster = ReplicatedCluster(
        zk_chroot,
        broker_factory,
        extra=TEST_HOOKS,
        env={ENV: UNVERIFIED_TXN_PRODUCE},
    )
    cluster.create_topic(TOPIC, 2, replication_factor=3, min_insync_replicas=2)
    client = BrokerClient(cluster.bootstrap, retries=10)

    # A transaction its coordinator knows, left open on partition 1: never "hanging".
    pid_alive, epoch_alive = client.init_producer_id("alive", 120_000)
    client.add_partitions_to_txn("alive", pid_alive, epoch_alive, [(TOPIC, 1)])
    send(client, 1, 100, pid_alive, epoch_alive, 0, txn=True, tid="alive")

    # The hanging one on partition 0, then plain rows behind it, held back by it.
    pid, epoch = client.init_producer_id()
    send(client, 0, 0, pid, epoch, 0, txn=True)
    plain_pid, plain_epoch = client.init_producer_id()
    send(client, 0, 10, plain_pid, plain_epoch, 0, txn=False)
    before = client.list_offsets(TOPIC, 0)
    assert before["last_stable_offset"] == 0 < before["log_end_offset"] == 6, before
    assert ids(client, TOPIC, 0) == []  # read_committed: nothing past the open transaction

    # Idle past the threshold: listed, with its start offset; the known one never is.
    started = time.monotonic()
    found = wait_until(
        lambda: find_hanging(cluster, "--topic", TOPIC, "--older-than-ms", str(IDLE_MS)),
        "find-hanging to list the hanging transaction",
        timeout=30,
        interval=0.5,
    )
    print(f"found after {time.monotonic() - started:.1f} s idle: {found}")
    assert [(h["partition"], h["producer_id"], h["txn_start_offset"]) for h in found] == [
        (0, pid, 0)
    ]
    assert found[0]["producer_epoch"] == epoch and found[0]["idle_ms"] >= IDLE_MS
    assert find_hanging(cluster, "--older-than-ms", "600000") == []
    text = idemlog(cluster, "find-hanging", "--older-than-ms", "0")
    assert text.returncode == 0 and f"{TOPIC}-0" in text.stdout and "abort one with" in text.stdout

    # Refused in one line: bad flags (exit 2), a stale epoch (exit 1).
    bad = idemlog(cluster, "abort", "--topic", TOPIC, "--partition", "0")
    assert bad.returncode == 2 and "--producer-id" in bad.stderr, bad.stderr
    stale = idemlog(cluster, "abort", "--topic", TOPIC, "--partition", "0",
                    "--producer-id", str(pid), "--producer-epoch", str(epoch + 1))  # fmt: skip
    assert stale.returncode == 1 and f"at epoch {epoch}" in stale.stderr, stale.stderr

    aborted = idemlog(cluster, "abort", "--topic", TOPIC, "--partition", "0",
                      "--producer-id", str(pid), "--producer-epoch", str(epoch))  # fmt: skip
    assert aborted.returncode == 0, aborted.stderr
    print(aborted.stdout.strip())
    assert f"producer id {pid}" in aborted.stdout and "fenced" in aborted.stdout
    after = client.list_offsets(TOPIC, 0)
    assert after["last_stable_offset"] == after["log_end_offset"] == 7, after  # + the marker
    assert ids(client, TOPIC, 0) == [10, 11, 12]
    assert find_hanging(cluster, "--older-than-ms", "0") == []

    again = idemlog(cluster, "abort", "--topic", TOPIC, "--partition", "0",
                    "--start-offset", "0")  # fmt: skip
    assert again.returncode == 1 and "no open transaction starts at offset 0" in again.stderr

    # The producer that left it is fenced there: loudly, never half-written.
    with pytest.raises((InvalidProducerEpochError, ProducerFencedError)):
        send(client, 0, 20, pid, epoch, 3, txn=True)

    # The marker is on every in-sync replica: a new leader has the same stable end.
    old = cluster.state(TOPIC, 0)
    assert cluster.brokers[old.leader].kill() != 0
    new = cluster.wait_leader_change(TOPIC, 0, old.leader)
    print(f"partition 0 moved from broker {old.leader} to {new.leader} (epoch {new.leader_epoch})")

    def stable_on_new_leader() -> dict[str, int] | None:
        try:
            return client.list_offsets(TOPIC, 0)
        except IdemlogError:
            return None

    moved = wait_until(stable_on_new_leader, "the new leader's offsets", timeout=60)
    assert moved["last_stable_offset"] == moved["log_end_offset"] == 7, moved
    assert ids(client, TOPIC, 0) == [10, 11, 12]

    # The known transaction was untouched; it commits.
    client.end_txn("alive", pid_alive, epoch_alive, commit=True)
    wait_until(lambda: ids(client, TOPIC, 1) == [100, 101, 102], "the known one's rows")
