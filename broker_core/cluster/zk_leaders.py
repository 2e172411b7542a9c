"""Partition leadership in ZooKeeper: the controller's elections, the preferred-leader
rebalance and a clean shutdown's hand-over (the decisions are :mod:`.election`'s).

* **The controller's pass** (the ``LEADERS`` worker task): whenever this broker becomes the
  controller and whenever the live brokers (their ids or epochs) change while it is, every
  topic node is read, each partition decided by
  :func:`~.election.decide_after_broker_change` with the live brokers' ids, epochs and
  directory ids read at the start of the pass, and the node rewritten if anything changed.
  Each write is a ZooKeeper multi: a ``check`` of the ``controller_epoch`` node's version
  as this controller's bump left it, and the ``set`` of the topic node at the version
  read. A newer controller's bump fails the check, so a deposed controller (one that does
  not know yet) changes nothing; the pass then stops. A conflict with another writer (a
  leader's ISR change) re-reads the node and decides again.
* **Preferred leaders** (on the controller, fenced the same way): each partition whose
  first replica is live, in sync and not leading is led by it.
* **Moving leadership away** (from any broker, conditional on the topic node's version
  only): a clean shutdown hands its partitions to live in-sync replicas first, so
  producers move before the broker goes rather than after a session timeout.

Every leader change bumps the partition's leader epoch and is logged at INFO (an unclean
one at WARNING); the other brokers see it through their topic data watches.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from kazoo.exceptions import NoNodeError

from broker_core.cluster.election import (
    Decision,
    Outcome,
    decide_after_broker_change,
    leader_moved_away,
    preferred_leader_elected,
    unclean_election_enabled,
)
from broker_core.cluster.records import BrokerInfo, PartitionState, TopicAssignment
from broker_core.cluster.zk_control import ZkControl, ZkTask
from broker_core.cluster.zk_requests import ZkRequests, ZkUnavailable
from broker_core.errors import (
    CorruptRecordError,
    InvalidRequestError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)

log = logging.getLogger("idemlog.cluster")

__all__ = ["ControllerFencedError", "TopicStore", "ZkLeaders"]

T = TypeVar("T")
Moves = dict[int, tuple[PartitionState, PartitionState]]  # partition -> (old, new)


class ControllerFencedError(Exception):
    """A fenced write was refused: a newer controller has bumped the controller epoch."""


class TopicStore(Protocol):
    """What the elections need of :class:`~broker_core.cluster.zk.ZkCluster`: its
    conditional rewrite of a topic node, which also updates its cache."""

    def rewrite_topic(
        self,
        name: str,
        change: Callable[[TopicAssignment], TopicAssignment | None],
        what: str,
        fence: tuple[int, int] | None = None,
    ) -> TopicAssignment | None: ...


class ZkLeaders:
    """The leader changes of one ZkCluster instance (module docstring)."""

    def __init__(
        self, store: TopicStore, control: ZkControl, requests: ZkRequests, root: str
    ) -> None:
        self._store = store
        self._control = control
        self._requests = requests
        self._ids_path = f"{root}/brokers/ids"
        self._topics_path = f"{root}/topics"
        self.unclean_leader_elections = 0  # written by this controller (metrics)
        self._offline_reported: dict[tuple[str, int], tuple[PartitionState, tuple[int, ...]]] = {}

    def _read_live_broker_ids(self) -> dict[int, int]:
        """The registered broker ids and their epochs (registration czxids), read now (a
        cache may lag). Raises ZkUnavailable."""
        return {b: info.epoch for b, info in self._read_live_brokers().items()}

    def _read_live_brokers(self) -> dict[int, BrokerInfo]:
        """The registrations, with their epochs and directory ids, read now. Raises
        ZkUnavailable."""
        client = self._requests.client
        children = self._requests.call(functools.partial(client.get_children_async, self._ids_path))
        live: dict[int, BrokerInfo] = {}
        for child in children:
            if not child.isdigit():
                continue
            path = f"{self._ids_path}/{child}"
            try:
                data, stat = self._requests.call(functools.partial(client.get_async, path))
            except NoNodeError:
                continue  # gone since the listing
            try:
                live[int(child)] = BrokerInfo.from_json(int(child), data, path, int(stat.czxid))
            except CorruptRecordError as exc:
                log.error("controller pass: %s", exc)
        return live

    def _read_topic_names(self) -> list[str]:
        """The topic names, read now. Raises ZkUnavailable."""
        children = self._requests.call(
            functools.partial(self._requests.client.get_children_async, self._topics_path)
        )
        return sorted(children)

    # -- the controller's pass: on the worker thread ----------------------------------------

    def run_pass(self) -> None:
        """Bring every partition's leader and ISR in line with the live brokers, if this
        broker is the controller (else nothing). Raises ZkUnavailable or
        RequestTimedOutError for the worker to retry the whole pass (it is idempotent);
        stops early, without error, once this broker is no longer the controller."""
        fence = self._control.controller_fence()
        if fence is None:
            return
        brokers = self._read_live_brokers()
        for name in self._read_topic_names():
            if self._control.controller_fence() != fence:
                log.info("controller pass stopped: this broker is no longer the controller")
                return
            if not self._elect_topic(name, brokers, fence):
                return

    def _elect_topic(
        self, name: str, brokers: dict[int, BrokerInfo], fence: tuple[int, int]
    ) -> bool:
        """The pass over one topic; False when the write was fenced (the pass stops)."""
        moves: Moves = {}
        offline: dict[int, PartitionState] = {}
        decisions: dict[int, Decision] = {}
        live = {b: info.epoch for b, info in brokers.items()}
        dirs = {b: info.directory_id for b, info in brokers.items()}

        def change(current: TopicAssignment) -> TopicAssignment | None:
            moves.clear()  # a retry after a conflict decides again from scratch
            offline.clear()
            decisions.clear()
            unclean = unclean_election_enabled(current.config)
            for p, state in current.states.items():
                decision = decide_after_broker_change(state, live, unclean=unclean, dirs=dirs)
                if decision is None:
                    continue
                decisions[p] = decision
                if decision.outcome is Outcome.OFFLINE:
                    offline[p] = state
                else:
                    moves[p] = (state, decision.state)
            if not moves:
                return None
            return current.with_states({p: new for p, (_, new) in moves.items()})

        what = f"electing leaders of topic {name!r} (controller epoch {fence[0]})"
        try:
            written = self._store.rewrite_topic(name, change, what, fence)
        except UnknownTopicOrPartitionError:
            return True  # deleted since the listing
        except CorruptRecordError as exc:
            log.error("controller pass: topic %s skipped: %s", name, exc)
            return True
        except ControllerFencedError as exc:
            log.warning("controller pass refused, this broker is deposed: %s", exc)
            self._control.request(ZkTask.CONTROLLER)  # find out who controls now
            return False
        if written is not None:
            _log_moves(name, moves, live)
            for p in sorted(moves):
                decision = decisions[p]
                if decision.outcome is Outcome.UNCLEAN:
                    self.unclean_leader_elections += 1
                    if decision.lost:
                        log.error(
                            "partition %s-%d: DATA LOSS: unclean leader election (the topic's "
                            "unclean.leader.election.enable): broker %d leads at leader epoch "
                            "%d although in-sync replicas %s came back without their data "
                            "(another log.dir directory.id than the ISR recorded)",
                            name, p, decision.state.leader, decision.state.leader_epoch,
                            list(decision.lost),
                        )  # fmt: skip
        for p, state in sorted(offline.items()):
            lost = decisions[p].lost
            if self._offline_reported.get((name, p)) == (state, lost):
                continue  # said once for this state; a pass runs at every broker change
            self._offline_reported[(name, p)] = (state, lost)
            if lost:
                log.error(
                    "partition %s-%d is offline: its in-sync replicas %s came back with "
                    "another log.dir directory.id than the ISR recorded (%s): their "
                    "acknowledged data is gone, and no other in-sync replica is live; it waits "
                    "for one, or for unclean.leader.election.enable on the topic, which "
                    "accepts the loss",
                    name, p, list(lost), {b: state.recorded_dir(b) for b in lost},
                )  # fmt: skip
                continue
            log.warning(
                "partition %s-%d is offline: its leader %d and in-sync replicas %s are all "
                "down and unclean.leader.election.enable is off; it waits for one of them "
                "to return (live replicas: %s)",
                name, p, state.leader, list(state.isr), [b for b in state.replicas if b in live],
            )  # fmt: skip
        return True

    # -- on request ---------------------------------------------------------------------------

    def elect_preferred_leaders(
        self, topics: Sequence[str] | None = None
    ) -> dict[str, dict[int, int]]:
        """On the controller: each partition of ``topics`` (default: every topic) whose
        first replica is live, in the ISR and not the leader is led by it, epoch + 1, with
        writes fenced by the controller epoch. Returns {topic: {partition: new leader}} of
        the partitions moved (topics with none left out).

        Raises InvalidRequestError when this broker is not (or stops being) the
        controller, UnknownTopicOrPartitionError for a named topic that does not exist,
        RequestTimedOutError (retriable) when ZooKeeper is unavailable.
        """
        fence = self._control.controller_fence()
        if fence is None:
            raise InvalidRequestError(
                "a preferred leader election runs on the controller, and this broker is not "
                "the controller"
            )
        live = self._foreground(self._read_live_broker_ids, "reading the live brokers")
        named = topics is not None
        names = (
            list(topics)
            if topics is not None
            else self._foreground(self._read_topic_names, "reading the topics")
        )
        moved: dict[str, dict[int, int]] = {}
        for name in names:
            moves: Moves = {}
            change = _partition_change(moves, lambda s: preferred_leader_elected(s, live))
            try:
                written = self._store.rewrite_topic(
                    name, change, f"electing preferred leaders of topic {name!r}", fence
                )
            except UnknownTopicOrPartitionError:
                if named:
                    raise
                continue
            except ControllerFencedError as exc:
                raise InvalidRequestError(
                    f"this broker is no longer the controller: {exc}"
                ) from exc
            if written is not None and moves:
                _log_moves(name, moves, live, why="preferred leader")
                moved[name] = {p: new.leader for p, (_, new) in sorted(moves.items())}
        return moved

    def move_leadership_away(self, broker_id: int) -> int:
        """For a clean shutdown of ``broker_id``: each partition it leads whose ISR has
        another live member is led by the first such (``replicas`` order), ISR without
        ``broker_id``, epoch + 1. Each topic node is written conditionally on its version
        (re-read on a conflict). Returns how many partitions moved. Raises
        RequestTimedOutError (retriable) when ZooKeeper is unavailable."""
        live = self._foreground(self._read_live_broker_ids, "reading the live brokers")
        names = self._foreground(self._read_topic_names, "reading the topics")
        count = 0
        for name in names:
            moves: Moves = {}
            change = _partition_change(moves, lambda s: leader_moved_away(s, broker_id, live))
            what = f"moving leadership of topic {name!r} away from broker {broker_id}"
            try:
                written = self._store.rewrite_topic(name, change, what)
            except UnknownTopicOrPartitionError:
                continue  # deleted since the listing
            if written is not None and moves:
                _log_moves(name, moves, live, why=f"broker {broker_id} shutting down")
                count += len(moves)
        return count

    @staticmethod
    def _foreground(read: Callable[[], T], what: str) -> T:
        try:
            return read()
        except ZkUnavailable as exc:
            raise RequestTimedOutError(f"ZooKeeper unavailable while {what}: {exc}") from exc


def _partition_change(
    moves: Moves, decide: Callable[[PartitionState], PartitionState | None]
) -> Callable[[TopicAssignment], TopicAssignment | None]:
    """A ``rewrite_topic`` change applying ``decide`` to every partition, recording the
    moves of its last run in ``moves``."""

    def change(current: TopicAssignment) -> TopicAssignment | None:
        moves.clear()
        for p, state in current.states.items():
            new = decide(state)
            if new is not None:
                moves[p] = (state, new)
        return current.with_states({p: n for p, (_, n) in moves.items()}) if moves else None

    return change


def _log_moves(name: str, moves: Moves, live: dict[int, int], why: str = "") -> None:
    reason = f" ({why})" if why else ""
    for p, (old, new) in sorted(moves.items()):
        if new.leader_epoch == old.leader_epoch:
            log.info(
                "partition %s-%d: isr %s -> %s (dead or restarted brokers removed), leader %d "
                "at epoch %d",
                name, p, list(old.isr), list(new.isr), new.leader, new.leader_epoch,
            )  # fmt: skip
        elif new.leader in old.isr and old.recorded_epoch(new.leader) not in (
            None,
            new.recorded_epoch(new.leader),
        ):
            log.warning(
                "partition %s-%d: only restarted in-sync replicas are live: broker %d leads "
                "again at leader epoch %d (isr %s, broker epochs %s)",
                name, p, new.leader, new.leader_epoch, list(new.isr), dict(new.isr_epochs),
            )  # fmt: skip
        elif new.leader in old.isr:
            log.info(
                "partition %s-%d: leader %d -> %d%s, leader epoch %d, isr %s",
                name, p, old.leader, new.leader, reason, new.leader_epoch, list(new.isr),
            )  # fmt: skip
        else:
            log.warning(
                "partition %s-%d: unclean leader election, leader %d -> %d (not in sync, isr "
                "was %s), leader epoch %d, isr %s: acknowledged batches it lacks may be lost",
                name, p, old.leader, new.leader, list(old.isr), new.leader_epoch, list(new.isr),
            )  # fmt: skip
