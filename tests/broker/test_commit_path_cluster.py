"""Issue test 5 on a cluster: three real broker processes on a real ZooKeeper, a foreign
transaction holding one partition's LSO back while a sink commits batch after batch.

Before, every commit record carried the ranges of every batch since (368 commits of
8 tasks x 16 partitions filled the 1 MB znode and every commit failed from then on).
Now the sink's record keeps the size of one batch, each held-back batch has a small
record of its own that goes (a tombstone) once the LSO passes it, and readers still see
every batch whole. The records are read from the coordinator's replica of
``__transaction_state`` (read-only, ``log.inspect``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from broker_core.client.broker_client import BrokerClient
from broker_core.log.config import LogConfig
from broker_core.log.inspect import open_partition
from broker_core.log.partition_log import IsolationLevel
from broker_core.protocol.wire import Action, SinkAttempt
from broker_core.txn.state_topic.schema import TXN_STATE_TOPIC
from broker_core.txn.state_topic.store import KIND_SINK, KIND_SINK_BATCH
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import TEST_BROKER_CONFIG, ids, prepared_attempt, rows
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.client_calls import answering_address
from tests.harness.waiting import wait_until

ClientFor = Callable[..., BrokerClient]
TOPIC = "held"
PARTITIONS = 6  # two per broker
TASKS = 4
COMMITS = 100
SINK = "q"


def _config(zk: ZooKeeperHarness, broker_id: int) -> dict[str, object]:
    return {
        **TEST_BROKER_CONFIG,
        "zookeeper.connect": zk.hosts,
        "zookeeper.session.timeout.ms": 6000,
        "broker.id": broker_id,
        "default.replication.factor": 1,
    }


def _cluster(
    zk: ZooKeeperHarness, factory: BrokerFactory, client_for: ClientFor
) -> tuple[list[BrokerProcess], BrokerClient]:
    brokers = [factory(_config(zk, 1), name="zk1")]  # alone first: the controller
    brokers += [factory(_config(zk, i), name=f"zk{i}") for i in (2, 3)]
    client = client_for(brokers[-1])

    def ready() -> bool:
        view = client.refresh_metadata()
        return len(view.brokers) == 3

    wait_until(ready, "all 3 brokers registered")
    return brokers, client


def _state(broker: BrokerProcess) -> dict[tuple[str, str], bytes]:
    """The newest live row per (kind, key) of the broker's __transaction_state-0."""
    view = open_partition(broker.log_dir / TXN_STATE_TOPIC / "0", LogConfig.from_mapping({}))
    newest: dict[tuple[str, str], bytes | None] = {}
    try:
        offset = view.log_start_offset
        while True:
            result = view.read(offset, isolation=IsolationLevel.READ_UNCOMMITTED)
            for batch in result.batches:
                cols = [batch.records.column(n).to_pylist() for n in ("kind", "key", "value")]
                for kind, key, value in zip(*cols, strict=True):
                    newest[(kind, key)] = value
            if result.next_offset == offset:
                break
            offset = result.next_offset
    finally:
        view.close()
    return {k: v for k, v in newest.items() if v is not None}


def _whole(client: BrokerClient, batches: dict[int, list[int]]) -> None:
    """Read up to the coordinator's cut: every batch all in or all out."""
    ends = client.stable_ends(TOPIC)
    readable: set[int] = set()
    for p in range(PARTITIONS):
        for meta, batch in client.fetch(TOPIC, p, isolation="read_committed"):
            for j, row_id in enumerate(batch.column("id").to_pylist()):
                if meta.base_offset + j < ends[p]:
                    readable.add(row_id)
    for batch_id, written in batches.items():
        inside = [i in readable for i in written]
        assert all(inside) or not any(inside), f"batch {batch_id} read in part"


def test_a_held_back_partition_keeps_sink_records_small_on_a_cluster(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    brokers, client = _cluster(zk_chroot, broker_factory, client_for)
    leaders = client.create_topic(TOPIC, PARTITIONS)
    assert sorted(set(leaders)) == [1, 2, 3]  # markers go to every broker
    found = client.action(answering_address(client), Action.FIND_COORDINATOR, {})
    coordinator = brokers[int(found["broker_id"]) - 1]

    def sink_record() -> int:
        return len(_state(coordinator)[(KIND_SINK, SINK)])

    def held_back() -> dict[str, bytes]:
        return {k: v for (kind, k), v in _state(coordinator).items() if kind == KIND_SINK_BATCH}

    # The foreign transaction: open on partition 0, never ended until the end.
    fpid, fepoch = client.init_producer_id("foreign", 600_000)
    client.add_partitions_to_txn("foreign", fpid, fepoch, [(TOPIC, 0)])
    with client.produce_stream(TOPIC, 0, transactional_id="foreign") as stream:
        stream.send(
            rows(3, start=10**8), producer_id=fpid, producer_epoch=fepoch,
            base_sequence=0, transactional=True,
        ).offsets(10)  # fmt: skip

    sizes: list[int] = []
    took: list[float] = []  # printed for the record, never asserted (a loaded machine)
    written: dict[int, list[int]] = {}
    for batch in range(COMMITS):
        attempt = SinkAttempt(SINK, "run-1", batch)
        txns = []
        written[batch] = []
        for task in range(TASKS):
            spans = {
                p: [
                    range(
                        batch * 10_000 + task * 1000 + p * 10,
                        batch * 10_000 + task * 1000 + p * 10 + 2,
                    )
                ]
                for p in range(PARTITIONS)
            }
            txns.append(prepared_attempt(client, attempt, task, TOPIC, spans, timeout_ms=600_000))
            written[batch] += [i for rs in spans.values() for r in rs for i in r]
        started = time.perf_counter()
        assert client.commit_sink_batch(SINK, batch, txns, "run-1") is True
        took.append(time.perf_counter() - started)
        if batch % 25 == 24 or batch == 1:
            sizes.append(sink_record())
            _whole(client, written)

    print(
        f"commit ms, first 10: {statistics.median(took[:10]) * 1e3:.1f}, last 10: "
        f"{statistics.median(took[-10:]) * 1e3:.1f}; sink record bytes {sizes[0]}..{sizes[-1]}"
    )
    # The sink's record holds one batch: as big after 100 held-back batches as after 2.
    # (A few bytes more as ids and offsets gain digits; before, it grew by a batch's
    # ranges with every commit.)
    assert max(sizes) <= 2 * sizes[0], sizes
    held = held_back()
    assert len(held) == COMMITS - 1  # every batch but the last (in the sink's record)
    assert max(len(v) for v in held.values()) < 2000

    client.end_txn("foreign", fpid, fepoch, commit=False)  # the LSO moves past them all
    attempt = SinkAttempt(SINK, "run-1", COMMITS)
    spans = {p: [range(9 * 10**7 + p * 10, 9 * 10**7 + p * 10 + 2)] for p in range(PARTITIONS)}
    txns = [prepared_attempt(client, attempt, 0, TOPIC, spans, timeout_ms=600_000)]
    assert client.commit_sink_batch(SINK, COMMITS, txns, "run-1") is True
    assert held_back() == {}  # every held-back batch's record removed (a tombstone)
    ends = client.stable_ends(TOPIC)
    for p in range(PARTITIONS):
        assert ends[p] == client.list_offsets(TOPIC, p)["log_end_offset"]
    total = sorted(i for p in range(PARTITIONS) for i in ids(client, TOPIC, p))
    expected = sorted(i for w in written.values() for i in w)
    expected += [i for rs in spans.values() for r in rs for i in r]
    assert total == sorted(expected)
