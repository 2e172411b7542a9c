"""Cluster metadata in ZooKeeper: live brokers, the controller, topic assignments.

Layout under ``root`` (default ``/idemlog``)::

    brokers/ids/<id>   ephemeral   {"version": 1, "host", "port"}   one per live broker
    controller         ephemeral   {"version": 1, "broker_id"}      the controller
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

Losing control is reported promptly: at once on session loss (``LOST``), and when the
connection has been gone (``SUSPENDED``) for ``suspended_grace_s``, a third of the session
timeout by default: kazoo notices a dead connection up to two thirds of the timeout late,
after which the server may have expired the session and another broker taken over. A
broker that reconnects in the same session and still owns ``controller`` regains control.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.protocol.states import KazooState
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from broker_core.cluster import (
    METADATA_VERSION,
    BrokerInfo,
    CallbackNotifier,
    ClusterMetadata,
    TopicAssignment,
    assign_partitions,
    load_json_object,
    validate_new_topic,
)
from broker_core.errors import (
    CorruptRecordError,
    DuplicateBrokerRegistrationError,
    IdemlogError,
    InvalidRequestError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from broker_core.store import validate_topic_name

log = logging.getLogger("idemlog.cluster")

_DEFAULT_SESSION_TIMEOUT_S = 10.0
_RETRY_INITIAL_S, _RETRY_MAX_S = 0.05, 2.0
_CONNECTION_ERRORS = (
    ConnectionLoss,
    SessionExpiredError,
    ConnectionClosedError,
    OperationTimeoutError,
)


class _Task(Enum):
    """Background work, run in this order when several are due."""

    REGISTER = 1
    BROKERS = 2  # before CONTROLLER, so a new controller's address is known when it is named
    CONTROLLER = 3
    TOPICS = 4


class _Unavailable(Exception):
    """Internal: ZooKeeper cannot be reached right now."""


class ZkCluster:
    """:class:`~broker_core.cluster.ClusterMetadata` kept in ZooKeeper (see the module doc).

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
        session_s = session_ms / 1000.0 if session_ms else _DEFAULT_SESSION_TIMEOUT_S
        self._client = client
        self._ids_path = f"{root}/brokers/ids"
        self._topics_path = f"{root}/topics"
        self._controller_path = f"{root}/controller"
        self._request_timeout_s = request_timeout_s or session_s
        self._registration_timeout_s = registration_timeout_s or 2 * session_s
        self._suspended_grace_s = suspended_grace_s or session_s / 3

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        # The connection as last reported to the listener; the session id outlives SUSPENDED.
        self._connected = False
        self._session_id: int | None = None
        self._suspension = 0  # bumped on every SUSPENDED: a stale grace timer does nothing
        self._suspended_timer: threading.Timer | None = None
        self._resigned = False  # suspended past the grace period
        self._broker: BrokerInfo | None = None
        self._registered_session: int | None = None
        self._rival: tuple[int, bytes] | None = None  # (session, data) holding our broker id
        # The controller node as last read: which broker, and which session owns it.
        self._controller_id: int | None = None
        self._controller_owner: int | None = None
        self._controller_checked_session: int | None = None
        self._reported_controller = False
        # Each cache keeps the zxid of the last child change it reflects, so a snapshot read
        # concurrently but older never replaces a newer one.
        self._brokers: dict[int, BrokerInfo] = {}
        self._brokers_zxid = -1
        self._topics: dict[str, TopicAssignment] = {}
        self._topics_zxid = -1
        self._controller_callbacks: list[Callable[[bool], None]] = []
        self._topics_callbacks: list[Callable[[], None]] = []
        self._pending: set[_Task] = set()
        self._not_before: dict[_Task, float] = {}
        self._failures: dict[_Task, int] = {}

        self._notifier = CallbackNotifier("idemlog-cluster-callbacks")
        client.add_listener(self._on_state)
        if client.connected:
            self._on_state(KazooState.CONNECTED)
        try:
            for path in (self._ids_path, self._topics_path):
                self._admin("creating " + path, functools.partial(client.ensure_path_async, path))
            self._refresh(_Task.BROKERS, "reading the live brokers")
            self._refresh(_Task.TOPICS, "reading the topics")
        except BaseException:
            client.remove_listener(self._on_state)
            self._notifier.close(0.0)
            raise
        self._worker = threading.Thread(target=self._run, name="idemlog-cluster", daemon=True)
        self._worker.start()
        # The recipes re-arm their watches across reconnects and sessions; their callbacks
        # only hand the work to the worker (returning False, once closed, ends a recipe).
        ChildrenWatch(client, self._ids_path, lambda _: self._request(_Task.BROKERS))
        ChildrenWatch(client, self._topics_path, lambda _: self._request(_Task.TOPICS))
        DataWatch(client, self._controller_path, lambda *_: self._request(_Task.CONTROLLER))

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
            self._request_locked(_Task.REGISTER)
            deadline = time.monotonic() + self._registration_timeout_s
            if not self._cond.wait_for(
                lambda: self._closed or self._registered_locked(), self._registration_timeout_s
            ):
                self._broker = None  # the worker undoes a success that comes too late
                self._pending.discard(_Task.REGISTER)
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
        live = self._refresh(_Task.BROKERS, f"creating topic {name!r} (reading the live brokers)")
        assignment = TopicAssignment(
            name, assign_partitions(name, partitions, list(live)), schema, overrides
        )
        data = json.dumps(assignment.to_doc(), separators=(",", ":")).encode()
        path, get = f"{self._topics_path}/{name}", self._client.get_async

        def ours_after_lost_reply() -> bool:
            # Same bytes: our create went through (a rival creating the very same assignment
            # at the same moment would be the same outcome).
            try:
                stored, _ = self._admin("reading " + path, functools.partial(get, path))
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

    def topics(self) -> dict[str, TopicAssignment]:
        with self._lock:
            return dict(self._topics)

    def topic(self, name: str) -> TopicAssignment:
        with self._lock:
            assignment = self._topics.get(name)
        if assignment is None:
            validate_topic_name(name)
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return assignment

    def on_topics_change(self, callback: Callable[[], None]) -> None:
        """``callback()`` on the notifier thread whenever :meth:`topics` changes."""
        with self._lock:
            self._topics_callbacks.append(callback)

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
            self._delete_own(self._controller_path, session)
            self._delete_own(f"{self._ids_path}/{broker.broker_id}", session)
            log.info("broker %d unregistered", broker.broker_id)

    # -- connection state: kazoo's connection thread, must not block ---------------------------

    def _on_state(self, state: str) -> None:
        with self._cond:
            if self._closed:
                return
            self._cancel_suspended_timer_locked()
            if state == KazooState.CONNECTED:
                client_id = self._client.client_id
                session = client_id[0] if client_id else None
                if self._session_id is not None and session != self._session_id:
                    self._lose_session_locked()  # a new session without LOST seen first
                self._connected, self._session_id = True, session
                # Whatever changed while disconnected, re-check everything now.
                self._not_before.clear()
                self._failures.clear()
                self._pending.update(t for t in _Task if t is not _Task.REGISTER or self._broker)
            elif state == KazooState.SUSPENDED:
                self._connected = False
                self._suspension += 1
                timer = threading.Timer(
                    self._suspended_grace_s, self._on_suspended_too_long, (self._suspension,)
                )
                timer.daemon = True
                self._suspended_timer = timer
                timer.start()  # starting a thread does not block
            elif state == KazooState.LOST:
                self._connected = False
                self._lose_session_locked()
            self._cond.notify_all()

    def _lose_session_locked(self) -> None:
        if self._registered_session is not None and self._broker is not None:
            log.warning(
                "ZooKeeper session lost: broker %d is no longer registered; it registers again "
                "in a new session",
                self._broker.broker_id,
            )
        self._session_id = self._registered_session = self._controller_owner = None
        self._resigned = False
        self._publish_control_locked()

    def _on_suspended_too_long(self, suspension: int) -> None:
        with self._lock:
            if self._closed or self._connected or suspension != self._suspension:
                return
            self._resigned = True
            if self._reported_controller:
                log.warning(
                    "no ZooKeeper connection for %.1fs: the session may have expired, so this "
                    "broker stops acting as the controller until it reconnects",
                    self._suspended_grace_s,
                )
            self._publish_control_locked()

    def _cancel_suspended_timer_locked(self) -> None:
        if self._suspended_timer is not None:
            self._suspended_timer.cancel()
            self._suspended_timer = None

    # -- the worker ---------------------------------------------------------------------------

    def _request(self, task: _Task, *_: object) -> bool | None:
        """Queue ``task`` (from a watch: never blocks); ``False`` once closed ends a recipe."""
        with self._cond:
            if self._closed:
                return False
            self._request_locked(task)
        return None

    def _request_locked(self, task: _Task) -> None:
        self._pending.add(task)
        self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    now = time.monotonic()
                    waiting = (
                        sorted(self._pending, key=lambda t: t.value) if self._connected else []
                    )
                    due = [t for t in waiting if self._not_before.get(t, 0.0) <= now]
                    if due:
                        self._pending.difference_update(due)
                        break
                    retry_at = [self._not_before[t] for t in waiting]
                    self._cond.wait(min(retry_at) - now if retry_at else None)
            for task in due:
                try:
                    if task is _Task.REGISTER:
                        self._register_now()
                    elif task is _Task.CONTROLLER:
                        self._check_controller()
                    else:
                        self._refresh(task)
                except Exception as exc:
                    self._retry_later(task, exc)
                else:
                    with self._lock:
                        self._failures.pop(task, None)
                        self._not_before.pop(task, None)

    def _retry_later(self, task: _Task, exc: Exception) -> None:
        with self._cond:
            failures = self._failures[task] = self._failures.get(task, 0) + 1
            delay = min(_RETRY_INITIAL_S * 2 ** (failures - 1), _RETRY_MAX_S)
            self._not_before[task] = time.monotonic() + delay
            self._request_locked(task)
        level = logging.DEBUG if isinstance(exc, _Unavailable) else logging.WARNING
        log.log(level, "cluster metadata: %s failed (%r), retrying in %.2fs", task.name, exc, delay)

    def _register_now(self) -> None:
        with self._lock:
            broker, session = self._broker, self._session_id
        if broker is None or session is None:
            return
        path = f"{self._ids_path}/{broker.broker_id}"
        try:
            self._call(
                functools.partial(self._client.create_async, path, broker.to_json(), ephemeral=True)
            )
        except NodeExistsError:
            try:  # the watch re-runs this task when a rival's node goes away
                data, stat = self._call(
                    functools.partial(self._client.get_async, path, watch=self._on_rival_gone)
                )
            except NoNodeError:
                self._request(_Task.REGISTER)  # gone in between: create again
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
                self._request_locked(_Task.BROKERS)
                self._request_locked(_Task.CONTROLLER)
        if cancelled:
            self._delete_own(path, session)

    def _on_rival_gone(self, event: object) -> None:
        self._request(_Task.REGISTER)

    def _check_controller(self) -> None:
        """Read the controller node; if there is none and this broker is registered, try to
        become the controller by creating it (the first creator wins)."""
        with self._lock:
            session, broker = self._session_id, self._broker
            eligible = broker is not None and self._registered_locked()
        while True:
            try:
                data, stat = self._call(
                    functools.partial(self._client.get_async, self._controller_path)
                )
            except NoNodeError:
                if not eligible or broker is None:
                    self._observe_controller(session, None, None)
                    return
                doc = {"version": METADATA_VERSION, "broker_id": broker.broker_id}
                create = functools.partial(
                    self._client.create_async,
                    self._controller_path,
                    json.dumps(doc, separators=(",", ":")).encode(),
                    ephemeral=True,
                )
                try:
                    self._call(create)
                except NodeExistsError:
                    continue  # somebody else won: read who
                self._observe_controller(session, broker.broker_id, session)
                return
            self._observe_controller(session, self._parse_controller(data), stat.ephemeralOwner)
            return

    def _parse_controller(self, data: bytes) -> int | None:
        try:
            broker_id = load_json_object(data, self._controller_path).get("broker_id")
        except CorruptRecordError as exc:
            log.warning("unreadable controller node: %s", exc)
            return None
        return broker_id if isinstance(broker_id, int) and not isinstance(broker_id, bool) else None

    def _observe_controller(
        self, session: int | None, broker_id: int | None, owner: int | None
    ) -> None:
        with self._cond:
            if session != self._session_id or self._closed:
                return  # the session changed meanwhile; a fresh check is queued
            if broker_id != self._controller_id:
                log.info("the controller is broker %s", broker_id)
            self._controller_id, self._controller_owner = broker_id, owner
            if self._connected:
                self._resigned = False  # read over a live connection: the session lives
            if self._registered_locked():
                self._controller_checked_session = session
            self._publish_control_locked()
            self._cond.notify_all()

    def _registered_locked(self) -> bool:
        return self._session_id is not None and self._registered_session == self._session_id

    def _is_controller_locked(self) -> bool:
        return (
            not self._closed
            and not self._resigned
            and self._registered_locked()
            and self._controller_owner == self._session_id
        )

    def _publish_control_locked(self) -> None:
        now = self._is_controller_locked()
        if now != self._reported_controller:
            self._reported_controller = now
            if self._broker is not None:
                log.info(
                    "broker %d is %s the controller",
                    self._broker.broker_id,
                    "now" if now else "no longer",
                )
            self._notifier.post(list(self._controller_callbacks), now)

    # -- caches -------------------------------------------------------------------------------

    def _refresh(self, task: _Task, foreground: str | None = None) -> dict[Any, Any]:
        """Re-read the brokers or the topics and update that cache; returns what was read.

        ``foreground`` names what a caller is doing, for the error if ZooKeeper is away.
        """
        brokers = task is _Task.BROKERS
        path = self._ids_path if brokers else self._topics_path
        try:
            zxid, docs = self._read_children(path)
        except _Unavailable as exc:
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
        children, stat = self._call(
            functools.partial(self._client.get_children_async, path, include_data=True)
        )
        requests = {c: self._client.get_async(f"{path}/{c}") for c in children}
        docs: dict[str, bytes] = {}
        for child, request in requests.items():
            try:
                docs[child] = bytes(self._wait(request)[0])
            except NoNodeError:
                continue  # deleted since the listing
        return int(stat.pzxid), docs

    # -- ZooKeeper requests -------------------------------------------------------------------

    def _call(self, request: Callable[[], Any]) -> Any:
        """One async request, bounded by ``request_timeout_s``; never queued into a
        disconnected client (kazoo would hold it until it reconnects)."""
        if not self._client.connected:
            raise _Unavailable("not connected to ZooKeeper")
        return self._wait(request())

    def _wait(self, request: Any) -> Any:
        try:
            return request.get(timeout=self._request_timeout_s)
        except _CONNECTION_ERRORS as exc:
            raise _Unavailable(type(exc).__name__) from exc
        except KazooException:
            raise
        except Exception as exc:
            if isinstance(exc, self._client.handler.timeout_exception):
                raise _Unavailable(f"no reply within {self._request_timeout_s:g}s") from exc
            raise

    def _admin(self, what: str, request: Callable[[], Any]) -> Any:
        """A request for a caller: ZooKeeper trouble becomes a typed, named error."""
        try:
            return self._call(request)
        except _Unavailable as exc:
            raise RequestTimedOutError(f"ZooKeeper unavailable while {what}: {exc}") from exc
        except (NoNodeError, NodeExistsError):
            raise
        except KazooException as exc:
            raise UnknownServerError(f"ZooKeeper refused {what}: {exc!r}") from exc

    def _write_once(
        self,
        what: str,
        request: Callable[[], Any],
        conflict: type[KazooException],
        resolved_after_lost_reply: Callable[[], bool],
        error: IdemlogError,
    ) -> None:
        """Run a create/delete; retried across a dropped connection within the timeout.

        A write whose reply was lost may have been applied, so a ``conflict`` on the retry
        is success when ``resolved_after_lost_reply()`` says so, else ``error``.
        """
        deadline = time.monotonic() + self._request_timeout_s
        ambiguous = False
        while True:
            try:
                self._admin(what, request)
                break
            except RequestTimedOutError:
                ambiguous = True
                with self._cond:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._cond.wait_for(
                        lambda: self._connected or self._closed, remaining
                    ):
                        raise
                self._check_open()
            except conflict:
                if ambiguous and resolved_after_lost_reply():
                    break
                raise error from None
        try:
            self._refresh(_Task.TOPICS)  # read-your-writes; the watch brings it a bit later
        except (_Unavailable, KazooException) as exc:
            log.debug("no cache refresh after %s: %r", what, exc)

    def _delete_own(self, path: str, session: int) -> None:
        """Delete ``path`` if it is an ephemeral node of ``session``; best effort."""
        try:
            _, stat = self._call(functools.partial(self._client.get_async, path))
            if stat.ephemeralOwner == session:
                self._call(functools.partial(self._client.delete_async, path, version=stat.version))
        except NoNodeError:
            pass
        except (_Unavailable, KazooException) as exc:
            log.warning("could not delete %s (%r); it goes when the session ends", path, exc)

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidRequestError("the cluster metadata client is closed")

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
