"""Leader election decisions: pure functions of a partition's state and the live brokers.

The controller (:mod:`broker_core.cluster.zk_leaders`) applies them to every partition
and writes the results; keeping the decisions here, free of ZooKeeper, lets them be
tested on their own. Each returns the new :class:`PartitionState` (always valid:
:meth:`PartitionState.problem` is None) or None when nothing is to change. A leader
change always bumps ``leader_epoch`` by one, so followers and clients can tell a stale
leader from the current one; an ISR change alone does not (Kafka's rule).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum

from broker_core.cluster.metadata import PartitionState
from broker_core.errors import InvalidConfigError
from broker_core.log.config import LOG_CONFIG

__all__ = [
    "Decision",
    "Outcome",
    "decide_after_broker_change",
    "leader_moved_away",
    "preferred_leader_elected",
    "unclean_election_enabled",
]


class Outcome(Enum):
    """What the controller decided for a partition after the live brokers changed."""

    ELECTED = "elected"  # the leader was dead: an in-sync live replica leads now
    UNCLEAN = "unclean"  # no in-sync replica alive: a live out-of-sync one leads (opt-in)
    ISR_SHRUNK = "isr_shrunk"  # the leader lives; dead followers left the ISR
    OFFLINE = "offline"  # the leader is dead and no replica may take over: unchanged


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    state: PartitionState  # the state to write; for OFFLINE the unchanged one


def decide_after_broker_change(
    state: PartitionState, live: Collection[int], *, unclean: bool = False
) -> Decision | None:
    """The controller's decision for one partition given the live broker ids.

    * leader dead: the first replica (``replicas`` order) that is in the ISR and live
      leads, ISR = old ISR ∩ live, epoch + 1 (ELECTED). With no live ISR member: when
      ``unclean`` (the topic's ``unclean.leader.election.enable``), the first live replica
      leads with ISR = (it,), epoch + 1 (UNCLEAN: acknowledged batches it lacks are lost);
      otherwise OFFLINE, the state unchanged, so a returning ISR member can still lead;
    * leader live: dead brokers leave the ISR, no epoch bump (ISR_SHRUNK);
    * None when nothing changes.
    """
    alive = set(live)
    isr_alive = tuple(b for b in state.isr if b in alive)
    if state.leader in alive:
        if isr_alive == state.isr:
            return None
        return Decision(Outcome.ISR_SHRUNK, _with(state, isr=isr_alive))
    candidates = [b for b in state.replicas if b in isr_alive]
    if candidates:
        new = _with(state, leader=candidates[0], epoch=state.leader_epoch + 1, isr=isr_alive)
        return Decision(Outcome.ELECTED, new)
    live_replicas = [b for b in state.replicas if b in alive]
    if unclean and live_replicas:
        leader = live_replicas[0]
        new = _with(state, leader=leader, epoch=state.leader_epoch + 1, isr=(leader,))
        return Decision(Outcome.UNCLEAN, new)
    return Decision(Outcome.OFFLINE, state)


def preferred_leader_elected(state: PartitionState, live: Collection[int]) -> PartitionState | None:
    """The preferred replica (the first of ``replicas``) as leader, epoch + 1, when it is
    live, in the ISR and not already the leader; else None."""
    preferred = state.replicas[0]
    if preferred == state.leader or preferred not in state.isr or preferred not in live:
        return None
    return _with(state, leader=preferred, epoch=state.leader_epoch + 1)


def leader_moved_away(
    state: PartitionState, broker_id: int, live: Collection[int]
) -> PartitionState | None:
    """For a clean shutdown of ``broker_id``: if it leads and another ISR member is live,
    that member (the first in ``replicas`` order) leads, ISR without ``broker_id``,
    epoch + 1. None when it does not lead or no other in-sync replica is live (the
    partition then stays on it until it goes, and the controller's pass takes over)."""
    if state.leader != broker_id:
        return None
    alive = set(live)
    others = [b for b in state.replicas if b != broker_id and b in state.isr and b in alive]
    if not others:
        return None
    isr = tuple(b for b in state.isr if b != broker_id)
    return _with(state, leader=others[0], epoch=state.leader_epoch + 1, isr=isr)


def unclean_election_enabled(config: Mapping[str, str]) -> bool:
    """A topic's ``unclean.leader.election.enable`` (its override, else the default)."""
    key = LOG_CONFIG.key("unclean.leader.election.enable")
    try:
        return bool(key.parse(config.get(key.name, key.default)))
    except InvalidConfigError:
        return False  # validated at creation; if it is unreadable, the safe choice


def _with(
    state: PartitionState,
    *,
    leader: int | None = None,
    epoch: int | None = None,
    isr: tuple[int, ...] | None = None,
) -> PartitionState:
    new = PartitionState(
        state.replicas,
        state.leader if leader is None else leader,
        state.leader_epoch if epoch is None else epoch,
        state.isr if isr is None else isr,
    )
    problem = new.problem()
    assert problem is None, problem  # each decision above keeps the leader in the ISR
    return new
