"""Cluster metadata in ZooKeeper: live brokers, the controller, topic assignments.

Layout under ``root`` (default ``/idemlog``)::

    brokers/ids/<id>   ephemeral   {"version", "host", "port"}      one per live broker
    controller         ephemeral   {"version", "broker_id"}         the controller
    controller_epoch   persistent  {"version", "controller_epoch"}  bumped per election
    topics/<name>      persistent  TopicAssignment.to_doc()         per partition: replicas,
                                                                    leader, leader_epoch, isr
                                                                    (version 1: partition ->
                                                                    broker id, still read)

What survives what (partitions never move: there is no replication):

* a registration and the controllership belong to one ZooKeeper session. A dropped
  connection re-established within the session timeout keeps both; an expired session
  loses both, and the broker then registers again in a new session and competes for the
  controller like any other broker (whoever creates ``controller`` first wins);
* ``close()`` deletes this broker's ephemeral nodes, so the others notice at once;
* topic assignments outlive every session and every broker. A dead broker's partitions
  stay assigned to it and are unavailable until that broker id registers again with its
  data; no other broker takes them over.

Threads: kazoo runs state listeners on its connection thread and watch callbacks on its
event thread, and neither may block, so both only record what happened and wake the
worker thread. The worker does the background requests (register, elect, refresh the
caches), each bounded by a timeout and retried with backoff while ZooKeeper is away.
The session handling, the worker, the registration and the election live in the
:class:`~broker_core.cluster.zk_control.ZkControl` component that ZkCluster holds, the
requests in :mod:`broker_core.cluster.zk_requests` (over the one ZooKeeper session helper,
:class:`broker_core.zookeeper.ZkSession`).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from broker_core.cluster.metadata import (
    BrokerInfo,
    CallbackNotifier,
    ClusterMetadata,
    TopicAssignment,
    TopicView,
    assign_partitions,
    load_json_object,
    replication_factor_of,
    validate_new_topic,
)
from broker_core.cluster.zk_control import DEFAULT_SESSION_TIMEOUT_S, ZkControl, ZkTask
from broker_core.cluster.zk_requests import ZkRequests, ZkUnavailable
from broker_core.errors import (
    CorruptRecordError,
    IdemlogError,
    InvalidRequestError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.topics import validate_topic_name
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
    ) -> None:
        if not root.startswith("/") or root.endswith("/") or "//" in root:
            raise InvalidRequestError(f"ZooKeeper root {root!r} must be an absolute path")
        session_ms = getattr(client, "_session_timeout", None)  # kazoo keeps it in ms
        session_s = session_ms / 1000.0 if session_ms else DEFAULT_SESSION_TIMEOUT_S
        self._client = client
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
        self._topics_callbacks: list[Callable[[], None]] = []
        self._control = ZkControl(
            self._requests,
            root,
            notifier=self._notifier,
            refresh=self._refresh,
            request_timeout_s=self._request_timeout_s,
            registration_timeout_s=registration_timeout_s or 2 * session_s,
            suspended_grace_s=suspended_grace_s or session_s / 3,
        )
        try:
            for path in (self._ids_path, self._topics_path):
                self._requests.admin(
                    "creating " + path, functools.partial(client.ensure_path_async, path)
                )
            self._refresh(ZkTask.BROKERS, "reading the live brokers")
            self._refresh(ZkTask.TOPICS, "reading the topics")
        except BaseException:
            self._control.detach()
            self._requests.session.close()
            self._notifier.close(0.0)
            raise
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
        """The epoch of the current controllership: this broker's own while it is the
        controller (set before it was reported), else the last value read."""
        return self._control.controller_epoch()

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
        factor = replication_factor_of(overrides)
        assignment = TopicAssignment.of(
            name, assign_partitions(name, partitions, list(live), factor), schema, overrides
        )
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
            functools.partial(self._client.create_async, path, data, makepath=True),
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

    def close(self) -> None:
        """Give up control (its callbacks finish first), then delete this broker's
        ephemeral nodes so the others notice at once. Idempotent; the client stays open."""
        self._control.close()
        self._notifier.close(self._request_timeout_s)
        self._control.unregister()
        self._requests.session.close()

    # -- caches -------------------------------------------------------------------------------

    def _refresh(self, task: ZkTask, foreground: str | None = None) -> dict[Any, Any]:
        """Re-read the brokers or the topics and update that cache; returns what was read.

        ``foreground`` names what a caller is doing, for the error if ZooKeeper is away.
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
        for child, data in docs.items():
            where = f"{path}/{child}"
            try:
                if brokers:
                    if not child.isdigit():
                        raise CorruptRecordError(f"{where}: not a broker id")
                    parsed[int(child)] = BrokerInfo.from_json(int(child), data, where)
                else:
                    parsed[child] = TopicAssignment.from_doc(
                        child, load_json_object(data, where), where
                    )
            except CorruptRecordError as exc:
                log.error("ignored: %s", exc)
        with self._lock:
            if brokers and zxid >= self._brokers_zxid:
                self._brokers, self._brokers_zxid = parsed, zxid
            elif not brokers and zxid >= self._topics_zxid:
                if parsed != self._topics:
                    self._notifier.post(list(self._topics_callbacks))
                self._topics, self._topics_zxid = parsed, zxid
        return parsed

    def _read_children(self, path: str) -> tuple[int, dict[str, bytes]]:
        """The children's data and the zxid of the last child change of ``path``."""
        children, stat = self._requests.call(
            functools.partial(self._client.get_children_async, path, include_data=True)
        )
        requests = {c: self._client.get_async(f"{path}/{c}") for c in children}
        docs: dict[str, bytes] = {}
        for child, request in requests.items():
            try:
                docs[child] = bytes(self._requests.wait(request)[0])
            except NoNodeError:
                continue  # deleted since the listing
        return int(stat.pzxid), docs

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


if TYPE_CHECKING:

    def _implements_the_protocol(cluster: ZkCluster) -> ClusterMetadata:
        return cluster  # mypy checks that ZkCluster has every method of ClusterMetadata
