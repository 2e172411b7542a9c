"""ZooKeeper session state, background worker, registration and controller election.

:class:`ZkControl` is a component of :class:`~broker_core.cluster.zk.ZkCluster`, which
holds one and passes it the requests, the callback notifier and how to refresh its
caches. It follows the connection (kazoo's states), runs the worker that does the
background requests, each retried with backoff while ZooKeeper is away, keeps this
broker's ephemeral registration, and holds the election:

* the first registered broker to create the ephemeral ``controller`` znode is the
  controller, for as long as its session lives;
* the winner then increments the persistent counter ``controller_epoch`` with a
  version-conditional set, *before* it reports itself controller, so every controllership
  has an epoch higher than all before it. The controller's writes of partition state
  (``cluster.zk_leaders``, ``cluster.zk``) check that node's version in the same multi,
  so a deposed controller's write fails in ZooKeeper. Transaction coordinators do not
  use it: each follows the leader epoch of its ``__transaction_state`` partition
  (``server.coordination.state_coordinator``).

Losing control is reported promptly: at once on session loss (``LOST``), and when the
connection has been gone (``SUSPENDED``) for ``suspended_grace_s``, a third of the session
timeout by default: kazoo notices a dead connection up to two thirds of the timeout late,
after which the server may have expired the session and another broker taken over. A
broker that reconnects in the same session and still owns ``controller`` regains control
(with the same epoch: nobody else can have been controller meanwhile).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from enum import Enum

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState

from broker_core.cluster.metadata import CallbackNotifier
from broker_core.cluster.records import CONTROL_DOC_VERSION, BrokerInfo, load_json_object
from broker_core.cluster.zk_requests import ZkRequests, ZkUnavailable
from broker_core.errors import (
    CorruptRecordError,
    DuplicateBrokerRegistrationError,
    IdemlogError,
    InvalidRequestError,
    RequestTimedOutError,
)
from broker_core.protocol.replica import NO_BROKER_EPOCH
from broker_core.security import zk_acl

log = logging.getLogger("idemlog.cluster")

DEFAULT_SESSION_TIMEOUT_S = 10.0
_RETRY_INITIAL_S, _RETRY_MAX_S = 0.05, 2.0
NO_CONTROLLER_EPOCH = 0  # before any election: every elected controller's epoch is higher


class ZkTask(Enum):
    """Background work, run in this order when several are due."""

    REGISTER = 1
    BROKERS = 2  # before CONTROLLER, so a new controller's address is known when it is named
    CONTROLLER = 3
    TOPICS = 4
    TOPIC_STATES = 5  # re-read the topics whose node data changed (per-topic data watches)
    LEADERS = 6  # the controller's election pass, after the brokers and topics are current


class ZkControl:
    """Connection state, the worker, this broker's registration and the election.

    ``requests`` wraps the caller's started kazoo client; ``refresh(task)`` runs the
    caller's tasks (BROKERS, TOPICS, TOPIC_STATES, LEADERS) on the worker thread, where
    an exception retries the task with backoff; ``notifier`` runs the
    controller callbacks. The state listener is attached at construction: call
    :meth:`start` to start the worker, or :meth:`detach` to give up before starting.
    """

    def __init__(
        self,
        requests: ZkRequests,
        root: str,
        *,
        notifier: CallbackNotifier,
        refresh: Callable[[ZkTask], object],
        request_timeout_s: float,
        registration_timeout_s: float,
        suspended_grace_s: float,
    ) -> None:
        self._requests = requests
        self._client = requests.client
        self._refresh = refresh
        self._notifier = notifier
        self._ids_path = f"{root}/brokers/ids"
        self._controller_path = f"{root}/controller"
        self._epoch_path = f"{root}/controller_epoch"
        self._request_timeout_s = request_timeout_s
        self.registration_timeout_s = registration_timeout_s
        self._suspended_grace_s = suspended_grace_s

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
        self._rival: tuple[int, bytes] | None = None  # (session, data) holding our broker id
        self._registered_session: int | None = None
        self._broker_epoch = NO_BROKER_EPOCH  # the registration's czxid, once registered
        # The controller node as last read: which broker, and which session owns it.
        self._controller_id: int | None = None
        self._controller_owner: int | None = None
        self._controller_checked_session: int | None = None
        self._reported_controller = False
        # The controller epoch last written (as the winner) or read; the session that won.
        self._controller_epoch = NO_CONTROLLER_EPOCH
        self._epoch_session: int | None = None
        # The controller_epoch node's version right after this broker's bump: the fence
        # its metadata writes carry (a newer controller's bump changes it).
        self._epoch_version: int | None = None
        self._controller_callbacks: list[Callable[[bool], None]] = []
        self._pending: set[ZkTask] = set()
        self._not_before: dict[ZkTask, float] = {}
        self._failures: dict[ZkTask, int] = {}
        self._worker: threading.Thread | None = None
        self._unregister: tuple[int, BrokerInfo] | None = None  # (session, broker) at close
        # Through the session, so that it counts as connected before this reacts to it.
        requests.session.add_listener(self._on_state)
        if requests.session.connected:
            self._on_state(KazooState.CONNECTED)

    def start(self) -> None:
        """Start the worker thread (once)."""
        self._worker = threading.Thread(target=self._run, name="idemlog-cluster", daemon=True)
        self._worker.start()

    def detach(self) -> None:
        """Stop following the connection (a constructor failing before :meth:`start`)."""
        self._requests.session.remove_listener(self._on_state)

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    def controller_epoch(self) -> int:
        """The epoch of the current controllership: this broker's own while it is the
        controller (set before it was reported), else the last value read."""
        with self._lock:
            return self._controller_epoch

    def is_controller(self) -> bool:
        with self._lock:
            return self._is_controller_locked()

    def controller_fence(self) -> tuple[int, int] | None:
        """(controller epoch, version of the ``controller_epoch`` node as this broker's bump
        left it) while this broker is the controller, else None. A write made conditional
        on that version (a multi with a ``check``) is refused once a newer controller has
        bumped the epoch, so a deposed controller cannot overwrite its successor's work."""
        with self._lock:
            if not self._is_controller_locked() or self._epoch_version is None:
                return None
            return self._controller_epoch, self._epoch_version

    def controller(self) -> tuple[BrokerInfo | None, int | None]:
        """(this broker, None) while it is the controller, else (None, the controller's id
        or None)."""
        with self._lock:
            if self._is_controller_locked():
                return self._broker, None
            return None, self._controller_id

    def on_controller_change(self, callback: Callable[[bool], None]) -> None:
        """``callback(is_controller)`` on every gain and loss, on the notifier thread.

        Added while this broker is the controller, it gets ``True`` first: every subscriber
        sees ``True, False, True, ...`` and never misses a gain.
        """
        with self._lock:
            self._controller_callbacks.append(callback)
            if self._reported_controller:
                self._notifier.post([callback], True)

    def broker_epoch(self) -> int:
        """The creation zxid of this broker's registration in its current session, or
        NO_BROKER_EPOCH while not registered."""
        with self._lock:
            return self._broker_epoch if self._registered_locked() else NO_BROKER_EPOCH

    def register(self, broker: BrokerInfo) -> None:
        """Create this broker's ephemeral registration; from then on it is kept up.

        Waits up to ``registration_timeout_s`` for another session's registration of the
        same id (a killed predecessor whose session has not expired yet) to go away, else
        raises :class:`DuplicateBrokerRegistrationError`; RequestTimedOutError (retriable)
        when ZooKeeper stayed unavailable. Returns once registered and once the election
        has been tried, so :meth:`is_controller` is current.
        """
        with self._cond:
            self.check_open()
            if self._broker is not None and self._broker != broker:
                raise InvalidRequestError(f"cannot register {broker}: already {self._broker}")
            self._broker, self._rival = broker, None
            self._request_locked(ZkTask.REGISTER)
            deadline = time.monotonic() + self.registration_timeout_s
            if not self._cond.wait_for(
                lambda: self._closed or self._registered_locked(), self.registration_timeout_s
            ):
                self._broker = None  # the worker undoes a success that comes too late
                self._pending.discard(ZkTask.REGISTER)
                raise self._registration_error(broker, self._rival)
            self.check_open()
            self._cond.wait_for(  # the election; if it fails now it is retried in background
                lambda: self._closed or self._controller_checked_session == self._session_id,
                max(0.0, deadline - time.monotonic()),
            )

    def close(self) -> None:
        """Give up control and stop the worker; :meth:`unregister` then deletes the nodes.

        Idempotent. The controller callbacks already posted still run (the caller closes
        the notifier, waiting for them, before :meth:`unregister`)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            session = self._session_id
            broker = self._broker if self._registered_locked() else None
            if broker is not None and session is not None:
                self._unregister = (session, broker)
            self._publish_control_locked()
            self._cancel_suspended_timer_locked()
            self._cond.notify_all()
        self._requests.session.remove_listener(self._on_state)
        worker = self._worker
        if worker is not None and threading.current_thread() is not worker:
            worker.join(self._request_timeout_s + 1.0)

    def unregister(self) -> None:
        """After :meth:`close`: delete this broker's ephemeral nodes so the others notice
        at once (best effort; they go with the session anyway)."""
        with self._lock:
            found, self._unregister = self._unregister, None
        if found is not None:
            session, broker = found
            self._requests.delete_own(self._controller_path, session)
            self._requests.delete_own(f"{self._ids_path}/{broker.broker_id}", session)
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
                self._pending.update(t for t in ZkTask if t is not ZkTask.REGISTER or self._broker)
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

    def request(self, task: ZkTask, *_: object) -> bool | None:
        """Queue ``task`` (from a watch: never blocks); ``False`` once closed ends a recipe."""
        with self._cond:
            if self._closed:
                return False
            self._request_locked(task)
        return None

    def _request_locked(self, task: ZkTask) -> None:
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
                    if task is ZkTask.CONTROLLER:
                        self._check_controller()
                    elif task is ZkTask.REGISTER:
                        self._register_now()
                    else:
                        self._refresh(task)
                except Exception as exc:
                    self._retry_later(task, exc)
                else:
                    with self._lock:
                        self._failures.pop(task, None)
                        self._not_before.pop(task, None)

    def _retry_later(self, task: ZkTask, exc: Exception) -> None:
        with self._cond:
            failures = self._failures[task] = self._failures.get(task, 0) + 1
            delay = min(_RETRY_INITIAL_S * 2 ** (failures - 1), _RETRY_MAX_S)
            self._not_before[task] = time.monotonic() + delay
            self._request_locked(task)
        level = logging.DEBUG if isinstance(exc, ZkUnavailable) else logging.WARNING
        log.log(level, "cluster metadata: %s failed (%r), retrying in %.2fs", task.name, exc, delay)

    def _check_controller(self) -> None:
        """Read the controller node; if there is none and this broker is registered, try to
        become the controller by creating it (the first creator wins)."""
        with self._lock:
            session, broker = self._session_id, self._broker
            eligible = broker is not None and self._registered_locked()
        while True:
            try:
                data, stat = self._requests.call(
                    functools.partial(self._client.get_async, self._controller_path)
                )
            except NoNodeError:
                if not eligible or broker is None:
                    self._observe_controller(session, None, None)
                    return
                doc = {"version": CONTROL_DOC_VERSION, "broker_id": broker.broker_id}
                create = functools.partial(
                    zk_acl.create_async,
                    self._client,
                    self._controller_path,
                    json.dumps(doc, separators=(",", ":")).encode(),
                    ephemeral=True,
                )
                try:
                    self._requests.call(create)
                except NodeExistsError:
                    continue  # somebody else won: read who
                self._won_election(session)
                self._observe_controller(session, broker.broker_id, session)
                return
            owner = stat.ephemeralOwner
            if owner == session and session is not None:
                self._won_election(session)  # e.g. our create's reply was lost, or a retry
            else:
                self._read_controller_epoch(session)
            self._observe_controller(session, self._parse_controller(data), owner)
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

    # -- registration ------------------------------------------------------------------------

    def _register_now(self) -> None:
        with self._lock:
            broker, session = self._broker, self._session_id
        if broker is None or session is None:
            return
        path = f"{self._ids_path}/{broker.broker_id}"
        # NodeExistsError: ours already (a lost reply, a reconnect), or a predecessor's.
        with contextlib.suppress(NodeExistsError):
            self._requests.call(
                functools.partial(
                    zk_acl.create_async, self._client, path, broker.to_json(), ephemeral=True
                )
            )
        try:  # the watch re-runs this task when a rival's node goes away
            data, stat = self._requests.call(
                functools.partial(self._client.get_async, path, watch=self._on_rival_gone)
            )
        except NoNodeError:
            self.request(ZkTask.REGISTER)  # gone in between: create again
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
        with self._cond:
            cancelled = self._broker != broker or self._closed  # register() gave up meanwhile
            if not cancelled:
                if self._registered_session != session:
                    log.info(
                        "broker %d registered at %s, broker epoch %d",
                        broker.broker_id,
                        path,
                        stat.czxid,
                    )
                self._registered_session, self._rival = session, None
                # The node's creation zxid: a later process's (or session's) is larger.
                self._broker_epoch = int(stat.czxid)
                self._request_locked(ZkTask.BROKERS)
                self._request_locked(ZkTask.CONTROLLER)
        if cancelled:
            self._requests.delete_own(path, session)

    def _on_rival_gone(self, event: object) -> None:
        self.request(ZkTask.REGISTER)

    def _registration_error(
        self, broker: BrokerInfo, rival: tuple[int, bytes] | None
    ) -> IdemlogError:
        chroot = getattr(self._client, "chroot", "") or ""
        path = f"{chroot}{self._ids_path}/{broker.broker_id}"
        waited = f"{self.registration_timeout_s:g}s"
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

    # -- the controller epoch ------------------------------------------------------------------

    def _won_election(self, session: int | None) -> None:
        """Bump the controller epoch once per controllership (per session that won)."""
        with self._lock:
            if self._epoch_session == session:
                return
        epoch, version = self._bump_controller_epoch()
        with self._lock:
            self._controller_epoch, self._epoch_session = epoch, session
            self._epoch_version = version
        log.info("controller epoch is now %d", epoch)

    def bump_controller_epoch(self) -> int:
        """Increment ``controller_epoch`` by a version-conditional set; retried on a race.

        A retry after a lost reply may increment twice: epochs only need to grow.
        """
        return self._bump_controller_epoch()[0]

    def _bump_controller_epoch(self) -> tuple[int, int]:
        """:meth:`bump_controller_epoch`, with the node's version after the bump."""
        client = self._client
        while True:
            try:
                data, stat = self._requests.call(
                    functools.partial(client.get_async, self._epoch_path)
                )
            except NoNodeError:
                first = NO_CONTROLLER_EPOCH + 1
                create = functools.partial(
                    zk_acl.create_async, client, self._epoch_path, _epoch_doc(first), makepath=True
                )
                try:
                    self._requests.call(create)
                except NodeExistsError:
                    continue  # created meanwhile: increment that one
                return first, 0  # a new node's version
            epoch = self._parse_epoch(data) + 1
            update = functools.partial(
                client.set_async, self._epoch_path, _epoch_doc(epoch), version=stat.version
            )
            try:
                written = self._requests.call(update)
            except BadVersionError:
                continue  # another broker's increment came first: increment again
            return epoch, int(written.version)

    def _read_controller_epoch(self, session: int | None) -> None:
        try:
            data, _ = self._requests.call(
                functools.partial(self._client.get_async, self._epoch_path)
            )
        except NoNodeError:
            return
        epoch = self._parse_epoch(data)
        with self._lock:
            if session == self._session_id and epoch > self._controller_epoch:
                self._controller_epoch = epoch

    def _parse_epoch(self, data: bytes) -> int:
        doc = load_json_object(data, self._epoch_path)
        epoch = doc.get("controller_epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise CorruptRecordError(
                f"{self._epoch_path}: controller_epoch={epoch!r} is not an integer >= 0"
            )
        return epoch

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
            if now:
                # A new controller first brings every partition's leader up to date.
                self._request_locked(ZkTask.LEADERS)
            if self._broker is not None:
                log.info(
                    "broker %d is %s the controller",
                    self._broker.broker_id,
                    "now" if now else "no longer",
                )
            self._notifier.post(list(self._controller_callbacks), now)

    def check_open(self) -> None:
        if self._closed:
            raise InvalidRequestError("the cluster metadata client is closed")


def _epoch_doc(epoch: int) -> bytes:
    doc = {"version": CONTROL_DOC_VERSION, "controller_epoch": epoch}
    return json.dumps(doc, separators=(",", ":")).encode()
