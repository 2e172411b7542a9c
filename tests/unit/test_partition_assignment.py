"""Per-partition replica state in the cluster metadata: the assignment and the stored form
(docs/replication.md, "Assignment")."""

from __future__ import annotations

import json
import zlib
from collections import Counter

import pytest

from broker_core.cluster.records import METADATA_VERSION, PartitionState, TopicAssignment
from broker_core.cluster.topic_creation import assign_partitions, validate_new_topic
from broker_core.errors import (
    CorruptRecordError,
    InvalidConfigError,
    InvalidReplicationFactorError,
    UnknownTopicOrPartitionError,
)
from broker_core.log.config import LogConfig

WHERE = "/idemlog/topics/t"


@pytest.mark.parametrize("brokers", range(1, 6))
@pytest.mark.parametrize("factor", range(1, 4))
def test_replicas_are_distinct_round_robin_and_leaders_spread(brokers: int, factor: int) -> None:
    ids = [10 * b + 3 for b in range(brokers)]  # not 0..n-1: indexes, not ids, rotate
    if factor > brokers:
        with pytest.raises(InvalidReplicationFactorError) as excinfo:
            assign_partitions("t", 6, ids, factor)
        assert excinfo.value.code == 38 and not excinfo.value.retriable
        assert f"replication.factor={factor}" in excinfo.value.message
        assert f"live brokers, {brokers}" in excinfo.value.message
        return
    partitions = 2 * brokers + 1
    states = assign_partitions("t", partitions, list(reversed(ids)), factor)

    assert sorted(states) == list(range(partitions))
    first = ids.index(states[0].leader)
    for p, state in states.items():
        assert len(state.replicas) == factor == len(set(state.replicas))
        # Partition p starts at broker index (start + p) mod n and continues round-robin.
        assert state.replicas == tuple(ids[(first + p + j) % brokers] for j in range(factor))
        assert state.leader == state.replicas[0] and state.isr == state.replicas
        assert state.leader_epoch == 0 and state.problem() is None
    leaders = Counter(s.leader for s in states.values())
    assert set(leaders) == set(ids) and max(leaders.values()) - min(leaders.values()) <= 1
    replicas = Counter(b for s in states.values() for b in s.replicas)
    assert max(replicas.values()) - min(replicas.values()) <= factor


def test_factor_one_assignment_is_unchanged_by_replicas() -> None:
    # Before replicas, partition p went to sorted(ids)[(crc32(name) + p) % n]: still so.
    states = assign_partitions("payments", 4, [3, 1, 2], 1)
    start = zlib.crc32(b"payments") % 3
    assert {p: s.leader for p, s in states.items()} == {
        p: [1, 2, 3][(start + p) % 3] for p in range(4)
    }


def test_bad_factors_are_refused() -> None:
    with pytest.raises(InvalidReplicationFactorError, match="below 1"):
        assign_partitions("t", 1, [1], 0)
    with pytest.raises(InvalidReplicationFactorError, match="not an integer"):
        assign_partitions("t", 1, [1], True)


def test_factor_and_min_insync_replicas_are_checked_together() -> None:
    assert validate_new_topic("t", 3, None, {"replication.factor": "3"})[3] == {
        "replication.factor": "3"
    }
    with pytest.raises(InvalidConfigError, match="below the minimum 1"):
        validate_new_topic("t", 3, None, {"replication.factor": "0"})
    with pytest.raises(InvalidConfigError, match=r"min\.insync\.replicas=3 is larger") as excinfo:
        validate_new_topic("t", 3, None, {"replication.factor": "2", "min.insync.replicas": "3"})
    assert excinfo.value.code == 40
    assert LogConfig.from_mapping({"replication.factor": 2}).replication_factor == 2
    assert LogConfig.from_mapping({}).replication_factor == 1


def test_new_stored_form_round_trips_and_keeps_leader_callers() -> None:
    states = {0: PartitionState((2, 1), 2, 4, (2,)), 1: PartitionState((1, 2), 1, 0, (1, 2))}
    topic = TopicAssignment.of("t", states, None, {"replication.factor": "2"})
    doc = json.loads(json.dumps(topic.to_doc()))

    assert doc["version"] == METADATA_VERSION == 2
    assert doc["partitions"]["0"] == {
        "replicas": [2, 1],
        "leader": 2,
        "leader_epoch": 4,
        "isr": [2],
    }
    again = TopicAssignment.from_doc("t", doc, WHERE)
    assert again == topic
    assert again.partitions == {0: 2, 1: 1} and again.leader(0) == 2
    assert again.partitions_of(1) == [1] and again.state(0).leader_epoch == 4
    with pytest.raises(UnknownTopicOrPartitionError):
        again.state(2)


def test_version_1_is_read_as_one_replica_at_epoch_0() -> None:
    doc = {"version": 1, "partitions": {"0": 5, "1": 6}, "schema": None, "config": {}}
    topic = TopicAssignment.from_doc("t", doc, WHERE)

    assert topic == TopicAssignment("t", {0: 5, 1: 6}, None, {})
    assert topic.state(1) == PartitionState((6,), 6, 0, (6,))
    assert topic.to_doc()["version"] == 2  # written back in the new form


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"version": 3, "partitions": {"0": 1}}, "has version 3; this broker reads versions 1, 2"),
        ({"partitions": {"0": 1}}, "has version None"),
        ({"version": 2, "partitions": {"0": 1}}, "bad partition entry '0'"),
        ({"version": 1, "partitions": {"0": {"leader": 1}}}, "bad partition entry '0'"),
        (
            {"version": 2, "partitions": {"0": {"replicas": [1], "leader": 1, "isr": [1]}}},
            "lacks replicas, leader, leader_epoch or isr",
        ),
        (
            {"version": 2, "partitions": {"0": {**PartitionState.single(1).to_doc(), "isr": []}}},
            "leader 1 is not in the isr",
        ),
        (
            {
                "version": 2,
                "partitions": {
                    "0": {"replicas": [1, 1], "leader": 1, "leader_epoch": 0, "isr": [1]}
                },
            },
            "repeat a broker",
        ),
        (
            {
                "version": 2,
                "partitions": {"0": {"replicas": [1], "leader": 1, "leader_epoch": 0, "isr": [2]}},
            },
            "is not a set of replicas",
        ),
        (
            {
                "version": 2,
                "partitions": {"0": {"replicas": [1], "leader": 1, "leader_epoch": -1, "isr": [1]}},
            },
            "leader_epoch -1",
        ),
    ],
)
def test_unknown_versions_and_bad_states_are_corrupt_naming_the_znode(
    doc: dict[str, object], problem: str
) -> None:
    with pytest.raises(CorruptRecordError) as excinfo:
        TopicAssignment.from_doc("t", doc, WHERE)
    assert WHERE in str(excinfo.value) and problem in str(excinfo.value)
