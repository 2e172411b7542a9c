"""A seeded randomized fault schedule over a :class:`ReplicatedCluster`, and the
invariant checks run over it (issue 15, required test 5).

* :func:`plan` turns a seed into a list of :class:`PlannedFault` (what to do -- kill,
  clean stop, crash loop, short or long pause, cut of the clients' links -- to which
  role: a partition's leader or follower, the controller, or the sink's transaction
  coordinator; for how long, and the gap before it): everything random is drawn here,
  from ``random.Random(seed)``, so a seed names one schedule. Only *which* broker holds a
  role is resolved when the step runs (it depends on earlier elections; the
  coordinator's is ``find_coordinator`` of the sink's key: ``sink_chaos.coordinator_of``).
* beside the producer, a steady sink and a plain transactional producer
  (``tests/harness/sink_chaos.py``) write a second topic through the same proxied links;
  their invariants (every committed batch and transaction whole and once, nothing else
  visible, no partition held back) are checked after each step and at the end.
* :class:`SteadyProducer`: an idempotent ``acks=all`` producer sending a steady stream of
  id ranges from a thread, recording which ids each acknowledged (or failed) send
  carried; its connections (:class:`ProxiedConnections`) go through a :class:`TcpProxy`
  per broker, so a fault can cut its link to one broker.
* :class:`StateMonitor`: a thread polling the partition states, recording every change of
  leader, epoch or ISR with its time, so the report says which elections each step caused.
* Invariant checks:

  1. :func:`check_acknowledged`: the read-back (``read_committed``, from the current
     leaders) holds no id twice, no id never sent, and every id acknowledged before the
     read (waiting a bounded time: a new leader's high watermark may trail the old one's
     for a moment, as in Kafka), at the offsets its acknowledgement gave;
  2. :func:`check_replicas_agree`: for each partition, every running in-sync replica's
     batches below the leader's high watermark are the leader's, byte for byte (read from
     the segment files of running brokers; only whole batches below the watermark count);
  3. :func:`compare_stopped_replicas`: after a clean stop of every broker, each
     partition's replicas hold the same log bytes, the same newest producer-state
     snapshot and the same epochs that wrote batches.

Assumption: at most one broker is down (killed, stopped or paused) at a time, and the
next fault waits until every replica is back in the ISR, so a partition always has a
live ISR member to elect; unclean elections are out of scope.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from broker_core.client.broker_client import BrokerClient
from broker_core.client.connections import FlightConnections
from broker_core.cluster.metadata import PartitionState
from broker_core.errors import IdemlogError
from broker_core.protocol.wire import Action
from broker_core.record.batch import decode_header, verify_crc
from broker_core.txn.state_topic import TXN_STATE_TOPIC
from spark_sink.producer import Producer, SendResult
from tests.harness.broker import BrokerProcess
from tests.harness.replicated import SESSION_MS, ReplicatedCluster
from tests.harness.sink_chaos import (
    RETRY_DEADLINE_S,
    SINK_ID,
    Coordinator,
    SinkCheck,
    SteadySink,
    SteadyTransactions,
    check_cut,
    check_sink_invariants,
    coordinator_of,
    state_partitions,
    wait_stable,
)
from tests.harness.tcp_proxy import TcpProxy
from tests.harness.waiting import WaitTimeout, wait_until

# -- the plan ------------------------------------------------------------------------------

KILL = "kill"  # SIGKILL, restart after `duration`
STOP = "stop"  # SIGTERM (clean: leadership moved away first), restart after `duration`
PAUSE = "pause"  # SIGSTOP for `duration` < the ZooKeeper session, then SIGCONT
LONG_PAUSE = "long_pause"  # SIGSTOP past the session: a frozen leader is replaced (zombie)
CUT = "cut"  # the producer's link to a leader cut (TCP proxy closed) for `duration`
# SIGKILL, restart, SIGKILL again `again_s` after the restart (while it truncates and
# catches up: still the only broker down), restart after `duration`.
CRASH_LOOP = "crash_loop"
KINDS = (KILL, STOP, PAUSE, LONG_PAUSE, CUT, CRASH_LOOP)
_WEIGHTS = (4, 3, 3, 2, 2, 2)
# A paused broker's ZooKeeper client pings every third of the session: a pause below
# 0.55 of it keeps the session, one above 1.5 of it loses it.
_SHORT_PAUSE_S = (0.2, 0.55 * SESSION_MS / 1000)
_LONG_PAUSE_S = (1.5 * SESSION_MS / 1000, 2.2 * SESSION_MS / 1000)
_DOWN_S = (0.2, 3.0)
_CUT_S = (0.5, 3.0)
_GAP_S = (0.0, 2.0)
_AGAIN_S = (0.0, 1.0)
LEADER = "leader"
FOLLOWER = "follower"
SEGMENT_BYTES = 512 * 1024
CONTROLLER = "controller"  # the controller broker (it may also lead or follow)
# The coordinator of the sink's ids: the leader of their __transaction_state partition,
# found with find_coordinator(key) when the step runs (sink_chaos.coordinator_of). Any
# kind may hit it; a CUT cuts every client's link to it (the sink's, the transactional
# and the idempotent producer's), never the brokers' links to each other.
COORDINATOR = "coordinator"
TAKES_A_LEADER_AWAY = (KILL, STOP, LONG_PAUSE, CRASH_LOOP)
# Every plan has one of these aimed at the coordinator: killed, frozen past its session
# (deposed, then resumed), or cut off from its clients.
COORDINATOR_KINDS = (KILL, LONG_PAUSE, CUT)


@dataclass(frozen=True)
class PlannedFault:
    kind: str
    role: str  # LEADER or FOLLOWER of `partition`, or CONTROLLER, or COORDINATOR
    partition: int
    follower_index: int  # which follower (0 or 1, in replica order) when role is FOLLOWER
    duration_s: float  # down or paused for this long
    gap_s: float  # steady producing before the fault
    again_s: float = 0.0  # CRASH_LOOP: up for this long between the two kills

    def describe(self) -> str:
        if self.role == CONTROLLER:
            who = "the controller"
        elif self.role == COORDINATOR:
            who = "the sink's coordinator"
        else:
            who = self.role if self.role == LEADER else f"follower#{self.follower_index}"
            who = f"{who} of p{self.partition}"
        again = f", up {self.again_s:.2f}s between kills" if self.kind == CRASH_LOOP else ""
        return f"{self.kind} {who} for {self.duration_s:.2f}s{again}"


def plan(seed: int, steps: int, partitions: int) -> list[PlannedFault]:
    """The schedule of ``seed``: ``steps`` faults, at least one of which takes a leader
    away (a kill, a clean stop or a long pause of a leader), so every run elects, and
    (with two steps or more) another that kills, freezes or cuts off the coordinator."""
    rng = random.Random(seed)
    faults: list[PlannedFault] = []
    for _ in range(steps):
        kind = rng.choices(KINDS, _WEIGHTS)[0]
        draw = rng.random()
        role = (
            LEADER
            if draw < 0.35
            else FOLLOWER
            if draw < 0.65
            else CONTROLLER
            if draw < 0.75
            else COORDINATOR
        )
        if kind == CUT and role != COORDINATOR:
            role = LEADER  # the producers talk to leaders (and to the coordinator) only
        low, high = {
            KILL: _DOWN_S,
            STOP: _DOWN_S,
            PAUSE: _SHORT_PAUSE_S,
            LONG_PAUSE: _LONG_PAUSE_S,
            CUT: _CUT_S,
            CRASH_LOOP: _DOWN_S,
        }[kind]
        faults.append(
            PlannedFault(
                kind=kind,
                role=role,
                partition=rng.randrange(partitions),
                follower_index=rng.randrange(2),
                duration_s=round(rng.uniform(low, high), 3),
                gap_s=round(rng.uniform(*_GAP_S), 3),
                again_s=round(rng.uniform(*_AGAIN_S), 3),
            )
        )
    if not any(f.role == LEADER and f.kind in TAKES_A_LEADER_AWAY for f in faults):
        i = rng.randrange(steps)
        faults[i] = PlannedFault(
            KILL, LEADER, faults[i].partition, 0, faults[i].duration_s, faults[i].gap_s
        )
    if steps > 1 and not any(f.role == COORDINATOR and f.kind in COORDINATOR_KINDS for f in faults):
        # Never the step that guarantees an election of a data partition's leader.
        free = [
            i
            for i, f in enumerate(faults)
            if not (f.role == LEADER and f.kind in TAKES_A_LEADER_AWAY)
        ] or list(range(1, steps))
        i = rng.choice(free)
        kind = rng.choice(COORDINATOR_KINDS)
        low, high = {KILL: _DOWN_S, LONG_PAUSE: _LONG_PAUSE_S, CUT: _CUT_S}[kind]
        faults[i] = PlannedFault(
            kind, COORDINATOR, 0, 0, round(rng.uniform(low, high), 3), faults[i].gap_s
        )
    return faults


# -- what happened ------------------------------------------------------------------------


@dataclass
class StepRecord:
    """One executed step: the fault, the broker it hit, and what the cluster did."""

    index: int
    fault: PlannedFault
    broker: int = -1
    started_s: float = 0.0  # since the run began
    ended_s: float = 0.0  # the cluster settled again (every replica in the ISR)
    before: dict[int, PartitionState] = field(default_factory=dict)
    after: dict[int, PartitionState] = field(default_factory=dict)
    controller_before: int | None = None
    controller_after: int | None = None
    coordinator_before: Coordinator | None = None  # of the sink's key
    coordinator_after: Coordinator | None = None
    changes: list[str] = field(default_factory=list)  # from the StateMonitor
    notes: list[str] = field(default_factory=list)

    def elections(self) -> list[str]:
        out = []
        for p, old in sorted(self.before.items()):
            new = self.after.get(p)
            if new is not None and new.leader_epoch != old.leader_epoch:
                out.append(
                    f"p{p}: leader {old.leader}@{old.leader_epoch} -> "
                    f"{new.leader}@{new.leader_epoch}"
                )
        return out

    def describe(self) -> str:
        head = (
            f"step {self.index} [{self.started_s:6.2f}s..{self.ended_s:6.2f}s] "
            f"{self.fault.describe()} (gap {self.fault.gap_s:.2f}s) -> broker {self.broker}"
        )
        lines = [head]
        lines += [f"    election {e}" for e in self.elections()] or ["    no election"]
        if self.controller_after != self.controller_before:
            lines.append(f"    controller {self.controller_before} -> {self.controller_after}")
        old, new = self.coordinator_before, self.coordinator_after
        if old is not None and new is not None and old != new:
            lines.append(
                f"    coordinator ({TXN_STATE_TOPIC}-{new.partition}) broker "
                f"{old.broker}@{old.leader_epoch} -> {new.broker}@{new.leader_epoch}"
            )
        lines += [f"    seen {c}" for c in self.changes]
        lines += [f"    note {n}" for n in self.notes]
        return "\n".join(lines)


class StateMonitor:
    """Polls the partitions' states (from any broker) on a thread of its own and records
    each change of leader, epoch or ISR with its time since ``t0``."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, t0: float) -> None:
        self.topic = topic
        self.partitions = partitions
        self.t0 = t0
        self._client = BrokerClient(bootstrap, timeout_s=1.0, retries=0)
        self._lock = threading.Lock()
        self._last: dict[int, PartitionState] = {}
        self._log: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="state-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):  # a poll interval: the states signal nothing here
            try:
                (doc,) = self._client.describe_topics([self.topic])
            except (IdemlogError, ValueError):
                continue
            now = time.monotonic() - self.t0
            for p in range(self.partitions):
                e = doc["partitions"][p]
                state = PartitionState(
                    tuple(e["replicas"]), e["leader"], e["leader_epoch"], tuple(e["isr"])
                )
                with self._lock:
                    old = self._last.get(p)
                    if old != state:
                        self._last[p] = state
                        if old is not None:
                            self._log.append(
                                (
                                    now,
                                    f"p{p} leader {state.leader} epoch {state.leader_epoch} "
                                    f"isr {sorted(state.isr)}",
                                )
                            )

    def since(self, start_s: float) -> list[str]:
        with self._lock:
            return [f"{t:6.2f}s {what}" for t, what in self._log if t >= start_s]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._client.close()


# -- the producer -------------------------------------------------------------------------


class ProxiedConnections(FlightConnections):
    """The producer's connection cache, with a :class:`TcpProxy` in front of each broker:
    every connection to a broker's address goes through its proxy, so :meth:`cut` can
    sever the producer's link to one broker (the proxy closed: open connections reset,
    new ones refused) while the brokers and the test's own client still reach it, and
    :meth:`heal` puts a new proxy in its place."""

    def __init__(self, targets: list[str]) -> None:
        super().__init__()
        self._map_lock = threading.Lock()
        self.proxies = {t: TcpProxy(t) for t in targets}
        self.cut_links: dict[str, TcpProxy] = {}  # the closed proxy of each cut link

    def get(self, address: str) -> flight.FlightClient:
        with self._map_lock:
            proxy = self.proxies[address].address
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = flight.connect(f"grpc://{proxy}")
                self._clients[address] = client
            return client

    def cut(self, address: str) -> TcpProxy:
        """Close ``address``'s proxy; returns it (its counters say what went through)."""
        with self._map_lock:
            proxy = self.proxies[address]
            self.cut_links[address] = proxy
        proxy.close()
        return proxy

    def heal(self, address: str) -> TcpProxy:
        """A new proxy for ``address``; the cached channel to the old one is dropped."""
        with self._map_lock:
            proxy = self.proxies[address] = TcpProxy(address)
            self.cut_links.pop(address, None)
        self.reset(address)
        return proxy

    def close(self) -> None:
        super().close()
        with self._map_lock:
            proxies = list(self.proxies.values())
        for proxy in proxies:
            proxy.close()


def id_table(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "key": ids % 97, "value": ids.astype(np.float64)})


class SteadyProducer:
    """An idempotent acks=all producer sending ``rows`` ids every ``interval_s`` (a
    steady stream, not a flood) from a thread, split over the partitions by key; records
    which ids each acknowledged send carried, and each failed send."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        rows: int = 100,
        interval_s: float = 0.01,
        connections: FlightConnections | None = None,
    ) -> None:
        self.topic = topic
        self.rows = rows
        self.interval_s = interval_s
        self.producer = Producer(
            bootstrap,
            acks="all",
            linger_ms=10,
            batch_size=64 * 1024,  # the test brokers' max.request.bytes is 256 KiB
            retry_backoff_ms=20,
            # Above the broker's acks=all wait (2 x replica.lag.time.max.ms + 5 s).
            request_timeout_ms=15_000,
            delivery_timeout_ms=300_000,
            connections=connections,
        )
        self._lock = threading.Lock()
        self._acked: dict[int, SendResult] = {}  # first id of an acknowledged send -> result
        self.failed: list[tuple[int, BaseException]] = []
        self.sent = 0  # ids 0..sent-1 were (or are being) handed to send()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                start = self.sent
                # Counted before send(): its ids may be read back before it returns.
                self.sent = start + self.rows
                future = self.producer.send(self.topic, id_table(start, self.rows), key="key")
                future.add_done_callback(functools.partial(self._done, start))
                self._stop.wait(self.interval_s)
        except BaseException as exc:  # reported by stop()
            self._error = exc

    def _done(self, start: int, future: Future[SendResult]) -> None:
        error = future.exception()
        with self._lock:
            if error is None:
                self._acked[start] = future.result()
            else:
                self.failed.append((start, error))

    @property
    def acked_count(self) -> int:
        with self._lock:
            return len(self._acked) * self.rows

    def acked_results(self) -> dict[int, SendResult]:
        """First id of each acknowledged send -> its result (the offsets per partition)."""
        with self._lock:
            return dict(self._acked)

    def acked_ids(self) -> set[int]:
        with self._lock:
            starts = list(self._acked)
        return {i for s in starts for i in range(s, s + self.rows)}

    def wait_progress(self, more: int, what: str, timeout: float = 30.0) -> None:
        """Wait until ``more`` ids beyond those acknowledged now are acknowledged."""
        target = self.acked_count + more
        self.check_alive()
        wait_until(lambda: self.acked_count >= target, what, timeout=timeout)

    def check_alive(self) -> None:
        if self._error is not None:
            raise AssertionError(f"the producer thread died: {self._error!r}")
        assert not self.failed, f"sends failed: {self.failed[:3]}"

    def stop(self) -> None:
        """Stop sending, flush (every send then acknowledged or failed) and close."""
        self._stop.set()
        self._thread.join(30)
        try:
            self.producer.flush(120)
        finally:
            self.producer.close()
        self.check_alive()


# -- invariant 1: acknowledged => present once ---------------------------------------------


def read_rows(
    client: BrokerClient, topic: str, partitions: int, timeout: float = 30.0
) -> dict[tuple[int, int], int]:
    """Every committed row of the topic as the current leaders serve it (read_committed):
    (partition, offset) -> id. A leader change during the read refreshes the metadata and
    reads again, for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            rows: dict[tuple[int, int], int] = {}
            for p in range(partitions):
                for meta, batch in client.fetch(topic, p, isolation="read_committed"):
                    for i, id_ in enumerate(batch.column("id").to_pylist()):
                        rows[(p, meta.base_offset + i)] = id_
            return rows
        except IdemlogError:
            if time.monotonic() > deadline:
                raise
            with contextlib.suppress(IdemlogError):
                client.refresh_metadata()
            time.sleep(0.1)  # a retry's backoff: the election signals nothing here


def read_ids(client: BrokerClient, topic: str, partitions: int) -> list[int]:
    """Every committed id of the topic, partition by partition, in offset order."""
    return list(read_rows(client, topic, partitions).values())


@dataclass
class AckCheck:
    ids: int  # ids read back
    reads: int  # reads it took until every acknowledged id was there
    duplicates: int  # acknowledged runs answered as duplicates, with the original offsets
    blind_duplicates: int  # ... answered as duplicates without offsets (nothing to check)


def check_acknowledged(
    client: BrokerClient,
    topic: str,
    partitions: int,
    acked: Mapping[int, SendResult],
    rows: int,
    sent: Callable[[], int],
    timeout: float = 20.0,
) -> AckCheck:
    """Invariant 1 over the read-back: no id twice and none never sent (at once), and
    every id of ``acked`` (send's first id -> its result, acknowledged before this call;
    each send carried ``rows`` ids) present, waiting up to ``timeout`` for a new leader's
    high watermark; then each acknowledged run of offsets holds ids of its own send
    (the offsets a retry answered as a duplicate are the original ones). ``sent()``: how
    many ids were handed to the producer."""
    reads = [0]
    seen: list[dict[tuple[int, int], int]] = [{}]
    expected = {i for start in acked for i in range(start, start + rows)}

    def complete() -> bool:
        at = read_rows(client, topic, partitions)
        bound = sent()  # after the read: every id read had been handed to send() by then
        reads[0] += 1
        seen[0] = at
        ids = list(at.values())
        twice = [i for i, n in Counter(ids).items() if n > 1]
        assert not twice, f"{len(twice)} ids read more than once, e.g. {sorted(twice)[:5]}"
        stray = [i for i in ids if not 0 <= i < bound]
        assert not stray, f"ids never sent read back: {stray[:5]}"
        return not expected - set(ids)

    def what() -> str:
        missing = sorted(expected - set(seen[0].values()))
        return (
            f"all {len(expected)} acknowledged ids in the read-back: {len(missing)} missing, "
            f"e.g. {missing[:5]}"
        )

    wait_until(complete, what, timeout=timeout, interval=0.2)
    at, duplicates, blind = seen[0], 0, 0
    for start, result in acked.items():
        assert sum(m.num_rows for m in result) == rows, f"send {start}: {result}"
        for m in result:
            if m.base_offset < 0:  # DUPLICATE_SEQUENCE: written before, offsets unknown
                assert m.duplicate, f"send {start}: {m}"
                blind += 1
                continue
            duplicates += m.duplicate  # a retry answered with the original offsets: checked
            assert m.last_offset - m.base_offset + 1 == m.num_rows, f"send {start}: {m}"
            for offset in range(m.base_offset, m.last_offset + 1):
                got = at.get((m.partition, offset))
                assert got is not None and start <= got < start + rows, (
                    f"the send of ids {start}..{start + rows - 1} was acknowledged at "
                    f"{topic}-{m.partition} offsets {m.base_offset}..{m.last_offset}, but "
                    f"offset {offset} holds id {got}"
                )
    return AckCheck(len(at), reads[0], duplicates, blind)


# -- invariant 2: replicas agree below the high watermark ----------------------------------

Batch = tuple[int, int, bytes]  # base offset, leader epoch, the batch's bytes


def whole_batches_below(raw: bytes, bound: int) -> list[Batch]:
    """The whole batches of a replica's segment bytes that end below ``bound`` (offsets),
    CRC-checked; a running broker's torn or unwritten tail is not read."""
    out: list[Batch] = []
    position = 0
    while position < len(raw):
        try:
            header = decode_header(raw, position)
        except IdemlogError:
            break  # a header still being written
        end = position + header.size
        if end > len(raw) or header.last_offset >= bound:
            break
        data = raw[position:end]
        verify_crc(header, data)
        out.append((header.base_offset, header.leader_epoch, data))
        position = end
    return out


def _segments(directory: Path) -> bytes:
    chunks = []
    for path in sorted(directory.glob("*.log")):
        with contextlib.suppress(FileNotFoundError):  # a truncation deleted it meanwhile
            chunks.append(path.read_bytes())
    return b"".join(chunks)


@dataclass
class AgreementSample:
    partition: int
    leader: int
    epoch: int
    high_watermark: int
    compared: list[int]  # the in-sync brokers compared with the leader
    batches: int


def check_replicas_agree(
    cluster: ReplicatedCluster, topic: str, partition: int
) -> AgreementSample | None:
    """Invariant 2, one sample: the leader's high watermark h, then the ISR as the leader
    describes it (a follower still in it was in sync when h was read, or caught up with a
    later, higher watermark); the whole batches below h of each running in-sync replica
    must be the leader's. None when the leadership moved or a broker did not answer
    during the sample (the caller samples again later)."""
    try:
        first = cluster.state(topic, partition)
        leader = cluster.brokers[first.leader]
        if not leader.running:
            return None
        hw = cluster.offsets(leader, topic, partition)["high_watermark"]
        state = cluster.state(topic, partition, via=leader)
    except (IdemlogError, KeyError):
        return None
    if state.leader != first.leader or state.leader_epoch != first.leader_epoch:
        return None
    reference = whole_batches_below(_segments(cluster.partition_dir(leader, topic, partition)), hw)
    expected_end = reference[-1][0] if reference else -1
    compared = []
    for broker_id in state.isr:
        broker = cluster.brokers[broker_id]
        if broker_id == state.leader or not broker.running:
            continue
        mine = whole_batches_below(_segments(cluster.partition_dir(broker, topic, partition)), hw)
        if mine != reference:
            diff = _first_difference(reference, mine)
            raise AssertionError(
                f"{topic}-{partition}: in-sync replica {broker_id} differs from leader "
                f"{state.leader} (epoch {state.leader_epoch}) below the high watermark {hw} "
                f"(leader's last whole batch at {expected_end}): {diff}"
            )
        compared.append(broker_id)
    return AgreementSample(
        partition, state.leader, state.leader_epoch, hw, compared, len(reference)
    )


def _first_difference(reference: list[Batch], mine: list[Batch]) -> str:
    for i, (a, b) in enumerate(zip(reference, mine, strict=False)):
        if a != b:
            return (
                f"batch #{i}: leader has (offset {a[0]}, epoch {a[1]}, {len(a[2])} bytes), "
                f"follower (offset {b[0]}, epoch {b[1]}, {len(b[2])} bytes)"
            )
    return f"leader has {len(reference)} whole batches below it, follower {len(mine)}"


# -- invariant 3: at quiescence, after a clean stop ----------------------------------------


def compare_stopped_replicas(cluster: ReplicatedCluster, topic: str, partitions: int) -> None:
    """Stop every broker cleanly, then check that each partition's replicas came out
    identical (``ReplicatedCluster.assert_stopped_replicas_identical``)."""
    for broker in cluster.running():
        clean_stop(broker)
    cluster.assert_stopped_replicas_identical(topic, partitions)


# -- faults -------------------------------------------------------------------------------


def process_state(broker: BrokerProcess) -> str:
    """The process's state letter from /proc (``T`` when stopped by SIGSTOP)."""
    stat = Path(f"/proc/{broker.pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0]


def thread_report(pid: int) -> str:
    """Each thread of process ``pid``: name, state, kernel wait channel and signal masks
    (from /proc), then its C stacks from gdb if gdb is there: the evidence of a hang."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda t: int(t.name)):
        with contextlib.suppress(OSError):
            status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines())
            wchan = (task / "wchan").read_text().strip()
            fields = " ".join(
                f"{k}={status[k].strip()}" for k in ("Name", "State", "SigPnd", "SigBlk")
            )
            lines.append(f"  tid {task.name} {fields} wchan={wchan}")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        gdb = subprocess.run(
            [
                "gdb",
                "-p",
                str(pid),
                "-batch",
                "-iex",
                "set auto-load safe-path /",  # CPython's py-bt, where installed
                "-ex",
                "thread apply all py-bt",
                "-ex",
                "thread apply all bt 12",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines.append(gdb.stdout[-20_000:])
    return "\n".join(lines)


def clean_stop(broker: BrokerProcess, evidence_after_s: float = 15.0) -> None:
    """SIGTERM and wait for a clean exit; a broker still running after
    ``evidence_after_s`` is a hang: its threads are reported (:func:`thread_report`),
    then it is SIGKILLed and the step fails with the report."""
    process = broker.process
    assert process is not None
    os.kill(broker.pid, signal.SIGTERM)
    try:
        process.wait(evidence_after_s)
    except subprocess.TimeoutExpired:
        report = thread_report(broker.pid)
        broker.kill(signal.SIGKILL)
        raise AssertionError(
            f"{broker.name} (pid {process.pid}) still running {evidence_after_s:g}s after "
            f"SIGTERM; its threads then:\n{report}\nlog:\n{broker.log_tail(30)}"
        ) from None
    broker.stop()  # reaps it; raises unless the exit status is 0


@contextlib.contextmanager
def paused(broker: BrokerProcess) -> Iterator[None]:
    """SIGSTOP the broker for the block (checked: the process is really stopped), then
    SIGCONT -- also when the block raises, so no test leaves a frozen broker behind."""
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: process_state(broker) == "T", f"{broker.name} stopped by SIGSTOP")
        yield
    finally:
        os.kill(broker.pid, signal.SIGCONT)


# -- the run ------------------------------------------------------------------------------


class ScheduleRun:
    """Runs ``plan(seed, steps, partitions)`` over ``cluster`` with a
    :class:`SteadyProducer` into a new topic (``replication.factor=3``), checking the
    invariants after every step and at quiescence. :meth:`report` says what was done when
    and what the cluster did; a failure carries it with the seed (``run`` raises an
    AssertionError naming both)."""

    def __init__(
        self,
        cluster: ReplicatedCluster,
        seed: int,
        steps: int,
        topic: str = "chaos",
        partitions: int = 2,
        sink_topic: str = "chaossink",
    ) -> None:
        self.cluster = cluster
        self.seed = seed
        self.topic = topic
        self.sink_topic = sink_topic  # the sink's and the transactional producer's
        self.partitions = partitions
        self.faults = plan(seed, steps, partitions)
        self.records: list[StepRecord] = []
        self.samples: list[AgreementSample] = []
        self.notes: list[str] = []
        # Acknowledged runs answered as duplicates, with and without offsets, at the end.
        self.duplicates = (0, 0)
        self.t0 = time.monotonic()
        self.producer: SteadyProducer | None = None
        self._monitor: StateMonitor | None = None
        self._links: ProxiedConnections | None = None
        self.sink: SteadySink | None = None
        self.txns: SteadyTransactions | None = None
        self.sink_check: SinkCheck | None = None
        self._zk = cluster.zk.client()  # reads __transaction_state's partition states

    def now(self) -> float:
        return time.monotonic() - self.t0

    def report(self) -> str:
        lines = [f"schedule seed {self.seed}: {len(self.faults)} faults"]
        lines += [f"  planned {i}: {f.describe()}" for i, f in enumerate(self.faults)]
        lines += [r.describe() for r in self.records]
        if self.producer is not None:
            lines.append(
                f"producer: {self.producer.sent} ids sent, {self.producer.acked_count} "
                f"acknowledged, {len(self.producer.failed)} failed sends"
            )
            lines.append(
                f"acknowledged runs answered as duplicates: {self.duplicates[0]} with the "
                f"original offsets (checked), {self.duplicates[1]} without offsets"
            )
        if self.sink is not None:
            lines.append(
                f"sink: {len(self.sink.outcomes)} batches, {self.sink.committed} committed, "
                f"{self.sink.runs} run(s), {self.sink.reused} task attempts reused, "
                f"{len(self.sink.errors)} errors retried (newest 200 kept)"
            )
            lines += [f"  failed commit of batch {b} ({r}): {e}" for b, r, e in self.sink.failures]
        if self.txns is not None:
            counts = Counter(str(o) for o in self.txns.outcomes.values())
            lines.append(f"transactional producer: {dict(counts)}")
        if self.sink_check is not None:
            c = self.sink_check
            lines.append(
                f"sink check: {c.visible} of {c.batches} batches whole and once, "
                f"{c.rows} rows read back, transactions {dict(c.transactions)}"
            )
        compared = sum(len(s.compared) for s in self.samples)
        lines.append(f"replica agreement: {len(self.samples)} samples, {compared} comparisons")
        lines += [f"note {n}" for n in self.notes]
        lines.append(
            f"replay: IDEMLOG_SCHEDULE_SEEDS={self.seed} "
            "pytest tests/broker/test_replication_schedule.py"
        )
        return "\n".join(lines)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            raise AssertionError(
                f"seed {self.seed} failed at {self.now():.2f}s: {exc!r}\n{self.report()}"
            ) from exc
        finally:
            if self.producer is not None:
                with contextlib.suppress(Exception):
                    self.producer.producer.close(0)
            for work in (self.sink, self.txns):
                if work is not None:
                    work.stop_now()
            if self._monitor is not None:
                self._monitor.close()
            if self._links is not None:
                self._links.close()

    def _run(self) -> None:
        cluster, topic = self.cluster, self.topic
        # Small segments: rolls, snapshots and truncations across segment files.
        cluster.create_topic(
            topic,
            self.partitions,
            replication_factor=3,
            segment_bytes=SEGMENT_BYTES,
            max_message_bytes=SEGMENT_BYTES // 2,
        )
        cluster.create_topic(self.sink_topic, self.partitions, replication_factor=3)
        coordinator_of(cluster, self._zk, SINK_ID)  # the first ask creates __transaction_state
        self._monitor = StateMonitor(cluster.bootstrap, topic, self.partitions, self.t0)
        self._links = ProxiedConnections([b.address for b in cluster.brokers.values()])
        self.producer = producer = SteadyProducer(cluster.bootstrap, topic, connections=self._links)
        self.sink = sink = SteadySink(
            cluster.bootstrap, self.sink_topic, self.partitions, self._links
        )
        self.txns = txns = SteadyTransactions(
            cluster.bootstrap, self.sink_topic, self.partitions, self._links, self.seed
        )
        producer.wait_progress(2_000, "the producer to get going")
        self._wait_transactions(5, "the sink and the transactional producer to get going")
        for index, fault in enumerate(self.faults):
            self._step(index, fault)
        # Quiescence: every send answered, every batch and transaction decided.
        sink.join(RETRY_DEADLINE_S * 3)
        txns.join(RETRY_DEADLINE_S * 3)
        producer.stop()
        # The producer leaves its (shared) connections open: closing the proxies ends its
        # streams, so the clean stops below need not wait out the brokers' shutdown grace.
        assert self._links is not None
        self._links.close()
        for p in range(self.partitions):
            cluster.wait_in_sync(topic, p)
        sent = set(range(producer.sent))
        assert producer.acked_ids() == sent, "a send neither failed nor was acknowledged"
        final = check_acknowledged(
            cluster.client,
            topic,
            self.partitions,
            producer.acked_results(),
            producer.rows,
            lambda: producer.sent,
        )
        self.duplicates = (final.duplicates, final.blind_duplicates)
        ids = read_ids(cluster.client, topic, self.partitions)
        assert len(ids) == len(set(ids)) and set(ids) == sent, "not every id exactly once"
        # The sink's invariants: nothing left holding readers back, then the read-back.
        wait_stable(cluster.client, self.sink_topic, self.partitions)
        self.sink_check = check_sink_invariants(
            read_rows(cluster.client, self.sink_topic, self.partitions),
            self.partitions,
            sink,
            txns,
        )
        assert self.sink_check.visible > 0, "the sink committed nothing"
        for p in range(self.partitions):
            sample = check_replicas_agree(cluster, topic, p)
            assert sample is not None and len(sample.compared) == 2, sample
            self.samples.append(sample)
        self.notes.append(f"quiescence at {self.now():.2f}s: {len(ids)} ids read back once")
        self._assert_faults_happened()
        compare_stopped_replicas(cluster, topic, self.partitions)
        cluster.assert_stopped_replicas_identical(self.sink_topic, self.partitions)
        self.notes.append(f"replicas identical after a clean stop at {self.now():.2f}s")

    def _check_cut(self) -> int:
        """:func:`sink_chaos.check_cut` now, with the sink and the faults going on: the
        readable ends first, then the read-back (which may only go further)."""

        def ends() -> dict[int, int] | None:
            try:
                offsets = self.cluster.client.readable_offsets(self.sink_topic, self.partitions)
            except IdemlogError as exc:
                if not exc.retriable:
                    raise
                return None  # the coordinator or a leader moving: asked again
            return {p: o["last_stable_offset"] for p, o in offsets.items()}

        cut = wait_until(ends, f"the readable ends of {self.sink_topic}", timeout=30)
        rows_at = read_rows(self.cluster.client, self.sink_topic, self.partitions)
        return check_cut(cut, rows_at, self.partitions)

    def _wait_transactions(self, more: int, what: str, timeout: float = 60.0) -> None:
        """Wait until the sink committed ``more`` batches and the transactional producer
        ended ``more`` transactions beyond those of now (both alive meanwhile)."""
        sink, txns = self.sink, self.txns
        assert sink is not None and txns is not None
        target = (sink.committed + more, len(txns.outcomes) + more)

        def progressed() -> bool:
            sink.check_alive()
            txns.check_alive()
            return sink.committed >= target[0] and len(txns.outcomes) >= target[1]

        wait_until(
            progressed,
            lambda: (
                f"{what}: sink {sink.committed} batches committed, transactional "
                f"producer {len(txns.outcomes)} ended (targets {target})"
            ),
            timeout=timeout,
        )

    def _assert_faults_happened(self) -> None:
        elections = [e for r in self.records for e in r.elections()]
        assert elections, "no leader changed over the whole run"
        for record in self.records:
            fault = record.fault
            if fault.role == LEADER and fault.kind in TAKES_A_LEADER_AWAY:
                old = record.before[fault.partition]
                new = record.after[fault.partition]
                assert new.leader_epoch > old.leader_epoch, (
                    f"step {record.index}: {fault.kind} of leader {record.broker} of "
                    f"p{fault.partition} elected no one: {old} -> {new}"
                )
            if fault.kind in (KILL, STOP, CRASH_LOOP):
                starts = self.cluster.brokers[record.broker].starts
                assert starts >= (3 if fault.kind == CRASH_LOOP else 2), starts
            if fault.role == CONTROLLER and fault.kind in TAKES_A_LEADER_AWAY:
                assert record.controller_after not in (None, record.broker), (
                    f"step {record.index}: {fault.kind} of controller {record.broker}: "
                    f"the controller is {record.controller_after} after it"
                )
            if fault.role == COORDINATOR and fault.kind in TAKES_A_LEADER_AWAY:
                old, new = record.coordinator_before, record.coordinator_after
                assert old is not None and new is not None
                assert new.partition == old.partition and new.leader_epoch > old.leader_epoch, (
                    f"step {record.index}: {fault.kind} of coordinator {record.broker} "
                    f"elected no new coordinator: {old} -> {new}"
                )
        if len(self.faults) > 1:
            assert any(
                r.fault.role == COORDINATOR and r.fault.kind in COORDINATOR_KINDS
                for r in self.records
            ), "no coordinator fault ran"

    # -- one step ------------------------------------------------------------------------
    def _states(self) -> dict[int, PartitionState]:
        return {p: self.cluster.state(self.topic, p) for p in range(self.partitions)}

    def _controller(self) -> int | None:
        """The controller's id as a running broker describes it (None if none answers)."""
        for broker in self.cluster.running():
            with contextlib.suppress(IdemlogError):
                doc = self.cluster.client.action(broker.address, Action.METADATA, {})
                if doc.get("controller") is not None:
                    return int(doc["controller"])
        return None

    def _step(self, index: int, fault: PlannedFault) -> None:
        cluster, producer = self.cluster, self.producer
        assert producer is not None
        time.sleep(fault.gap_s)  # steady producing between faults: a duration, not a wait
        record = StepRecord(index, fault, started_s=self.now())
        began = time.monotonic()
        self.records.append(record)
        record.before = self._states()
        record.controller_before = self._controller()
        record.coordinator_before = coordinator_of(cluster, self._zk, SINK_ID)
        state = record.before[fault.partition]
        if fault.role == CONTROLLER:
            assert record.controller_before is not None, "no controller"
            record.broker = record.controller_before
        elif fault.role == COORDINATOR:
            record.broker = record.coordinator_before.broker
        elif fault.role == LEADER:
            record.broker = state.leader
        else:
            followers = [b for b in state.replicas if b != state.leader]
            record.broker = followers[fault.follower_index]
        broker = cluster.brokers[record.broker]
        if fault.role == COORDINATOR:
            assert self.sink is not None
            # The fault lands while the driver's commit is asked (an event the sink sets;
            # the commit may still finish before the signal arrives: noted, not assumed).
            in_flight = self.sink.committing.wait(10)
            record.notes.append(
                f"sink commit of batch {self.sink.current} "
                f"{'in flight' if in_flight else 'NOT in flight'} as the fault began"
            )
        if fault.kind in (KILL, STOP, CRASH_LOOP):
            if fault.kind == STOP:
                clean_stop(broker)
            else:
                broker.kill(signal.SIGKILL)
            until = time.monotonic() + fault.duration_s
            self._sample(record, "while down")
            time.sleep(max(0.0, until - time.monotonic()))  # the rest of the downtime
            broker.restart()
            record.notes.append(f"{broker.name} restarted at {self.now():.2f}s")
            if fault.kind == CRASH_LOOP:
                time.sleep(fault.again_s)  # up this long: fetching, truncating, catching up
                broker.kill(signal.SIGKILL)
                record.notes.append(f"{broker.name} SIGKILLed again at {self.now():.2f}s")
                broker.restart()
                record.notes.append(f"{broker.name} restarted again at {self.now():.2f}s")
        elif fault.kind == CUT:
            assert self._links is not None
            old = self._links.cut(broker.address)
            assert old.bytes_to_target > 0, f"no client traffic went to {broker.name}"
            until = time.monotonic() + fault.duration_s
            self._sample(record, "while cut")
            time.sleep(max(0.0, until - time.monotonic()))  # the rest of the cut
            new = self._links.heal(broker.address)
            record.notes.append(
                f"producer link to {broker.name} healed at {self.now():.2f}s "
                f"({old.connections} connection(s), {old.bytes_to_target} bytes before the cut)"
            )
            wait_until(
                lambda: new.bytes_to_target > 0,
                f"the producer back on its link to {broker.name}",
                timeout=30,
            )
        else:
            # No request to any broker while one is frozen: it would wait for it.
            with paused(broker):
                time.sleep(fault.duration_s)  # the fault's duration
            record.notes.append(f"{broker.name} resumed at {self.now():.2f}s")
        # Right after the fault's end (a coordinator may just have loaded, markers may
        # still be under way): readers already see every sink batch whole or not at all.
        whole = self._check_cut()
        record.notes.append(f"{whole} sink batches whole below the readers' cut as it ended")
        self._settle(record)
        record.ended_s = self.now()
        record.after = self._states()
        record.controller_after = self._controller()
        record.coordinator_after = coordinator_of(cluster, self._zk, SINK_ID)
        assert self._monitor is not None
        record.changes = self._monitor.since(record.started_s)
        producer.check_alive()
        producer.wait_progress(1_000, f"acknowledgements after step {index}")
        # The next batches commit, and no transaction holds a partition back for good.
        self._wait_transactions(2, f"sink commits and transactions after step {index}")
        wait_stable(cluster.client, self.sink_topic, self.partitions)
        whole = self._check_cut()
        sink, txns = self.sink, self.txns
        assert sink is not None and txns is not None
        record.notes.append(f"{whole} sink batches whole below the readers' cut, none in part")
        record.notes.append(
            f"sink at batch {len(sink.outcomes)} ({sink.committed} committed, "
            f"{len(sink.failures)} failed commits so far), {sink.errors_since(began)} errors "
            f"retried since the fault; transactional producer at {len(txns.outcomes)} "
            f"({txns.errors_since(began)} errors); {self.sink_topic} stable to its log end"
        )
        check = check_acknowledged(
            cluster.client,
            self.topic,
            self.partitions,
            producer.acked_results(),
            producer.rows,
            lambda: producer.sent,
        )
        record.notes.append(
            f"{check.ids} ids read back once, every acknowledged one at its offsets "
            f"({check.reads} read(s); duplicate answers: {check.duplicates} with offsets, "
            f"{check.blind_duplicates} without)"
        )
        self._sample(record, "settled")

    def _sample(self, record: StepRecord, when: str) -> None:
        for p in range(self.partitions):
            try:  # a poll: a broker down or an election under way answers nothing for a bit
                sample = wait_until(
                    functools.partial(check_replicas_agree, self.cluster, self.topic, p),
                    "a sample",
                    timeout=2.0,
                    interval=0.1,
                )
            except WaitTimeout:
                record.notes.append(f"p{p} agreement {when}: no sample (leadership moving)")
                continue
            assert sample is not None  # wait_until returns only a truthy value
            self.samples.append(sample)
            record.notes.append(
                f"p{p} agreement {when}: leader {sample.leader}@{sample.epoch} hw "
                f"{sample.high_watermark}, {sample.batches} batches equal on {sample.compared}"
            )

    def _settle(self, record: StepRecord) -> None:
        """Wait until every replica of every partition is in the ISR as its leader sees
        it and the leader's high watermark passed its log end of now (so the faulted
        broker has fetched since it came back): the next fault may take any broker."""
        cluster, topic = self.cluster, self.topic
        # The coordinator's state partitions too (as ZooKeeper holds them: internal topic).
        wait_until(
            lambda: all(set(s.isr) == set(s.replicas) for s in state_partitions(self._zk).values()),
            lambda: (
                f"{TXN_STATE_TOPIC}: every replica back in the ISR after step "
                f"{record.index}: {state_partitions(self._zk)}"
            ),
            timeout=60,
        )
        for p in range(self.partitions):
            state = cluster.wait_state(
                topic,
                p,
                lambda s: set(s.isr) == set(s.replicas),
                f"every replica back in the ISR after step {record.index}",
                timeout=60,
            )
            target: list[int] = []

            def caught_up(p: int = p, target: list[int] = target) -> bool:
                try:
                    leader = cluster.leader_of(topic, p)
                    offsets = cluster.offsets(leader, topic, p)
                    full = cluster.state(topic, p, via=leader)
                except (IdemlogError, KeyError):
                    return False
                if not target:
                    target.append(offsets["log_end_offset"])
                return (
                    set(full.isr) == set(full.replicas) and offsets["high_watermark"] >= target[0]
                )

            wait_until(
                caught_up,
                f"p{p}: the ISR full and the high watermark past the log end "
                f"after step {record.index} (state {state})",
                timeout=60,
            )
