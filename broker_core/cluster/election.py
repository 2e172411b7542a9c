"""Leader election decisions: pure functions of a partition's state and the live brokers.

The controller (:mod:`broker_core.cluster.zk_leaders`) applies them to every partition
and writes the results; keeping the decisions here, free of ZooKeeper, lets them be
tested on their own. Each returns the new :class:`PartitionState` (always valid:
:meth:`PartitionState.problem` is None; :func:`decide_after_broker_change` returns it in
a :class:`Decision` with its outcome) or None when nothing is to change. A leader
change always bumps ``leader_epoch`` by one, so followers and clients can tell a stale
leader from the current one; an ISR change alone does not (Kafka's rule).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from enum import Enum

from broker_core.cluster.records import PartitionState
from broker_core.errors import InvalidConfigError
from broker_core.log.config import LOG_CONFIG
from broker_core.protocol.replica import NO_BROKER_EPOCH

__all__ = [
    "Decision",
    "Live",
    "Outcome",
    "decide_after_broker_change",
    "leader_moved_away",
    "preferred_leader_elected",
    "unclean_election_enabled",
]


class Outcome(Enum):
    """What the controller decided for a partition after the live brokers changed."""

    ELECTED = "elected"  # the leader was dead: an in-sync live replica leads now
    RESTARTED = "restarted"  # only restarted members of the ISR live: one leads again
    UNCLEAN = "unclean"  # no in-sync replica alive: a live out-of-sync one leads (opt-in)
    ISR_SHRUNK = "isr_shrunk"  # the leader lives; dead followers left the ISR
    OFFLINE = "offline"  # the leader is dead and no replica may take over: unchanged


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    state: PartitionState  # the state to write; for OFFLINE the unchanged one
    lost: tuple[int, ...] = ()  # live ISR members whose data is gone (another directory id)


# The live brokers: their ids, or their ids and broker epochs (ids alone: epochs unknown).
Live = Collection[int] | Mapping[int, int]


def _epochs(live: Live) -> dict[int, int]:
    if isinstance(live, Mapping):
        return dict(live)
    return dict.fromkeys(live, NO_BROKER_EPOCH)


def _is_member(state: PartitionState, broker: int, epochs: Mapping[int, int]) -> bool:
    """``broker`` is live and is the process the ISR admitted: its epoch now is the one
    recorded (or one of them is unknown). A new process of a member is not the member: it
    may have started on an empty disk, and its predecessor's acknowledgements count for
    nothing (KIP-380)."""
    if broker not in epochs or broker not in state.isr:
        return False
    recorded, now = state.recorded_epoch(broker), epochs[broker]
    return recorded is None or now == NO_BROKER_EPOCH or recorded == now


def decide_after_broker_change(
    state: PartitionState,
    live: Live,
    *,
    unclean: bool = False,
    dirs: Mapping[int, str | None] | None = None,
) -> Decision | None:
    """The controller's decision for one partition given the live brokers (ids and
    epochs); an ISR member counts as live only as the process the ISR admitted
    (:func:`_is_member`): a restarted one failed and started again.

    * leader not a live member: the first replica (``replicas`` order) that is a live
      member leads, ISR = those members, epoch + 1 (ELECTED). With none, but restarted
      members live: the first of them leads, ISR = them at their new epochs, epoch + 1
      (RESTARTED: the partition's only copies are theirs; a restart of a replication
      factor 1 broker is this) -- only those back with the directory id the ISR recorded
      (``dirs``: the live brokers' ids): one with another lost its data (``lost``).
      Otherwise, when ``unclean`` (the topic's
      ``unclean.leader.election.enable``), the first live replica leads with ISR = (it,),
      epoch + 1 (UNCLEAN: acknowledged batches it lacks are lost); else OFFLINE, the
      state unchanged, so a returning ISR member can still lead;
    * leader a live member: the others leave the ISR, no epoch bump (ISR_SHRUNK);
    * None when nothing changes.
    """
    epochs = _epochs(live)
    members = tuple(b for b in state.isr if _is_member(state, b, epochs))
    if state.leader in members:
        if members == state.isr:
            return None
        return Decision(Outcome.ISR_SHRUNK, _with(state, isr=members))
    candidates = [b for b in state.replicas if b in members]
    if candidates:
        new = _with(state, leader=candidates[0], epoch=state.leader_epoch + 1, isr=members)
        return Decision(Outcome.ELECTED, new)
    found = dirs or {}
    restarted = [b for b in state.replicas if b in state.isr and b in epochs]
    lost = tuple(b for b in restarted if state.recorded_dir(b) not in (None, found.get(b)))
    intact = tuple(b for b in restarted if b not in lost)
    if intact:
        new = _with(
            state,
            leader=intact[0],
            epoch=state.leader_epoch + 1,
            isr=intact,
            admitted={b: epochs[b] for b in intact},
            admitted_dirs={b: found.get(b) for b in intact},
        )
        return Decision(Outcome.RESTARTED, new, lost)
    live_replicas = [b for b in state.replicas if b in epochs]
    if unclean and live_replicas:
        leader = live_replicas[0]
        new = _with(
            state,
            leader=leader,
            epoch=state.leader_epoch + 1,
            isr=(leader,),
            admitted={leader: epochs[leader]},
            admitted_dirs={leader: found.get(leader)},
        )
        return Decision(Outcome.UNCLEAN, new, lost)
    return Decision(Outcome.OFFLINE, state, lost)


def preferred_leader_elected(state: PartitionState, live: Live) -> PartitionState | None:
    """The preferred replica (the first of ``replicas``) as leader, epoch + 1, when it is
    a live member of the ISR (the process it admitted) and not already the leader; else
    None."""
    preferred = state.replicas[0]
    if preferred == state.leader or not _is_member(state, preferred, _epochs(live)):
        return None
    return _with(state, leader=preferred, epoch=state.leader_epoch + 1)


def leader_moved_away(state: PartitionState, broker_id: int, live: Live) -> PartitionState | None:
    """For a clean shutdown of ``broker_id``: if it leads and another ISR member is live
    (the process admitted), that member (the first in ``replicas`` order) leads, ISR
    without ``broker_id``, epoch + 1. None when it does not lead or no other in-sync
    replica is live (the partition then stays on it until it goes, and the controller's
    pass takes over)."""
    if state.leader != broker_id:
        return None
    epochs = _epochs(live)
    others = [b for b in state.replicas if b != broker_id and _is_member(state, b, epochs)]
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
    admitted: Mapping[int, int] | None = None,
    admitted_dirs: Mapping[int, str | None] | None = None,
) -> PartitionState:
    """``state`` changed; ``admitted``, ``admitted_dirs``: ISR members' broker epochs and
    directory ids to record now."""
    base = state.with_isr(state.isr if isr is None else isr, admitted, admitted_dirs)
    new = replace(
        base,
        leader=state.leader if leader is None else leader,
        leader_epoch=state.leader_epoch if epoch is None else epoch,
    )
    problem = new.problem()
    assert problem is None, problem  # each decision above keeps the leader in the ISR
    return new
