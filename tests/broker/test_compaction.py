"""A compacted user topic through a real broker process: created with cleanup.policy=
compact, written, rolled, cleaned by the broker's log-cleaner task, read back newest per
key by the client (a whole read, and a read that resumes at every offset); bad configs
refused at creation with the topic, key and column named."""

from __future__ import annotations

import signal
from typing import Any

import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import InvalidConfigError
from broker_core.log.store import LogStore
from broker_core.protocol.requests import ACKS_LEADER
from broker_core.protocol.wire import Action
from spark_sink.options import OFFSET_COLUMN, Scope, parse_options
from spark_sink.reader import IdemlogBatchReader, IdemlogStreamReader
from spark_sink.topics import require
from testkit.zookeeper import ZooKeeperHarness
from tests.harness.broker import BrokerFactory
from tests.harness.replicated import ReplicatedCluster
from tests.harness.waiting import wait_until

SCHEMA = pa.schema([("user", pa.string()), ("score", pa.int64())])
TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "compaction.key.columns": "user",
    "segment.ms": "1",  # every batch rolls the segment before it: all but the last cleanable
    "delete.retention.ms": "0",
    "min.cleanable.dirty.ratio": "0.01",
}
USERS = [f"u{i}" for i in range(5)]


def rows_of(client: BrokerClient, topic: str, start: int = 0) -> list[tuple[int, str, object]]:
    out = []
    for meta, batch in client.fetch(topic, 0, start):
        for i, row in enumerate(batch.to_pylist()):
            out.append((meta.base_offset + i, row["user"], row["score"]))
    return out


def spark_rows(reader: Any, parts: list[Any]) -> list[tuple[int, str, object]]:
    out = []
    for part in parts:
        for batch in reader.read(part):
            for row in batch.to_pylist():
                out.append((row[OFFSET_COLUMN], row["user"], row["score"]))
    return out


def test_a_compacted_topic_is_cleaned_by_the_broker_and_read_newest_per_key(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory({"log.cleaner.backoff.ms": 200})
    with BrokerClient(broker.address) as client:
        client.create_topic("scores", 1, schema=SCHEMA, config=TOPIC_CONFIG)
        written: dict[int, tuple[str, int | None]] = {}
        with client.produce_stream("scores", 0, SCHEMA) as stream:
            for i in range(30):
                user = USERS[i % len(USERS)]
                score = None if i == 22 else i  # u2's last write is a tombstone
                rows = pa.RecordBatch.from_pylist([{"user": user, "score": score}], schema=SCHEMA)
                first, _last = stream.send(rows).offsets(30)
                written[first] = (user, score)
            # The last batch and the active segment are never cleaned: a fresh key.
            for user in ("tail-1", "tail-2"):
                rows = pa.RecordBatch.from_pylist([{"user": user, "score": 0}], schema=SCHEMA)
                first, _last = stream.send(rows).offsets(30)
                written[first] = (user, 0)

        def cleaned() -> dict[str, object] | None:
            row = next(r for r in client.metrics()["partitions"] if r["topic"] == "scores")
            return row if row["cleaner_removed_rows"] >= 25 else None

        metrics = wait_until(cleaned, "the broker's cleaner removed the superseded rows")
        assert metrics["cleaner_passes"] >= 1 and metrics["cleaner_cleaned_bytes"] > 0
        assert metrics["cleaner_last_clean_ms"] > 0

        read = rows_of(client, "scores")
        newest: dict[str, int] = {}
        for offset, (user, _score) in sorted(written.items()):
            newest[user] = offset
        expected = sorted(
            offset
            for user, offset in newest.items()
            if written[offset][1] is not None  # the tombstone went with its key
        )
        assert [o for o, _u, _s in read] == expected
        for offset, user, score in read:
            assert written[offset] == (user, score), f"row at {offset} changed"
        # A reader resuming anywhere, inside a gap or not, reads on from there.
        for start in range(0, max(written) + 1):
            assert [o for o, _u, _s in rows_of(client, "scores", start)] == [
                o for o in expected if o >= start
            ]
        offsets = client.list_offsets("scores", 0)
        assert offsets["log_start_offset"] == 0 and offsets["log_end_offset"] == 32
        # The Spark source's readers (driven as Spark drives them, without a JVM): a batch
        # read, and a stream of micro-batches of at most 3 offsets, most of them gaps.
        opts = parse_options(
            {"topic": "scores", "brokers": broker.address, "includeMetadata": "true"},
            Scope.READ,
        )
        batch_reader = IdemlogBatchReader(opts, require(client, opts))
        parts = batch_reader.partitions()
        assert [(p.start, p.end) for p in parts] == [(0, 32)]
        assert spark_rows(batch_reader, parts) == [(o, u, s) for o, u, s in read]
        # Split into sub-ranges (maxRecordsPerPartition): pieces that fall wholly in a gap
        # read nothing, the others their rows, every row once, in order.
        for most in ("1", "2", "5"):
            split_opts = parse_options(
                {
                    "topic": "scores",
                    "brokers": broker.address,
                    "includeMetadata": "true",
                    "maxRecordsPerPartition": most,
                },
                Scope.READ,
            )
            split_reader = IdemlogBatchReader(split_opts, require(client, split_opts))
            pieces = split_reader.partitions()
            assert len(pieces) == -(-32 // int(most))
            in_gaps = [p for p in pieces if not any(p.start <= o < p.end for o in expected)]
            assert in_gaps, "no sub-range fell wholly in a gap"
            assert spark_rows(split_reader, pieces) == [(o, u, s) for o, u, s in read]
        stream_opts = parse_options(
            {
                "topic": "scores",
                "brokers": broker.address,
                "includeMetadata": "true",
                "maxOffsetsPerTrigger": "3",
            },
            Scope.READ,
        )
        stream = IdemlogStreamReader(stream_opts, require(client, stream_opts))
        start, streamed, triggers = stream.initialOffset(), [], 0
        while (end := stream.latestOffset(start, stream.getDefaultReadLimit())) != start:
            streamed += spark_rows(stream, stream.partitions(start, end))
            stream.commit(end)
            start, triggers = end, triggers + 1
        assert triggers >= 10 and streamed == [(o, u, s) for o, u, s in read]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"cleanup.policy": "compact", "compaction.key.columns": "user,team"},
            r"topic 'bad'.*'user,team'.*column 'team'",
        ),
        ({"cleanup.policy": "compress"}, r"cleanup\.policy='compress' is not one of"),
    ],
)
def test_bad_compaction_config_is_refused_at_creation(
    broker_factory: BrokerFactory, config: dict[str, str], message: str
) -> None:
    broker = broker_factory()
    with BrokerClient(broker.address) as client:
        with pytest.raises(InvalidConfigError, match=message):
            client.create_topic("bad", 1, schema=SCHEMA, config=config)
        assert client.describe_topics() == []  # nothing partial


def test_a_follower_copies_a_cleaned_leader_and_every_replica_agrees(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    """Three brokers on ZooKeeper: a follower killed while the leader takes writes and
    cleans them comes back, fetches across the leader's gaps, rejoins the ISR; stopped,
    every replica (each cleaned by its own broker) reads back the same rows."""
    cluster = ReplicatedCluster(zk_chroot, broker_factory, extra={"log.cleaner.backoff.ms": 200})
    config = {k.replace(".", "_"): v for k, v in TOPIC_CONFIG.items()}
    cluster.create_topic("kv", 1, replication_factor=3, **config)
    state = cluster.state("kv", 0)
    leader = cluster.brokers[state.leader]
    fid = next(b for b in state.replicas if b != state.leader)
    follower = cluster.brokers[fid]
    follower.kill(signal.SIGKILL)
    written: dict[int, tuple[str, int | None]] = {}
    with cluster.client.produce_stream("kv", 0, SCHEMA, acks=ACKS_LEADER) as stream:
        for i in range(30):
            rows = pa.RecordBatch.from_pylist(
                [{"user": USERS[i % len(USERS)], "score": i}], schema=SCHEMA
            )
            first, _last = stream.send(rows).offsets(30)
            written[first] = (USERS[i % len(USERS)], i)

    def leader_cleaned() -> bool:
        doc = cluster.client.action(leader.address, Action.METRICS, {})
        row = next((r for r in doc["partitions"] if r["topic"] == "kv"), None)
        return row is not None and row["cleaner_removed_rows"] >= 20

    wait_until(leader_cleaned, "the leader's cleaner removed the superseded rows")
    follower.restart()
    cluster.wait_state("kv", 0, lambda s: fid in s.isr, f"broker {fid} back in the ISR")
    cluster.wait_in_sync("kv", 0)
    read = rows_of(cluster.client, "kv")
    assert len(read) < 30  # the leader serves a cleaned log
    for broker in cluster.brokers.values():
        broker.stop()
    for broker in cluster.brokers.values():
        with LogStore(broker.log_dir) as store:
            replica = store.partition("kv", 0)
            rows = []
            offset = replica.log_start_offset
            while True:
                result = replica.read(offset)
                for b in result.batches:
                    rows += [
                        (b.base_offset + i, r["user"], r["score"])
                        for i, r in enumerate(b.records.to_pylist())
                    ]
                if result.next_offset == offset:
                    break
                offset = result.next_offset
            for o, user, score in rows:
                assert written[o] == (user, score), f"broker {broker.name}: row at {o} changed"
            newest = {user: (o, score) for o, user, score in rows}
            assert newest == {u: (o, s) for o, u, s in read}, broker.name
            assert replica.log_end_offset == 30
