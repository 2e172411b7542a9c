"""The group state machine and one partition's group coordinator, on a fake log and clock.

The log is an in-memory list with a leader epoch the test moves (a fenced append is
refused as the broker's replica refuses it); JoinGroup and SyncGroup block until their
phase ends, so members run on threads and the clock moves by hand."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from broker_core.errors import (
    GroupIdNotFoundError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidSessionTimeoutError,
    NonEmptyGroupError,
    NotCoordinatorError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    UnsupportedVersionError,
)
from broker_core.groups.coordinator import (
    GroupConfig,
    GroupCoordinator,
    JoinRequest,
    OffsetToCommit,
)
from broker_core.groups.group import JoinAnswer
from broker_core.groups.records import Row, offsets_partition_of
from broker_core.groups.state import (
    TRANSITIONS,
    GroupState,
    IllegalGroupTransitionError,
    check_transition,
    parse_state,
)
from tests.harness.waiting import wait_until

CONFIG = GroupConfig(
    min_session_timeout_ms=1_000,
    max_session_timeout_ms=60_000,
    initial_rebalance_delay_ms=0,
    offsets_retention_ms=10_000,
    offsets_retention_check_interval_ms=1_000,
)


class FakeLog:
    """A partition led at ``epoch``: an append at another epoch is refused."""

    name = "__consumer_offsets-0"

    def __init__(self) -> None:
        self.epoch = 1
        self.written: list[Row] = []

    def append(self, rows: Sequence[Row], leader_epoch: int) -> None:
        if leader_epoch != self.epoch:
            raise NotCoordinatorError(f"led at {self.epoch}, not {leader_epoch}")
        self.written.extend(rows)

    def rows(self) -> Iterator[tuple[int, Row]]:
        return iter(list(enumerate(self.written)))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def parts() -> Iterator[tuple[FakeLog, Clock, GroupCoordinator, ThreadPoolExecutor]]:
    log_, clock = FakeLog(), Clock()
    coordinator = GroupCoordinator(log_, 1, CONFIG, clock=clock, wall=clock)
    coordinator.load()
    with ThreadPoolExecutor(8) as pool:
        yield log_, clock, coordinator, pool
        coordinator.close()


def join_request(
    member_id: str = "", protocols: Sequence[str] = ("range",), **kw: Any
) -> JoinRequest:
    values: dict[str, Any] = {
        "group_id": "g",
        "member_id": member_id,
        "group_instance_id": None,
        "client_id": "c",
        "client_host": "/127.0.0.1",
        "session_timeout_ms": 10_000,
        "rebalance_timeout_ms": 20_000,
        "protocol_type": "consumer",
        "protocols": tuple((p, f"meta-{p}".encode()) for p in protocols),
    }
    values.update(kw)
    return JoinRequest(**values)


def state(coordinator: GroupCoordinator) -> GroupState:
    described = coordinator.describe("g")
    assert described is not None
    return described.state


def test_the_transition_table_is_kafkas() -> None:
    assert TRANSITIONS[GroupState.DEAD] == frozenset()
    assert check_transition("g", GroupState.EMPTY, GroupState.PREPARING_REBALANCE)
    for old, new in [
        (GroupState.EMPTY, GroupState.STABLE),
        (GroupState.STABLE, GroupState.COMPLETING_REBALANCE),
        (GroupState.PREPARING_REBALANCE, GroupState.STABLE),
        (GroupState.DEAD, GroupState.EMPTY),
    ]:
        with pytest.raises(IllegalGroupTransitionError, match=f"{old.value} -> {new.value}"):
            check_transition("g", old, new)
    assert parse_state("stable") is GroupState.STABLE
    assert parse_state("nope") is None
    assert 0 <= offsets_partition_of("some-group", 50) < 50
    assert offsets_partition_of("some-group", 50) == offsets_partition_of("some-group", 50)


def join_all(
    coordinator: GroupCoordinator, pool: ThreadPoolExecutor, requests: Sequence[JoinRequest]
) -> list[JoinAnswer]:
    futures = [pool.submit(coordinator.join, r) for r in requests]
    return [f.result(10) for f in futures]


def stabilise(
    coordinator: GroupCoordinator, pool: ThreadPoolExecutor, answers: Sequence[JoinAnswer]
) -> dict[str, bytes]:
    leader = next(a for a in answers if a.members)
    assignment = {m: f"for-{m}".encode() for m, _ in leader.members}
    futures: list[Future[tuple[str | None, str | None, bytes]]] = [
        pool.submit(
            coordinator.sync,
            "g",
            a.member_id,
            a.generation,
            "consumer",
            a.protocol,
            assignment if a is leader else {},
        )
        for a in answers
    ]
    got = {a.member_id: f.result(10)[2] for a, f in zip(answers, futures, strict=True)}
    assert got == assignment
    return got


def test_members_join_sync_commit_and_rebalance_when_one_leaves_or_times_out(
    parts: tuple[FakeLog, Clock, GroupCoordinator, ThreadPoolExecutor],
) -> None:
    log_, clock, coordinator, pool = parts
    first = coordinator.join(join_request(protocols=("range", "roundrobin")))
    assert first.generation == 1 and first.leader == first.member_id
    assert first.members == ((first.member_id, b"meta-range"),)
    stabilise(coordinator, pool, [first])
    assert state(coordinator) is GroupState.STABLE
    coordinator.heartbeat("g", first.member_id, 1)

    # A second member: the first learns of the rebalance by its heartbeat and rejoins.
    second = pool.submit(coordinator.join, join_request(protocols=("roundrobin", "range")))
    wait_until(lambda: state(coordinator) is GroupState.PREPARING_REBALANCE, "rebalance", timeout=5)
    with pytest.raises(RebalanceInProgressError):
        coordinator.heartbeat("g", first.member_id, 1)
    # An eager member commits its offsets before it rejoins: allowed while preparing.
    commit = OffsetToCommit("t", 0, 42, 3, "meta", "id1")
    coordinator.commit("g", first.member_id, 1, [commit])
    again = coordinator.join(join_request(first.member_id, protocols=("range", "roundrobin")))
    answers = [again, second.result(10)]
    assert {a.generation for a in answers} == {2}
    # Both support both: one vote each, the tie broken by name.
    assert {a.protocol for a in answers} == {"range"}
    assert again.leader == first.member_id and len(again.members) == 2
    with pytest.raises(IllegalGenerationError):
        coordinator.heartbeat("g", first.member_id, 1)
    stabilise(coordinator, pool, answers)
    with pytest.raises(IllegalGenerationError):
        coordinator.commit("g", first.member_id, 1, [commit])
    with pytest.raises(UnknownMemberIdError):
        coordinator.heartbeat("g", "nobody", 2)
    fetched = coordinator.fetch("g", [("t", 0), ("t", 1)])
    assert fetched[0][2] is not None and fetched[0][2].offset == 42 and fetched[1][2] is None

    # The second member's session runs out: it is removed and the first rejoins alone.
    clock.now += 5
    coordinator.heartbeat("g", first.member_id, 2)
    clock.now += 6
    coordinator.tick()
    assert state(coordinator) is GroupState.PREPARING_REBALANCE
    alone = coordinator.join(join_request(first.member_id, protocols=("range",)))
    assert alone.generation == 3 and len(alone.members) == 1
    stabilise(coordinator, pool, [alone])

    # It leaves: the group is empty at generation 4, persisted.
    assert coordinator.leave("g", [alone.member_id, "nobody"])[0] is None
    assert state(coordinator) is GroupState.EMPTY
    kinds = [row[0] for row in log_.written]
    assert kinds.count("group") == 4 and kinds.count("offset") == 1


def test_a_new_coordinator_loads_the_generation_members_and_offsets(
    parts: tuple[FakeLog, Clock, GroupCoordinator, ThreadPoolExecutor],
) -> None:
    log_, clock, coordinator, pool = parts
    member = coordinator.join(join_request())
    stabilise(coordinator, pool, [member])
    coordinator.commit("g", member.member_id, 1, [OffsetToCommit("t", 2, 7, -1, None, "id1")])

    # An election: the old coordinator's next append is refused and it stands down.
    log_.epoch = 2
    with pytest.raises(NotCoordinatorError):
        coordinator.commit("g", member.member_id, 1, [OffsetToCommit("t", 2, 9, -1, None, "")])
    with pytest.raises(NotCoordinatorError):
        coordinator.heartbeat("g", member.member_id, 1)
    successor = GroupCoordinator(log_, 2, CONFIG, clock=clock, wall=clock)
    successor.load()
    assert state(successor) is GroupState.STABLE
    successor.heartbeat("g", member.member_id, 1)  # the member carries on
    assert [c.offset for _, _, c in successor.fetch("g", None) if c] == [7]
    described = successor.describe("g")
    assert (
        described is not None
        and described.members[0].assignment == b"for-" + member.member_id.encode()
    )


def test_refusals_name_what_is_wrong(
    parts: tuple[FakeLog, Clock, GroupCoordinator, ThreadPoolExecutor],
) -> None:
    _, _, coordinator, pool = parts
    with pytest.raises(InvalidSessionTimeoutError, match=r"group\.min\.session\.timeout\.ms"):
        coordinator.join(join_request(session_timeout_ms=10))
    with pytest.raises(UnsupportedVersionError, match="static membership"):
        coordinator.join(join_request(group_instance_id="i1"))
    with pytest.raises(UnknownMemberIdError):
        coordinator.join(join_request("ghost"))
    member = coordinator.join(join_request())
    with pytest.raises(InconsistentGroupProtocolError):
        coordinator.join(join_request(protocols=("sticky",)))
    with pytest.raises(NonEmptyGroupError):
        coordinator.delete("g")
    with pytest.raises(GroupIdNotFoundError):
        coordinator.delete("other")
    stabilise(coordinator, pool, [member])


def test_offsets_expire_only_once_the_group_is_empty_then_the_group_goes(
    parts: tuple[FakeLog, Clock, GroupCoordinator, ThreadPoolExecutor],
) -> None:
    log_, clock, coordinator, pool = parts
    member = coordinator.join(join_request())
    stabilise(coordinator, pool, [member])
    coordinator.commit("g", member.member_id, 1, [OffsetToCommit("t", 0, 5, -1, None, "")])
    clock.now += 20  # past the retention, but the group has a member
    coordinator.heartbeat("g", member.member_id, 1)
    assert coordinator.expire_offsets() == 0
    coordinator.leave("g", [member.member_id])
    clock.now += 9
    assert coordinator.expire_offsets() == 0
    clock.now += 1
    assert coordinator.expire_offsets() == 1
    assert coordinator.describe("g") is None
    assert log_.written[-2:] == [
        ("offset", '["g","t",0]', None),
        ("group", "g", None),
    ]
    # A hand-assigned consumer's commit (no member, generation -1) expires by its age.
    coordinator.commit("solo", "", -1, [OffsetToCommit("t", 0, 1, -1, None, "")])
    clock.now += 10
    assert coordinator.expire_offsets() == 1


def test_a_member_that_does_not_rejoin_is_removed_at_the_rebalance_deadline(
    parts: tuple[FakeLog, Clock, GroupCoordinator, ThreadPoolExecutor],
) -> None:
    _, clock, coordinator, pool = parts
    first = coordinator.join(join_request())
    stabilise(coordinator, pool, [first])
    second = pool.submit(coordinator.join, join_request())
    wait_until(lambda: state(coordinator) is GroupState.PREPARING_REBALANCE, "rebalance", timeout=5)
    answers = [coordinator.join(join_request(first.member_id)), second.result(10)]
    stabilise(coordinator, pool, answers)
    # The first rejoins with other protocols; the second never does.
    rejoin = pool.submit(coordinator.join, join_request(first.member_id, protocols=("range", "x")))
    wait_until(lambda: state(coordinator) is GroupState.PREPARING_REBALANCE, "rebalance", timeout=5)
    coordinator.tick()
    assert not rejoin.done()
    clock.now += 21  # the rebalance timeout
    coordinator.tick()
    answer = rejoin.result(10)
    assert answer.generation == 3 and len(answer.members) == 1
    with pytest.raises(UnknownMemberIdError):
        coordinator.heartbeat("g", answers[1].member_id, 2)
