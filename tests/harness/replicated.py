"""A replicated broker cluster for tests: N broker processes on a real ZooKeeper chroot.

:class:`ReplicatedCluster` starts brokers ``1..n`` (broker 1 first, so it is the
controller) with a short ZooKeeper session and replica lag time, and offers what the
replication tests ask of it:

* the partition state as the cluster metadata holds it (:meth:`state`), the broker
  process that leads a partition (:meth:`leader_of`), waits for an election
  (:meth:`wait_leader_change`) and for every replica to be in sync (:meth:`wait_in_sync`);
* :meth:`replica_logs`: each replica's segment bytes below a bound, to check that the
  replicas are byte-identical where they must be;
* the metrics' ``replication`` section per broker.

Every wait polls the brokers' own answers with a deadline (``tests.harness.waiting``).
The fixture ``replicated_cluster`` (registered in ``tests/conftest.py``) is one with the
defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.cluster.records import PartitionState
from broker_core.errors import IdemlogError
from broker_core.log.leader_epoch import LeaderEpochCache
from broker_core.log.replica import parse_fetched
from broker_core.protocol.admin_requests import TopicDescription
from broker_core.protocol.wire import Action
from broker_core.record.batch import NO_LEADER_EPOCH, decode_header
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.tls import PLAINTEXT_MATERIAL, TlsMaterial
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import TEST_BROKER_CONFIG
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.waiting import wait_until

SESSION_MS = 2000  # a SIGKILLed leader's partitions move this long after its death
LAG_MS = 3000  # a stopped follower leaves the ISR this long after it stopped fetching
ELECTION_S = 30.0  # the longest a test waits for an election


class ReplicatedCluster:
    """Brokers ``1..count`` on ``zk``'s chroot, made by ``factory`` (which kills them at
    teardown); ``extra`` broker keys for every broker; ``tls``: the test's client's files
    when ``extra`` sets security.protocol=SSL or SASL_SSL; ``sasl``: the credentials of
    its client on a SASL cluster; ``env``: each broker's environment at its first start
    (a test hook's ``IDEMLOG_TEST_FAILPOINT``, with ``TEST_HOOKS`` in ``extra``)."""

    def __init__(
        self,
        zk: ZooKeeperHarness,
        factory: BrokerFactory,
        count: int = 3,
        extra: Mapping[str, object] | None = None,
        tls: TlsMaterial = PLAINTEXT_MATERIAL,
        sasl: SaslCredentials | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.zk = zk
        self.factory = factory
        self.config = {
            **TEST_BROKER_CONFIG,
            "zookeeper.connect": zk.hosts,
            "zookeeper.session.timeout.ms": SESSION_MS,
            "replica.lag.time.max.ms": LAG_MS,
            "replica.fetch.wait.max.ms": 200,
            "replica.fetch.backoff.ms": 50,
            **(extra or {}),
        }
        self.brokers: dict[int, BrokerProcess] = {}
        for broker_id in range(1, count + 1):
            self.brokers[broker_id] = factory(
                {**self.config, "broker.id": broker_id}, name=f"b{broker_id}", env=env
            )
        self.bootstrap = ",".join(b.address for b in self.brokers.values())
        # The brokers' protocol, and the client's credentials on a SASL cluster.
        self.client = BrokerClient(self.bootstrap, tls=tls, sasl=sasl)
        wait_until(
            lambda: all(self._live_count(b) == count for b in self.brokers.values()),
            f"all {count} brokers registered",
        )

    def _live_count(self, broker: BrokerProcess) -> int:
        try:
            return len(self.client.action(broker.address, Action.METADATA, {})["brokers"])
        except IdemlogError:
            return -1

    def close(self) -> None:
        self.client.close()

    # -- metadata ------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, **config: object) -> None:
        """Create a topic (``config`` keys with dots written as underscores) and wait until
        every live broker has every replica's role."""
        conf = {k.replace("_", "."): str(v) for k, v in config.items()}
        self.client.create_topic(name, partitions, config=conf)
        for p in range(partitions):
            self.wait_state(name, p, lambda s: True, "the topic's metadata")

    def coordinator(self) -> int:
        """The transaction coordinator's broker id (the leader of __transaction_state-0,
        as FIND_COORDINATOR names it; the first ask creates the topic)."""
        answer: dict[str, Any] = wait_until(
            lambda: self._find_coordinator(), "a broker to name the coordinator"
        )
        return int(answer["broker_id"])

    def _find_coordinator(self) -> dict[str, Any] | None:
        for broker in self.running():
            try:
                return self.client.action(broker.address, Action.FIND_COORDINATOR, {})
            except IdemlogError:
                continue
        return None

    def state(self, topic: str, partition: int, via: BrokerProcess | None = None) -> PartitionState:
        """The partition's state as ``via`` (else any broker) describes it."""
        if via is None:
            (doc,) = self.client.describe_topics([topic])
        else:
            answer = self.client.action(via.address, Action.DESCRIBE_TOPICS, {"names": [topic]})
            (raw,) = answer["topics"]
            doc = TopicDescription.from_doc(raw)
        entry = doc.partitions[partition]
        return PartitionState(entry.replicas, entry.leader, entry.leader_epoch, entry.isr)

    def wait_state(
        self,
        topic: str,
        partition: int,
        check: Callable[[PartitionState], bool],
        what: str,
        timeout: float = ELECTION_S,
    ) -> PartitionState:
        """Wait until every running broker describes a state passing ``check``; returns it."""
        seen: list[PartitionState] = []

        def agreed() -> bool:
            try:
                states = {self.state(topic, partition, b) for b in self.running()}
            except IdemlogError:
                return False
            if len(states) != 1:
                return False
            (state,) = states
            seen[:] = [state]
            return check(state)

        wait_until(agreed, f"{topic}-{partition}: {what}", timeout=timeout)
        return seen[0]

    def running(self) -> list[BrokerProcess]:
        return [b for b in self.brokers.values() if b.running]

    def leader_of(self, topic: str, partition: int) -> BrokerProcess:
        return self.brokers[self.state(topic, partition).leader]

    def wait_leader_change(self, topic: str, partition: int, old: int) -> PartitionState:
        """Wait for a leader other than ``old`` that every running broker agrees on."""
        return self.wait_state(
            topic, partition, lambda s: s.leader != old, f"a leader other than broker {old}"
        )

    # -- replicas ------------------------------------------------------------------------
    def replication(self, broker: BrokerProcess) -> dict[str, Any]:
        doc: dict[str, Any] = self.client.action(broker.address, Action.METRICS, {})
        return dict(doc["replication"])

    def offsets(self, broker: BrokerProcess, topic: str, partition: int) -> dict[str, int]:
        """The leader's offsets of a partition, asked of that one broker."""
        body = {"topic": topic, "partition": partition}
        return dict(self.client.action(broker.address, Action.LIST_OFFSETS, body))

    def wait_in_sync(self, topic: str, partition: int, timeout: float = ELECTION_S) -> None:
        """Wait until every replica is in the ISR, every follower has the leader's whole log
        and the leader's high watermark is its log end."""
        name = f"{topic}-{partition}"

        def in_sync() -> bool:
            try:
                state = self.state(topic, partition)
                if set(state.isr) != set(state.replicas):
                    return False
                leader = self.brokers[state.leader]
                lag = self.replication(leader)["follower_lag"].get(name)
                offsets = self.offsets(leader, topic, partition)
            except IdemlogError:
                return False
            followers_done = lag is not None and all(v == 0 for v in lag.values())
            return followers_done and offsets["high_watermark"] == offsets["log_end_offset"]

        wait_until(in_sync, f"{name}: every replica in sync", timeout=timeout)

    def partition_dir(self, broker: BrokerProcess, topic: str, partition: int) -> Path:
        return broker.log_dir / topic / str(partition)

    def replica_log(self, broker: BrokerProcess, topic: str, partition: int) -> bytes:
        """The replica's whole log, its segments' bytes in offset order."""
        directory = self.partition_dir(broker, topic, partition)
        return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))

    def assert_stopped_replicas_identical(self, topic: str, partitions: int) -> None:
        """Every broker stopped: each partition's replicas hold the same log bytes (not
        empty), the same newest producer-state snapshot and the same epochs that wrote
        batches (a leadership that wrote nothing, e.g. during the clean stops, is only in
        the cache of the broker that held it)."""
        assert not self.running(), "stop every broker first"
        replicas = list(self.brokers.values())
        for p in range(partitions):
            logs = {b.name: self.replica_log(b, topic, p) for b in replicas}
            sizes = {name: len(data) for name, data in logs.items()}
            assert len(set(logs.values())) == 1, f"{topic}-{p}: replica logs differ: {sizes}"
            assert next(iter(logs.values())), f"{topic}-{p}: nothing was written"
            snapshots = {
                b.name: [
                    (f.name, f.read_bytes())
                    for f in sorted(self.partition_dir(b, topic, p).glob("*.snapshot"))
                ][-1:]
                for b in replicas
            }
            names = {n: [f for f, _ in v] for n, v in snapshots.items()}
            assert all(snapshots.values()), f"{topic}-{p}: a replica has no snapshot: {names}"
            assert len({tuple(v) for v in snapshots.values()}) == 1, (
                f"{topic}-{p}: producer state differs: {names}"
            )
            end = self.batches(replicas[0], topic, p)[-1][0] + 1
            epochs = {b.name: _epochs_below(self.partition_dir(b, topic, p), end) for b in replicas}
            assert len({tuple(v) for v in epochs.values()}) == 1, f"{topic}-{p}: epochs {epochs}"

    def batches(self, broker: BrokerProcess, topic: str, partition: int) -> list[tuple[int, int]]:
        """(base offset, leader epoch) of every batch of the replica, each checked (CRC,
        contiguous): a stopped broker's whole log, or a running one's at a batch boundary."""
        raw = self.replica_log(broker, topic, partition)
        if not raw:
            return []
        first = decode_header(memoryview(raw), 0).base_offset
        name = f"broker {broker.name} {topic}-{partition}"
        return [
            (b.header.base_offset, b.header.leader_epoch)
            for b in parse_fetched(raw, first, NO_LEADER_EPOCH, name)
        ]


def _epochs_below(directory: Path, end: int) -> list[tuple[int, int]]:
    """The (epoch, start offset) entries of a replica's epoch cache that wrote a batch
    below ``end`` (an epoch followed at once by another, or starting at the end, wrote
    nothing); a log without a cache file counts as [(0, 0)]."""
    cache = LeaderEpochCache.load(directory)
    assert cache is not None, f"{directory}: unreadable leader-epoch-checkpoint"
    entries = cache.entries
    wrote = [
        (e.epoch, e.start_offset)
        for e, after in zip(entries, [*entries[1:], None], strict=False)
        if e.start_offset < (end if after is None else min(after.start_offset, end))
    ]
    return wrote or [(0, 0)]


@pytest.fixture
def replicated_cluster(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> Iterator[ReplicatedCluster]:
    """Three brokers on the test's ZooKeeper chroot (the harness defaults); the brokers
    go with ``broker_factory``'s teardown."""
    cluster = ReplicatedCluster(zk_chroot, broker_factory)
    try:
        yield cluster
    finally:
        cluster.close()
