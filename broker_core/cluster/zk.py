"""Cluster metadata in ZooKeeper: live brokers, the controller, topic assignments.

Layout under ``root`` (default ``/idemlog``)::

    brokers/ids/<id>   ephemeral   {"version": 1, "host", "port"}   one per live broker
    controller         ephemeral   {"version": 1, "broker_id"}      the controller
    controller_epoch   persistent  {"version": 1, "controller_epoch"}  bumped per election
    topics/<name>      persistent  TopicAssignment.to_doc()         partition -> broker

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
The session handling, the worker and the election live in the base class
(:mod:`broker_core.cluster.zk_control`), the bounded requests in
:mod:`broker_core.cluster.zk_requests`.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from broker_core.cluster.metadata import (
    BrokerInfo,
    ClusterMetadata,
    TopicAssignment,
    TopicView,
    assign_partitions,
    load_json_object,
    validate_new_topic,
)
from broker_core.cluster.zk_control import ZkControl, ZkTask
from broker_core.cluster.zk_requests import ZkUnavailable
from broker_core.errors import (
    CorruptRecordError,
    DuplicateBrokerRegistrationError,
    IdemlogError,
    InvalidRequestError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.topics import validate_topic_name

log = logging.getLogger("idemlog.cluster")


class ZkCluster(ZkControl, TopicView):
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
        super().__init__(
            client,
            root,
            request_timeout_s=request_timeout_s,
            registration_timeout_s=registration_timeout_s,
            suspended_grace_s=suspended_grace_s,
        )
        self._ids_path = f"{root}/brokers/ids"
        self._topics_path = f"{root}/topics"
        self._rival: tuple[int, bytes] | None = None  # (session, data) holding our broker id
        # Each cache keeps the zxid of the last child change it reflects, so a snapshot read
        # concurrently but older never replaces a newer one.
        self._brokers: dict[int, BrokerInfo] = {}
        self._brokers_zxid = -1
        self._topics: dict[str, TopicAssignment] = {}
        self._topics_zxid = -1
        self._topics_callbacks: list[Callable[[], None]] = []

        client.add_listener(self._on_state)
        if client.connected:
            self._on_state(KazooState.CONNECTED)
        try:
            for path in (self._ids_path, self._topics_path):
                self._requests.admin(
                    "creating " + path, functools.partial(client.ensure_path_async, path)
                )
            self._refresh(ZkTask.BROKERS, "reading the live brokers")
            self._refresh(ZkTask.TOPICS, "reading the topics")
        except BaseException:
            client.remove_listener(self._on_state)
            self._requests.session.close()
            self._notifier.close(0.0)
            raise
        self._worker = threading.Thread(target=self._run, name="idemlog-cluster", daemon=True)
        self._worker.start()
        # The recipes re-arm their watches across reconnects and sessions; their callbacks
        # only hand the work to the worker (returning False, once closed, ends a recipe).
        ChildrenWatch(client, self._ids_path, lambda _: self._request(ZkTask.BROKERS))
        ChildrenWatch(client, self._topics_path, lambda _: self._request(ZkTask.TOPICS))
        DataWatch(client, self._controller_path, lambda *_: self._request(ZkTask.CONTROLLER))

    # -- ClusterMetadata ----------------------------------------------------------------------

    def register(self, broker: BrokerInfo) -> None:
        """Create this broker's ephemeral registration; from then on it is kept up.

        Waits up to ``registration_timeout_s`` for another session's registration of the
        same id (a killed predecessor whose session has not expired yet) to go away, else
        raises :class:`DuplicateBrokerRegistrationError`. Returns once registered and once
        the election has been tried, so :meth:`is_controller` is current.
        """
        with self._cond:
            self._check_open()
            if self._broker is not None and self._broker != broker:
                raise InvalidRequestError(f"cannot register {broker}: already {self._broker}")
            self._broker, self._rival = broker, None
            self._request_locked(ZkTask.REGISTER)
            deadline = time.monotonic() + self._registration_timeout_s
            if not self._cond.wait_for(
                lambda: self._closed or self._registered_locked(), self._registration_timeout_s
            ):
                self._broker = None  # the worker undoes a success that comes too late
                self._pending.discard(ZkTask.REGISTER)
                raise self._registration_error(broker, self._rival)
            self._check_open()
            self._cond.wait_for(  # the election; if it fails now it is retried in background
                lambda: self._closed or self._controller_checked_session == self._session_id,
                max(0.0, deadline - time.monotonic()),
            )

    def brokers(self) -> list[BrokerInfo]:
        with self._lock:
            return [self._brokers[b] for b in sorted(self._brokers)]

    def controller(self) -> BrokerInfo | None:
        """The controller; None while there is none or its registration is not cached yet."""
        with self._lock:
            if self._is_controller_locked():
                return self._broker
            return None if self._controller_id is None else self._brokers.get(self._controller_id)

    def is_controller(self) -> bool:
        with self._lock:
            return self._is_controller_locked()

    def on_controller_change(self, callback: Callable[[bool], None]) -> None:
        """``callback(is_controller)`` on every gain and loss, on the notifier thread.

        Added while this broker is the controller, it gets ``True`` first: every subscriber
        sees ``True, False, True, ...`` and never misses a gain.
        """
        with self._lock:
            self._controller_callbacks.append(callback)
            if self._reported_controller:
                self._notifier.post([callback], True)

    def create_topic(
        self, name: str, partitions: int, schema: bytes | None, config: dict[str, str]
    ) -> TopicAssignment:
        """Assign the partitions round-robin over the live brokers; write ``topics/<name>``."""
        name, partitions, schema, overrides = validate_new_topic(name, partitions, schema, config)
        self._check_open()
        # The live brokers read afresh, not from the cache, which may lag a moment.
        live = self._refresh(ZkTask.BROKERS, f"creating topic {name!r} (reading the live brokers)")
        assignment = TopicAssignment(
            name, assign_partitions(name, partitions, list(live)), schema, overrides
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
        log.info("created topic %s: partition -> broker %s", name, assignment.partitions)
        return assignment

    def delete_topic(self, name: str) -> None:
        validate_topic_name(name)
        self._check_open()
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
        with self._cond:
            if self._closed:
                return
            self._closed = True
            session = self._session_id
            broker = self._broker if self._registered_locked() else None
            self._publish_control_locked()
            self._cancel_suspended_timer_locked()
            self._cond.notify_all()
        self._client.remove_listener(self._on_state)
        if threading.current_thread() is not self._worker:
            self._worker.join(self._request_timeout_s + 1.0)
        self._notifier.close(self._request_timeout_s)
        if broker is not None and session is not None:
            self._requests.delete_own(self._controller_path, session)
            self._requests.delete_own(f"{self._ids_path}/{broker.broker_id}", session)
            log.info("broker %d unregistered", broker.broker_id)
        self._requests.session.close()

    # -- background tasks ------------------------------------------------------------------

    def _run_task(self, task: ZkTask) -> None:
        if task is ZkTask.REGISTER:
            self._register_now()
        else:
            self._refresh(task)

    def _register_now(self) -> None:
        with self._lock:
            broker, session = self._broker, self._session_id
        if broker is None or session is None:
            return
        path = f"{self._ids_path}/{broker.broker_id}"
        try:
            self._requests.call(
                functools.partial(self._client.create_async, path, broker.to_json(), ephemeral=True)
            )
        except NodeExistsError:
            try:  # the watch re-runs this task when a rival's node goes away
                data, stat = self._requests.call(
                    functools.partial(self._client.get_async, path, watch=self._on_rival_gone)
                )
            except NoNodeError:
                self._request(ZkTask.REGISTER)  # gone in between: create again
                return
            if stat.ephemeralOwner != session:
                with self._lock:
                    first, self._rival = self._rival is None, (stat.ephemeralOwner, bytes(data))
                if first:
                    log.warning(
                        "broker id %d is registered by another ZooKeeper session (0x%x); waiting "
                        "for it to go away",
                        broker.broker_id,
                        stat.ephemeralOwner,
                    )
                return
            # Ours already: a create whose reply was lost, or a reconnect in the same session.
        with self._cond:
            cancelled = self._broker != broker or self._closed  # register() gave up meanwhile
            if not cancelled:
                if self._registered_session != session:
                    log.info("broker %d registered at %s", broker.broker_id, path)
                self._registered_session, self._rival = session, None
                self._request_locked(ZkTask.BROKERS)
                self._request_locked(ZkTask.CONTROLLER)
        if cancelled:
            self._requests.delete_own(path, session)

    def _on_rival_gone(self, event: object) -> None:
        self._request(ZkTask.REGISTER)

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
            what, request, conflict, resolved_after_lost_reply, error, self._check_open
        )
        try:
            self._refresh(ZkTask.TOPICS)  # the watch brings it a bit later
        except (ZkUnavailable, KazooException) as exc:
            log.debug("no cache refresh after %s: %r", what, exc)

    def _registration_error(
        self, broker: BrokerInfo, rival: tuple[int, bytes] | None
    ) -> IdemlogError:
        chroot = getattr(self._client, "chroot", "") or ""
        path = f"{chroot}{self._ids_path}/{broker.broker_id}"
        waited = f"{self._registration_timeout_s:g}s"
        if rival is None:
            return RequestTimedOutError(
                f"could not register broker id {broker.broker_id} at {path} within {waited}: "
                f"ZooKeeper unavailable"
            )
        try:
            holder = f" at {BrokerInfo.from_json(broker.broker_id, rival[1], path).address}"
        except CorruptRecordError:
            holder = ""
        return DuplicateBrokerRegistrationError(
            f"broker id {broker.broker_id} is already registered{holder} by another ZooKeeper "
            f"session (0x{rival[0]:x}, {path}) that did not go away within {waited}: another "
            f"broker runs with broker.id={broker.broker_id}, or a previous process of this "
            f"broker has not timed out yet"
        )


if TYPE_CHECKING:

    def _implements_the_protocol(cluster: ZkCluster) -> ClusterMetadata:
        return cluster  # mypy checks that ZkCluster has every method of ClusterMetadata
