"""The controller's leader-election decisions (broker_core.cluster.election), without
ZooKeeper, and the embedded cluster's alter_partition / elections (one broker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_core.cluster.election import (
    Decision,
    Outcome,
    decide_after_broker_change,
    leader_moved_away,
    preferred_leader_elected,
    unclean_election_enabled,
)
from broker_core.cluster.embedded import EmbeddedCluster
from broker_core.cluster.records import (
    BrokerInfo,
    PartitionState,
    TopicAssignment,
    check_partition_update,
)
from broker_core.errors import InvalidRequestError, UnknownTopicOrPartitionError
from tests.harness.waiting import Recorder

S = PartitionState  # (replicas, leader, leader_epoch, isr)
Oc = Outcome


@pytest.mark.parametrize(
    ("state", "live", "unclean", "expected"),
    [
        # Leader dead: the first replica in replicas order that is in the ISR and live.
        (S((1, 2, 3), 1, 4, (1, 3, 2)), {2, 3}, False, (Oc.ELECTED, S((1, 2, 3), 2, 5, (3, 2)))),
        (S((1, 2, 3), 1, 0, (1, 3)), {2, 3}, False, (Oc.ELECTED, S((1, 2, 3), 3, 1, (3,)))),
        # ...a live replica out of the ISR is passed over.
        (S((3, 1, 2), 3, 2, (3, 2)), {1, 2}, False, (Oc.ELECTED, S((3, 1, 2), 2, 3, (2,)))),
        # No live ISR member: unchanged (offline) unless unclean election is enabled.
        (S((1, 2, 3), 1, 7, (1,)), {2, 3}, False, (Oc.OFFLINE, S((1, 2, 3), 1, 7, (1,)))),
        (S((1, 2, 3), 1, 7, (1,)), {3, 2}, True, (Oc.UNCLEAN, S((1, 2, 3), 2, 8, (2,)))),
        (S((1, 2, 3), 1, 7, (1, 2)), {3}, True, (Oc.UNCLEAN, S((1, 2, 3), 3, 8, (3,)))),
        # Nothing live at all: offline even with unclean election.
        (S((1, 2), 1, 0, (1, 2)), set(), True, (Oc.OFFLINE, S((1, 2), 1, 0, (1, 2)))),
        # Leader live: dead followers leave the ISR, the epoch stays.
        (S((1, 2, 3), 2, 3, (2, 1, 3)), {2, 3}, False, (Oc.ISR_SHRUNK, S((1, 2, 3), 2, 3, (2, 3)))),
        (S((1, 2, 3), 2, 3, (2,)), {2}, False, None),
        (S((1, 2, 3), 1, 0, (1, 2, 3)), {1, 2, 3, 4}, False, None),
        # A returning ISR member of an offline partition leads again.
        (S((1, 2), 1, 5, (1, 2)), {2}, False, (Oc.ELECTED, S((1, 2), 2, 6, (2,)))),
        (S((1, 2), 1, 5, (1,)), {1}, False, None),
    ],
)  # fmt: skip
def test_decide_after_broker_change(
    state: PartitionState,
    live: set[int],
    unclean: bool,
    expected: tuple[Outcome, PartitionState] | None,
) -> None:
    decision = decide_after_broker_change(state, live, unclean=unclean)
    assert decision == (None if expected is None else Decision(*expected))
    if decision is not None:
        assert decision.state.problem() is None
        assert decision.state.replicas == state.replicas


def test_preferred_leader_only_when_live_in_sync_and_not_leading() -> None:
    moved = S((1, 2, 3), 2, 4, (2, 3, 1))
    assert preferred_leader_elected(moved, {1, 2, 3}) == S((1, 2, 3), 1, 5, (2, 3, 1))
    assert preferred_leader_elected(moved, {2, 3}) is None  # not live
    assert preferred_leader_elected(S((1, 2, 3), 2, 4, (2, 3)), {1, 2, 3}) is None  # not in sync
    assert preferred_leader_elected(S((1, 2, 3), 1, 4, (1, 2)), {1, 2, 3}) is None  # leads


def test_leader_moved_away_to_a_live_in_sync_replica() -> None:
    state = S((1, 2, 3), 1, 2, (1, 3, 2))
    assert leader_moved_away(state, 1, {1, 2, 3}) == S((1, 2, 3), 2, 3, (3, 2))
    assert leader_moved_away(state, 1, {1, 3}) == S((1, 2, 3), 3, 3, (3, 2))
    assert leader_moved_away(state, 2, {1, 2, 3}) is None  # not the leader
    assert leader_moved_away(S((1, 2, 3), 1, 2, (1,)), 1, {1, 2, 3}) is None  # none in sync
    assert leader_moved_away(state, 1, {1}) is None  # none live


def test_unclean_election_setting_defaults_to_off() -> None:
    assert unclean_election_enabled({}) is False
    assert unclean_election_enabled({"unclean.leader.election.enable": "true"}) is True
    assert unclean_election_enabled({"unclean.leader.election.enable": "false"}) is False
    assert unclean_election_enabled({"unclean.leader.election.enable": "junk"}) is False


def test_check_partition_update_refuses_impossible_states() -> None:
    current = S((1, 2), 1, 3, (1, 2))
    assert check_partition_update("t", 0, current, S((1, 2), 1, 3, (1,))) == S((1, 2), 1, 3, (1,))
    with pytest.raises(InvalidRequestError, match="partition 0: the new state leader 2 is not"):
        check_partition_update("t", 0, current, S((1, 2), 2, 4, (1,)))
    with pytest.raises(InvalidRequestError, match="leader epoch 2 is below the current 3"):
        check_partition_update("t", 0, current, S((1, 2), 1, 2, (1, 2)))
    with pytest.raises(InvalidRequestError, match="not a PartitionState"):
        check_partition_update("t", 0, current, (1, 2))


def test_with_states_replaces_some_partitions() -> None:
    topic = TopicAssignment.of(
        "t", {0: S((1, 2), 1, 0, (1, 2)), 1: S((2, 1), 2, 0, (2, 1))}, None, {}
    )
    changed = topic.with_states({1: S((2, 1), 1, 1, (1,))})
    assert changed.partitions == {0: 1, 1: 1} and changed.state(0) == topic.state(0)
    with pytest.raises(UnknownTopicOrPartitionError, match=r"not \[2\]"):
        topic.with_states({2: S((1,), 1, 0, (1,))})


# -- the embedded cluster ---------------------------------------------------------------------


def test_embedded_alter_partition_is_durable_and_notifies(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    cluster = EmbeddedCluster(BrokerInfo(1, "127.0.0.1", 9092), path)
    try:
        cluster.register(BrokerInfo(1, "127.0.0.1", 9092))
        cluster.create_topic("t", 2, None, {})
        changes = Recorder()
        cluster.on_topics_change(changes)
        bumped = S((1,), 1, 1, (1,))

        assert cluster.alter_partition("t", 1, lambda s: S(s.replicas, 1, 1, s.isr)) == bumped
        assert cluster.topic("t").state(1) == bumped  # read-your-writes
        changes.wait_for_count(1, "the topics callback")
        stored = json.loads(path.read_text())["topics"]["t"]["partitions"]["1"]
        assert stored == {"replicas": [1], "leader": 1, "leader_epoch": 1, "isr": [1]}

        before = path.read_bytes()
        assert cluster.alter_partition("t", 0, lambda s: None) is None
        assert path.read_bytes() == before  # nothing written
        with pytest.raises(InvalidRequestError, match="leader 2 is not in the isr"):
            cluster.alter_partition("t", 0, lambda s: S((1,), 2, 1, (1,)))
        with pytest.raises(UnknownTopicOrPartitionError):
            cluster.alter_partition("t", 5, lambda s: s)
        with pytest.raises(UnknownTopicOrPartitionError):
            cluster.alter_partition("nope", 0, lambda s: s)
        assert path.read_bytes() == before
        assert cluster.elect_preferred_leaders() == {}
        assert cluster.move_leadership_away(1) == 0
    finally:
        cluster.close()
    reopened = EmbeddedCluster(BrokerInfo(1, "127.0.0.1", 9092), path)
    try:
        assert reopened.topic("t").state(1) == bumped
    finally:
        reopened.close()


# -- broker epochs (KIP-380): a restarted process of an ISR member is not the member ------

E = {1: 100, 2: 200, 3: 300}  # the broker epochs the ISR admitted


def admitted(replicas: tuple[int, ...], leader: int, epoch: int, isr: tuple[int, ...]) -> S:
    return S(replicas, leader, epoch, isr, tuple((b, E[b]) for b in isr))


def test_a_restarted_leader_inside_its_session_loses_its_partitions_to_a_live_member() -> None:
    state = admitted((1, 2, 3), 1, 4, (1, 2, 3))
    # The same three ids are live; broker 1's registration is a new process's.
    decision = decide_after_broker_change(state, {1: 900, 2: 200, 3: 300})
    assert decision == Decision(Oc.ELECTED, admitted((1, 2, 3), 2, 5, (2, 3)))
    # With ids alone (epochs unknown) nothing is seen, as before epochs.
    assert decide_after_broker_change(state, {1, 2, 3}) is None


def test_a_restarted_follower_leaves_the_isr_and_the_leader_stays() -> None:
    state = admitted((1, 2, 3), 1, 4, (1, 2, 3))
    decision = decide_after_broker_change(state, {1: 100, 2: 201, 3: 300})
    assert decision == Decision(Oc.ISR_SHRUNK, admitted((1, 2, 3), 1, 4, (1, 3)))


def test_only_restarted_members_live_lead_again_at_a_higher_epoch_and_their_new_epochs() -> None:
    state = admitted((1, 2), 1, 4, (1,))
    decision = decide_after_broker_change(state, {1: 900, 2: 200})
    assert decision == Decision(Oc.RESTARTED, S((1, 2), 1, 5, (1,), ((1, 900),)))
    # A replication factor 1 partition after a restart of its broker: the same.
    single = S((1,), 1, 0, (1,), ((1, 100),))
    restarted = decide_after_broker_change(single, {1: 900})
    assert restarted == Decision(Oc.RESTARTED, S((1,), 1, 1, (1,), ((1, 900),)))


def test_unclean_election_records_the_new_leaders_epoch() -> None:
    state = admitted((1, 2, 3), 1, 4, (1,))
    decision = decide_after_broker_change(state, {2: 200, 3: 300}, unclean=True)
    assert decision == Decision(Oc.UNCLEAN, S((1, 2, 3), 2, 5, (2,), ((2, 200),)))


def test_preferred_and_moved_away_pass_over_a_restarted_member() -> None:
    state = admitted((1, 2, 3), 2, 4, (1, 2, 3))
    assert preferred_leader_elected(state, {1: 900, 2: 200, 3: 300}) is None
    assert preferred_leader_elected(state, E) == admitted((1, 2, 3), 1, 5, (1, 2, 3))
    moved = leader_moved_away(state, 2, {1: 900, 2: 200, 3: 300})
    assert moved == admitted((1, 2, 3), 3, 5, (1, 3))


def test_isr_epochs_round_trip_and_a_state_without_them_reads_as_unknown() -> None:
    state = admitted((1, 2, 3), 1, 4, (1, 3))
    doc = state.to_doc()
    assert doc["isr_epochs"] == {"1": 100, "3": 300}
    assert PartitionState.from_doc(json.loads(json.dumps(doc))) == state
    old = {"replicas": [1, 2], "leader": 1, "leader_epoch": 0, "isr": [1, 2]}
    read = PartitionState.from_doc(old)
    assert read.isr_epochs == () and read.recorded_epoch(1) is None
    assert "isr_epochs" not in read.to_doc()
    # Epochs of brokers that are not (or no longer) members are dropped.
    assert S((1, 2), 1, 0, (1,), ((2, 5), (1, 7))).isr_epochs == ((1, 7),)
    with pytest.raises(ValueError, match="isr_epochs"):
        PartitionState.from_doc({**old, "isr_epochs": {"x": 1}})


def test_a_restarted_only_member_back_with_another_directory_id_is_not_elected() -> None:
    state = S((1, 2), 1, 4, (1,), ((1, 100),), ((1, "dir-a"),))
    # Back on the same directory (a restart without a wipe): it leads again.
    same = decide_after_broker_change(state, {1: 900, 2: 200}, dirs={1: "dir-a", 2: "dir-x"})
    assert same is not None and same.outcome is Oc.RESTARTED and same.lost == ()
    assert same.state.recorded_dir(1) == "dir-a" and same.state.recorded_epoch(1) == 900
    # Back on an empty disk: offline, and the lost member named.
    wiped = decide_after_broker_change(state, {1: 900, 2: 200}, dirs={1: "dir-b", 2: "dir-x"})
    assert wiped == Decision(Oc.OFFLINE, state, (1,))
    # Unless the topic accepts the loss: the first live replica leads, its data recorded.
    unclean = decide_after_broker_change(
        state, {1: 900, 2: 200}, unclean=True, dirs={1: "dir-b", 2: "dir-x"}
    )
    assert unclean == Decision(
        Oc.UNCLEAN, S((1, 2), 1, 5, (1,), ((1, 900),), ((1, "dir-b"),)), (1,)
    )


def test_isr_dirs_round_trip() -> None:
    state = S((1, 2), 1, 0, (1, 2), ((1, 5), (2, 6)), ((1, "a"), (2, "b")))
    doc = state.to_doc()
    assert doc["isr_dirs"] == {"1": "a", "2": "b"}
    assert PartitionState.from_doc(doc) == state
    assert state.with_isr((1,)).isr_dirs == ((1, "a"),)
