"""The run of one seeded fault schedule (``tests/harness/schedule.py``): the faults of
``plan(seed)`` one at a time over a :class:`ReplicatedCluster`, under the steady
producer (``tests/harness/schedule_checks.py``), the sink and the transactional producer
(``tests/harness/sink_chaos.py``), with every invariant checked after each step and at
quiescence, and a report of what was done when and what the cluster did.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import time
from collections import Counter

from broker_core.cluster.records import PartitionState
from broker_core.errors import IdemlogError
from broker_core.protocol.wire import Action
from broker_core.server.config.broker_config import ZK_ROOT
from broker_core.txn.state_topic.schema import TXN_STATE_TOPIC
from tests.harness.replicated import ReplicatedCluster
from tests.harness.schedule import (
    CONTROLLER,
    COORDINATOR,
    COORDINATOR_KINDS,
    CRASH_LOOP,
    CUT,
    KILL,
    LEADER,
    SEGMENT_BYTES,
    STOP,
    TAKES_A_LEADER_AWAY,
    PlannedFault,
    StateMonitor,
    StepRecord,
    clean_stop,
    paused,
    plan,
)
from tests.harness.schedule_checks import (
    AgreementSample,
    ProxiedConnections,
    SteadyProducer,
    check_acknowledged,
    check_replicas_agree,
    compare_stopped_replicas,
    read_ids,
    read_rows,
)
from tests.harness.sink_chaos import (
    RETRY_DEADLINE_S,
    SINK_ID,
    SinkCheck,
    SteadySink,
    SteadyTransactions,
    check_cut,
    check_sink_invariants,
    coordinator_of,
    state_partitions,
    wait_stable,
)
from tests.harness.waiting import WaitTimeout, wait_until

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
                f"{self.sink.runs} run(s), {self.sink.died_mid_commit} drivers died "
                f"mid-commit, task attempts finding their batch {dict(self.sink.reused)}, "
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
            cluster.bootstrap, self.sink_topic, self.partitions, self._links, self.seed
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
                # A broker SIGKILLed and restarted before its ZooKeeper session expired may
                # lead again at the same epoch (the controller saw no bounce): its new
                # process loaded the state anew (coordinator_of waits for the load), which
                # is the fault this step is after.
                bounced = fault.kind == KILL and new.broker == old.broker
                assert new.partition == old.partition and (
                    new.leader_epoch > old.leader_epoch or bounced
                ), (
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
            if fault.kind == CRASH_LOOP or record.broker == record.controller_before:
                self._wait_registration_gone(record.broker)
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

    def _wait_registration_gone(self, broker_id: int) -> None:
        """Wait until the killed broker's ZooKeeper session has expired (its registration
        is gone), so that a controller saw it leave and elected its partitions' new
        leaders. Needed by a crash loop, which kills it again while it truncates and
        catches up behind them, and by a kill of the controller, which the step checks
        by a new controller and, for a leader, an election. Restarted sooner, the new
        process registers the moment the old registration goes; when it was the
        controller, that is before the next controller (elected at that moment) first
        reads the brokers, which then sees no change and elects no one (a bounce,
        docs/failure-model.md). The client's old any-broker retries hid this for broker
        1: while it stayed in the metadata as the controller, the sample above failed
        until its session had expired."""
        registration = f"{ZK_ROOT}/brokers/ids/{broker_id}"
        wait_until(
            lambda: self._zk.exists(registration) is None,
            f"broker {broker_id}'s registration gone with its session",
            timeout=30,
        )

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
