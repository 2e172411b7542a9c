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
* ``tests/harness/schedule_checks.py``: the steady idempotent producer, its proxied
  links (a fault can cut them), and invariants 1-3 (below).
* ``tests/harness/schedule_run.py``: :class:`ScheduleRun`, the run of one seed.
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
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from broker_core.client.broker_client import BrokerClient
from broker_core.cluster.records import PartitionState
from broker_core.errors import IdemlogError
from broker_core.txn.state_topic.schema import TXN_STATE_TOPIC
from tests.harness.broker import BrokerProcess
from tests.harness.replicated import SESSION_MS
from tests.harness.sink_chaos import (
    Coordinator,
)
from tests.harness.waiting import wait_until

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
                e = doc.partitions[p]
                state = PartitionState(e.replicas, e.leader, e.leader_epoch, e.isr)
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
