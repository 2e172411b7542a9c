"""The group coordinator of one ``__consumer_offsets`` partition (Kafka's classic protocol).

It holds the groups whose ids hash to its partition (``records.offsets_partition_of``),
loaded from the partition's rows when its broker became the leader, and serves JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups
and DeleteGroups for them. The assignors run in the clients: protocol metadata and
assignments pass through unchanged.

Every change that must survive the coordinator (a committed offset, a generation's
assignment, a group that became empty, an expiry or deletion) is appended to the
partition **before** it is applied or answered, through :class:`OffsetsLog`, whose append
refuses (NotCoordinatorError) once the partition is no longer led at this coordinator's
leader epoch: the coordinator then closes and answers NOT_COORDINATOR from then on, so a
deposed coordinator never acknowledges a commit the new leader lacks. Appends are made
under the coordinator's lock, so the log's order is the order changes were applied.

Timers (member sessions, the join and sync deadlines, offsets' retention) advance in
:meth:`GroupCoordinator.tick`, which the broker calls a few times a second.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from broker_core.errors import (
    CoordinatorNotAvailableError,
    GroupIdNotFoundError,
    IdemlogError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidGroupIdError,
    InvalidSessionTimeoutError,
    NonEmptyGroupError,
    NotCoordinatorError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    UnsupportedVersionError,
)
from broker_core.groups.group import Group, JoinAnswer, Member
from broker_core.groups.records import (
    CommittedOffset,
    Row,
    group_row,
    group_tombstone,
    load_rows,
    offset_row,
    offset_tombstone,
)
from broker_core.groups.state import GroupState

T = TypeVar("T")

log = logging.getLogger("idemlog.groups")

# A JoinGroup or SyncGroup waits at most its rebalance timeout plus this for its answer;
# tick() ends every phase at its deadline, so this only covers a stalled tick.
WAIT_SLACK_S = 5.0


class OffsetsLog(Protocol):
    """One ``__consumer_offsets`` partition as its coordinator writes and loads it (the
    broker's ``server.coordination.group_coordinators.LeaderOffsetsLog``)."""

    @property
    def name(self) -> str: ...

    def append(self, rows: Sequence[Row], leader_epoch: int) -> None:
        """``rows`` as one batch, on every in-sync replica before it returns (acks=all).
        NotCoordinatorError when the partition is no longer led at ``leader_epoch`` (the
        rows never acknowledged); the retriable replication errors otherwise."""

    def rows(self) -> Iterator[tuple[int, Row]]:
        """Every row with its offset, in offset order (the load)."""


@dataclass(frozen=True)
class GroupConfig:
    """The broker's group.* and offsets.* keys (``server.config.groups``)."""

    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3_000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    offsets_retention_check_interval_ms: int = 600_000


@dataclass(frozen=True)
class JoinRequest:
    group_id: str
    member_id: str  # "": a new member
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: GroupState
    protocol_type: str
    protocol: str
    members: tuple[MemberDescription, ...]


@dataclass(frozen=True)
class OffsetToCommit:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None
    topic_id: str


@dataclass(frozen=True)
class GroupLag:
    """A group's consumer lag as its coordinator sees it (the metrics' ``groups``)."""

    group_id: str
    state: GroupState
    generation: int
    members: int
    partitions: int  # committed partitions
    lag: int  # records between the committed offsets and the high watermarks
    unknown: int  # committed partitions without a replica on this broker: not counted

    def to_doc(self) -> dict[str, object]:
        return {
            "group": self.group_id,
            "state": self.state.value,
            "generation": self.generation,
            "members": self.members,
            "partitions": self.partitions,
            "lag": self.lag,
            "partitions_unknown": self.unknown,
        }


class GroupCoordinator:
    """The coordinator of the groups of ``log`` (a ``__consumer_offsets`` partition) while
    it is led at ``leader_epoch``; ``clock`` (monotonic s) runs the sessions, ``wall``
    (epoch s) stamps commits for the retention."""

    def __init__(
        self,
        log_: OffsetsLog,
        leader_epoch: int,
        config: GroupConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._log = log_
        self.leader_epoch = leader_epoch
        self._config = config
        self._clock = clock
        self._wall = wall
        self._cond = threading.Condition()
        self._groups: dict[str, Group] = {}
        self._closed = False
        self._next_expiry = 0.0

    @property
    def name(self) -> str:
        return self._log.name

    # -- life ------------------------------------------------------------------------------
    def load(self) -> None:
        """Read the partition's groups and offsets (before serving)."""
        state = load_rows(self._log.rows(), self._log.name)
        now, now_ms = self._clock(), self._now_ms()
        with self._cond:
            for group_id, persisted in state.groups.items():
                self._groups[group_id] = Group.restored(group_id, persisted, now)
            for group_id, offsets in state.offsets.items():
                group = self._groups.get(group_id)
                if group is None:  # offsets committed without a group (simple commits)
                    group = self._groups[group_id] = Group(group_id, now_ms)
                group.offsets.update(offsets)
        log.info("%s: loaded %d groups", self._log.name, len(self._groups))

    def close(self) -> None:
        """Stop serving (NOT_COORDINATOR from now on); waiting requests are answered so."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise NotCoordinatorError(
                f"{self._log.name}: the coordinator of leader epoch {self.leader_epoch} stood down"
            )

    def _now_ms(self) -> int:
        return int(self._wall() * 1000)

    def _append(self, rows: Sequence[Row]) -> None:
        """Append under the lock; a fenced append closes this coordinator."""
        try:
            self._log.append(rows, self.leader_epoch)
        except NotCoordinatorError:
            self._closed = True
            self._cond.notify_all()
            log.info("%s: coordinator of epoch %d fenced", self._log.name, self.leader_epoch)
            raise

    # -- JoinGroup -------------------------------------------------------------------------
    def join(self, request: JoinRequest) -> JoinAnswer:
        """Add or rejoin a member; waits until the join phase ends (see the state module).
        Raises INVALID_GROUP_ID, INVALID_SESSION_TIMEOUT, UNKNOWN_MEMBER_ID,
        INCONSISTENT_GROUP_PROTOCOL, UNSUPPORTED_VERSION (static membership, not served),
        NOT_COORDINATOR."""
        cfg = self._config
        if not request.group_id:
            raise InvalidGroupIdError("JoinGroup: the group id is empty")
        if request.group_instance_id is not None:
            raise UnsupportedVersionError(
                f"group {request.group_id!r}: static membership (group.instance.id "
                f"{request.group_instance_id!r}) is not served"
            )
        if (
            not cfg.min_session_timeout_ms
            <= request.session_timeout_ms
            <= (cfg.max_session_timeout_ms)
        ):
            raise InvalidSessionTimeoutError(
                f"session timeout {request.session_timeout_ms} ms is outside "
                f"group.min.session.timeout.ms={cfg.min_session_timeout_ms}.."
                f"group.max.session.timeout.ms={cfg.max_session_timeout_ms}"
            )
        with self._cond:
            self._check_open()
            now = self._clock()
            group = self._groups.get(request.group_id)
            if group is None:
                if request.member_id:
                    raise UnknownMemberIdError(
                        f"group {request.group_id!r} has no member {request.member_id!r}"
                    )
                group = self._groups[request.group_id] = Group(request.group_id, self._now_ms())
            names = [name for name, _ in request.protocols]
            if request.member_id == "":
                if not group.supports(request.protocol_type, names):
                    raise InconsistentGroupProtocolError(
                        f"group {group.group_id!r}: protocol type {request.protocol_type!r} "
                        f"and protocols {names} do not match the group's "
                        f"({group.protocol_type!r})"
                    )
                member = Member(
                    f"{request.client_id or 'member'}-{uuid.uuid4()}",
                    request.client_id,
                    request.client_host,
                    request.session_timeout_ms,
                    request.rebalance_timeout_ms,
                    request.protocol_type,
                    request.protocols,
                    now,
                )
                group.members[member.member_id] = member
                if not group.protocol_type or len(group.members) == 1:
                    group.protocol_type = request.protocol_type
                log.info("group %s: member %s joins", group.group_id, member.member_id)
                if group.state is not GroupState.PREPARING_REBALANCE:
                    self._prepare_rebalance(group, f"{member.member_id} joined")
            else:
                member = self._member(group, request.member_id)
                if not group.supports(request.protocol_type, names, member.member_id):
                    raise InconsistentGroupProtocolError(
                        f"group {group.group_id!r}: member {member.member_id!r}'s protocols "
                        f"{names} do not match the other members'"
                    )
                changed = member.protocols != request.protocols
                member.protocols = request.protocols
                member.session_timeout_ms = request.session_timeout_ms
                member.rebalance_timeout_ms = request.rebalance_timeout_ms
                member.last_seen = now
                state = group.state
                if state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE) and not (
                    changed or (state is GroupState.STABLE and member.member_id == group.leader)
                ):
                    # Nothing changed: the current generation, as its member got it.
                    return self._join_answer(group, member)
                if state is not GroupState.PREPARING_REBALANCE:
                    self._prepare_rebalance(group, f"{member.member_id} rejoined")
            member.awaiting_join = True
            member.join_answer = None
            self._maybe_complete_join(group, now)
            timeout = request.rebalance_timeout_ms / 1000.0 + WAIT_SLACK_S
            answer = self._await_answer(lambda: member.join_answer, timeout)
            if answer is None:
                member.awaiting_join = False
                raise RebalanceInProgressError(f"group {group.group_id!r}: the join timed out")
            return answer

    def _await_answer(
        self, answer: Callable[[], T | IdemlogError | None], timeout_s: float
    ) -> T | None:
        """With the coordinator's condition held: wait for ``answer()`` (a member's join or
        sync answer, set by the rebalance); it, raised if an error, or None when
        ``timeout_s`` passed first. Raises NOT_COORDINATOR once the coordinator closed."""
        self._cond.wait_for(lambda: answer() is not None or self._closed, timeout_s)
        self._check_open()
        found = answer()
        if isinstance(found, IdemlogError):
            raise found
        return found

    def _member(self, group: Group, member_id: str) -> Member:
        member = group.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(f"group {group.group_id!r} has no member {member_id!r}")
        return member

    def _join_answer(self, group: Group, member: Member) -> JoinAnswer:
        assert group.leader is not None and group.protocol is not None
        members: tuple[tuple[str, bytes], ...] = ()
        if member.member_id == group.leader:
            protocol = group.protocol
            members = tuple((m.member_id, m.metadata(protocol)) for m in group.members.values())
        return JoinAnswer(
            group.generation,
            group.protocol_type,
            group.protocol,
            group.leader,
            member.member_id,
            members,
        )

    def _prepare_rebalance(self, group: Group, why: str) -> None:
        now = self._clock()
        was_empty = group.state is GroupState.EMPTY
        for member in group.members.values():
            if member.awaiting_sync:  # the generation they wait for is gone
                member.answer_sync(RebalanceInProgressError(f"group {group.group_id!r}: {why}"))
        group.transition(GroupState.PREPARING_REBALANCE, self._now_ms())
        group.join_deadline = now + group.rebalance_timeout_s()
        delay = self._config.initial_rebalance_delay_ms / 1000.0 if was_empty else 0.0
        group.join_not_before = min(now + delay, group.join_deadline)
        log.info("group %s: rebalancing (generation %d): %s", group.group_id, group.generation, why)
        self._cond.notify_all()

    def _maybe_complete_join(self, group: Group, now: float) -> None:
        """End the join phase once every member rejoined (after the initial delay) or at
        its deadline, removing the members that did not rejoin."""
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        everyone = all(m.awaiting_join for m in group.members.values())
        if not (everyone and now >= group.join_not_before) and now < group.join_deadline:
            return
        for member in [m for m in group.members.values() if not m.awaiting_join]:
            log.info("group %s: %s did not rejoin in time", group.group_id, member.member_id)
            del group.members[member.member_id]
        group.generation += 1
        if not group.members:
            group.protocol = group.leader = None
            group.state_ms = self._now_ms()  # persisted: the retention counts from here
            self._append([group_row(group.group_id, group.persisted())])
            group.transition(GroupState.EMPTY, group.state_ms)
            log.info("group %s: empty at generation %d", group.group_id, group.generation)
            self._cond.notify_all()
            return
        group.protocol = group.select_protocol()
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.transition(GroupState.COMPLETING_REBALANCE, self._now_ms())
        group.sync_deadline = now + group.rebalance_timeout_s()
        for member in group.members.values():
            member.assignment = b""
            member.last_seen = now
            member.answer_join(self._join_answer(group, member))
        log.info(
            "group %s: generation %d, protocol %s, leader %s, %d members",
            group.group_id,
            group.generation,
            group.protocol,
            group.leader,
            len(group.members),
        )
        self._cond.notify_all()

    # -- SyncGroup -------------------------------------------------------------------------
    def sync(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        protocol_type: str | None,
        protocol: str | None,
        assignments: dict[str, bytes],
    ) -> tuple[str | None, str | None, bytes]:
        """The member's assignment of ``generation`` (the leader's ``assignments`` are
        persisted first): (protocol type, protocol, assignment). Raises UNKNOWN_MEMBER_ID,
        ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL, REBALANCE_IN_PROGRESS,
        NOT_COORDINATOR and the append's errors."""
        with self._cond:
            self._check_open()
            group = self._groups.get(group_id)
            if group is None:
                raise UnknownMemberIdError(f"no group {group_id!r}")
            member = self._member(group, member_id)
            self._check_generation(group, generation)
            if (protocol_type is not None and protocol_type != group.protocol_type) or (
                protocol is not None and protocol != group.protocol
            ):
                raise InconsistentGroupProtocolError(
                    f"group {group_id!r} runs {group.protocol_type!r}/{group.protocol!r}, "
                    f"not {protocol_type!r}/{protocol!r}"
                )
            now = self._clock()
            member.last_seen = now
            if group.state is GroupState.PREPARING_REBALANCE:
                raise RebalanceInProgressError(f"group {group_id!r} is rebalancing")
            if group.state is GroupState.STABLE:
                return group.protocol_type, group.protocol, member.assignment
            member.awaiting_sync = True
            member.sync_answer = None
            if member_id == group.leader:
                self._assign(group, assignments)
            timeout = member.rebalance_timeout_ms / 1000.0 + WAIT_SLACK_S
            answer = self._await_answer(lambda: member.sync_answer, timeout)
            if answer is None:
                member.awaiting_sync = False
                raise RebalanceInProgressError(f"group {group_id!r}: the sync timed out")
            return group.protocol_type, group.protocol, answer

    def _assign(self, group: Group, assignments: dict[str, bytes]) -> None:
        for member in group.members.values():
            member.assignment = assignments.get(member.member_id, b"")
        try:
            self._append([group_row(group.group_id, group.persisted())])
        except NotCoordinatorError:
            raise
        except IdemlogError as exc:
            # Not persisted: the generation cannot be handed out; everyone rejoins.
            log.warning("group %s: assignment not persisted: %s", group.group_id, exc)
            error = CoordinatorNotAvailableError(f"group {group.group_id!r}: {exc.message}")
            for member in group.members.values():
                member.assignment = b""
                if member.awaiting_sync:
                    member.answer_sync(error)
            self._prepare_rebalance(group, "its assignment was not persisted")
            return
        group.transition(GroupState.STABLE, self._now_ms())
        for member in group.members.values():
            if member.awaiting_sync:
                member.answer_sync(member.assignment)
        log.info("group %s: stable at generation %d", group.group_id, group.generation)
        self._cond.notify_all()

    def _check_generation(self, group: Group, generation: int) -> None:
        if generation != group.generation:
            raise IllegalGenerationError(
                f"group {group.group_id!r} is at generation {group.generation}, not {generation}"
            )

    # -- Heartbeat, LeaveGroup -------------------------------------------------------------
    def heartbeat(self, group_id: str, member_id: str, generation: int) -> None:
        """Keep the member's session. Raises UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
        REBALANCE_IN_PROGRESS (the member rejoins), NOT_COORDINATOR."""
        with self._cond:
            self._check_open()
            group = self._groups.get(group_id)
            if group is None:
                raise UnknownMemberIdError(f"no group {group_id!r}")
            member = self._member(group, member_id)
            self._check_generation(group, generation)
            member.last_seen = self._clock()
            if group.state is GroupState.PREPARING_REBALANCE:
                raise RebalanceInProgressError(f"group {group_id!r} is rebalancing")

    def leave(self, group_id: str, member_ids: Sequence[str]) -> list[IdemlogError | None]:
        """Remove the members (one error or None per id, in order); the group rebalances."""
        with self._cond:
            self._check_open()
            group = self._groups.get(group_id)
            answers: list[IdemlogError | None] = []
            for member_id in member_ids:
                if group is None or member_id not in group.members:
                    answers.append(
                        UnknownMemberIdError(f"group {group_id!r} has no member {member_id!r}")
                    )
                    continue
                self._remove(group, group.members[member_id], "left")
                answers.append(None)
            return answers

    def _remove(self, group: Group, member: Member, why: str) -> None:
        del group.members[member.member_id]
        gone = UnknownMemberIdError(f"member {member.member_id!r} {why}")
        if member.awaiting_join:
            member.answer_join(gone)
        if member.awaiting_sync:
            member.answer_sync(gone)
        log.info("group %s: member %s %s", group.group_id, member.member_id, why)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"{member.member_id} {why}")
        self._maybe_complete_join(group, self._clock())
        self._cond.notify_all()

    # -- offsets ---------------------------------------------------------------------------
    def commit(
        self, group_id: str, member_id: str, generation: int, offsets: Sequence[OffsetToCommit]
    ) -> None:
        """Persist ``offsets`` (acks=all) then apply them. A member of the current
        generation commits while the group is STABLE or PREPARING_REBALANCE (an eager
        member commits before it rejoins); a generation of -1 with no member id commits for
        a group without members (a consumer assigned by hand). Raises UNKNOWN_MEMBER_ID,
        ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS (COMPLETING_REBALANCE),
        NOT_COORDINATOR and the append's errors (nothing applied)."""
        if not group_id:
            raise InvalidGroupIdError("OffsetCommit: the group id is empty")
        with self._cond:
            self._check_open()
            group = self._groups.get(group_id)
            simple = generation < 0 and not member_id
            if group is None:
                if not simple:
                    raise UnknownMemberIdError(f"no group {group_id!r}")
                group = Group(group_id, self._now_ms())
            elif not (simple and not group.members):
                member = self._member(group, member_id)
                self._check_generation(group, generation)
                if group.state is GroupState.COMPLETING_REBALANCE:
                    raise RebalanceInProgressError(f"group {group_id!r} is rebalancing")
                member.last_seen = self._clock()
            now_ms = self._now_ms()
            committed = {
                (o.topic, o.partition): CommittedOffset(
                    o.offset, o.leader_epoch, o.metadata, now_ms, o.topic_id
                )
                for o in offsets
            }
            rows = [offset_row(group_id, t, p, c) for (t, p), c in committed.items()]
            self._append(rows)
            self._groups.setdefault(group_id, group)
            group.offsets.update(committed)

    def fetch(
        self, group_id: str, partitions: Sequence[tuple[str, int]] | None
    ) -> list[tuple[str, int, CommittedOffset | None]]:
        """The committed offsets of ``partitions`` (None: every one the group has)."""
        with self._cond:
            self._check_open()
            group = self._groups.get(group_id)
            offsets = {} if group is None else group.offsets
            if partitions is None:
                return [(t, p, c) for (t, p), c in sorted(offsets.items())]
            return [(t, p, offsets.get((t, p))) for t, p in partitions]

    # -- DescribeGroups, ListGroups, DeleteGroups ------------------------------------------
    def describe(self, group_id: str) -> GroupDescription | None:
        """The group (members' metadata of the chosen protocol and assignments), None if
        this coordinator has no such group."""
        with self._cond:
            self._check_open()
            group = self._groups.get(group_id)
            if group is None:
                return None
            protocol = group.protocol or ""
            stable = group.state is GroupState.STABLE
            return GroupDescription(
                group_id,
                group.state,
                group.protocol_type or "",
                protocol if stable else "",
                tuple(
                    MemberDescription(
                        m.member_id,
                        m.client_id,
                        m.client_host,
                        m.metadata(protocol) if stable else b"",
                        m.assignment if stable else b"",
                    )
                    for m in group.members.values()
                ),
            )

    def list_groups(self) -> list[tuple[str, str, GroupState]]:
        """(group id, protocol type, state) of every group this coordinator holds."""
        with self._cond:
            self._check_open()
            return [
                (g.group_id, g.protocol_type or "", g.state)
                for g in sorted(self._groups.values(), key=lambda g: g.group_id)
            ]

    def delete(self, group_id: str) -> None:
        """Remove an empty group and its offsets (tombstones, acks=all). Raises
        GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, NOT_COORDINATOR and the append's errors."""
        with self._cond:
            self._check_open()
            group = self._groups.get(group_id)
            if group is None:
                raise GroupIdNotFoundError(f"no group {group_id!r}")
            if group.members:
                raise NonEmptyGroupError(
                    f"group {group_id!r} has {len(group.members)} members ({group.state.value})"
                )
            self._drop(group)

    def _drop(self, group: Group) -> None:
        rows = [offset_tombstone(group.group_id, t, p) for t, p in sorted(group.offsets)]
        rows.append(group_tombstone(group.group_id))
        self._append(rows)
        group.transition(GroupState.DEAD, self._now_ms())
        del self._groups[group.group_id]
        log.info("group %s removed (%d offsets)", group.group_id, len(group.offsets))

    # -- timers ----------------------------------------------------------------------------
    def tick(self) -> None:
        """Expire members' sessions, end join and sync phases at their deadlines and, every
        offsets.retention.check.interval.ms, expire offsets (:meth:`expire_offsets`)."""
        with self._cond:
            if self._closed:
                return
            now = self._clock()
            for group in list(self._groups.values()):
                for member in [m for m in group.members.values() if m.expired(now)]:
                    self._remove(group, member, "timed out (session)")
                self._maybe_complete_join(group, now)
                if group.state is GroupState.COMPLETING_REBALANCE and now >= group.sync_deadline:
                    for member in [m for m in group.members.values() if not m.awaiting_sync]:
                        self._remove(group, member, "did not sync in time")
            if now >= self._next_expiry:
                self._next_expiry = now + self._config.offsets_retention_check_interval_ms / 1000
                self.expire_offsets()

    def expire_offsets(self) -> int:
        """Kafka's rule (KIP-211): a group's offsets expire only while it has no members,
        offsets.retention.ms after it became empty (a group of a protocol type) or after
        the commit (a group of hand-assigned consumers); a tombstone each, and the group
        is removed with its last. Returns how many offsets expired."""
        retention = self._config.offsets_retention_ms
        expired = 0
        with self._cond:
            now_ms = self._now_ms()
            for group in list(self._groups.values()):
                if group.members or group.state is not GroupState.EMPTY:
                    continue
                gone = [
                    key
                    for key, c in group.offsets.items()
                    if now_ms - (group.state_ms if group.protocol_type else c.commit_ms)
                    >= retention
                ]
                if len(gone) == len(group.offsets):
                    expired += len(gone)
                    self._drop(group)
                    continue
                if gone:
                    self._append([offset_tombstone(group.group_id, t, p) for t, p in gone])
                    for key in gone:
                        del group.offsets[key]
                    expired += len(gone)
        return expired

    def lags(self, high_watermark: Callable[[str, int], int | None]) -> list[GroupLag]:
        """Each group's consumer lag: over its committed partitions, the partition's high
        watermark (``high_watermark``: None when this broker has no replica of it) less
        the committed offset, at least 0."""
        with self._cond:
            groups = [
                (g.group_id, g.state, g.generation, len(g.members), dict(g.offsets))
                for g in self._groups.values()
            ]
        found = []
        for group_id, state, generation, members, offsets in groups:
            lag = unknown = 0
            for (topic, partition), committed in offsets.items():
                end = high_watermark(topic, partition)
                if end is None:
                    unknown += 1
                else:
                    lag += max(0, end - committed.offset)
            found.append(GroupLag(group_id, state, generation, members, len(offsets), lag, unknown))
        return found
