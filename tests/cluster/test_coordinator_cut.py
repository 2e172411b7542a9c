"""A sink's transaction coordinator cut off from the network with a batch prepared and its
commit not yet sent, then healed (issue 23, required test 1, the host-cut variant; the
frozen-process variant is ``tests/broker/test_cluster_zk.py``, the deterministic one
``tests/store/test_state_partition_fencing.py``).

ZooKeeper and three brokers run on hosts of their own (``BrokerCluster``); the data topic
and ``__transaction_state`` have three replicas (``min.insync.replicas`` 2 on the state
topic). The sink's coordinator is whichever broker ``find_coordinator`` names for the
sink's key (the leader of the state partition the key hashes to), never assumed.

1. A sink batch is prepared (the tasks' transactions, as the Spark writer makes them) on
   the data partitions led by the other two brokers; the driver's commit is not sent.
2. The coordinator's host is cut off (its one link down). Its ZooKeeper session expires,
   the controller elects another replica of the state partition at a higher leader epoch,
   and that broker loads the partition; the driver's commit goes there and succeeds.
3. Meanwhile the old coordinator, still running and still believing it leads, reaches
   the batch's transaction timeout by its own clock (no task heartbeats it) and its
   timeout pass tries to abort the batch: its ``PREPARE_ABORT`` goes into its own replica
   of the state partition (its log end grows on disk) and waits for followers that fetch
   from the new leader instead.
4. Healed: the old broker finds its session lost, learns of the election, its coordinator
   stands down, it cuts the unacknowledged tail of its state partition (the abort) and
   follows the new leader.
5. The batch is read once and whole (read_committed); a repeated commit answers "committed
   before"; the next batches commit; every partition's last stable offset reaches its log
   end; the old broker's log never reports an abort.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.cluster.records import PartitionState
from broker_core.errors import IdemlogError
from broker_core.log.config import LogConfig
from broker_core.log.inspect import open_partition
from broker_core.log.leader_epoch import LeaderEpochCache
from broker_core.protocol.wire import Action, SinkAttempt
from broker_core.retry import RetryPolicy
from broker_core.txn.state_topic.schema import TXN_STATE_TOPIC, state_partition_of
from tests.broker.helpers import ids, prepared_attempt
from tests.harness.broker import BrokerProcess
from tests.harness.cluster import BrokerCluster, cut_cluster, live_ids
from tests.harness.netns import TestBed
from tests.harness.waiting import wait_until

SESSION_MS = 2000
BROKER_CONFIG = {
    "replica.lag.time.max.ms": 3000,
    "replica.fetch.wait.max.ms": 200,
    "replica.fetch.backoff.ms": 50,
}
TOPIC = "coordcut"
PARTITIONS = 3  # one led by each broker: two of them by brokers other than the coordinator
SINK = "coordcut-sink"  # the sink's key: its tasks' ids "<sink>/<n>" share its coordinator
ROWS = 10  # rows per partition per batch; partition p, batch b holds ids p*1000 + b*ROWS ..
# The batch's transaction timeout. The old coordinator's clock passes it while it is cut
# off (so its timeout pass tries to abort the batch); the new coordinator counts it from
# the end of its load, and gets the driver's commit right after that, well within it.
TIMEOUT_MS = 8000
FAILOVER_S = 30.0  # session expiry + an election + a load, on a loaded 2-core machine
DEPOSED = re.compile(r"coordinator of epoch \d+ deposed|was replaced by a newer one")
REFUSED = "timeout pass stopped: the abort of timed-out"  # its in-flight abort, fenced
TIMED_OUT = f"aborted by the coordinator: no task of sink {SINK!r}"
ABORTED = "aborted transactions open past their timeout"  # logged once an abort is done


@pytest.fixture
def cluster(
    testbed: TestBed, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[BrokerCluster]:
    with cut_cluster(
        testbed,
        tmp_path / "cluster",
        request,
        session_ms=SESSION_MS,
        config=BROKER_CONFIG,
        log_lines=80,
    ) as brokers:
        yield brokers


def _describe(client: BrokerClient, broker: BrokerProcess, topic: str) -> list[PartitionState]:
    """Every partition of ``topic`` as this one broker describes it (no routing)."""
    # Unnamed: an internal topic is described only in the list of all.
    answer = client.action(broker.address, Action.DESCRIBE_TOPICS, {})
    (doc,) = [t for t in answer["topics"] if t["name"] == topic]
    return [
        PartitionState(tuple(e["replicas"]), e["leader"], e["leader_epoch"], tuple(e["isr"]))
        for e in doc["partitions"]
    ]


def _agreed(
    client: BrokerClient, brokers: list[BrokerProcess], topic: str
) -> list[PartitionState] | None:
    """The partitions' states every one of ``brokers`` describes, if they agree."""
    try:
        views = {tuple(_describe(client, b, topic)) for b in brokers}
    except (IdemlogError, ValueError):
        return None
    return list(views.pop()) if len(views) == 1 else None


def _all_in_sync(client: BrokerClient, brokers: list[BrokerProcess], topic: str) -> bool:
    states = _agreed(client, brokers, topic)
    return states is not None and all(set(s.isr) == {1, 2, 3} for s in states)


def _coordinator(client: BrokerClient, brokers: list[BrokerProcess], old: int | None) -> int:
    """The broker every one of ``brokers`` names as the sink's coordinator
    (FIND_COORDINATOR with the sink's key), once it is not ``old`` and has loaded its
    state partition (the first ask creates ``__transaction_state``)."""

    def named() -> int | None:
        try:
            answers = {
                client.action(b.address, Action.FIND_COORDINATOR, {"transactional_id": SINK})[
                    "broker_id"
                ]
                for b in brokers
            }
        except IdemlogError as exc:
            assert exc.retriable, exc
            return None
        if len(answers) != 1 or (leader := answers.pop()) == old:
            return None
        try:  # named is not loaded: the state partition loads in the background
            address = next(b.address for b in brokers if b.name == f"broker{leader}")
            client.action(address, Action.LIST_TRANSACTIONS, {})
        except IdemlogError as exc:
            assert exc.retriable, exc
            return None
        return int(leader)

    found = wait_until(named, f"one loaded coordinator other than {old}", timeout=FAILOVER_S)
    assert found is not None
    return found


def _state_log_end(broker: BrokerProcess, partition: int) -> int:
    """The log end of ``broker``'s replica of a state partition, read from its files
    without changing them (``log.inspect``): a cut host's broker answers no request."""
    directory = broker.log_dir / TXN_STATE_TOPIC / str(partition)
    view = open_partition(directory, LogConfig.from_mapping({}))
    try:
        return view.log_end_offset
    finally:
        view.close()


def _expected(p: int, batches: range) -> list[int]:
    return [p * 1000 + b * ROWS + j for b in batches for j in range(ROWS)]


def _batch(
    client: BrokerClient, batch_id: int, partitions: list[int], run: str = "run-1"
) -> list[tuple[str, int, int]]:
    """Micro-batch ``batch_id`` of the sink prepared as its tasks prepare it: task p writes
    partition p's rows in one transaction and prepares it."""
    attempt = SinkAttempt(SINK, run, batch_id)
    return [
        prepared_attempt(
            client,
            attempt,
            p,
            TOPIC,
            {p: [range(p * 1000 + batch_id * ROWS, p * 1000 + (batch_id + 1) * ROWS)]},
            timeout_ms=TIMEOUT_MS,
        )
        for p in partitions
    ]


def _commit(driver: BrokerClient, batch_id: int, txns: list[tuple[str, int, int]]) -> bool:
    """The driver's commit, retried while it fails retriably (NOT_COORDINATOR,
    COORDINATOR_LOAD_IN_PROGRESS, a request timed out), as the Spark driver retries it."""
    policy = RetryPolicy(deadline_s=FAILOVER_S, backoff_s=0.05, max_backoff_s=0.5)
    return bool(policy.call(lambda: driver.commit_sink_batch(SINK, batch_id, txns)))


def test_coordinator_cut_off_mid_batch_times_nothing_out_and_its_successor_commits_it_once(
    cluster: BrokerCluster,
) -> None:
    client = cluster.client()
    brokers = cluster.brokers
    client.create_topic(TOPIC, PARTITIONS, config={"replication.factor": 3})
    coordinator_id = _coordinator(client, brokers, None)
    wait_until(
        lambda: (
            _all_in_sync(client, brokers, TOPIC) and _all_in_sync(client, brokers, TXN_STATE_TOPIC)
        ),
        "every replica of the data topic and of the state topic in sync",
        timeout=30,
    )
    states = _agreed(client, brokers, TXN_STATE_TOPIC)
    assert states is not None
    state_p = state_partition_of(SINK, len(states))
    before = states[state_p]
    assert before.leader == coordinator_id and len(before.replicas) == 3, before
    victim, host = brokers[coordinator_id - 1], cluster.hosts[coordinator_id - 1]
    survivors = [b for i, b in enumerate(brokers, 1) if i != coordinator_id]
    data = _agreed(client, brokers, TOPIC)
    assert data is not None
    parts = [p for p, s in enumerate(data) if s.leader != coordinator_id]
    assert len(parts) == 2, data

    # 1. The batch prepared on the other brokers' partitions; the commit not yet sent.
    first = _batch(client, 0, parts)

    # Its prepare was an acks=all append: every follower has the state log's end.
    def followers_caught_up() -> bool:
        doc = client.action(victim.address, Action.METRICS, {})["replication"]
        lag = doc["follower_lag"].get(f"{TXN_STATE_TOPIC}-{state_p}", {})
        return len(lag) == 2 and set(lag.values()) == {0}

    wait_until(followers_caught_up, "the state partition's followers caught up", timeout=10)
    at_cut = _state_log_end(victim, state_p)

    # 2. The coordinator's host cut off.
    host.cut()
    cut_at = time.monotonic()
    try:
        wait_until(
            lambda: all(coordinator_id not in live_ids(client, b) for b in survivors),
            f"the other brokers to drop broker {coordinator_id}",
            timeout=FAILOVER_S,
        )
        dropped_at = time.monotonic()
        new_id = _coordinator(client, survivors, coordinator_id)
        elected_at = time.monotonic()
        after = _agreed(client, survivors, TXN_STATE_TOPIC)
        assert after is not None
        assert after[state_p].leader == new_id and after[state_p].leader_epoch > before.leader_epoch
        assert coordinator_id not in after[state_p].isr, after[state_p]

        # The driver (here a client of the reachable brokers) commits: the new coordinator.
        driver = BrokerClient(",".join(b.address for b in survivors), timeout_s=20)
        committed = _commit(driver, 0, first)
        committed_at = time.monotonic()
        assert committed is True

        # 3. By its own clock the old coordinator's timeout pass now tries to abort the
        # batch: it says so, and its PREPARE_ABORT goes into its replica of the state
        # partition, where it waits for followers that fetch from the new leader instead.
        victim.wait_for_log(TIMED_OUT, timeout=TIMEOUT_MS / 1000 + FAILOVER_S)
        tried_at = time.monotonic()
        with_abort = wait_until(
            lambda: (end := _state_log_end(victim, state_p)) > at_cut and end,
            "the old coordinator's abort appended to its own state log",
            timeout=FAILOVER_S,
        )
        assert ABORTED not in victim.log_text()  # in flight, not done
        healed_log = len(victim.log_text())
    finally:
        host.heal()
        healed_at = time.monotonic()

    # 4. Healed: its session is gone, its coordinator stands down, it cuts its state log
    # back to where the new leader's epoch began and follows it.
    # The cut was real: the old broker's session expired while it could not reach
    # ZooKeeper, and it learns so only now.
    wait_until(
        lambda: "ZooKeeper session lost" in victim.log_text()[healed_log:],
        "the old broker to find its ZooKeeper session lost after the heal",
        timeout=FAILOVER_S,
    )
    assert "ZooKeeper session lost" not in victim.log_text()[:healed_log]
    wait_until(
        lambda: DEPOSED.search(victim.log_text()[healed_log:]),
        "the old coordinator to stand down after the heal",
        timeout=FAILOVER_S,
    )
    # Its abort, in flight since before the heal, was refused for its epoch.
    victim.wait_for_log(REFUSED, timeout=FAILOVER_S)
    assert REFUSED in victim.log_text()[healed_log:]
    pattern = re.compile(
        rf"{TXN_STATE_TOPIC}-{state_p}: truncated from (\d+) to (\d+) to follow broker {new_id}"
    )
    truncation = wait_until(
        lambda: pattern.search(victim.log_text()[healed_log:]),
        f"broker {coordinator_id} to truncate {TXN_STATE_TOPIC}-{state_p}",
        timeout=FAILOVER_S,
    )
    assert truncation is not None
    cut_from, cut_to = int(truncation[1]), int(truncation[2])
    # Cut back to where the new leader's epoch began, which is past everything the old
    # coordinator had acknowledged; its abort, after that, is gone.
    cache = LeaderEpochCache.load(brokers[new_id - 1].log_dir / TXN_STATE_TOPIC / str(state_p))
    assert cache is not None
    epoch_start = cache.start_offset_of(after[state_p].leader_epoch)
    assert cut_to == epoch_start and at_cut <= epoch_start < with_abort <= cut_from, (
        at_cut,
        epoch_start,
        with_abort,
        cut_from,
        cut_to,
    )
    client = cluster.client()
    wait_until(
        lambda: all(live_ids(client, b) == {1, 2, 3} for b in brokers),
        f"broker {coordinator_id} registered again, seen by every broker",
        timeout=FAILOVER_S,
    )
    wait_until(
        lambda: (
            _all_in_sync(client, brokers, TOPIC) and _all_in_sync(client, brokers, TXN_STATE_TOPIC)
        ),
        f"broker {coordinator_id} back in sync as a follower",
        timeout=FAILOVER_S,
    )
    rejoined_at = time.monotonic()
    final = _agreed(client, brokers, TXN_STATE_TOPIC)
    assert final is not None and final[state_p].leader == new_id, final
    assert _coordinator(client, brokers, coordinator_id) == new_id

    # 5. The batch once and whole; a repeated commit is answered "committed before".
    for p in range(PARTITIONS):
        assert ids(client, TOPIC, p) == (_expected(p, range(1)) if p in parts else []), p
    assert driver.commit_sink_batch(SINK, 0, first) is False
    # The next batches commit, on every partition.
    for batch_id in (1, 2):
        assert _commit(driver, batch_id, _batch(client, batch_id, list(range(PARTITIONS))))
    for p in range(PARTITIONS):
        got = ids(client, TOPIC, p)
        assert got == (_expected(p, range(3)) if p in parts else _expected(p, range(1, 3))), p
        assert not [i for i, n in collections.Counter(got).items() if n > 1], p

    def stable() -> dict[int, dict[str, Any]] | None:
        offsets = {p: client.list_offsets(TOPIC, p) for p in range(PARTITIONS)}
        done = all(
            o["last_stable_offset"] == o["high_watermark"] == o["log_end_offset"]
            for o in offsets.values()
        )
        return None if not done else offsets

    wait_until(stable, "every partition's last stable offset at its log end", timeout=30)
    # The old coordinator changed nothing: no abort of it ever completed.
    assert ABORTED not in victim.log_text()
    driver.close()
    client.close()
    print(
        f"coordinator broker {coordinator_id} (state partition {state_p}, epoch "
        f"{before.leader_epoch}) cut; dropped {dropped_at - cut_at:.2f}s after the cut, "
        f"broker {new_id} coordinates at epoch {after[state_p].leader_epoch} "
        f"{elected_at - cut_at:.2f}s, driver's commit done {committed_at - cut_at:.2f}s, "
        f"old coordinator's timeout pass tried {tried_at - cut_at:.2f}s, healed "
        f"{healed_at - cut_at:.2f}s, back in sync {rejoined_at - healed_at:.2f}s after the "
        f"heal; its state log ended at {at_cut} at the cut, {with_abort} with its abort, "
        f"truncated from {cut_from} to {cut_to} (the new epoch's start)"
    )
