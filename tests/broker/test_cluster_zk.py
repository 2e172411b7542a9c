"""Three real broker processes on a real ZooKeeper: routing, a dead broker, controller failover.

Every broker is a subprocess (``tests/harness/broker.py``) registered in a per-test chroot
of the session's ZooKeeper server. The session timeout is short (``SESSION_MS``) because a
SIGKILLed broker leaves the cluster, and its controllership passes on, only when its
ZooKeeper session expires; every wait below polls the cluster's metadata with a deadline.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from broker_core.cli.main import main as cli_main
from broker_core.client.broker_client import BrokerClient
from broker_core.client.produce_stream import ProduceStream
from broker_core.errors import IdemlogError, InvalidReplicationFactorError
from broker_core.protocol.admin_requests import BrokerAddress
from broker_core.protocol.wire import Action, ProduceResponse, SinkAttempt
from broker_core.retry import RetryPolicy
from broker_core.server.config.broker_config import ZK_ROOT
from testkit.zookeeper import ZooKeeperHarness, ZooKeeperServer
from tests.broker.helpers import TEST_BROKER_CONFIG, ids, prepared_attempt, rows
from tests.harness.broker import TEST_HOOKS, BrokerFactory, BrokerProcess
from tests.harness.schedule import paused
from tests.harness.waiting import wait_until

ClientFor = Callable[..., BrokerClient]
SESSION_MS = 2000  # a killed broker's registration (and controllership) lasts this long
FAILOVER_S = 20.0  # session expiry + a new election + the new coordinator's start
ROWS = 10  # rows per batch; partition p, batch i holds ids p*1000 + i*ROWS ..


def _config(
    zk: ZooKeeperHarness, broker_id: int, session_ms: int = SESSION_MS
) -> dict[str, object]:
    return {
        **TEST_BROKER_CONFIG,
        "zookeeper.connect": zk.hosts,
        "zookeeper.session.timeout.ms": session_ms,
        "broker.id": broker_id,
        # These scenarios are about single-replica partitions on a ZooKeeper cluster (a
        # dead broker's partitions are unavailable); replication: test_replication.py.
        "default.replication.factor": 1,
    }


def _metadata(client: BrokerClient, broker: BrokerProcess) -> dict[str, Any]:
    """METADATA as this one broker sees it (no routing)."""
    return client.action(broker.address, Action.METADATA, {})


def _start_cluster(
    zk: ZooKeeperHarness,
    factory: BrokerFactory,
    client_for: ClientFor,
    count: int = 3,
    env: Mapping[int, Mapping[str, str]] | None = None,
    session_ms: int = SESSION_MS,
) -> tuple[list[BrokerProcess], BrokerClient]:
    """Brokers 1..count (``env``: extra environment by broker id, a failpoint, and then
    that broker is started with the test hooks on); broker 1 starts alone first, so it
    wins the controller election."""
    env = env or {}

    def config(i: int) -> dict[str, object]:
        return {**_config(zk, i, session_ms), **(TEST_HOOKS if i in env else {})}

    brokers = [factory(config(1), name="zk1", env=env.get(1))]
    brokers += [factory(config(i), name=f"zk{i}", env=env.get(i)) for i in range(2, count + 1)]
    probe = client_for(brokers[-1])

    def everyone_sees_everyone() -> bool:
        docs = [_metadata(probe, b) for b in brokers]
        return all(len(d["brokers"]) == count and d["controller"] == 1 for d in docs)

    wait_until(everyone_sees_everyone, f"all {count} brokers registered, broker 1 controller")
    return brokers, probe


def _hp(broker: BrokerProcess) -> tuple[str, int]:
    host, _, port = broker.address.rpartition(":")
    return host, int(port)


def _create_everywhere(
    client: BrokerClient, brokers: list[BrokerProcess], topic: str, partitions: int
) -> list[int]:
    """Create a topic and wait until every live broker's cached metadata has it."""
    leaders = client.create_topic(topic, partitions)
    wait_until(
        lambda: all(_metadata(client, b)["topics"].get(topic) == leaders for b in brokers),
        f"every broker to learn topic {topic!r}",
    )
    return leaders


def _send(
    stream: ProduceStream,
    pid: int,
    epoch: int,
    p: int,
    i: int,
    *,
    transactional: bool = False,
    id_base: int = 0,
) -> ProduceResponse:
    """Batch ``i`` of partition ``p``: sequence i*ROWS, ids id_base + p*1000 + i*ROWS .."""
    batch = rows(ROWS, start=id_base + p * 1000 + i * ROWS)
    handle = stream.send(
        batch,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=i * ROWS,
        transactional=transactional,
    )
    return handle.result(10)


def _produce(
    client: BrokerClient, topic: str, p: int, pid: int, epoch: int, batches: range
) -> None:
    with client.produce_stream(topic, p) as stream:
        for i in batches:
            response = _send(stream, pid, epoch, p, i)
            assert response.ok and not response.duplicate, (topic, p, i, response)


def _expected(p: int, batches: range, id_base: int = 0) -> list[int]:
    return [id_base + p * 1000 + i * ROWS + j for i in batches for j in range(ROWS)]


def _stable(client: BrokerClient, topic: str, p: int) -> bool:
    offsets = client.list_offsets(topic, p)
    return offsets["last_stable_offset"] == offsets["log_end_offset"]


def _new_controller(client: BrokerClient, survivor: BrokerProcess, old: int) -> int:
    """Poll the survivor's metadata until a live broker other than ``old`` is controller."""
    found: list[int] = []

    def elected() -> bool:
        doc = _metadata(client, survivor)
        live = {b["broker_id"] for b in doc["brokers"]}
        controller = doc["controller"]
        if controller is None or controller == old or controller not in live:
            return False
        found.append(controller)
        return True

    wait_until(elected, f"a controller other than broker {old}", timeout=FAILOVER_S)
    return found[-1]


def _coordinator(client: BrokerClient, brokers: list[BrokerProcess], old: int | None = None) -> int:
    """The broker FIND_COORDINATOR names (every live broker agreeing), once it is not
    ``old`` and has loaded its state partition; __transaction_state is created by the
    first ask."""
    found: list[int] = []

    def named() -> bool:
        answers = set()
        for broker in brokers:
            if not broker.running:
                continue
            try:
                doc = client.action(broker.address, Action.FIND_COORDINATOR, {})
                answers.add((doc["broker_id"], f"{doc['host']}:{doc['port']}"))
            except IdemlogError as exc:
                assert exc.retriable, exc
                return False
        if len(answers) != 1:
            return False
        leader, address = answers.pop()
        if leader == old:
            return False
        try:  # named is not loaded: the state partition loads in the background
            client.action(address, Action.LIST_TRANSACTIONS, {})
        except IdemlogError as exc:
            assert exc.retriable, exc
            return False
        found.append(leader)
        return True

    wait_until(named, f"one loaded coordinator other than broker {old}", timeout=FAILOVER_S)
    return found[-1]


def _retry_until(call: Callable[[], Any], what: str, timeout: float = FAILOVER_S) -> Any:
    """``call()`` until it stops failing with a retriable error, within a deadline; the
    last error as it is after that (``what`` names the call for the reader)."""
    # A fixed 50 ms between retries of a request to another process, as the tests expect.
    policy = RetryPolicy(deadline_s=timeout, backoff_s=0.05, max_backoff_s=0.05, jitter=0.0)
    return policy.call(call)


# -- 1. routing from any broker ----------------------------------------------------------


def test_any_broker_bootstraps_a_client_to_every_leader(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    brokers, probe = _start_cluster(zk_chroot, broker_factory, client_for)
    leaders = _create_everywhere(probe, brokers, "six", 6)
    assert sorted(leaders) == [1, 1, 2, 2, 3, 3]  # round-robin over all three
    described = [probe.action(b.address, Action.DESCRIBE_TOPICS, {}) for b in brokers]
    assert described[0] == described[1] == described[2]
    [topic] = described[0]["topics"]
    assert [p["leader"] for p in topic["partitions"]] == leaders
    for round_, bootstrap in enumerate(brokers):
        client = client_for(bootstrap)  # knows this one address only
        view = client.refresh_metadata()
        assert sorted(view.brokers) == [1, 2, 3] and view.controller == 1
        assert view.topics["six"] == leaders
        pid, epoch = client.init_producer_id()  # from the bootstrap broker's own block
        for p in range(6):
            assert client.leader("six", p).broker_id == leaders[p]
            _produce(client, "six", p, pid, epoch, range(round_, round_ + 1))
    for p in range(6):
        assert ids(probe, "six", p) == _expected(p, range(3))
        # Only the leader serves the partition; the others say who does.
        for b in brokers:
            if brokers.index(b) + 1 != leaders[p]:
                with pytest.raises(IdemlogError, match=f"does not lead six-{p}") as err:
                    probe.action(b.address, Action.LIST_OFFSETS, {"topic": "six", "partition": p})
                assert err.value.retriable and err.value.code == 6


def test_describe_shows_single_replica_state_and_reads_a_version_1_topic(
    zk_chroot: ZooKeeperHarness,
    broker_factory: BrokerFactory,
    client_for: ClientFor,
    capsys: pytest.CaptureFixture[str],
) -> None:
    brokers, probe = _start_cluster(zk_chroot, broker_factory, client_for)
    leaders = _create_everywhere(probe, brokers, "three", 3)
    # A topic as a broker from before replica metadata stored it (version 1), written with
    # kazoo under the brokers' chroot; every broker reads it as one replica per partition.
    old = b'{"version":1,"partitions":{"0":3,"1":1},"schema":null,"config":{"retention.ms":"7"}}'
    zk_chroot.client().create(f"{ZK_ROOT}/topics/legacy", old)
    wait_until(
        lambda: all(_metadata(probe, b)["topics"].get("legacy") == [3, 1] for b in brokers),
        "every broker to read the version 1 topic",
    )

    for b in brokers:
        doc = probe.action(b.address, Action.DESCRIBE_TOPICS, {})
        described = {t["name"]: t for t in doc["topics"]}
        for name, expected in (("three", leaders), ("legacy", [3, 1])):
            assert [
                (p["partition"], p["leader"], p["replicas"], p["isr"], p["leader_epoch"])
                for p in described[name]["partitions"]
            ] == [(p, leader, [leader], [leader], 0) for p, leader in enumerate(expected)]
        assert described["legacy"]["config"] == {"retention.ms": "7"}
    stored = json.loads(zk_chroot.client().get(f"{ZK_ROOT}/topics/three")[0])
    assert stored["version"] == 2 and stored["partitions"]["0"]["replicas"] == [leaders[0]]
    # The old topic is served, not only described.
    client = client_for(brokers[0])
    pid, epoch = client.init_producer_id()
    _produce(client, "legacy", 0, pid, epoch, range(2))
    assert ids(client, "legacy", 0) == _expected(0, range(2))

    assert cli_main(["topics", "describe", "--bootstrap", brokers[1].address]) == 0
    out = capsys.readouterr().out
    assert "topic legacy" in out and "topic three" in out
    assert "partition    0  leader   3  replicas 3         isr 3         leader epoch   0" in out
    assert "partition    1  leader   1  replicas 1         isr 1         leader epoch   0" in out
    with pytest.raises(InvalidReplicationFactorError, match=r"replication\.factor=4") as info:
        probe.create_topic("replicated", 3, config={"replication.factor": 4})
    assert info.value.code == 38 and "number of live brokers, 3" in info.value.message


# -- 2. a dead broker and its return -----------------------------------------------------


def test_sigkilled_broker_partitions_fail_retriably_then_return_exactly_once(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    brokers, probe = _start_cluster(zk_chroot, broker_factory, client_for)
    leaders = _create_everywhere(probe, brokers, "victim", 6)
    victim = brokers[1]  # broker 2: not the controller
    mine = [p for p in range(6) if leaders[p] == 2]
    others = [p for p in range(6) if leaders[p] != 2]
    client = client_for(brokers[0], retries=1)
    pid, epoch = client.init_producer_id()
    for p in range(6):
        _produce(client, "victim", p, pid, epoch, range(3))
    # Two more batches pipelined to each of the victim's partitions; only the first is
    # awaited, so the second may or may not be written when the SIGKILL lands.
    acked: dict[tuple[int, int], tuple[int, int]] = {}
    streams = {p: client.produce_stream("victim", p) for p in mine}
    for p, stream in streams.items():
        handles = [
            stream.send(
                rows(ROWS, start=p * 1000 + i * ROWS),
                producer_id=pid, producer_epoch=epoch, base_sequence=i * ROWS,
            )
            for i in (3, 4)
        ]  # fmt: skip
        acked[(p, 3)] = handles[0].offsets(10)
    assert victim.kill() == -9
    for stream in streams.values():
        stream.close(timeout=10)

    for p in mine:
        with (
            pytest.raises(IdemlogError, match=f"victim-{p}") as produce_err,
            client.produce_stream("victim", p) as stream,
        ):
            _send(stream, pid, epoch, p, 5)
        assert produce_err.value.retriable, produce_err.value
        with pytest.raises(IdemlogError, match=f"victim-{p}") as fetch_err:
            client.fetch_once("victim", p, 0)
        assert fetch_err.value.retriable, fetch_err.value
    for p in others:  # the live brokers' partitions keep working meanwhile
        _produce(client, "victim", p, pid, epoch, range(3, 5))
        assert ids(client, "victim", p) == _expected(p, range(5))

    # Same log.dir and broker.id; a new port, because the old one may meanwhile be the
    # source port of some outgoing connection. The client learns it from the metadata.
    victim.restart(same_port=False)
    wait_until(
        lambda: client.refresh_metadata().brokers.get(2) == BrokerAddress(2, *_hp(victim)),
        "broker 2 registered again at its new address",
    )
    for p in mine:
        with client.produce_stream("victim", p) as stream:
            resent = _send(stream, pid, epoch, p, 3)  # acknowledged before the kill
            assert resent.ok and resent.duplicate
            assert (resent.base_offset, resent.last_offset) == acked[(p, 3)]
            maybe = _send(stream, pid, epoch, p, 4)  # unacknowledged: written once either way
            assert maybe.ok, maybe
            fresh = _send(stream, pid, epoch, p, 5)
            assert fresh.ok and not fresh.duplicate, fresh
    for p in range(6):
        got = ids(client, "victim", p, isolation="read_uncommitted")
        assert got == _expected(p, range(6 if p in mine else 5)), p


def test_any_broker_calls_go_on_while_a_sigkilled_controller_is_still_listed(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    """A SIGKILLed controller stays in every broker's metadata, as the controller, until
    its ZooKeeper session expires (CI: a stream's topic check in that window retried on
    the dead controller until its retries ran out). The any-broker calls go on through
    the live brokers meanwhile."""
    # A session long enough that the calls below surely fall inside it.
    brokers, probe = _start_cluster(zk_chroot, broker_factory, client_for, session_ms=10_000)
    leaders = _create_everywhere(probe, brokers, "window", 3)
    _coordinator(probe, brokers)  # __transaction_state exists before the kill
    client = client_for(brokers[0])  # bootstrapped from the victim alone
    view = client.refresh_metadata()
    assert view.controller == 1 and sorted(view.brokers) == [1, 2, 3]
    assert brokers[0].kill() == -9  # broker 1: the controller, the first known broker

    (described,) = client.describe_topics(["window"])
    assert [p.leader for p in described.partitions] == leaders
    assert client.state_partition_count() >= 1  # FIND_COORDINATOR
    pid, epoch = client.init_producer_id()  # from a live broker's block
    assert pid >= 0 and epoch == 0
    # The scenario held: after those calls the survivors still list the dead broker, as
    # the controller (its session had not expired).
    for survivor in brokers[1:]:
        doc = _metadata(probe, survivor)
        assert doc["controller"] == 1, doc
        assert 1 in {b["broker_id"] for b in doc["brokers"]}, doc


# -- 3. coordinator failover in the middle of end_txn --------------------------------------

# __transaction_state-0 of brokers [1, 2, 3]: its replicas start at a stable hash of the
# name (cluster.topic_creation.assign_partitions), so its first leader is always broker 2.
COORDINATOR = 2


def test_new_coordinator_finishes_a_commit_its_predecessor_died_in(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    brokers, probe = _start_cluster(
        zk_chroot,
        broker_factory,
        client_for,
        env={COORDINATOR: {"IDEMLOG_TEST_FAILPOINT": "after_first_marker"}},
        # The half-done state below lasts until the dead coordinator's session expires and
        # its successor finishes the commit: give the checks a window a loaded machine
        # cannot miss (a CI run took over 2 s between the kill and the check).
        session_ms=3 * SESSION_MS,
    )
    assert _coordinator(probe, brokers) == COORDINATOR
    leaders = _create_everywhere(probe, brokers, "failover", 3)
    # The transaction spans the partitions of brokers 1 and 3, which outlive the coordinator.
    parts = sorted(p for p in range(3) if leaders[p] != COORDINATOR)
    assert sorted(leaders[p] for p in parts) == [1, 3]
    client = client_for(brokers[2])
    pid, epoch = client.init_producer_id("failover-app")
    client.add_partitions_to_txn("failover-app", pid, epoch, [("failover", p) for p in parts])
    for p in parts:
        with client.produce_stream("failover", p, transactional_id="failover-app") as stream:
            for i in range(2):
                assert _send(stream, pid, epoch, p, i, transactional=True).ok

    # Broker 2 stores PREPARE_COMMIT (acks=all: on brokers 1 and 3 too), writes the first
    # leader's (broker 1's) marker and SIGKILLs itself.
    with pytest.raises(IdemlogError) as died:
        client.end_txn("failover-app", pid, epoch, commit=True)
    assert died.value.retriable, died.value
    assert brokers[1].wait_exit(10) == -9
    assert "test failpoint after_first_marker" in brokers[1].log_text()
    first = parts[0] if leaders[parts[0]] == 1 else parts[1]
    second = parts[1] if first == parts[0] else parts[0]
    # Half done: the first partition is committed, the second still open.
    assert ids(client, "failover", first) == _expected(first, range(2))
    assert ids(client, "failover", second) == []

    live = [brokers[0], brokers[2]]
    assert _coordinator(client, live, old=COORDINATOR) in (1, 3)
    # The new leader of __transaction_state-0 loads the PREPARE_COMMIT and finishes it.
    for p in parts:
        stable = functools.partial(_stable, client, "failover", p)
        wait_until(stable, f"failover-{p} stable", timeout=FAILOVER_S)
        assert ids(client, "failover", p) == _expected(p, range(2))  # once, committed
    # The client's retry of end_txn reaches the new coordinator and is a no-op, answered
    # with the epoch the markers carry (each transaction ends at its own: KIP-890).
    answer = _retry_until(
        lambda: client.end_txn("failover-app", pid, epoch, commit=True), "end_txn retry"
    )
    assert answer == (pid, epoch + 1)
    for p in parts:
        assert ids(client, "failover", p) == _expected(p, range(2))
        assert ids(client, "failover", p, isolation="read_uncommitted") == _expected(p, range(2))
    # The same transactional id goes on at the epoch after that on the new coordinator.
    assert client.init_producer_id("failover-app") == (pid, epoch + 2)


# -- 4. a sink commit repeated across a coordinator failover -----------------------------


def test_sink_commit_repeated_after_coordinator_failover_is_not_committed_twice(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    brokers, probe = _start_cluster(zk_chroot, broker_factory, client_for)
    assert _coordinator(probe, brokers) == COORDINATOR
    leaders = _create_everywhere(probe, brokers, "sinkfo", 3)
    parts = [p for p in range(3) if leaders[p] != COORDINATOR]  # led by brokers that stay up
    client = client_for(brokers[2])

    def batch(id_base: int) -> list[tuple[str, int, int]]:
        """One Spark batch attempt: a transaction per partition (fencing older attempts)."""
        run = SinkAttempt("query-7", f"run-{id_base}", 5 if id_base < 900 else 6)
        return [
            prepared_attempt(
                client,
                run,
                p,
                "sinkfo",
                {
                    p: [
                        range(id_base + p * 1000 + i * ROWS, id_base + p * 1000 + (i + 1) * ROWS)
                        for i in range(2)
                    ]
                },
            )
            for p in parts
        ]

    # Sequences restart at 0 with each epoch; the ids tell the attempts apart.
    first = batch(0)
    assert client.commit_sink_batch("query-7", 5, first) is True
    assert brokers[1].kill() == -9  # the coordinator, right after the commit
    assert _coordinator(client, [brokers[0], brokers[2]], old=COORDINATOR) in (1, 3)

    # The driver re-runs batch 5 (new attempts fence the old epochs) and commits it again.
    again = _retry_until(lambda: batch(500), "the replayed batch's transactions")
    assert [(t, pid) for t, pid, _ in again] == [(t, pid) for t, pid, _ in first]
    assert all(e2 == e1 + 1 for (_, _, e1), (_, _, e2) in zip(first, again, strict=True))
    assert client.commit_sink_batch("query-7", 5, again) is False
    assert client.commit_sink_batch("query-7", 4, again) is False
    for p in parts:
        wait_until(functools.partial(_stable, client, "sinkfo", p), f"sinkfo-{p} stable")
        assert ids(client, "sinkfo", p) == _expected(p, range(2))  # the first attempt only
    # The old coordinator comes back as an ordinary broker; the record is still there.
    brokers[1].restart(same_port=False)  # see the SIGKILL test for why a new port
    wait_until(lambda: len(_metadata(client, brokers[0])["brokers"]) == 3, "broker 2 back")
    assert client.commit_sink_batch("query-7", 5, again) is False
    assert client.commit_sink_batch("query-7", 6, batch(900)) is True
    for p in parts:
        assert ids(client, "sinkfo", p) == _expected(p, range(2)) + _expected(p, range(2), 900)


def test_coordinator_paused_past_its_session_resumes_fenced_and_changes_nothing(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    """Issue 23, test 1: a deposed coordinator still running (frozen past its session,
    resumed) can neither record a decision nor time a transaction out."""
    brokers, probe = _start_cluster(zk_chroot, broker_factory, client_for)
    assert _coordinator(probe, brokers) == COORDINATOR
    leaders = _create_everywhere(probe, brokers, "paused", 3)
    parts = [p for p in range(3) if leaders[p] != COORDINATOR]  # led by brokers that stay up
    client = client_for(brokers[2])
    timeout_ms = 8000  # the new coordinator gets the commit well within it

    def batch(bid: int) -> list[tuple[str, int, int]]:
        attempt = SinkAttempt("query-9", "run-1", bid)
        spans = {p: [range(p * 1000 + bid * ROWS, p * 1000 + (bid + 1) * ROWS)] for p in parts}
        return [
            prepared_attempt(client, attempt, p, "paused", {p: spans[p]}, timeout_ms=timeout_ms)
            for p in parts
        ]

    first = batch(0)
    prepared_at = time.monotonic()
    with paused(brokers[1]):  # the coordinator, its batch prepared, frozen past its session
        new = _coordinator(client, [brokers[0], brokers[2]], old=COORDINATOR)
        assert new in (1, 3)
        # The driver's commit, through a client that knows the new coordinator (the first
        # one's request to the frozen broker would wait out its whole timeout).
        driver = client_for(brokers[new - 1])
        assert _retry_until(lambda: driver.commit_sink_batch("query-9", 0, first), "commit")
        # The fault's duration, not a synchronisation: by the frozen coordinator's clock the
        # batch is past its timeout when it resumes, so its timeout pass tries to abort it.
        time.sleep(max(0.0, prepared_at + timeout_ms / 1000 + 1 - time.monotonic()))
    fenced = "was replaced by a newer one"  # an append refused for its leader epoch
    deposed = "coordinator of epoch 0 deposed"  # the leadership change seen first
    wait_until(
        lambda: fenced in brokers[1].log_text() or deposed in brokers[1].log_text(),
        "the resumed coordinator to stand down",
    )
    wait_until(lambda: len(_metadata(client, brokers[0])["brokers"]) == 3, "broker 2 back")
    assert "aborted transactions open past their timeout" not in brokers[1].log_text()
    for p in parts:
        wait_until(functools.partial(_stable, client, "paused", p), f"paused-{p} stable")
        assert ids(client, "paused", p) == _expected(p, range(1))  # once and whole
    assert driver.commit_sink_batch("query-9", 1, batch(1)) is True
    for p in parts:
        assert ids(client, "paused", p) == _expected(p, range(2))
        assert _stable(client, "paused", p)


# -- 5. ZooKeeper down -------------------------------------------------------------------


def test_zookeeper_down_leaders_and_the_coordinator_keep_serving_while_metadata_waits(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    """ZooKeeper is off the commit path: without it, leaders serve from their cached
    metadata and the coordinator (the leader of __transaction_state-0, whose replicas stay
    in sync) commits transactions; only metadata changes wait."""
    brokers, probe = _start_cluster(zk_chroot, broker_factory, client_for, count=2)
    _coordinator(probe, brokers)  # creates __transaction_state before the outage
    leaders = _create_everywhere(probe, brokers, "nozk", 2)
    client = client_for(brokers[1], retries=0)
    pid, epoch = client.init_producer_id()  # broker 2 leases its block now
    for p in range(2):
        _produce(client, "nozk", p, pid, epoch, range(2))
    txn_pid, txn_epoch = client.init_producer_id("nozk-app")

    zk_chroot.stop_server()
    try:
        # Existing leaders serve produce and fetch from their cached metadata.
        for p in range(2):
            _produce(client, "nozk", p, pid, epoch, range(2, 4))
            assert ids(client, "nozk", p) == _expected(p, range(4))
        assert client.refresh_metadata().topics["nozk"] == leaders
        # A transaction commits through the coordinator meanwhile (an epoch bump needs no
        # producer-id block).
        txn_pid, txn_epoch = client.init_producer_id("nozk-app")
        client.add_partitions_to_txn("nozk-app", txn_pid, txn_epoch, [("nozk", 0)])
        with client.produce_stream("nozk", 0, transactional_id="nozk-app") as stream:
            sent = rows(ROWS, start=5000)
            handle = stream.send(
                sent,
                producer_id=txn_pid,
                producer_epoch=txn_epoch,
                base_sequence=0,
                transactional=True,
            )
            assert handle.result(10).ok
        # The next transaction's epoch (each ends at its own: KIP-890).
        txn_pid, txn_epoch = client.end_txn("nozk-app", txn_pid, txn_epoch, commit=True)
        wait_until(functools.partial(_stable, client, "nozk", 0), "nozk-0 stable")
        assert ids(client, "nozk", 0) == _expected(0, range(4)) + list(range(5000, 5000 + ROWS))
        # A producer id from the block broker 2 already holds needs no ZooKeeper.
        second = client.action(brokers[1].address, Action.INIT_PRODUCER_ID, {})
        # (The coordinator may be broker 2 too and have taken ids from it meanwhile.)
        assert pid < second["producer_id"] < pid + 1000 and second["producer_epoch"] == 0
        with pytest.raises(IdemlogError, match="ZooKeeper unavailable while creating") as err:
            client.create_topic("later", 1)
        assert err.value.retriable, err.value
    finally:
        zk_chroot.start_server()
    # Back in the same sessions: the controller returns, metadata changes go on.
    wait_until(lambda: _metadata(probe, brokers[0])["controller"] == 1, "broker 1 controller again")
    assert _retry_until(lambda: client.init_producer_id("nozk-app"), "init") == (
        txn_pid,
        txn_epoch + 1,
    )
    # The client asked may not be back in its session yet (the coordinator never left).
    assert _retry_until(lambda: client.create_topic("later", 1), "create")


# -- 6. a chroot several levels deep -------------------------------------------------------


@pytest.fixture
def zk_unmade_root(zk_server: ZooKeeperServer) -> Iterator[ZooKeeperHarness]:
    """A harness whose unique chroot is *not* created, deleted with everything under it
    at teardown; request it before ``broker_factory`` (brokers are killed first)."""
    harness = ZooKeeperHarness(zk_server)
    try:
        yield harness
    finally:
        harness.teardown()


def test_broker_creates_every_missing_level_of_a_deep_chroot(
    zk_unmade_root: ZooKeeperHarness, broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    # zookeeper.connect=host:port/<unique>/a/b, none of the three levels there: Kafka
    # creates the whole chroot path on first start, so does the broker.
    zk = zk_unmade_root
    chroot = f"{zk.chroot}/a/b"
    with zk.admin_client() as admin:
        assert admin.exists(zk.chroot) is None
    config = {
        **TEST_BROKER_CONFIG,
        "zookeeper.connect": zk.server.address + chroot,
        "zookeeper.session.timeout.ms": SESSION_MS,
        "broker.id": 1,
    }
    broker = broker_factory(config, name="deep")
    client = client_for(broker)
    wait_until(lambda: _metadata(client, broker)["controller"] == 1, "broker 1 the controller")
    assert client.create_topic("deep", 2) == [1, 1]
    pid, epoch = client.init_producer_id()
    _produce(client, "deep", 0, pid, epoch, range(2))
    assert ids(client, "deep", 0) == _expected(0, range(2))
    with zk.admin_client() as admin:
        # Everything lives under the chroot, nothing beside it.
        assert admin.get_children(zk.chroot) == ["a"]
        assert admin.get_children(f"{zk.chroot}/a") == ["b"]
        assert admin.exists(f"{chroot}/idemlog/brokers/ids/1") is not None
        assert admin.exists(f"{chroot}/idemlog/topics/deep") is not None
        assert admin.exists(f"{chroot}/latest_producer_id_block") is not None
    # Started again on the chroot that now exists: the same cluster, the data still there.
    broker.stop()
    broker.restart(same_port=False)
    client = client_for(broker)
    wait_until(lambda: _metadata(client, broker)["controller"] == 1, "broker 1 back")
    assert ids(client, "deep", 0) == _expected(0, range(2))
