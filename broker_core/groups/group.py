"""One consumer group in its coordinator's memory: members, generation, chosen protocol.

The coordinator (``groups.coordinator``) holds its lock around every use; nothing here
locks or waits. A member's pending JoinGroup or SyncGroup is a slot the coordinator fills
with the answer (or an error) and the waiting handler thread reads.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from broker_core.errors import IdemlogError
from broker_core.groups.records import (
    CommittedOffset,
    PersistedGroup,
    PersistedMember,
)
from broker_core.groups.state import GroupState, check_transition


@dataclass(frozen=True)
class JoinAnswer:
    """A JoinGroup's answer: ``members`` (id, metadata of the chosen protocol) only for the
    leader, empty for the others."""

    generation: int
    protocol_type: str | None
    protocol: str | None
    leader: str
    member_id: str
    members: tuple[tuple[str, bytes], ...]


@dataclass
class Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata), the member's preference order
    last_seen: float  # monotonic s of its last request (its session)
    assignment: bytes = b""
    awaiting_join: bool = False
    join_answer: JoinAnswer | IdemlogError | None = None
    awaiting_sync: bool = False
    sync_answer: bytes | IdemlogError | None = None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def expired(self, now: float) -> bool:
        """Its session ran out; a member waiting in a JoinGroup or SyncGroup is never
        expired (the rebalance's own deadlines remove it)."""
        if self.awaiting_join or self.awaiting_sync:
            return False
        return now - self.last_seen > self.session_timeout_ms / 1000.0

    def answer_join(self, answer: JoinAnswer | IdemlogError) -> None:
        self.awaiting_join = False
        self.join_answer = answer

    def answer_sync(self, answer: bytes | IdemlogError) -> None:
        self.awaiting_sync = False
        self.sync_answer = answer


@dataclass
class Group:
    group_id: str
    state_ms: int  # wall-clock ms of the last state change (for the offsets' retention)
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    offsets: dict[tuple[str, int], CommittedOffset] = field(default_factory=dict)
    # PREPARING_REBALANCE: the join phase ends at join_deadline, or once every member
    # rejoined but not before join_not_before (the initial delay of an empty group).
    join_deadline: float = 0.0
    join_not_before: float = 0.0
    # COMPLETING_REBALANCE: the leader's SyncGroup is awaited until sync_deadline.
    sync_deadline: float = 0.0

    def transition(self, new: GroupState, now_ms: int) -> None:
        self.state = check_transition(self.group_id, self.state, new)
        self.state_ms = now_ms

    def rebalance_timeout_s(self) -> float:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0) / 1000.0

    def supports(self, protocol_type: str, names: list[str]) -> bool:
        """A joining member fits: the group's protocol type, and a protocol every member
        (the joiner included) supports."""
        if not self.members:
            return bool(protocol_type) and bool(names)
        if protocol_type != self.protocol_type:
            return False
        return bool(self._candidates(set(names)))

    def _candidates(self, also: set[str] | None = None) -> set[str]:
        common: set[str] | None = None if also is None else set(also)
        for member in self.members.values():
            names = set(member.protocol_names())
            common = names if common is None else common & names
        return common or set()

    def select_protocol(self) -> str:
        """Kafka's choice: among the protocols every member supports, each member votes for
        its first; the most votes win (ties: the name first in sort order, so a reload
        picks the same)."""
        candidates = self._candidates()
        votes: Counter[str] = Counter()
        for member in self.members.values():
            vote = next(n for n in member.protocol_names() if n in candidates)
            votes[vote] += 1
        best = max(votes.values())
        return sorted(name for name, count in votes.items() if count == best)[0]

    def persisted(self) -> PersistedGroup:
        return PersistedGroup(
            self.generation,
            self.protocol_type,
            self.protocol,
            self.leader,
            self.state_ms,
            tuple(
                PersistedMember(
                    m.member_id,
                    m.client_id,
                    m.client_host,
                    m.session_timeout_ms,
                    m.rebalance_timeout_ms,
                    m.protocols,
                    m.assignment,
                )
                for m in self.members.values()
            ),
        )

    @classmethod
    def restored(cls, group_id: str, persisted: PersistedGroup, now: float) -> Group:
        """The group as a new coordinator finds it: STABLE with its persisted members (each
        given a fresh session to find this coordinator), EMPTY without."""
        group = cls(
            group_id,
            persisted.state_ms,
            GroupState.STABLE if persisted.members else GroupState.EMPTY,
            persisted.generation,
            persisted.protocol_type,
            persisted.protocol,
            persisted.leader,
        )
        for m in persisted.members:
            group.members[m.member_id] = Member(
                m.member_id,
                m.client_id,
                m.client_host,
                m.session_timeout_ms,
                m.rebalance_timeout_ms,
                persisted.protocol_type or "",
                m.protocols,
                now,
                m.assignment,
            )
        return group
