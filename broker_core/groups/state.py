"""A consumer group's states and the transitions between them (Kafka's classic protocol).

* EMPTY: no members (a new group, or every member left); offsets may be kept.
* PREPARING_REBALANCE: members rejoin; the join phase ends when every member rejoined
  (not before the initial delay of a group that was empty) or the rebalance timeout
  passed (members that did not rejoin are removed).
* COMPLETING_REBALANCE: the new generation is chosen; the members wait for the leader's
  assignment (SyncGroup).
* STABLE: the leader's assignment was persisted and handed out; heartbeats keep members.
* DEAD: removed (deleted, or its offsets expired while empty); never left.
"""

from __future__ import annotations

from enum import Enum


class GroupState(Enum):
    """The state names are Kafka's, as DescribeGroups and ListGroups report them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


TRANSITIONS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE, GroupState.DEAD}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.COMPLETING_REBALANCE, GroupState.EMPTY, GroupState.DEAD}
    ),
    GroupState.COMPLETING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.PREPARING_REBALANCE, GroupState.DEAD}
    ),
    GroupState.STABLE: frozenset({GroupState.PREPARING_REBALANCE, GroupState.DEAD}),
    GroupState.DEAD: frozenset(),
}


class IllegalGroupTransitionError(RuntimeError):
    """A transition the table does not have: a bug in the coordinator, never a client's."""


def check_transition(group_id: str, old: GroupState, new: GroupState) -> GroupState:
    """``new`` if the table allows ``old`` -> ``new``; IllegalGroupTransitionError otherwise."""
    if new not in TRANSITIONS[old]:
        raise IllegalGroupTransitionError(
            f"group {group_id!r}: no transition {old.value} -> {new.value}"
        )
    return new


def parse_state(name: str) -> GroupState | None:
    """The state Kafka names ``name`` (ListGroups' filter, case-insensitive), or None."""
    for state in GroupState:
        if state.value.lower() == name.lower():
            return state
    return None
