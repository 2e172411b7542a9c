"""The transaction side of the seeded fault schedule (issue 23, required test 8): a
steady sink and a plain transactional producer beside ``schedule.SteadyProducer``, the
lookup of the coordinator the schedule's coordinator faults aim at, and the sink's
invariants checked at the end of each seed.

* :func:`coordinator_of`: the broker that coordinates a key (``find_coordinator`` with
  the key, every running broker agreeing, and that broker answering a coordinator call:
  loaded), and the ``__transaction_state`` partition it leads for that key. Never
  assumes partition 0: the partition is the product's own ``state_partition_of``.
* :class:`SteadySink`: one thread driving the sink protocol as Spark's tasks and driver
  do (``spark_sink.writer`` / ``spark_sink.commit``): per batch, each task's attempt
  InitProducerId for ``<sink>/<task>`` (reusing a prepared or committed attempt), its
  rows into every partition in one transaction, prepare; then the driver's
  ``commit_sink_batch``, asked again while it fails retriably; a commit that fails for
  good (non-retriable, or past its deadline) makes the "query" restart: a new run
  re-plans the same batch with the same rows, as Spark re-runs a batch after a restart.
  The driver of a seeded :data:`DRIVER_DIES_P` of the batches dies right after sending
  its commit (the answer never awaited), and the new run re-runs the batch.
* :class:`SteadyTransactions`: a plain transactional producer committing (mostly) and
  aborting transactions over the same topic, recording each transaction's outcome:
  committed (``end_txn(commit)`` returned), aborted (never asked to commit) or unknown
  (the commit was asked and failed: all or nothing).
* :func:`check_sink_invariants`: the read-back (read_committed) against both records:
  no id twice and none never written; every batch whose commit returned (True or False,
  committed before) whole and once; no batch in part; a failed batch's rows only as its
  re-run's, once; every committed transaction whole, no aborted one's rows, an unknown
  one whole or absent; and (:func:`wait_stable`) every partition's last stable offset at
  its log end once the writers stopped (none stuck).

Row ids name their writer: a sink row's id gives its batch, task and partition
(:func:`sink_span`), a transaction's rows start at :data:`TXN_BASE`. Bounds: both
workloads keep one small record per batch or transaction (a seed runs a few hundred).
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from broker_core.client.broker_client import BrokerClient
from broker_core.client.connections import FlightConnections
from broker_core.cluster.records import PartitionState
from broker_core.errors import IdemlogError
from broker_core.protocol.wire import Action, SinkAttempt, SinkTxnStatus
from broker_core.server.config.broker_config import ZK_ROOT
from broker_core.txn.state_topic.schema import TXN_STATE_TOPIC, state_partition_of
from tests.harness.replicated import ReplicatedCluster
from tests.harness.waiting import wait_until
from tests.store.helpers import rows

SINK_ID = "chaos-sink"
TXN_ID = "chaos-txn"
TASKS = 2
ROWS = 20  # per task and partition
TXN_BASE = 10**9  # the plain producer's ids start here; the sink's stay below
# Longer than any fault of the plan (a crash loop, a freeze past the session, an
# election), so no transaction times out because of one: a timeout abort is not what the
# schedule tests, and a prepared batch aborted by it would fail its commit for good.
TXN_TIMEOUT_MS = 120_000
# A batch whose driver dies right after sending its commit (``random.Random(seed)``): the
# restarted query re-runs it, finding it committed or re-preparing it.
DRIVER_DIES_P = 0.05
# A commit (or a task, or end_txn) retried this long before the batch counts as failed.
RETRY_DEADLINE_S = 45.0
_BACKOFF_S = 0.1  # between retries of a failed call: a retry's backoff, not a wait
_RETRYABLE = (IdemlogError, TimeoutError)


def sink_span(batch: int, task: int, partition: int, partitions: int) -> range:
    """The ids task ``task`` writes to ``partition`` in ``batch`` (every run the same)."""
    base = ((batch * TASKS + task) * partitions + partition) * ROWS
    return range(base, base + ROWS)


def sink_batch_of(id_: int, partitions: int) -> int:
    return id_ // (TASKS * partitions * ROWS)


def txn_span(n: int, partition: int, partitions: int) -> range:
    base = TXN_BASE + (n * partitions + partition) * ROWS
    return range(base, base + ROWS)


def txn_of(id_: int, partitions: int) -> int:
    return (id_ - TXN_BASE) // (partitions * ROWS)


# -- the coordinator ----------------------------------------------------------------------


@dataclass(frozen=True)
class Coordinator:
    broker: int  # the broker id find_coordinator names
    partition: int  # the __transaction_state partition it leads for the key
    leader_epoch: int  # that partition's leader epoch: the coordinator epoch


def state_partitions(zk: KazooClient) -> dict[int, PartitionState]:
    """``__transaction_state``'s partition states as ZooKeeper holds them (the topic is
    internal: the brokers refuse to describe it); empty before its creation."""
    try:
        data, _ = zk.get(f"{ZK_ROOT}/topics/{TXN_STATE_TOPIC}")
    except NoNodeError:
        return {}
    doc = json.loads(data)
    return {int(p): PartitionState.from_doc(e) for p, e in doc["partitions"].items()}


def coordinator_of(
    cluster: ReplicatedCluster, zk: KazooClient, key: str, timeout: float = 60.0
) -> Coordinator:
    """The coordinator of ``key``: every running broker's ``find_coordinator(key)`` names
    the same broker, ZooKeeper names it leader of ``key``'s state partition, and it
    answers a coordinator call (it has loaded that partition). Waits (a poll with a
    deadline) through elections and loads; the first ask creates the state topic."""
    found: list[Coordinator] = []

    def named() -> bool:
        answers = set()
        for broker in cluster.running():
            try:
                doc = cluster.client.action(
                    broker.address, Action.FIND_COORDINATOR, {"transactional_id": key}
                )
            except IdemlogError as exc:
                assert exc.retriable, exc
                return False
            answers.add(int(doc["broker_id"]))
        if len(answers) != 1:
            return False
        (leader,) = answers
        states = state_partitions(zk)
        if not states:
            return False
        partition = state_partition_of(key, len(states))
        if states[partition].leader != leader:
            return False  # ZooKeeper and the brokers' caches disagree for a moment
        try:
            # Loaded: a load in progress answers COORDINATOR_LOAD_IN_PROGRESS (retriable).
            cluster.client.action(cluster.brokers[leader].address, Action.LIST_TRANSACTIONS, {})
        except IdemlogError as exc:
            assert exc.retriable, exc
            return False
        found[:] = [Coordinator(leader, partition, states[partition].leader_epoch)]
        return True

    wait_until(named, f"one loaded coordinator of {key!r}", timeout=timeout)
    return found[0]


# -- the steady sink ----------------------------------------------------------------------


class Outcome(StrEnum):
    COMMITTED = "committed"  # commit_sink_batch / end_txn(commit) returned True
    REPEATED = "repeated"  # commit_sink_batch returned False: committed before
    FAILED = "failed"  # the commit was asked and failed for good: all or nothing
    ABORTED = "aborted"  # never asked to commit: never visible


class _Workload:
    """What both steady writers share: the thread, the stop, the log of retried errors
    (bounded: the newest 200)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.errors: list[tuple[float, str]] = []  # (monotonic time, error), retried
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._abandoned = False  # stop_now(): no batch or transaction is finished any more
        self.client: BrokerClient  # set by the subclass before its thread starts

    def start(self, body: Callable[[], None]) -> None:
        def run() -> None:
            try:
                body()
            except BaseException as exc:  # reported by check_alive()
                self._error = exc

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()

    def note(self, exc: BaseException, what: str = "") -> None:
        with self._lock:
            self.errors.append((time.monotonic(), f"{what}: {type(exc).__name__}: {exc}"[:200]))
            del self.errors[:-200]  # bounded: the newest 200

    def errors_since(self, t: float) -> int:
        with self._lock:
            return sum(1 for at, _ in self.errors if at >= t)

    def check_alive(self) -> None:
        if self._error is not None:
            raise AssertionError(f"{self.name} died: {self._error!r}") from self._error

    def stop_now(self) -> None:
        """Stop without waiting (a failed run's teardown): the thread ends at its next
        call, which fails once the client is closed."""
        self._abandoned = True
        self._stop.set()
        self.close()

    def close(self) -> None:
        raise NotImplementedError

    def refresh(self) -> None:
        """Fresh metadata for the next attempt (never raises: the attempt will)."""
        with contextlib.suppress(IdemlogError):
            self.client.refresh_metadata()

    def join(self, timeout: float) -> None:
        """Stop after the unit of work in hand (a batch, a transaction) is finished."""
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self.name} still running {timeout:g}s after stop"
        self.check_alive()


def _retrying(work: _Workload, call: Callable[[], Any], what: str) -> Any:
    """``call`` again while it fails retriably, for up to RETRY_DEADLINE_S, with fresh
    metadata (a produce stream goes where the cached metadata says the leader is); raises
    the non-retriable error at once and the last retriable one at the deadline."""
    deadline = time.monotonic() + RETRY_DEADLINE_S
    while True:
        try:
            return call()
        except _RETRYABLE as exc:
            work.note(exc, what)
            retriable = not isinstance(exc, IdemlogError) or exc.retriable
            if not retriable or time.monotonic() > deadline:
                raise
            time.sleep(_BACKOFF_S)  # a retry's backoff
            work.refresh()


class SteadySink(_Workload):
    """A sink of TASKS tasks writing ``partitions`` partitions of ``topic``, batch after
    batch, from a thread (:mod:`module docs <tests.harness.sink_chaos>`)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        connections: FlightConnections,
        seed: int,
        interval_s: float = 0.05,
    ) -> None:
        super().__init__("steady-sink")
        self.topic = topic
        self.partitions = partitions
        self.interval_s = interval_s
        # A short request timeout: a frozen coordinator's calls fail and are asked again.
        self.client = BrokerClient(bootstrap, timeout_s=5.0, retries=3, connections=connections)
        # The driver that dies right after sending its commit: the request leaves, its
        # answer is never awaited (a 20 ms deadline, no retry).
        self._hasty = BrokerClient(bootstrap, timeout_s=0.02, retries=0, connections=connections)
        self.rng = random.Random(seed)  # which batches' drivers die mid-commit
        self.died_mid_commit = 0
        self.outcomes: dict[int, Outcome] = {}  # batch -> its final outcome
        self.failures: list[tuple[int, str, str]] = []  # (batch, run, error) failed commits
        # Task attempts that found their batch prepared (reused) or committed already.
        self.reused: Counter[str] = Counter()
        self.runs = 1
        # Set while the driver's commit is asked (retries included): a fault aimed at the
        # coordinator waits for it, so the commit is in flight when the fault lands.
        self.committing = threading.Event()
        self.current = 0  # the batch being committed (or last committed)
        self.start(self._run)

    @property
    def committed(self) -> int:
        with self._lock:
            return sum(o in (Outcome.COMMITTED, Outcome.REPEATED) for o in self.outcomes.values())

    def _run(self) -> None:
        batch = 0
        while not self._stop.is_set():
            run = f"run-{self.runs}"
            try:
                txns = [self._task(run, batch, task) for task in range(TASKS)]
                self.current = batch
                if self.rng.random() < DRIVER_DIES_P:
                    self._die_mid_commit(run, batch, txns)
                    continue  # the restarted query's new run re-plans the batch
                self.committing.set()
                try:
                    committed = _retrying(
                        self,
                        functools.partial(self.client.commit_sink_batch, SINK_ID, batch, txns, run),
                        f"commit of batch {batch}",
                    )
                finally:
                    self.committing.clear()
            except _RETRYABLE as exc:
                # The driver's commit failed for good: the query dies and restarts, and
                # the new run re-plans the same batch (same rows).
                with self._lock:
                    self.outcomes[batch] = Outcome.FAILED
                    self.failures.append((batch, run, f"{type(exc).__name__}: {exc}"[:300]))
                self.runs += 1
                if self._abandoned:
                    return
                continue  # re-run it even when stopping: every batch ends decided
            with self._lock:
                self.outcomes[batch] = Outcome.COMMITTED if committed else Outcome.REPEATED
            batch += 1
            self._stop.wait(self.interval_s)

    def _die_mid_commit(self, run: str, batch: int, txns: list[tuple[str, int, int]]) -> None:
        """The driver sends the batch's commit and dies before the answer: the commit may
        or may not be recorded; the query restarts with a new run."""
        with contextlib.suppress(*_RETRYABLE):
            self._hasty.commit_sink_batch(SINK_ID, batch, txns, run)
        with self._lock:
            self.died_mid_commit += 1
            self.outcomes[batch] = Outcome.FAILED
            self.failures.append((batch, run, "the driver died with its commit in flight"))
        self.runs += 1

    def _task(self, run: str, batch: int, task: int) -> tuple[str, int, int]:
        """One task's attempts until one has prepared (or found prepared or committed)
        the batch's rows; its (transactional id, pid, epoch) for the commit."""
        tid = f"{SINK_ID}/{task}"
        attempt = SinkAttempt(SINK_ID, run, batch)

        def once() -> tuple[str, int, int]:
            pid, epoch, status = self.client.init_sink_producer(tid, TXN_TIMEOUT_MS, attempt)
            if status is not SinkTxnStatus.NEW:
                self.reused[str(status)] += 1
                return tid, pid, epoch
            parts = range(self.partitions)
            self.client.add_partitions_to_txn(tid, pid, epoch, [(self.topic, p) for p in parts])
            ranges = []
            for p in parts:
                span = sink_span(batch, task, p, self.partitions)
                with self.client.produce_stream(self.topic, p, transactional_id=tid) as stream:
                    first, last = stream.send(
                        rows(len(span), start=span.start),
                        producer_id=pid,
                        producer_epoch=epoch,
                        base_sequence=0,
                        transactional=True,
                    ).offsets(10)
                ranges.append((self.topic, p, first, last))
            self.client.prepare_sink_txn(tid, pid, epoch, batch, ranges)
            return tid, pid, epoch

        # A failed attempt is re-run as Spark re-runs a failed task: a new InitProducerId
        # fences the old attempt (its open transaction is aborted) or reuses it (prepared).
        result: tuple[str, int, int] = _retrying(self, once, f"task {task} of batch {batch}")
        return result

    def close(self) -> None:
        self.client.close()
        self._hasty.close()


# -- the plain transactional producer ------------------------------------------------------


class SteadyTransactions(_Workload):
    """A plain transactional producer (``TXN_ID``) over every partition of ``topic``: a
    transaction at a time, committed with probability 0.7 (``random.Random(seed)``),
    else aborted; after any failure it re-initialises (a new epoch aborts what was open)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        connections: FlightConnections,
        seed: int,
        interval_s: float = 0.05,
    ) -> None:
        super().__init__("steady-transactions")
        self.topic = topic
        self.partitions = partitions
        self.interval_s = interval_s
        self.client = BrokerClient(bootstrap, timeout_s=5.0, retries=3, connections=connections)
        self.rng = random.Random(seed)
        self.outcomes: dict[int, Outcome] = {}
        self.start(self._run)

    @property
    def committed(self) -> int:
        with self._lock:
            return sum(o is Outcome.COMMITTED for o in self.outcomes.values())

    def _run(self) -> None:
        n = 0
        producer: tuple[int, int] | None = None
        sequences = [0] * self.partitions
        while not self._stop.is_set():
            commit = self.rng.random() < 0.7
            outcome = Outcome.ABORTED
            try:
                if producer is None:
                    producer = _retrying(
                        self,
                        lambda: self.client.init_producer_id(TXN_ID, TXN_TIMEOUT_MS),
                        "init_producer_id",
                    )
                    sequences = [0] * self.partitions
                pid, epoch = producer
                parts = [(self.topic, p) for p in range(self.partitions)]
                self.client.add_partitions_to_txn(TXN_ID, pid, epoch, parts)
                for p in range(self.partitions):
                    span = txn_span(n, p, self.partitions)
                    with self.client.produce_stream(
                        self.topic, p, transactional_id=TXN_ID
                    ) as stream:
                        stream.send(
                            rows(len(span), start=span.start),
                            producer_id=pid,
                            producer_epoch=epoch,
                            base_sequence=sequences[p],
                            transactional=True,
                        ).offsets(10)
                    sequences[p] += len(span)
                if commit:
                    outcome = Outcome.FAILED  # asked: decided or not, all or nothing
                _retrying(
                    self,
                    functools.partial(self.client.end_txn, TXN_ID, pid, epoch, commit),
                    f"end_txn {n}",
                )
                outcome = Outcome.COMMITTED if commit else Outcome.ABORTED
            except _RETRYABLE as exc:
                self.note(exc)
                producer = None  # the next InitProducerId fences this epoch and aborts
                self.refresh()
            with self._lock:
                self.outcomes[n] = outcome
            n += 1
            self._stop.wait(self.interval_s)
        if producer is None and not self._abandoned:
            # The last transaction failed: an InitProducerId settles it (aborts it, or
            # finishes a recorded commit), so nothing of it stays open at the end.
            _retrying(
                self,
                lambda: self.client.init_producer_id(TXN_ID, TXN_TIMEOUT_MS),
                "the final init_producer_id",
            )

    def close(self) -> None:
        self.client.close()


# -- the invariants -----------------------------------------------------------------------


def wait_stable(client: BrokerClient, topic: str, partitions: int, timeout: float = 60.0) -> None:
    """Every partition's last stable offset reaches the log end it has now (no
    transaction left holding readers back); fails naming the partitions stuck."""
    targets: dict[int, int] = {}
    seen: dict[int, dict[str, int]] = {}

    def stable() -> bool:
        try:
            for p in range(partitions):
                offsets = client.list_offsets(topic, p)
                seen[p] = offsets
                targets.setdefault(p, offsets["log_end_offset"])
        except IdemlogError:
            return False
        return all(seen[p]["last_stable_offset"] >= targets[p] for p in range(partitions))

    wait_until(
        stable,
        lambda: f"{topic}: every last stable offset at the log end {targets}: {seen}",
        timeout=timeout,
    )


def check_cut(ends: dict[int, int], rows_at: dict[tuple[int, int], int], partitions: int) -> int:
    """Readers' whole-batch visibility while the sink runs: of a read_committed
    read-back taken after ``ends`` (``readable_offsets``: each partition's last stable
    offset lowered by the coordinator's cut), the rows below those ends hold every sink
    batch whole or not at all. Returns the number of whole batches below the cut."""
    below = [id_ for (p, offset), id_ in rows_at.items() if offset < ends[p]]
    seen = Counter(sink_batch_of(i, partitions) for i in below if i < TXN_BASE)
    whole = TASKS * partitions * ROWS
    partial = {b: n for b, n in seen.items() if n != whole}
    assert not partial, (
        f"below the readable ends {ends}, sink batches visible in part "
        f"(batch: rows of {whole}): {dict(sorted(partial.items())[:5])}"
    )
    return len(seen)


@dataclass
class SinkCheck:
    batches: int  # sink batches decided
    visible: int  # sink batches read back whole
    failed_commits: int
    transactions: Counter[str]  # outcome -> count
    rows: int


def check_sink_invariants(
    rows_at: dict[tuple[int, int], int],
    partitions: int,
    sink: SteadySink,
    txns: SteadyTransactions,
) -> SinkCheck:
    """The sink's and the plain producer's invariants over a read-back (``read_rows``:
    (partition, offset) -> id, read_committed, taken after both writers stopped)."""
    ids = list(rows_at.values())
    twice = [i for i, n in Counter(ids).items() if n > 1]
    assert not twice, f"{len(twice)} ids read more than once, e.g. {sorted(twice)[:5]}"
    by_batch: dict[int, set[int]] = {}
    by_txn: dict[int, set[int]] = {}
    for id_ in ids:
        if id_ >= TXN_BASE:
            by_txn.setdefault(txn_of(id_, partitions), set()).add(id_)
        else:
            by_batch.setdefault(sink_batch_of(id_, partitions), set()).add(id_)
    stray = sorted(set(by_batch) - set(sink.outcomes))
    assert not stray, f"rows of sink batches never written: {stray[:5]}"
    whole = 0
    for batch, outcome in sorted(sink.outcomes.items()):
        expected = {
            i
            for t in range(TASKS)
            for p in range(partitions)
            for i in sink_span(batch, t, p, partitions)
        }
        got = by_batch.get(batch, set())
        assert got in (set(), expected), (
            f"sink batch {batch} ({outcome}) visible in part: {len(got)} of {len(expected)} "
            f"rows, missing e.g. {sorted(expected - got)[:5]}"
        )
        if outcome in (Outcome.COMMITTED, Outcome.REPEATED):
            assert got == expected, f"sink batch {batch} {outcome} but not visible"
        whole += got == expected
    stray = sorted(set(by_txn) - set(txns.outcomes))
    assert not stray, f"rows of transactions never written: {stray[:5]}"
    for n, outcome in sorted(txns.outcomes.items()):
        expected = {i for p in range(partitions) for i in txn_span(n, p, partitions)}
        got = by_txn.get(n, set())
        if outcome is Outcome.COMMITTED:
            assert got == expected, f"committed transaction {n}: {len(got)} of {len(expected)}"
        elif outcome is Outcome.ABORTED:
            assert not got, f"transaction {n} never asked to commit: {len(got)} rows visible"
        else:
            assert got in (set(), expected), f"transaction {n} ({outcome}) visible in part"
    return SinkCheck(
        batches=len(sink.outcomes),
        visible=whole,
        failed_commits=len(sink.failures),
        transactions=Counter(str(o) for o in txns.outcomes.values()),
        rows=len(ids),
    )
