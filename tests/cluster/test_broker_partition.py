"""A broker host cut off from ZooKeeper and the clients while producers send (issue 14,
scenario 4).

ZooKeeper and three brokers run on hosts of their own (``BrokerCluster``); an idempotent
producer in the test process sends keyed rows to all six partitions of a topic, one
partition per send, so every send's future tells whether exactly its ids were
acknowledged. The host of broker 2 (not the controller) is cut for 2.5x the ZooKeeper
session timeout: its session expires, the other brokers drop it from the metadata and go
on serving their partitions, and its partitions answer nothing. Healed, it learns its
session is gone, registers again in a new one, and the producer's retries (same producer
id, epoch and sequences) carry the batches held back by the cut into its partitions.
Read back, every acknowledged id is there exactly once and in per-key order.

A transactional producer's commit issued during such a cut waits for the cut broker's
markers (the coordinator, on the controller, retries them) and succeeds after its return.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import IdemlogError
from broker_core.producer import Producer, SendResult
from broker_core.producer.partitioner import partitions_for_keys
from broker_core.protocol.wire import Action
from spark_sink.verify import verify_exactly_once
from tests.harness.broker import BrokerProcess
from tests.harness.cluster import BrokerCluster, cut_cluster, live_ids, read_back
from tests.harness.netns import TestBed
from tests.harness.waiting import wait_until

SESSION_MS = 2000
CUT_S = 2.5 * SESSION_MS / 1000  # held so long that ZooKeeper surely expires the session
PARTITIONS = 6
ROWS = 8  # rows per send, all of one partition
KEYS_PER_PARTITION = 5
SEND_EVERY_S = 0.004  # a steady stream of sends, not one burst
# The batches held back by the cut must outlive it and the return: the delivery timeout
# covers the cut, the new session and the reconnection many times over.
PRODUCER_CONFIG = {
    "linger.ms": 5,
    "retry.backoff.ms": 50,
    "request.timeout.ms": 2000,
    "delivery.timeout.ms": 45_000,
}
# Margin for an acknowledgement already on its way when the link went down (the sender's
# thread completes the future a poll later).
ACK_SLACK_S = 0.5


@dataclass
class Send:
    partition: int
    ids: range
    queued_at: float
    future: Future[SendResult]
    done_at: float | None = None


@dataclass
class Stream:
    """A thread sending ``ROWS`` keyed rows to one partition at a time, round-robin over
    the partitions, ids increasing; every send and when its future completed."""

    producer: Producer
    topic: str
    keys: dict[int, list[int]]  # partition -> keys routed to it
    sends: list[Send] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    error: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        try:
            next_id, i = 0, 0
            while not self.stop.is_set():
                p = i % PARTITIONS
                keys = self.keys[p]
                ids = np.arange(next_id, next_id + ROWS, dtype=np.int64)
                key = np.array([keys[(i // PARTITIONS + j) % len(keys)] for j in range(ROWS)])
                table = pa.table({"id": ids, "key": key, "value": ids.astype(np.float64)})
                queued = time.monotonic()
                future = self.producer.send(self.topic, table, key="key")
                send = Send(p, range(next_id, next_id + ROWS), queued, future)
                with self.lock:
                    self.sends.append(send)
                future.add_done_callback(lambda _f, s=send: setattr(s, "done_at", time.monotonic()))
                next_id += ROWS
                i += 1
                time.sleep(SEND_EVERY_S)  # pacing: the stream's rate, not a synchronisation
        except BaseException as exc:
            self.error.append(exc)

    def snapshot(self) -> list[Send]:
        with self.lock:
            return list(self.sends)

    def acked(self, send: Send) -> bool:
        f = send.future
        return f.done() and not f.cancelled() and f.exception() is None

    def acks_after(self, partitions: set[int], since: float) -> set[int]:
        """The partitions of ``partitions`` with an acknowledgement after ``since``."""
        return {
            s.partition
            for s in self.snapshot()
            if s.partition in partitions
            and s.done_at is not None
            and s.done_at > since
            and self.acked(s)
        }


def _keys_by_partition() -> dict[int, list[int]]:
    """``KEYS_PER_PARTITION`` integer keys the producer's hash routes to each partition."""
    candidates = np.arange(10_000, dtype=np.int64)
    routed = np.asarray(partitions_for_keys(pa.array(candidates), PARTITIONS))
    keys = {p: candidates[routed == p][:KEYS_PER_PARTITION].tolist() for p in range(PARTITIONS)}
    assert all(len(k) == KEYS_PER_PARTITION for k in keys.values())
    return keys


def _metadata(client: BrokerClient, broker: BrokerProcess) -> dict[str, Any]:
    """METADATA as this one broker sees it (no routing)."""
    return client.action(broker.address, Action.METADATA, {})


@pytest.fixture
def cluster(
    testbed: TestBed, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[BrokerCluster]:
    with cut_cluster(testbed, tmp_path / "cluster", request, session_ms=SESSION_MS) as brokers:
        yield brokers


@dataclass
class Cut:
    """When a cut began, when the others dropped the broker, when it was healed, when
    every broker saw it registered again (``time.monotonic()``)."""

    at: float = 0.0
    dropped_at: float = 0.0
    healed_at: float = 0.0
    back_at: float = 0.0

    def __str__(self) -> str:
        return (
            f"dropped {self.dropped_at - self.at:.2f}s after the cut, healed at "
            f"{self.healed_at - self.at:.2f}s, registered again "
            f"{self.back_at - self.healed_at:.2f}s after the heal"
        )


@contextlib.contextmanager
def _cut_past_session(
    cluster: BrokerCluster, client: BrokerClient, victim_id: int
) -> Iterator[Cut]:
    """Cut broker ``victim_id``'s host; once the other brokers dropped it (its session
    expired), run the body; hold the cut for ``CUT_S`` in all, heal, and return once the
    broker saw its session was lost and every broker sees it registered again."""
    victim, host = cluster.brokers[victim_id - 1], cluster.hosts[victim_id - 1]
    survivors = [b for i, b in enumerate(cluster.brokers, 1) if i != victim_id]
    cut = Cut()
    host.cut()
    cut.at = time.monotonic()
    try:
        # The session expires on the ZooKeeper server: the other brokers' metadata drops
        # the broker (its ephemeral registration went with the session).
        wait_until(
            lambda: all(victim_id not in live_ids(client, b) for b in survivors),
            f"the surviving brokers to drop broker {victim_id}",
            timeout=CUT_S,
        )
        cut.dropped_at = time.monotonic()
        yield cut
        # The fault's duration: the cut is held for CUT_S in all.
        time.sleep(max(0.0, CUT_S - (time.monotonic() - cut.at)))
    finally:
        host.heal()
        cut.healed_at = time.monotonic()
    # The returning broker finds its session expired and registers in a new one.
    victim.wait_for_log("ZooKeeper session lost", timeout=30)
    wait_until(
        lambda: all(live_ids(client, b) == {1, 2, 3} for b in cluster.brokers),
        f"broker {victim_id} registered again, seen by every broker",
        timeout=30,
    )
    cut.back_at = time.monotonic()


def _create_topic(cluster: BrokerCluster, client: BrokerClient, topic: str) -> list[int]:
    """The topic on all three brokers, known to each; broker 1 is the controller."""
    # One replica per partition: the scenario is a partition whose only broker is cut off
    # (a replicated leader cut off: test_replica_cut.py).
    leaders = client.create_topic(topic, PARTITIONS, config={"replication.factor": 1})
    wait_until(
        lambda: all(_metadata(client, b)["topics"].get(topic) == leaders for b in cluster.brokers),
        f"every broker to learn topic {topic!r}",
    )
    assert sorted(leaders) == [1, 1, 2, 2, 3, 3]
    assert all(_metadata(client, b)["controller"] == 1 for b in cluster.brokers)
    return leaders


def test_broker_cut_off_past_its_session_returns_without_losing_or_duplicating_acked_rows(
    cluster: BrokerCluster,
) -> None:
    """Its partitions are unavailable during the cut, the others' served; nothing sent
    fails (delivery.timeout.ms outlasts the outage); read back, each acknowledged id
    once, in per-key order, in the partition it was sent to."""
    topic = "cut"
    client = cluster.client()
    leaders = _create_topic(cluster, client, topic)
    victim_id = 2  # not the controller
    cut_parts = {p for p in range(PARTITIONS) if leaders[p] == victim_id}
    other_parts = set(range(PARTITIONS)) - cut_parts
    # For the reads during the cut: no retries, an unavailable leader fails at once.
    reader = BrokerClient(cluster.bootstrap, retries=0, timeout_s=5)

    producer = Producer(cluster.bootstrap, **PRODUCER_CONFIG)
    stream = Stream(producer, topic, _keys_by_partition())
    thread = threading.Thread(target=stream.run, name="stream", daemon=True)
    thread.start()
    try:
        start = time.monotonic()
        wait_until(
            lambda: stream.acks_after(set(range(PARTITIONS)), start) == set(range(PARTITIONS)),
            "acknowledged sends to every partition before the cut",
        )
        with _cut_past_session(cluster, client, victim_id) as cut:
            # Reads of the cut broker's partitions fail retriably, naming the partition
            # (its leader is not alive); the others' partitions are read.
            for p in sorted(cut_parts):
                with pytest.raises(IdemlogError, match=f"{topic}-{p}") as err:
                    reader.fetch_once(topic, p, 0)
                assert err.value.retriable, err.value
            for p in sorted(other_parts):
                assert reader.fetch_once(topic, p, 0) is not None
        # Its partitions take produce again: the batches held back by the cut, then more.
        wait_until(
            lambda: stream.acks_after(cut_parts, cut.back_at) == cut_parts,
            f"acknowledged sends to {sorted(cut_parts)} after the return",
            timeout=45,
        )
    finally:
        stream.stop.set()
        thread.join(30)
        reader.close()
    assert not stream.error, stream.error
    producer.flush(60)
    metrics = producer.metrics_snapshot()
    producer.close()
    sends = stream.snapshot()
    acked = [s for s in sends if stream.acked(s)]
    failed = [s for s in sends if not stream.acked(s)]
    print(
        f"sends {len(sends)}, acknowledged {len(acked)}, failed {len(failed)}; broker {cut}; "
        f"producer retries {metrics['retries']}, duplicates {metrics['duplicates']}"
    )

    # During the cut the other brokers kept serving: sends queued after the cut were
    # acknowledged before the heal on every one of their partitions.
    served = {
        s.partition
        for s in acked
        if s.partition in other_parts and s.queued_at > cut.at and s.done_at < cut.healed_at
    }
    assert served == other_parts, (served, other_parts)
    # The cut broker's partitions acknowledged nothing queued after the cut, and nothing
    # at all once an answer already on its way had had time to arrive.
    cut_acks = [s for s in acked if s.partition in cut_parts and s.done_at < cut.healed_at]
    assert not [s for s in cut_acks if s.queued_at > cut.at], cut_acks
    assert not [s for s in cut_acks if s.done_at > cut.at + ACK_SLACK_S], cut_acks
    # Sends to its partitions queued during the cut were held and retried, not failed:
    # nothing failed at all (delivery.timeout.ms outlasts the outage).
    held = [s for s in sends if s.partition in cut_parts and cut.at < s.queued_at < cut.healed_at]
    assert held and all(s.done_at > cut.healed_at for s in held)
    assert metrics["retries"] > 0, metrics
    assert not failed, [(s.partition, s.ids, s.future.exception()) for s in failed[:5]]

    table = read_back(client, topic)
    client.close()
    ids = table.column("id").to_numpy()
    assert len(ids) == len(np.unique(ids)), "an id was written twice"
    acked_ids = [i for s in acked for i in s.ids]
    verdict = verify_exactly_once(table, id_column="id", key_column="key", expected_ids=acked_ids)
    assert verdict.duplicates == 0 and verdict.missing == 0, verdict
    assert verdict.order_violations == 0, verdict
    # Anything present but not acknowledged can only be a send whose future failed.
    unacked_present = set(ids.tolist()) - set(acked_ids)
    assert unacked_present <= {i for s in failed for i in s.ids}, sorted(unacked_present)[:10]
    # Each id is in the partition its send went to.
    where = dict(zip(ids.tolist(), table.column("_partition").to_pylist(), strict=True))
    assert all(where[i] == s.partition for s in acked for i in s.ids)


def _txn_sends(
    producer: Producer, topic: str, keys: dict[int, list[int]], first_id: int
) -> list[Send]:
    """``ROWS`` rows to every partition, one send each, ids from ``first_id``."""
    sends = []
    for p in range(PARTITIONS):
        start = first_id + p * ROWS
        ids = np.arange(start, start + ROWS, dtype=np.int64)
        key = np.array([keys[p][j % len(keys[p])] for j in range(ROWS)])
        table = pa.table({"id": ids, "key": key, "value": ids.astype(np.float64)})
        future = producer.send(topic, table, key="key")
        sends.append(Send(p, range(start, start + ROWS), time.monotonic(), future))
    return sends


def test_commit_across_a_broker_cut_off_past_its_session(cluster: BrokerCluster) -> None:
    """A transaction whose rows were all acknowledged before the cut, committed during
    it: the commit waits for the marker of the cut broker's partitions and succeeds once
    it is back; every committed row is read once, every partition stable again."""
    topic = "cuttxn"
    client = cluster.client()
    leaders = _create_topic(cluster, client, topic)
    keys = _keys_by_partition()
    producer = Producer(cluster.bootstrap, **PRODUCER_CONFIG, **{"transactional.id": "cut-app"})
    producer.init_transactions()
    # Neither the controller (broker 1) nor the transaction's coordinator (the leader of
    # its __transaction_state partition): the scenario is a data partition's broker cut.
    found = client.action(
        cluster.brokers[0].address, Action.FIND_COORDINATOR, {"transactional_id": "cut-app"}
    )
    victim_id = 3 if found["broker_id"] == 2 else 2
    cut_parts = {p for p in range(PARTITIONS) if leaders[p] == victim_id}
    per_txn = PARTITIONS * ROWS
    committed: list[int] = []

    producer.begin_transaction()
    _txn_sends(producer, topic, keys, 0)
    producer.commit_transaction()
    committed += range(0, per_txn)

    # Every row of the second transaction is acknowledged before the cut; its commit
    # must write a marker into the cut broker's partitions.
    producer.begin_transaction()
    sends = _txn_sends(producer, topic, keys, per_txn)
    producer.flush()
    assert all(s.future.exception() is None for s in sends)
    assert cut_parts <= {s.partition for s in sends}
    outcome: list[BaseException | None] = []
    committed_at: list[float] = []

    def commit() -> None:
        try:
            producer.commit_transaction()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)
        committed_at.append(time.monotonic())

    committer = threading.Thread(target=commit, name="commit", daemon=True)
    with _cut_past_session(cluster, client, victim_id) as cut:
        committer.start()
        # The live leaders get their markers while the cut broker's wait: their readers
        # see the transaction committed, not held back until the broker returns.
        live = [p for p in range(PARTITIONS) if p not in cut_parts]

        def stable(p: int) -> bool:
            offsets = client.list_offsets(topic, p)
            return bool(offsets["last_stable_offset"] == offsets["log_end_offset"])

        wait_until(
            lambda: all(stable(p) for p in live),
            "the live brokers' partitions committed during the cut",
            timeout=30,
        )
        assert not outcome, f"the commit cannot be complete while broker {victim_id} is cut off"
    committer.join(60)
    assert outcome == [None], outcome
    # The coordinator writes every marker before EndTxn succeeds: the commit waited for
    # the broker's return (the producer retried EndTxn meanwhile), then succeeded.
    assert committed_at[0] > cut.healed_at, (committed_at[0] - cut.at, cut)
    print(f"broker {cut}; commit returned {committed_at[0] - cut.healed_at:.2f}s after the heal")
    committed += range(per_txn, 2 * per_txn)

    producer.begin_transaction()
    _txn_sends(producer, topic, keys, 2 * per_txn)
    producer.commit_transaction()
    committed += range(2 * per_txn, 3 * per_txn)
    producer.close()

    for p in range(PARTITIONS):
        offsets = client.list_offsets(topic, p)
        assert offsets["last_stable_offset"] == offsets["log_end_offset"], (p, offsets)
    table = read_back(client, topic)
    client.close()
    verdict = verify_exactly_once(table, id_column="id", key_column="key", expected_ids=committed)
    assert verdict.ok and verdict.order_violations == 0, verdict
