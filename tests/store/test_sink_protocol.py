"""The sink protocol's coordinator rules (docs/design.md, "The sink protocol"), against a
real LogStore: runs, leftovers, long batches, the reader cut, operators' aborts.

Each test reads the partitions back read_committed: every row of the committed plan once,
nothing of any other plan, and no transaction left holding the last stable offset.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from broker_core.errors import (
    InvalidTxnStateError,
    ProducerFencedError,
    UnknownServerError,
)
from broker_core.protocol.wire import SinkTxnStatus
from broker_core.txn.coordinator.visibility import consistent_cut
from broker_core.txn.state_topic.records import (
    SinkCommitState,
    TransactionMetadata,
    TransactionState,
)
from tests.store.test_txn_coordinator import (
    P0,
    P1,
    Broker,
    CrashingMarkers,
    Producer,
    start_broker,
)

S = TransactionState


@pytest.fixture
def broker(tmp_path: Path) -> Broker:
    return start_broker(tmp_path)


def task(broker: Broker, sink: str, index: int, batch: int, run: str, ids: range) -> Producer:
    """One prepared attempt of Spark task ``index`` writing ``ids`` to P0 and P1."""
    producer = Producer(broker, f"{sink}/{index}").init_sink(batch, run)
    producer.send(P0, ids)
    producer.send(P1, range(ids.start + 1000, ids.stop + 1000))
    producer.prepare()
    return producer


def test_a_rerun_with_fewer_tasks_commits_its_own_plan_once(broker: Broker) -> None:
    """Run 1 split batch 3 in four tasks and died before its commit; run 2 plans it in two.
    Run 2 reuses none of run 1's transactions (same ids!) and run 1's leftovers end."""
    c = broker.coordinator
    run1 = [task(broker, "q", i, 3, "run1", range(i * 10, i * 10 + 10)) for i in range(3)]
    unprepared = Producer(broker, "q/3").init_sink(3, "run1")
    unprepared.send(P0, range(30, 40))
    assert not broker.stable(P0)
    run2 = [task(broker, "q", i, 3, "run2", range(i * 20, i * 20 + 20)) for i in range(2)]
    assert [p.status for p in run2] == [SinkTxnStatus.NEW] * 2  # not run 1's work
    # Run 1's tasks were all fenced when run 2's first task arrived: q/2, q/3 included.
    for p in [*run1[2:], unprepared]:
        assert broker.stored(p.transactional_id).state is S.COMPLETE_ABORT
    assert c.commit_sink_batch("q", 3, [p.txn for p in run2], "run2") is True
    assert broker.committed(P0) == list(range(40))
    assert broker.committed(P1) == list(range(1000, 1040))
    assert broker.stable(P0) and broker.stable(P1)
    assert c.describe()["sink_leftovers_aborted"] == 4


def test_a_rerun_with_more_tasks_commits_its_own_plan_once(broker: Broker) -> None:
    c = broker.coordinator
    [task(broker, "q", i, 0, "run1", range(i * 50, i * 50 + 50)) for i in range(2)]
    run2 = [task(broker, "q", i, 0, "run2", range(i * 25, i * 25 + 25)) for i in range(4)]
    assert c.commit_sink_batch("q", 0, [p.txn for p in run2], "run2") is True
    assert broker.committed(P0) == list(range(100))
    assert broker.stable(P0) and broker.stable(P1)


def test_a_commit_fences_every_other_attempt_of_its_batch_and_earlier(broker: Broker) -> None:
    """A straggler of the same run the commit does not name (a task id past the plan, a
    zombie of an earlier batch) ends with the commit instead of holding readers back."""
    c = broker.coordinator
    zombie = Producer(broker, "q/7").init_sink(1, "run")  # an earlier batch's attempt
    zombie.send(P0, range(900, 905))
    later = Producer(broker, "q/8").init_sink(3, "run")  # a later batch: kept
    plan = [task(broker, "q", i, 2, "run", range(i * 10, i * 10 + 10)) for i in range(2)]
    assert c.commit_sink_batch("q", 2, [p.txn for p in plan], "run") is True
    assert broker.stored("q/7").state is S.COMPLETE_ABORT
    assert broker.stored("q/8").sink_batch == 3 and broker.stored("q/8").state is S.EMPTY
    assert later.epoch == broker.stored("q/8").producer_epoch
    assert broker.committed(P0) == list(range(20)) and broker.stable(P0)
    with pytest.raises(ProducerFencedError, match="batch 2 of the sink was committed without"):
        zombie.prepare()


def test_commit_refuses_messages_of_another_batch_or_run(broker: Broker) -> None:
    c = broker.coordinator
    p = task(broker, "q", 0, 5, "run", range(10))
    with pytest.raises(InvalidTxnStateError, match="batch 5 of sink 'q', not this batch's"):
        c.commit_sink_batch("q", 6, [p.txn], "run")
    with pytest.raises(InvalidTxnStateError, match="written by run 'run', not by run 'other'"):
        c.commit_sink_batch("q", 5, [p.txn], "other")
    unprepared = Producer(broker, "q/1").init_sink(5, "run")
    unprepared.send(P0, range(20, 25))
    with pytest.raises(InvalidTxnStateError, match="an unprepared attempt of batch 5"):
        c.commit_sink_batch("q", 5, [p.txn, unprepared.txn], "run")
    assert c.last_committed_batch("q") is None  # nothing recorded
    assert broker.committed(P0) == []


def test_a_decided_commit_whose_transaction_no_longer_matches_fails_loudly(
    tmp_path: Path,
) -> None:
    """The commit of batch 1 is decided (its PREPARE record stored) when its markers fail
    before any is written; meanwhile one of its transactions moved to another epoch --
    which the protocol never does. Finishing the commit must fail, naming the transaction,
    and leave the record PREPARE, instead of recording COMPLETE for rows that are not
    committed."""
    b = start_broker(tmp_path, lambda s: CrashingMarkers(s, partitions_before_crash=0))
    c = b.coordinator
    plan = [task(b, "q", i, 1, "run", range(i * 10, i * 10 + 10)) for i in range(2)]
    with pytest.raises(UnknownServerError):
        c.commit_sink_batch("q", 1, [p.txn for p in plan], "run")
    assert b.state.load()[1]["q"].state == SinkCommitState.PREPARE
    broken = c._registry.meta("q/1")
    assert broken is not None
    moved = broken.copy()
    moved.producer_epoch += 1  # the invariant broken behind the coordinator's back
    c._registry.persist(moved)
    with pytest.raises(
        InvalidTxnStateError, match=r"'q/1' \(producer id \d+ epoch \d+\) is now at"
    ):
        c.commit_sink_batch("q", 2, [], "run")
    assert b.state.load()[1]["q"].state == SinkCommitState.PREPARE  # never COMPLETE
    assert b.committed(P0) == b.committed(P1) == []  # none of the batch, not half of it


def test_a_rerun_of_a_committed_batch_writes_nothing(broker: Broker) -> None:
    c = broker.coordinator
    plan = [task(broker, "q", i, 4, "run1", range(i * 10, i * 10 + 10)) for i in range(2)]
    assert c.commit_sink_batch("q", 4, [p.txn for p in plan], "run1") is True
    rerun = Producer(broker, "q/5").init_sink(4, "run2")  # another split, same batch
    assert rerun.status is SinkTxnStatus.COMMITTED


def test_a_long_batch_lives_while_its_run_beats(broker: Broker) -> None:
    """transaction.timeout.ms of 1 s, one task 30 s slower than another: the fast task's
    prepared transaction is kept while the slow one beats, and the batch commits once."""
    c = broker.coordinator
    fast = Producer(broker, "q/0").init_sink(0, "run", timeout_ms=1000)
    fast.send(P0, range(10))
    fast.prepare()
    slow = Producer(broker, "q/1").init_sink(0, "run", timeout_ms=1000)
    for second in range(30):
        slow.send(P1, range(100 + second, 101 + second))
        for _ in range(4):
            broker.clock.advance(250)
            c.sink_heartbeat("q", "run")
            assert c.abort_timed_out() == []
    slow.prepare()
    assert c.commit_sink_batch("q", 0, [fast.txn, slow.txn], "run") is True
    assert broker.committed(P0) == list(range(10))
    assert broker.committed(P1) == list(range(100, 130))


def test_a_run_that_stops_beating_times_out_with_a_named_reason(broker: Broker) -> None:
    c = broker.coordinator
    p = Producer(broker, "q/0").init_sink(0, "run", timeout_ms=1000)
    p.send(P0, range(10))
    p.prepare()
    broker.clock.advance(900)
    c.sink_heartbeat("q", "run")
    broker.clock.advance(900)
    assert c.abort_timed_out() == []  # 900 ms since the last beat
    broker.clock.advance(200)
    assert c.abort_timed_out() == ["q/0"]
    assert broker.stable(P0) and broker.committed(P0) == []
    with pytest.raises(ProducerFencedError, match=r"raise the sink option transaction\.timeout"):
        c.commit_sink_batch("q", 0, [p.txn], "run")


def test_abort_of_a_run_needs_no_message(broker: Broker) -> None:
    """The driver's abort() when every task failed: the run id alone ends them all."""
    c = broker.coordinator
    written = Producer(broker, "q/0").init_sink(2, "run")
    written.send(P0, range(10))
    prepared = task(broker, "q", 1, 2, "run", range(20, 30))
    empty = Producer(broker, "q/2").init_sink(2, "run")
    other_run = Producer(broker, "other/0").init_sink(2, "run-b")
    other_run.send(P1, range(50, 55))
    assert c.abort_sink_run("run", 2) == ["q/0", "q/1", "q/2"]
    assert broker.stored("other/0").state is S.ONGOING
    assert broker.committed(P0) == [] and broker.stable(P0)
    for p in (written, prepared, empty):
        with pytest.raises(ProducerFencedError, match="aborted by the Spark driver"):
            p.send(P0, range(60, 61))


def test_an_attempt_that_takes_the_id_after_the_scan_is_not_fenced(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """abort_sink_run chose q/0 (batch 2); before it fenced it, the run's next batch
    took the id. The target is checked again under the claim: the new attempt stays."""
    c = broker.coordinator
    old = Producer(broker, "q/0").init_sink(2, "run")
    old.send(P0, range(5))
    scan = c._registry.attempts
    newer: list[Producer] = []

    def scan_then_a_new_attempt(
        target: Callable[[TransactionMetadata], bool],
        *,
        sink_id: str | None = None,
        run_id: str | None = None,
    ) -> list[TransactionMetadata]:
        found = scan(target, sink_id=sink_id, run_id=run_id)
        newer.append(Producer(broker, "q/0").init_sink(3, "run"))
        return found

    monkeypatch.setattr(c._registry, "attempts", scan_then_a_new_attempt)
    assert c.abort_sink_run("run", 2) == []
    assert newer and newer[0].status is SinkTxnStatus.NEW
    stored = broker.stored("q/0")
    assert (stored.sink_batch, stored.producer_epoch) == (3, newer[0].epoch)
    newer[0].send(P0, range(10, 15))  # not fenced
    newer[0].prepare()


def test_operators_list_and_abort_hanging_transactions(broker: Broker) -> None:
    c = broker.coordinator
    hanging = Producer(broker, "q/0").init_sink(1, "run")
    hanging.send(P0, range(5))
    broker.clock.advance(5000)
    fresh = Producer(broker, "plain").init()
    fresh.send(P1, range(5))
    listed = c.list_transactions(min_age_ms=1000)
    assert [t["transactional_id"] for t in listed] == ["q/0"]
    assert listed[0]["age_ms"] == 5000 and listed[0]["sink_id"] == "q"
    assert listed[0]["partitions"] == [list(P0)]
    assert c.abort_transaction("q/0") is True
    assert c.abort_transaction("q/0") is False
    assert broker.stable(P0)
    with pytest.raises(ProducerFencedError, match="aborted by an operator"):
        hanging.prepare()


# -- readers see whole sink batches (broker_core.txn.coordinator.visibility) ---------------


def test_a_batch_held_back_in_one_partition_is_held_back_in_all(broker: Broker) -> None:
    """Another writer's open transaction holds P1's LSO below the batch's rows there; the
    batch is visible at P0 by its LSO alone. The cut keeps it out of both."""
    c = broker.coordinator
    other = Producer(broker, "other").init()
    other.send(P1, range(500, 505))  # open, before the batch's rows in P1
    plan = [task(broker, "q", 0, 0, "run", range(10))]
    assert c.commit_sink_batch("q", 0, [p.txn for p in plan], "run") is True
    lso = {0: broker.store.partition(*P0).last_stable_offset}
    lso[1] = broker.store.partition(*P1).last_stable_offset
    assert lso[0] > 0 and lso[1] == 0  # a reader stopping at the LSO would see half
    assert c.stable_ends("payments") == {0: 0, 1: 0}
    other.commit()
    assert c.stable_ends("payments") == lso | {1: broker.store.partition(*P1).log_end_offset}
    assert c.describe()["sink_batches_tracked"] == 0  # settled: nothing left to track


def test_every_tracked_batch_is_settled_by_its_markers(broker: Broker) -> None:
    c = broker.coordinator
    for batch in range(5):
        plan = [
            task(
                broker, "q", i, batch, "run", range(batch * 100 + i * 10, batch * 100 + i * 10 + 10)
            )
            for i in range(2)
        ]
        assert c.commit_sink_batch("q", batch, [p.txn for p in plan], "run") is True
    assert c.describe()["sink_batches_tracked"] == 0
    ends = c.stable_ends("payments")
    assert ends == {p: broker.store.partition("payments", p).log_end_offset for p in (0, 1)}


def test_the_cut_keeps_every_batch_whole() -> None:
    # Batch A straddles P0's end; B depends on A's cut at P1; C lies wholly above.
    a = [(0, 10, 20), (1, 5, 8)]
    b = [(1, 6, 7), (2, 3, 4)]
    c = [(0, 30, 40)]
    cut = consistent_cut({0: 15, 1: 50, 2: 50}, [a, b, c])
    assert cut == {0: 10, 1: 5, 2: 3}
    assert consistent_cut({0: 50, 1: 50, 2: 50}, [a, b, c]) == {0: 50, 1: 50, 2: 50}
    # A batch in a partition the reader's topic lacks constrains nothing here.
    assert consistent_cut({0: 15}, [[(0, 10, 20), (9, 0, 1)]]) == {0: 15}
