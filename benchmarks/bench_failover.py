"""How long a partition is unwritable when its leader dies, and that no row is lost.

Part of ``make bench-broker`` (after the replication-cost part, on the same 3-broker
cluster, ``benchmarks/zk_cluster.py``; ``--failovers N`` rounds, default 5). Each round:

- a new topic, one partition, ``replication.factor=3``, named so that its leader, the
  broker killed, is broker 1, 2, 3, 1, ... in turn; when it is the controller (broker 1 in
  the first round), a new controller is elected as well: the table says when;
- one idempotent ``broker_core.producer.Producer`` (``acks=all``, ``linger.ms=2``,
  ``delivery.timeout.ms=300000``, the other keys at their defaults, e.g.
  ``retry.backoff.ms=100``) fed steadily by a thread: 100 rows every 2 ms, pipelined;
- once 2,000 rows are acknowledged, SIGKILL of the partition's leader, then two times
  from the moment of the kill:

  (a) **leader visible**: the first time a surviving broker's metadata (DescribeTopics,
      polled every 20 ms on each survivor) names another leader;
  (b) **writes resumed**: the first acknowledgement of a row sent after the kill (new
      writes are accepted again; answers already on their way from the old leader at
      the kill are not counted, which a plain "first ack after the kill" would do);

- the producer goes on until 2,000 more rows are acknowledged, is flushed, and the
  partition is read back (``BrokerClient.fetch``, read_committed): every acknowledged
  row must be there exactly once (no send may fail, no id may appear twice), else the
  benchmark exits non-zero;
- the killed broker is restarted (same port and log.dir) and the round waits until all
  three replicas are in sync again (``rejoin`` in the table).

The leader's loss is noticed when its ZooKeeper session expires, so both times are
bounded below by about ``zookeeper.session.timeout.ms`` (2000 ms here, as in the tests;
the broker default is 18000) minus the time since the victim's last heartbeat; the rest is
the controller's election, the metadata reaching the brokers and the producer's retry
(metadata refresh, ``retry.backoff.ms``). p50/p95 over the rounds (linear interpolation).
"""

from __future__ import annotations

import signal
import statistics
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa

from benchmarks.common import percentile
from benchmarks.zk_cluster import LocalCluster, wait_until
from broker_core.cluster.topic_creation import assign_partitions
from broker_core.errors import IdemlogError
from broker_core.producer import Producer, ProducerConfig, SendResult
from broker_core.producer.transport import FlightTransport
from broker_core.protocol.requests import ACKS_ALL

ROWS_PER_SEND = 100
SEND_EVERY_S = 0.002
WARM_ROWS = 2_000  # acknowledged before the kill, and again after writes resumed
ELECTION_TIMEOUT_S = 60.0
# A guard against a producer that does not refresh its metadata after a NetworkError (the
# dead leader never answers NOT_LEADER_OR_FOLLOWER) and so keeps sending to the dead broker,
# as spark_sink's did before 2351eed: a round whose writes have not resumed this long after
# the new leader was visible refreshes the producer's metadata for it and is marked
# "nudged" (its writes-resumed time includes this grace). A producer that refreshes on its
# own never waits for it.
NUDGE_GRACE_S = 1.0
PRODUCER_SETTINGS = ProducerConfig(acks=ACKS_ALL, linger_ms=2, delivery_timeout_ms=300_000)


@dataclass(frozen=True)
class Round:
    topic: str
    victim: int
    was_controller: bool
    new_leader: int
    epochs: tuple[int, int]
    visible_s: float
    resumed_s: float
    acked: int
    read_back: int
    rejoin_s: float
    nudged: bool


def _table(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "key": ids % 97, "value": ids.astype(np.float64)})


class SteadyProducer:
    """A thread sending ``ROWS_PER_SEND`` rows every ``SEND_EVERY_S`` through ``producer``,
    recording each send's time and each acknowledgement's."""

    def __init__(self, producer: Producer, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self.lock = threading.Lock()
        self.acked: list[int] = []  # ids of acknowledged rows
        self.failed: list[BaseException] = []
        self.sent_rows = 0
        self.resumed_at: float | None = None  # first ack of a send made after kill_at
        self.kill_at: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        start = 0
        while not self.stop.is_set():
            sent_at = time.monotonic()
            future = self.producer.send(self.topic, _table(start, ROWS_PER_SEND), key="key")
            ids = range(start, start + ROWS_PER_SEND)
            future.add_done_callback(partial(self._done, ids=ids, sent_at=sent_at))
            start += ROWS_PER_SEND
            with self.lock:
                self.sent_rows = start
            self.stop.wait(SEND_EVERY_S)

    def _done(self, future: Future[SendResult], *, ids: range, sent_at: float) -> None:
        error = future.exception()
        now = time.monotonic()
        with self.lock:
            if error is not None:
                self.failed.append(error)
                return
            self.acked.extend(ids)
            after_kill = self.kill_at is not None and sent_at >= self.kill_at
            if after_kill and self.resumed_at is None:
                self.resumed_at = now

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.producer.flush(120)


def _other_leader(cluster: LocalCluster, topic: str, old: int) -> int | None:
    """A leader other than ``old`` named by any surviving broker's metadata, if any."""
    for node in cluster.running():
        try:
            leader = cluster.state(topic, 0, node).leader
        except (IdemlogError, IndexError, KeyError):
            continue
        if leader is not None and leader != old and leader in cluster.nodes:
            return int(leader)
    return None


def _resumed_within(steady: SteadyProducer, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while steady.resumed_at is None and time.monotonic() < deadline:
        time.sleep(0.01)  # the producer's callbacks: polled, as the metadata is
    return steady.resumed_at is not None


def one_round(cluster: LocalCluster, topic: str) -> Round:
    cluster.create_topic(topic, 1, 3)
    before = cluster.agreed_state(topic, 0)
    assert before is not None
    controller = cluster.controller()
    victim = cluster.nodes[before.leader]
    producer = Producer(cluster.bootstrap, config=PRODUCER_SETTINGS)
    steady = SteadyProducer(producer, topic)
    finished = False
    try:
        wait_until(lambda: steady.acked_count() >= WARM_ROWS, "the producer to get going")
        kill_at = time.monotonic()
        with steady.lock:
            steady.kill_at = kill_at
        victim.kill(signal.SIGKILL)
        found = wait_until(
            lambda: _other_leader(cluster, topic, before.leader),
            f"{topic}-0: a leader other than broker {before.leader} (is leader election "
            "on a ZooKeeper session's expiry in this build?)",
            ELECTION_TIMEOUT_S,
        )
        visible_s = time.monotonic() - kill_at
        assert found is not None
        new_leader = found
        nudged = not _resumed_within(steady, NUDGE_GRACE_S)
        if nudged and isinstance(producer.transport, FlightTransport):
            producer.transport.client.refresh_metadata()  # see NUDGE_GRACE_S
        wait_until(lambda: steady.resumed_at is not None, "writes to resume", 120)
        acked_then = steady.acked_count()
        wait_until(lambda: steady.acked_count() >= acked_then + WARM_ROWS, "writes to go on")
        steady.finish()
        finished = True
    finally:
        steady.stop.set()
        producer.close(None if finished else 0)  # a failed round does not wait for its sends
    if steady.failed:
        raise SystemExit(f"{topic}: {len(steady.failed)} sends failed: {steady.failed[0]!r}")
    assert steady.resumed_at is not None
    ids = [
        i
        for _m, b in cluster.admin.fetch(topic, 0, isolation="read_committed")
        for i in b.column("id").to_pylist()
    ]
    if len(ids) != len(set(ids)):
        raise SystemExit(f"{topic}: {len(ids) - len(set(ids))} rows written twice")
    missing = set(steady.acked) - set(ids)
    if missing or len(steady.acked) != steady.sent_rows:
        raise SystemExit(
            f"{topic}: {len(missing)} acknowledged rows lost (e.g. {sorted(missing)[:5]}); "
            f"{steady.sent_rows} sent, {len(steady.acked)} acknowledged"
        )
    after = cluster.agreed_state(topic, 0)
    restart_at = time.monotonic()
    victim.start()
    cluster.wait_in_sync(topic, 0, timeout=120)
    rejoin_s = time.monotonic() - restart_at
    return Round(
        topic,
        before.leader,
        controller == before.leader,
        new_leader,
        (before.leader_epoch, -1 if after is None else after.leader_epoch),
        visible_s,
        steady.resumed_at - kill_at,
        len(steady.acked),
        len(ids),
        rejoin_s,
        nudged,
    )


def topic_led_by(round_: int, broker_id: int, brokers: list[int]) -> str:
    """A topic name whose partition 0 the assignment gives to ``broker_id`` (preferred
    leader), so the rounds kill brokers 1, 2, 3, 1, ... in turn (1 is the first controller)."""
    for k in range(1000):
        name = f"failover-{round_}-{k}"
        if assign_partitions(name, 1, brokers, 3)[0].leader == broker_id:
            return name
    raise AssertionError(f"no topic name found for broker {broker_id}")


def measure(cluster: LocalCluster, rounds: int) -> list[Round]:
    ids = sorted(cluster.nodes)
    try:
        return [one_round(cluster, topic_led_by(r, ids[r % len(ids)], ids)) for r in range(rounds)]
    except TimeoutError as exc:
        raise SystemExit(f"failover: {exc}") from exc


def report(rounds: list[Round], session_ms: int) -> None:
    print()
    print(
        f"Failover: SIGKILL of a partition's leader (rf=3, acks=all, one idempotent producer "
        f"sending {ROWS_PER_SEND} rows every {SEND_EVERY_S * 1000:g} ms), "
        f"zookeeper.session.timeout.ms={session_ms} (the times include it); seconds from the "
        "kill; every acknowledged row read back exactly once"
    )
    print(
        f"{'round':>5}  {'killed':>16}  {'new leader':>10}  {'epoch':>6}  "
        f"{'leader visible s':>16}  {'writes resumed s':>16}  {'rows acked':>10}  "
        f"{'read back':>9}  {'rejoin s':>8}  producer"
    )
    for i, r in enumerate(rounds):
        killed = f"b{r.victim}" + (" (controller)" if r.was_controller else "")
        print(
            f"{i:>5}  {killed:>16}  {f'b{r.new_leader}':>10}  "
            f"{f'{r.epochs[0]}->{r.epochs[1]}':>6}  {r.visible_s:>16.2f}  "
            f"{r.resumed_s:>16.2f}  {r.acked:>10}  {r.read_back:>9}  {r.rejoin_s:>8.2f}  "
            f"{'nudged' if r.nudged else 'own'}"
        )
    visible = [r.visible_s for r in rounds]
    resumed = [r.resumed_s for r in rounds]
    print(
        f"p50/p95 over {len(rounds)} rounds: leader visible {percentile(visible, 50):.2f} / "
        f"{percentile(visible, 95):.2f} s, writes resumed {percentile(resumed, 50):.2f} / "
        f"{percentile(resumed, 95):.2f} s (session timeout {session_ms / 1000:g} s; "
        f"median rejoin {statistics.median(r.rejoin_s for r in rounds):.2f} s)"
    )
    nudged = sum(r.nudged for r in rounds)
    if nudged:
        print(
            f"# misses: in {nudged} of {len(rounds)} rounds the producer still sent to the dead "
            f"leader {NUDGE_GRACE_S:g} s after the new one was visible and resumed only once "
            "the benchmark refreshed its metadata (no metadata refresh after a NetworkError: "
            "broker_core.producer.transport); those times include the grace"
        )
    print()
    print(f"failover_zookeeper_session_timeout_ms={session_ms}")
    print(f"failover_producer_nudged_rounds={nudged}")
    print(f"failover_rounds={len(rounds)}")
    print(f"failover_leader_visible_p50_s={percentile(visible, 50):.2f}")
    print(f"failover_leader_visible_p95_s={percentile(visible, 95):.2f}")
    print(f"failover_writes_resumed_p50_s={percentile(resumed, 50):.2f}")
    print(f"failover_writes_resumed_p95_s={percentile(resumed, 95):.2f}")
