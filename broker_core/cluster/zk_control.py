"""ZooKeeper session, background worker and controller election of :class:`ZkCluster`.

:class:`ZkControl` is the base of :class:`~broker_core.cluster.zk.ZkCluster`: it follows
the connection (kazoo's states), runs the worker that does the background requests, each
retried with backoff while ZooKeeper is away, and holds the election:

* the first registered broker to create the ephemeral ``controller`` znode is the
  controller, for as long as its session lives;
* the winner then increments the persistent counter ``controller_epoch`` with a
  version-conditional set, *before* it reports itself controller, so every controllership
  has an epoch higher than all before it. The transaction coordinator it starts stamps
  that epoch on its state and markers, and whatever a newer coordinator wrote refuses an
  older one (TRANSACTION_COORDINATOR_FENCED, Kafka's coordinator epoch).

Losing control is reported promptly: at once on session loss (``LOST``), and when the
connection has been gone (``SUSPENDED``) for ``suspended_grace_s``, a third of the session
timeout by default: kazoo notices a dead connection up to two thirds of the timeout late,
after which the server may have expired the session and another broker taken over. A
broker that reconnects in the same session and still owns ``controller`` regains control
(with the same epoch: nobody else can have been controller meanwhile).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from enum import Enum
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState

from broker_core.cluster.metadata import (
    METADATA_VERSION,
    BrokerInfo,
    CallbackNotifier,
    load_json_object,
)
from broker_core.cluster.zk_requests import ZkRequests, ZkUnavailable
from broker_core.errors import CorruptRecordError, InvalidRequestError
from broker_core.zookeeper import ZkSession

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


class ZkControl(ABC):
    """Connection state, the worker and the election; ZkCluster adds the rest."""

    def __init__(
        self,
        client: Any,
        root: str,
        *,
        request_timeout_s: float | None,
        registration_timeout_s: float | None,
        suspended_grace_s: float | None,
    ) -> None:
        if not root.startswith("/") or root.endswith("/") or "//" in root:
            raise InvalidRequestError(f"ZooKeeper root {root!r} must be an absolute path")
        session_ms = getattr(client, "_session_timeout", None)  # kazoo keeps it in ms
        session_s = session_ms / 1000.0 if session_ms else DEFAULT_SESSION_TIMEOUT_S
        self._client = client
        self._controller_path = f"{root}/controller"
        self._epoch_path = f"{root}/controller_epoch"
        self._request_timeout_s = request_timeout_s or session_s
        self._registration_timeout_s = registration_timeout_s or 2 * session_s
        self._suspended_grace_s = suspended_grace_s or session_s / 3
        self._requests = ZkRequests(ZkSession(client, request_timeout_s=self._request_timeout_s))

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
        # The controller node as last read: which broker, and which session owns it.
        self._controller_id: int | None = None
        self._controller_owner: int | None = None
        self._controller_checked_session: int | None = None
        self._reported_controller = False
        # The controller epoch last written (as the winner) or read; the session that won.
        self._controller_epoch = NO_CONTROLLER_EPOCH
        self._epoch_session: int | None = None
        self._controller_callbacks: list[Callable[[bool], None]] = []
        self._pending: set[ZkTask] = set()
        self._not_before: dict[ZkTask, float] = {}
        self._failures: dict[ZkTask, int] = {}
        self._notifier = CallbackNotifier("idemlog-cluster-callbacks")

    def controller_epoch(self) -> int:
        """The epoch of the current controllership: this broker's own while it is the
        controller (set before it was reported), else the last value read."""
        with self._lock:
            return self._controller_epoch

    @abstractmethod
    def _run_task(self, task: ZkTask) -> None:
        """One background task other than the election (REGISTER, BROKERS, TOPICS)."""

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

    def _request(self, task: ZkTask, *_: object) -> bool | None:
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
                    else:
                        self._run_task(task)
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
                doc = {"version": METADATA_VERSION, "broker_id": broker.broker_id}
                create = functools.partial(
                    self._client.create_async,
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

    # -- the controller epoch ------------------------------------------------------------------

    def _won_election(self, session: int | None) -> None:
        """Bump the controller epoch once per controllership (per session that won)."""
        with self._lock:
            if self._epoch_session == session:
                return
        epoch = self._bump_controller_epoch()
        with self._lock:
            self._controller_epoch, self._epoch_session = epoch, session
        log.info("controller epoch is now %d", epoch)

    def _bump_controller_epoch(self) -> int:
        """Increment ``controller_epoch`` by a version-conditional set; retried on a race.

        A retry after a lost reply may increment twice: epochs only need to grow.
        """
        client = self._client
        while True:
            try:
                data, stat = self._requests.call(
                    functools.partial(client.get_async, self._epoch_path)
                )
            except NoNodeError:
                first = NO_CONTROLLER_EPOCH + 1
                create = functools.partial(
                    client.create_async, self._epoch_path, _epoch_doc(first), makepath=True
                )
                try:
                    self._requests.call(create)
                except NodeExistsError:
                    continue  # created meanwhile: increment that one
                return first
            epoch = self._parse_epoch(data) + 1
            update = functools.partial(
                client.set_async, self._epoch_path, _epoch_doc(epoch), version=stat.version
            )
            try:
                self._requests.call(update)
            except BadVersionError:
                continue  # another broker's increment came first: increment again
            return epoch

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
            if self._broker is not None:
                log.info(
                    "broker %d is %s the controller",
                    self._broker.broker_id,
                    "now" if now else "no longer",
                )
            self._notifier.post(list(self._controller_callbacks), now)

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidRequestError("the cluster metadata client is closed")


def _epoch_doc(epoch: int) -> bytes:
    doc = {"version": METADATA_VERSION, "controller_epoch": epoch}
    return json.dumps(doc, separators=(",", ":")).encode()
