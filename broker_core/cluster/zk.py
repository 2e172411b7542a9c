"""Cluster metadata in ZooKeeper: live brokers, the controller, topic assignments.

Layout under ``root`` (default ``/idemlog``)::

    brokers/ids/<id>   ephemeral   BrokerInfo.to_json()             one per live broker:
                                                  host, port, directory_id; its
                                                  czxid is the broker epoch
    controller         ephemeral   {"version", "broker_id"}         the controller
    controller_epoch   persistent  {"version", "controller_epoch"}  bumped per election
    topics/<name>      persistent  TopicAssignment.to_doc()         topic_id, schema, config;
                                                  per partition: replicas, leader,
                                                  leader_epoch, isr, isr_epochs, isr_dirs
                                                  (v1, and v2 without the optional
                                                  fields, still read)

What survives what:

* a registration and the controllership belong to one ZooKeeper session. A dropped
  connection re-established within the session timeout keeps both; an expired session
  loses both, and the broker then registers again in a new session and competes for the
  controller like any other broker (whoever creates ``controller`` first wins);
* ``close()`` deletes this broker's ephemeral nodes, so the others notice at once;
* topic assignments outlive every session and every broker. Their replicas are fixed at
  creation; leader, leader epoch and ISR change by version-conditional writes of the
  topic node: :meth:`ZkCluster.alter_partition` (a leader's ISR changes), and the
  controller's elections (:mod:`broker_core.cluster.zk_leaders`) when brokers come and go,
  fenced by the ``controller_epoch`` node's version. A dead broker's partitions move to a
  live in-sync replica; with none, a partition stays unavailable until one returns
  (or, with ``unclean.leader.election.enable``, an out-of-sync live replica leads).
* a topic's id (``topic_id`` in its node) is chosen when the node is created and kept
  while it lives; a node without one (written before ids, or rewritten by an older
  broker) gets one from the controller by a version-conditional write: the id it was
  seen with, else one derived from the node's creation zxid.

Every instance sees every change (a children watch on ``topics``, a data watch per topic);
each cached topic keeps its node's zxids, so a read older than the cache never replaces it.
Threads: kazoo's listeners and watch callbacks must not block, so they only wake the
worker, which does the background requests (bounded, retried while ZooKeeper is away).
Session, worker, registration and election: :mod:`~broker_core.cluster.zk_control`;
requests: :mod:`broker_core.cluster.zk_requests` (over ``broker_core.zookeeper``).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError, RolledBackError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from broker_core.cluster.metadata import (
    CallbackNotifier,
    ClusterMetadata,
    ControllerFence,
    TopicView,
)
from broker_core.cluster.records import (
    BrokerInfo,
    PartitionState,
    TopicAssignment,
    check_partition_update,
    load_json_object,
)
from broker_core.cluster.topic_creation import (
    DEFAULT_REPLICATION_FACTOR,
    assign_partitions,
    replication_factor_of,
    validate_new_topic,
)
from broker_core.cluster.zk_control import DEFAULT_SESSION_TIMEOUT_S, ZkControl, ZkTask
from broker_core.cluster.zk_leaders import ControllerFencedError, ZkLeaders
from broker_core.cluster.zk_requests import ZkRequests, ZkUnavailable
from broker_core.errors import (
    CorruptRecordError,
    IdemlogError,
    InvalidRequestError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.topics import new_topic_id, validate_topic_name
from broker_core.security import zk_acl
from broker_core.zookeeper import ZkSession

log = logging.getLogger("idemlog.cluster")


class ZkCluster(TopicView):
    """:class:`~broker_core.cluster.metadata.ClusterMetadata` kept in ZooKeeper (module doc).

    ``client`` is a started kazoo client and stays the caller's: ``close`` leaves it open.
    ``request_timeout_s`` bounds each request and each admin call (default: the session
    timeout); ``registration_timeout_s`` is how long :meth:`register` waits for another
    session's registration of the same id to go away (default: twice the session timeout,
    enough for the session of a killed predecessor to expire).
    """

    def __init__(
        self,
        client: Any,
        root: str = "/idemlog",
        *,
        request_timeout_s: float | None = None,
        registration_timeout_s: float | None = None,
        suspended_grace_s: float | None = None,
        default_replication_factor: int = DEFAULT_REPLICATION_FACTOR,
    ) -> None:
        if not root.startswith("/") or root.endswith("/") or "//" in root:
            raise InvalidRequestError(f"ZooKeeper root {root!r} must be an absolute path")
        session_ms = getattr(client, "_session_timeout", None)  # kazoo keeps it in ms
        session_s = session_ms / 1000.0 if session_ms else DEFAULT_SESSION_TIMEOUT_S
        self._client = client
        self._default_factor = default_replication_factor
        self._request_timeout_s = request_timeout_s or session_s
        self._requests = ZkRequests(ZkSession(client, request_timeout_s=self._request_timeout_s))
        self._ids_path = f"{root}/brokers/ids"
        self._topics_path = f"{root}/topics"
        self._notifier = CallbackNotifier("idemlog-cluster-callbacks")
        self._lock = threading.Lock()  # the caches below
        # Each cache keeps the zxid of the last child change it reflects, so a snapshot read
        # concurrently but older never replaces a newer one.
        self._brokers: dict[int, BrokerInfo] = {}
        self._brokers_zxid = -1
        self._topics: dict[str, TopicAssignment] = {}
        self._topics_zxid = -1
        # Per topic node listed (corrupt ones too): (czxid, mzxid) of the version cached.
        self._topic_zxids: dict[str, tuple[int, int]] = {}
        self._stale_topics: set[str] = set()  # data changed: for the TOPIC_STATES task
        # The id each topic node (name, czxid) was seen with (bounded by the nodes seen).
        self._node_ids: dict[tuple[str, int], str] = {}
        self._id_less: set[str] = set()  # topics whose node, as last read, has no id
        # The data watch of each topic node, by a token: a watch whose token was replaced
        # or dropped ends at its next event (its callback returns False).
        self._watches: dict[str, object] = {}
        self._topics_callbacks: list[Callable[[], None]] = []
        self._epoch_path = f"{root}/controller_epoch"
        self._control = ZkControl(
            self._requests,
            root,
            notifier=self._notifier,
            refresh=self._background,
            request_timeout_s=self._request_timeout_s,
            registration_timeout_s=registration_timeout_s or 2 * session_s,
            suspended_grace_s=suspended_grace_s or session_s / 3,
        )
        try:
            for path in (self._ids_path, self._topics_path):
                self._requests.admin(
                    "creating " + path, functools.partial(zk_acl.ensure_path_async, client, path)
                )
            self._refresh(ZkTask.BROKERS, "reading the live brokers")
            self._refresh(ZkTask.TOPICS, "reading the topics")
        except BaseException:
            self._control.detach()
            self._requests.session.close()
            self._notifier.close(0.0)
            raise
        self._leaders = ZkLeaders(self, self._control, self._requests, root)
        self._control.start()
        # The recipes re-arm their watches across reconnects and sessions; their callbacks
        # only hand the work to the worker (returning False, once closed, ends a recipe).
        request = self._control.request
        ChildrenWatch(client, self._ids_path, lambda _: request(ZkTask.BROKERS))
        ChildrenWatch(client, self._topics_path, lambda _: request(ZkTask.TOPICS))
        DataWatch(client, f"{root}/controller", lambda *_: request(ZkTask.CONTROLLER))

    # -- ClusterMetadata ----------------------------------------------------------------------

    def register(self, broker: BrokerInfo) -> None:
        """Create this broker's ephemeral registration; from then on it is kept up.

        Waits up to ``registration_timeout_s`` for another session's registration of the
        same id (a killed predecessor whose session has not expired yet) to go away, else
        raises :class:`DuplicateBrokerRegistrationError`. Returns once registered and once
        the election has been tried, so :meth:`is_controller` is current.
        """
        self._control.register(broker)

    def broker_epoch(self) -> int:
        """The creation zxid of this broker's registration (NO_BROKER_EPOCH before)."""
        return self._control.broker_epoch()

    def unclean_leader_elections(self) -> int:
        return self._leaders.unclean_leader_elections

    def brokers(self) -> list[BrokerInfo]:
        with self._lock:
            return [self._brokers[b] for b in sorted(self._brokers)]

    def controller(self) -> BrokerInfo | None:
        """The controller; None while there is none or its registration is not cached yet."""
        me, controller_id = self._control.controller()
        if me is not None:
            return me
        with self._lock:
            return None if controller_id is None else self._brokers.get(controller_id)

    def is_controller(self) -> bool:
        return self._control.is_controller()

    def controller_epoch(self) -> int:
        """This broker's controllership's epoch while it is the controller (set before it
        was reported), else the last value read."""
        return self._control.controller_epoch()

    def controller_fence(self) -> ControllerFence | None:
        """While controller: the ``controller_epoch`` node at the version its bump left."""
        fence = self._control.controller_fence()
        return None if fence is None else ControllerFence(fence[0], self._epoch_path, fence[1])

    def on_controller_change(self, callback: Callable[[bool], None]) -> None:
        """``callback(is_controller)`` on every gain and loss, on the notifier thread.

        Added while this broker is the controller, it gets ``True`` first: every subscriber
        sees ``True, False, True, ...`` and never misses a gain.
        """
        self._control.on_controller_change(callback)

    def create_topic(
        self, name: str, partitions: int, schema: bytes | None, config: dict[str, str]
    ) -> TopicAssignment:
        """Assign the partitions' replicas round-robin over the live brokers; write
        ``topics/<name>``."""
        name, partitions, schema, overrides = validate_new_topic(name, partitions, schema, config)
        self._control.check_open()
        # The live brokers read afresh, not from the cache, which may lag a moment.
        live = self._refresh(ZkTask.BROKERS, f"creating topic {name!r} (reading the live brokers)")
        factor = replication_factor_of(name, overrides, len(live), self._default_factor)
        epochs = {b: info.epoch for b, info in live.items()}
        dirs = {b: info.directory_id for b, info in live.items()}
        states = assign_partitions(name, partitions, list(live), factor, epochs, dirs)
        assignment = TopicAssignment.of(name, states, schema, overrides, new_topic_id())
        data = json.dumps(assignment.to_doc(), separators=(",", ":")).encode()
        path, get = f"{self._topics_path}/{name}", self._client.get_async

        def ours_after_lost_reply() -> bool:
            # Same bytes: our create went through (a rival creating the very same assignment
            # at the same moment would be the same outcome).
            try:
                stored, _ = self._requests.admin("reading " + path, functools.partial(get, path))
            except NoNodeError:
                return False
            return bool(stored == data)

        self._write_once(
            f"creating topic {name!r}",
            functools.partial(zk_acl.create_async, self._client, path, data, makepath=True),
            NodeExistsError,
            ours_after_lost_reply,
            TopicAlreadyExistsError(f"topic {name!r} already exists"),
        )
        log.info("created topic %s: partition -> leader %s", name, assignment.partitions)
        return assignment

    def delete_topic(self, name: str) -> None:
        validate_topic_name(name)
        self._control.check_open()
        self._write_once(
            f"deleting topic {name!r}",
            functools.partial(self._client.delete_async, f"{self._topics_path}/{name}"),
            NoNodeError,
            lambda: True,  # after a lost reply, a missing node is our delete's doing
            UnknownTopicOrPartitionError(f"topic {name!r} does not exist"),
        )
        log.info("deleted topic %s", name)

    def alter_partition(
        self,
        topic: str,
        partition: int,
        update: Callable[[PartitionState], PartitionState | None],
        topic_id: str | None = None,
    ) -> PartitionState | None:
        """Read-modify-write of one partition's state in ``topics/<topic>``.

        ``update(current)`` returns the new state, or None to write nothing (e.g. the caller
        no longer leads at the epoch it knows); None is then returned. The write is a ``set``
        conditional on the node's version; on a conflicting write the node is re-read and
        ``update`` runs again (at most ``MAX_CONFLICTS`` times), so it must depend only on
        the state it is given. The new state must pass :meth:`PartitionState.problem` and
        keep or raise the leader epoch (INVALID_REQUEST otherwise; an unchanged state is
        returned without a write). Returns the state stored; this instance's cache has it
        before the return (read-your-writes) and the topic-change callbacks fire. Raises
        RequestTimedOutError (retriable) when ZooKeeper is unavailable or the conflicts
        persist, UnknownTopicOrPartitionError when the topic or partition is gone.
        """
        validate_topic_name(topic)
        self._control.check_open()
        result: list[PartitionState | None] = [None]

        def change(current: TopicAssignment) -> TopicAssignment | None:
            state = current.state(partition)  # UnknownTopicOrPartitionError, named
            if topic_id and current.topic_id and current.topic_id != topic_id:
                # Another incarnation of the topic: a change meant for the deleted one
                # (an old replica's ISR change) never lands in it, whatever its epochs.
                result[0] = None
                return None
            proposed = update(state)
            if proposed is None:
                result[0] = None
                return None
            result[0] = new = check_partition_update(topic, partition, state, proposed)
            return current.with_states({partition: new})

        self.rewrite_topic(topic, change, f"altering partition {topic}-{partition}")
        return result[0]

    def read_topic(self, name: str) -> TopicAssignment:
        """``topics/<name>`` as ZooKeeper has it now (the cache updated with it): what a
        broker asks before refusing a request whose topic id its cache does not know, in
        case the cache is the older one. Raises UnknownTopicOrPartitionError when the
        topic is gone, RequestTimedOutError (retriable) when ZooKeeper is away."""
        validate_topic_name(name)
        self._control.check_open()
        self._refresh(ZkTask.TOPICS, f"reading topic {name!r}")
        return self.topic(name)

    def _upgrade_topic_ids(self) -> None:
        """On the controller: give every topic stored without an id one (stored before
        ids, or rewritten by an older broker, which drops the field), each by a write
        conditional on the node's version that writes nothing if it has one by then, so
        of several writers (a controller deposed meanwhile) only one id is ever stored."""
        if not self._control.is_controller():
            return
        with self._lock:
            names = sorted(self._id_less & set(self._topics))
        for name in names:
            with self._lock:
                node = self._topic_zxids.get(name)
                known = None if node is None else self._node_ids.get((name, node[0]))
            if node is None:
                continue
            # The id this node had (an older broker's rewrite dropped the field), or one
            # derived from the node's creation zxid: every controller picks the same one,
            # and a node recreated under the name has another.
            topic_id = known or f"{node[0]:032x}"

            def upgrade(
                current: TopicAssignment, topic_id: str = topic_id
            ) -> TopicAssignment | None:
                return None if current.topic_id else current.with_topic_id(topic_id)

            try:
                stored = self.rewrite_topic(name, upgrade, f"giving topic {name!r} an id")
            except (IdemlogError, ZkUnavailable) as exc:
                log.warning("topic %s keeps no id for now (retried next pass): %s", name, exc)
                continue
            if stored is not None:
                log.info("topic %s stored before topic ids now has id %s", name, stored.topic_id)

    def elect_preferred_leaders(
        self, topics: Sequence[str] | None = None
    ) -> dict[str, dict[int, int]]:
        """The controller's preferred-leader rebalance (see
        :meth:`ZkLeaders.elect_preferred_leaders`, which says what it raises)."""
        self._control.check_open()
        return self._leaders.elect_preferred_leaders(topics)

    def move_leadership_away(self, broker_id: int) -> int:
        """A clean shutdown's first step, from any broker (see
        :meth:`ZkLeaders.move_leadership_away`, which says what it raises)."""
        self._control.check_open()
        return self._leaders.move_leadership_away(broker_id)

    def close(self) -> None:
        """Give up control (its callbacks finish first), then delete this broker's
        ephemeral nodes so the others notice at once. Idempotent; the client stays open.
        The watches end at their next event."""
        self._control.close()
        with self._lock:
            self._watches.clear()
        self._notifier.close(self._request_timeout_s)
        self._control.unregister()
        self._requests.session.close()

    # -- caches -------------------------------------------------------------------------------

    def _background(self, task: ZkTask) -> None:
        """A worker task (ZkControl runs REGISTER and CONTROLLER itself)."""
        if task is ZkTask.TOPIC_STATES:
            self._refresh_topic_states()
        elif task is ZkTask.LEADERS:
            self._leaders.run_pass()
        else:
            self._refresh(task)
        if task is not ZkTask.BROKERS:
            self._upgrade_topic_ids()  # on the controller, when a topic read has no id

    def _refresh(self, task: ZkTask, foreground: str | None = None) -> dict[Any, Any]:
        """Re-read the brokers or the topics and update that cache; returns what was read.

        ``foreground`` names what a caller is doing, for the error if ZooKeeper is away.
        A change of the live broker ids or epochs asks for the controller's election pass.
        """
        brokers = task is ZkTask.BROKERS
        path = self._ids_path if brokers else self._topics_path
        try:
            zxid, docs = self._read_children(path)
        except ZkUnavailable as exc:
            if foreground is None:
                raise
            raise RequestTimedOutError(f"ZooKeeper unavailable while {foreground}: {exc}") from exc
        parsed: dict[Any, Any] = {}
        for child, (data, _) in docs.items():
            where = f"{path}/{child}"
            try:
                if brokers:
                    if not child.isdigit():
                        raise CorruptRecordError(f"{where}: not a broker id")
                    epoch = int(docs[child][1].czxid)
                    parsed[int(child)] = BrokerInfo.from_json(int(child), data, where, epoch)
                else:
                    parsed[child] = self._parse_topic(child, data)
            except CorruptRecordError as exc:
                log.error("ignored: %s", exc)
        if not brokers:
            zxids = {child: (stat.czxid, stat.mzxid) for child, (_, stat) in docs.items()}
            return self._apply_listing(zxid, parsed, zxids)
        with self._lock:
            changed = False
            if zxid >= self._brokers_zxid:
                # A new epoch under the same id is a new process (KIP-380): to the
                # controller, the old one failed and a new one started.
                changed = _epochs(parsed) != _epochs(self._brokers)
                self._brokers, self._brokers_zxid = parsed, zxid
        if changed:
            self._control.request(ZkTask.LEADERS)  # a no-op unless this is the controller
        return parsed

    def _parse_topic(self, name: str, data: bytes) -> TopicAssignment:
        where = f"{self._topics_path}/{name}"
        return TopicAssignment.from_doc(name, load_json_object(data, where), where)

    def _apply_listing(
        self,
        zxid: int,
        parsed: dict[str, TopicAssignment],
        zxids: dict[str, tuple[int, int]],
    ) -> dict[str, TopicAssignment]:
        """Install a listing of ``topics`` (at child zxid ``zxid``), topic by topic keeping
        whichever of the cached and the listed version of a node is newer."""
        with self._lock:
            if zxid < self._topics_zxid:
                return parsed  # an older listing than the cache's
            topics: dict[str, TopicAssignment] = {}
            kept: dict[str, tuple[int, int]] = {}
            for name, read in zxids.items():
                cached = self._topic_zxids.get(name)
                if cached is not None and cached[1] > read[1]:
                    kept[name] = cached  # a newer state came from the data watch meanwhile
                    if name in self._topics:
                        topics[name] = self._topics[name]
                else:
                    kept[name] = read
                    if name in parsed:
                        topics[name] = self._keep_node_id(name, read[0], parsed[name])
            for name, cached in self._topic_zxids.items():
                if name not in zxids and cached[0] > zxid:
                    # Created after this listing was taken (seen by our own write): keep it.
                    kept[name] = cached
                    if name in self._topics:
                        topics[name] = self._topics[name]
            if topics != self._topics:
                self._notifier.post(list(self._topics_callbacks))
            self._topics, self._topics_zxid, self._topic_zxids = topics, zxid, kept
            self._stale_topics &= set(kept)
            starting = self._sync_watches_locked()
        self._start_watches(starting)
        return parsed

    def _apply_topic(
        self, name: str, assignment: TopicAssignment | None, czxid: int, mzxid: int
    ) -> bool:
        """Install one topic node read (or written) at ``mzxid``; None: it is corrupt.

        Only a version newer than the cached one is installed, and only of a node the
        cached listing has, or one created after it. Returns whether it was installed.
        """
        with self._lock:
            cached = self._topic_zxids.get(name)
            listed = cached is not None or czxid > self._topics_zxid
            if not listed or (cached is not None and cached[1] >= mzxid):
                return False
            self._topic_zxids[name] = (czxid, mzxid)
            old = self._topics.get(name)
            if assignment is None:
                self._topics.pop(name, None)
            else:
                assignment = self._keep_node_id(name, czxid, assignment)
                self._topics[name] = assignment
            if assignment != old:
                self._notifier.post(list(self._topics_callbacks))
            starting = self._sync_watches_locked()
        self._start_watches(starting)
        return True

    def _keep_node_id(self, name: str, czxid: int, assignment: TopicAssignment) -> TopicAssignment:
        """``assignment`` with the id its node (``name`` created at ``czxid``) was last
        seen with, if an older broker's rewrite dropped it: an id never changes while the
        node lives. Called with the lock held."""
        if assignment.topic_id:
            self._node_ids[(name, czxid)] = assignment.topic_id
            self._id_less.discard(name)
            return assignment
        self._id_less.add(name)  # for the controller to write one (_upgrade_topic_ids)
        known = self._node_ids.get((name, czxid))
        return assignment if known is None else assignment.with_topic_id(known)

    # -- per-topic data watches ---------------------------------------------------------------

    def _sync_watches_locked(self) -> list[tuple[str, object]]:
        """Drop the watches of topics gone from the cache; the topics to start one for."""
        for name in [n for n in self._watches if n not in self._topic_zxids]:
            del self._watches[name]  # the watch ends at its next event (the deletion)
        if self._control.closed:
            return []
        starting = [(n, object()) for n in self._topic_zxids if n not in self._watches]
        self._watches.update(starting)
        return starting

    def _start_watches(self, starting: list[tuple[str, object]]) -> None:
        if starting:
            # A DataWatch reads its node at once, retrying while ZooKeeper is away: on a
            # thread of its own, so the worker (or a caller) never waits for an outage.
            self._client.handler.spawn(self._watch_topics, starting)

    def _watch_topics(self, starting: list[tuple[str, object]]) -> None:
        for name, token in starting:
            with self._lock:
                if self._watches.get(name) is not token:
                    continue
            callback = functools.partial(self._on_topic_data, name, token)
            try:
                DataWatch(self._client, f"{self._topics_path}/{name}", callback)
            except Exception as exc:
                # The next listing (every reconnect brings one) starts it again.
                log.warning("could not watch topic %s: %r", name, exc)
                with self._lock:
                    if self._watches.get(name) is token:
                        del self._watches[name]

    def _on_topic_data(self, name: str, token: object, data: Any, stat: Any, *_: Any) -> bool:
        """A topic node's DataWatch (kazoo's thread, must not block): queue a re-read of a
        newer version for the worker. Returns False to end the watch: once closed, when
        its token was replaced, or when the node is gone (the listing takes over)."""
        with self._lock:
            if self._watches.get(name) is not token:
                return False
            if stat is None:
                del self._watches[name]
            else:
                cached = self._topic_zxids.get(name)
                if cached is not None and cached[1] >= stat.mzxid:
                    return not self._control.closed  # e.g. the watch's first read
                self._stale_topics.add(name)
        if stat is None:
            # Deleted, or deleted and created again: the listing sorts out which, and
            # starts a new watch if the name is back.
            self._control.request(ZkTask.TOPICS)
            return False
        return self._control.request(ZkTask.TOPIC_STATES) is not False

    def _refresh_topic_states(self) -> None:
        """TOPIC_STATES: re-read the topic nodes whose data watch fired."""
        with self._lock:
            names, self._stale_topics = sorted(self._stale_topics), set()
        for i, name in enumerate(names):
            path = f"{self._topics_path}/{name}"
            try:
                data, stat = self._requests.call(functools.partial(self._client.get_async, path))
            except NoNodeError:
                continue  # deleted: the children watch brings the listing
            except Exception:
                with self._lock:
                    self._stale_topics.update(names[i:])  # the worker retries them
                raise
            try:
                assignment: TopicAssignment | None = self._parse_topic(name, bytes(data))
            except CorruptRecordError as exc:
                log.error("ignored: %s", exc)
                assignment = None
            self._apply_topic(name, assignment, stat.czxid, stat.mzxid)

    def _read_children(self, path: str) -> tuple[int, dict[str, tuple[bytes, Any]]]:
        """The children's data and stat, and the zxid of the last child change of ``path``."""
        children, stat = self._requests.call(
            functools.partial(self._client.get_children_async, path, include_data=True)
        )
        requests = {c: self._client.get_async(f"{path}/{c}") for c in children}
        docs: dict[str, tuple[bytes, Any]] = {}
        for child, request in requests.items():
            try:
                data, child_stat = self._requests.wait(request)
            except NoNodeError:
                continue  # deleted since the listing
            docs[child] = (bytes(data), child_stat)
        return int(stat.pzxid), docs

    # -- the one writer of partition states -------------------------------------------------

    def rewrite_topic(
        self,
        name: str,
        change: Callable[[TopicAssignment], TopicAssignment | None],
        what: str,
        fence: tuple[int, int] | None = None,
    ) -> TopicAssignment | None:
        """Read-modify-write of ``topics/<name>``: ``change(current)`` returns the new
        assignment, or None to write nothing; an unchanged one is not written either.

        The write is conditional on the node's version; with ``fence`` (controller epoch,
        ``controller_epoch`` node version) it is a multi that also checks that version,
        so it is refused (:class:`ControllerFencedError`) once a newer controller exists.
        Retried as :meth:`ZkRequests.read_modify_write` says, so ``change`` may run several
        times. Returns what is stored (in the cache before the return, callbacks fired),
        or None. Raises UnknownTopicOrPartitionError when the topic is gone,
        RequestTimedOutError when ZooKeeper stayed unavailable, CorruptRecordError for an
        unreadable node, and whatever ``change`` raises.
        """
        path = f"{self._topics_path}/{name}"
        gone = UnknownTopicOrPartitionError(f"topic {name!r} does not exist")

        def attempt() -> TopicAssignment | None:
            try:
                data, stat = self._requests.call(functools.partial(self._client.get_async, path))
            except NoNodeError:
                raise gone from None
            current = self._parse_topic(name, bytes(data))
            new = change(current)
            if new is None or new == current:
                self._apply_topic(name, current, stat.czxid, stat.mzxid)
                return None if new is None else current
            payload = json.dumps(new.to_doc(), separators=(",", ":")).encode()
            if fence is None:
                try:
                    written = self._requests.call(
                        functools.partial(
                            self._client.set_async, path, payload, version=stat.version
                        )
                    )
                except NoNodeError:
                    raise gone from None
            else:
                transaction = self._client.transaction()
                transaction.check(self._epoch_path, fence[1])
                transaction.set_data(path, payload, version=stat.version)
                fenced, written = self._requests.call(transaction.commit_async)
                # A failed multi reports the ops before the failing one as RolledBackError:
                # only the check's own failure means a newer controller.
                if isinstance(fenced, Exception) and not isinstance(fenced, RolledBackError):
                    raise ControllerFencedError(
                        f"{what}: the controller epoch {fence[0]} is no longer current "
                        f"({self._epoch_path} changed: a newer controller exists)"
                    )
                if isinstance(written, NoNodeError):
                    raise gone
                if isinstance(written, Exception):
                    raise written  # BadVersionError: a conflict, redone
            self._apply_topic(name, new, written.czxid, written.mzxid)
            return new

        return self._requests.read_modify_write(what, attempt, self._control.check_open)

    # -- writes for callers --------------------------------------------------------------------

    def _write_once(
        self,
        what: str,
        request: Callable[[], Any],
        conflict: type[KazooException],
        resolved_after_lost_reply: Callable[[], bool],
        error: IdemlogError,
    ) -> None:
        """:meth:`ZkRequests.write_once`, then the topics re-read (read-your-writes)."""
        self._requests.write_once(
            what, request, conflict, resolved_after_lost_reply, error, self._control.check_open
        )
        try:
            self._refresh(ZkTask.TOPICS)  # the watch brings it a bit later
        except (ZkUnavailable, KazooException) as exc:
            log.debug("no cache refresh after %s: %r", what, exc)


def _epochs(brokers: dict[int, BrokerInfo]) -> dict[int, int]:
    return {b: info.epoch for b, info in brokers.items()}


if TYPE_CHECKING:

    def _implements_the_protocol(cluster: ZkCluster) -> ClusterMetadata:
        return cluster  # mypy checks that ZkCluster has every method of ClusterMetadata
