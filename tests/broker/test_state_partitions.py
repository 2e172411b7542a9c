"""Coordination spread over the brokers (issue 23): ``__transaction_state`` with several
partitions on three real broker processes and a real ZooKeeper.

Two sinks and a plain transactional producer whose ids map to state partitions led by
different brokers commit concurrently; one coordinator's broker is SIGKILLed: only its
partitions' ids wait for the failover while the other coordinator's sink keeps
committing; afterwards every batch is read exactly once and whole through the readers'
cut across every state partition's coordinator, and ``idemlog transactions list`` shows
both sinks' ids. A restart of every broker with other ``num.partitions`` settings keeps
the topic's own count and routes every id to the partition that holds its state.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import IdemlogError, InvalidRequestError, NotCoordinatorError
from broker_core.protocol.admin_requests import TransactionListing
from broker_core.protocol.coordinator_keys import TXN_STATE_TOPIC, state_partition_of
from broker_core.protocol.txn_requests import CommitSinkBatchRequest
from broker_core.protocol.wire import Action, SinkAttempt, SinkTxnStatus
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import ids, prepared_attempt, rows, sink_task_attempt
from tests.harness.broker import BrokerFactory
from tests.harness.client_calls import answering_address
from tests.harness.replicated import ReplicatedCluster
from tests.harness.waiting import wait_until

STATE_PARTITIONS = 6
TOPIC = "spread"
PARTITIONS = 3
# A SIGKILLed coordinator's partitions move after its session (6 s) and a load; the
# followers drop it from their ISR after 1.5 s, so acks=all appends of the partitions it
# did not lead go on long before its own ids are served again.
EXTRA = {
    "transaction.state.log.num.partitions": STATE_PARTITIONS,
    "zookeeper.session.timeout.ms": 6000,
    "replica.lag.time.max.ms": 1500,
}


def _leaders(cluster: ReplicatedCluster) -> dict[int, int]:
    """Each state partition's leader as FIND_COORDINATOR names it, once every one's
    coordinator answers (loaded)."""
    client = cluster.client
    client.state_partition_count()  # the first FIND_COORDINATOR creates the topic

    def loaded() -> dict[int, int] | None:
        try:
            client.list_transactions()  # every partition's coordinator answers
            return {p: _leader(cluster, p) for p in range(STATE_PARTITIONS)}
        except IdemlogError:
            return None

    found: dict[int, int] = wait_until(loaded, "every state partition's coordinator loaded")
    return found


def _leader(cluster: ReplicatedCluster, state_partition: int) -> int:
    request = {"state_partition": state_partition}
    doc = cluster.client.action(answering_address(cluster.client), Action.FIND_COORDINATOR, request)
    assert doc["state_partitions"] == STATE_PARTITIONS, doc
    return int(doc["broker_id"])


def _key_led_by(prefix: str, leaders: dict[int, int], broker: int) -> str:
    """The first ``<prefix>-<n>`` whose state partition ``broker`` leads."""
    n = 0
    while leaders[state_partition_of(f"{prefix}-{n}", STATE_PARTITIONS)] != broker:
        n += 1
    return f"{prefix}-{n}"


@dataclass
class Committer:
    """A sink committing batch after batch into ``partitions`` (each batch's rows ids
    ``base + batch * 1000 + ...``), recording when each commit returned."""

    client: BrokerClient
    sink: str
    base: int
    partitions: list[int]
    committed: dict[int, list[int]] = field(default_factory=dict)
    done_at: list[float] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    # (batch, task) -> the ids of its last attempt whose prepare answered
    prepared: dict[tuple[int, int], list[int]] = field(default_factory=dict)

    def run(self) -> None:
        batch = 0
        attempt = 0
        try:
            while not self.stop.is_set():
                written = self._one(batch, attempt)
                if written is None:
                    attempt += 1  # the batch again, as a new attempt (Spark's retry)
                    continue
                self.committed[batch] = written
                self.done_at.append(time.monotonic())
                batch += 1
        except BaseException as exc:  # asserted empty by the test
            self.errors.append(exc)

    def _one(self, batch: int, attempt: int) -> list[int] | None:
        """One batch: two tasks, then the driver's commit; None after a retriable error
        (a partition or the coordinator moving), to be retried as a new attempt.

        A task whose init hands back an earlier attempt's prepared transaction of the
        batch writes nothing, as the Spark writer does: its rows are that attempt's
        (``self.prepared``); when that attempt's prepare answer was lost they are not
        known here, and the batch's rows are then not checked, only not doubled."""
        run = "run-1"
        rows_of: dict[int, list[int] | None] = {}
        try:
            txns = []
            for task in range(2):
                first = self.base + batch * 1000 + attempt * 100 + task * 5
                spans = {p: [range(first + p * 10, first + p * 10 + 3)] for p in self.partitions}
                txn, status = sink_task_attempt(
                    self.client,
                    SinkAttempt(self.sink, run, batch),
                    task,
                    TOPIC,
                    spans,
                    timeout_ms=120_000,
                )
                if status is SinkTxnStatus.NEW:
                    written = [i for rs in spans.values() for r in rs for i in r]
                    self.prepared[(batch, task)] = written
                    rows_of[task] = written
                else:
                    rows_of[task] = self.prepared.get((batch, task))
                txns.append(txn)
            committed = self.client.commit_sink_batch(self.sink, batch, txns, run)
        except IdemlogError as exc:
            if not exc.retriable:
                raise
            time.sleep(0.2)  # backoff before the next attempt, not a synchronisation
            return None
        if not committed or any(r is None for r in rows_of.values()):
            # An earlier attempt whose commit answer was lost committed the batch (these
            # transactions were aborted), or a reused transaction's rows are not known:
            # its rows are not known here, only not doubled.
            return []
        return [i for task in range(2) for i in rows_of[task] or []]


def test_two_coordinators_commit_concurrently_and_a_failover_stalls_only_its_own_ids(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    cluster = ReplicatedCluster(zk_chroot, broker_factory, extra=EXTRA)
    leaders = _leaders(cluster)
    assert len(set(leaders.values())) >= 2, leaders  # coordination is spread
    cluster.create_topic(TOPIC, PARTITIONS, replication_factor=3)
    victim, survivor = sorted(set(leaders.values()))[:2]
    sink_a = _key_led_by("sinkA", leaders, victim)  # its coordinator is killed
    sink_b = _key_led_by("sinkB", leaders, survivor)
    plain = _key_led_by("plain", leaders, survivor)
    _misrouted_calls_are_refused(cluster, sink_a, sink_b, victim, survivor)
    data_leaders = {p: cluster.state(TOPIC, p).leader for p in range(PARTITIONS)}
    away = [p for p, b in data_leaders.items() if b != victim]  # untouched by the kill
    assert away, data_leaders

    a = Committer(
        BrokerClient(cluster.bootstrap, retries=10), sink_a, 10**6, list(range(PARTITIONS))
    )
    b = Committer(BrokerClient(cluster.bootstrap, retries=10), sink_b, 2 * 10**6, away)
    threads = [threading.Thread(target=c.run, daemon=True) for c in (a, b)]
    for t in threads:
        t.start()
    wait_until(lambda: len(a.committed) >= 3 and len(b.committed) >= 3, "both sinks committing")

    # A plain transactional producer of the survivor's, committed meanwhile.
    pclient = BrokerClient(cluster.bootstrap, retries=10)
    pid, epoch = pclient.init_producer_id(plain, 60_000)
    pclient.add_partitions_to_txn(plain, pid, epoch, [(TOPIC, away[0])])
    with pclient.produce_stream(TOPIC, away[0], transactional_id=plain) as stream:
        stream.send(rows(4, start=9 * 10**6), producer_id=pid, producer_epoch=epoch,
                    base_sequence=0, transactional=True).offsets(10)  # fmt: skip
    pclient.end_txn(plain, pid, epoch, commit=True)

    a_before, b_before = len(a.committed), len(b.committed)
    killed_at = time.monotonic()
    assert cluster.brokers[victim].kill() != 0
    # Sink A's coordinator comes back once its partition has a new leader that loaded.
    wait_until(lambda: len(a.committed) > a_before + 1, "sink A committing again", timeout=90)
    a_back = next(t for t in a.done_at[a_before:] if t > killed_at)
    b_during = [t for t in b.done_at if killed_at < t < a_back]
    print(f"sink A stalled {a_back - killed_at:.1f}s; sink B committed {len(b_during)} meanwhile")
    assert b_during, "sink B (the other coordinator's) made no commit while sink A waited"
    wait_until(lambda: len(b.committed) > b_before + len(b_during), "sink B still committing")
    for c in (a, b):
        c.stop.set()
    for t in threads:
        t.join(120)
    assert not a.errors and not b.errors, (a.errors, b.errors)

    # Exactly once and whole, through the cut across every state partition's coordinator.
    reader = BrokerClient(cluster.bootstrap, retries=10)
    ends = wait_until(lambda: _cut(reader), "a reader's cut across every coordinator")
    readable: list[int] = []
    for p in range(PARTITIONS):
        for meta, batch in reader.fetch(TOPIC, p, isolation="read_committed"):
            readable += [
                i
                for j, i in enumerate(batch.column("id").to_pylist())
                if meta.base_offset + j < ends[p]
            ]
    assert len(readable) == len(set(readable)), "a row read twice"
    seen = set(readable)
    for c in (a, b):
        for batch_id, written in c.committed.items():
            if not written:
                continue  # committed by an attempt whose answer was lost
            inside = [i in seen for i in written]
            assert all(inside), f"{c.sink} batch {batch_id} not whole: {sum(inside)}/{len(inside)}"
    assert set(range(9 * 10**6, 9 * 10**6 + 4)) <= seen  # the plain producer's commit
    all_ids = {i for p in range(PARTITIONS) for i in ids(reader, TOPIC, p)}
    assert all_ids == seen  # nothing committed beyond the cut once all settled

    # idemlog transactions list (every id) shows both sinks' ids and the plain one's.
    alive = next(b for b in cluster.running())
    done = subprocess.run(
        [sys.executable, "-m", "broker_core.cli.main", "transactions", "list", "--all",
         "--json", "--bootstrap", alive.address],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    listed = {r["transactional_id"]: r["state_partition"] for r in json.loads(done.stdout)}
    for key in (f"{sink_a}/0", f"{sink_b}/1", plain):
        assert listed[key] == state_partition_of(key, STATE_PARTITIONS), listed
    assert {listed[f"{sink_a}/0"], listed[f"{sink_b}/1"]} == {
        state_partition_of(sink_a, STATE_PARTITIONS),
        state_partition_of(sink_b, STATE_PARTITIONS),
    }
    for c in (a.client, b.client, pclient, reader):
        c.close()
    cluster.close()


def _misrouted_calls_are_refused(
    cluster: ReplicatedCluster, sink_a: str, sink_b: str, victim: int, survivor: int
) -> None:
    """A keyed call at a broker that does not lead its key's state partition is refused
    with NOT_COORDINATOR naming that partition (even though that broker runs other
    partitions' coordinators); a sink commit naming an id of another partition is
    refused as invalid."""
    client = cluster.client
    home = state_partition_of(sink_a, STATE_PARTITIONS)
    wrong = cluster.brokers[survivor].address
    with pytest.raises(NotCoordinatorError, match=f"{TXN_STATE_TOPIC}-{home}:") as info:
        client.action(wrong, Action.SINK_HEARTBEAT, {"sink_id": sink_a, "run_id": "r"})
    assert info.value.retriable and f"broker {victim}" in info.value.message
    commit = CommitSinkBatchRequest(sink_b, 0, ((f"{sink_a}/0", 1, 0),))
    with pytest.raises(InvalidRequestError, match=f"'{sink_a}/0' is coordinated by"):
        client.action(wrong, Action.COMMIT_SINK_BATCH, commit.to_doc())


def _cut(client: BrokerClient) -> dict[int, int] | None:
    """The reader's cut once every partition's LSO is at its log end (nothing open)."""
    try:
        ends = client.stable_ends(TOPIC)
        if all(
            ends[p] == client.list_offsets(TOPIC, p)["log_end_offset"] for p in range(PARTITIONS)
        ):
            return ends
    except IdemlogError:
        pass
    return None


def test_a_restart_with_another_partition_count_keeps_the_topics_and_routes_as_before(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    # The count is fixed when the topic is created (Kafka's rule): brokers restarted with
    # other settings keep 6 partitions, so every id is still where its state is.
    cluster = ReplicatedCluster(zk_chroot, broker_factory, extra=EXTRA)
    leaders = _leaders(cluster)
    cluster.create_topic(TOPIC, PARTITIONS, replication_factor=3)
    # A sink per state partition (an identity "leader" map finds the key of each).
    sinks = {p: _key_led_by("s", {q: q for q in leaders}, p) for p in range(STATE_PARTITIONS)}
    client = BrokerClient(cluster.bootstrap, retries=10)
    spans = {p: [range(p * 10, p * 10 + 2)] for p in range(PARTITIONS)}
    for sink in sinks.values():
        attempt = SinkAttempt(sink, "run-1", 0)
        txn = prepared_attempt(client, attempt, 0, TOPIC, spans, timeout_ms=120_000)
        assert client.commit_sink_batch(sink, 0, [txn], "run-1") is True
    client.close()

    for broker in cluster.brokers.values():
        broker.stop()
    for broker, setting in zip(cluster.brokers.values(), (2, 8, 1), strict=True):
        broker.config["transaction.state.log.num.partitions"] = setting
        broker.restart()

    fresh = BrokerClient(cluster.bootstrap, retries=10)
    wait_until(lambda: _listed(fresh), "every state partition's coordinator loaded again")
    assert fresh.state_partition_count() == STATE_PARTITIONS
    listed = {r.transactional_id: r.state_partition for r in _listed(fresh) or []}
    for p, sink in sinks.items():
        assert listed[f"{sink}/0"] == p  # its state found in its own partition
        # Its coordinator knows batch 0 is committed: a repeated commit is not a new one.
        attempt = SinkAttempt(sink, "run-2", 0)
        again = prepared_attempt(fresh, attempt, 1, TOPIC, spans, timeout_ms=120_000)
        assert fresh.commit_sink_batch(sink, 0, [again], "run-2") is False
    fresh.close()
    cluster.close()


def _listed(client: BrokerClient) -> list[TransactionListing] | None:
    try:
        return client.list_transactions(every_id=True)
    except IdemlogError:
        return None
