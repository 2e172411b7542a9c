"""Producer-id blocks leased from ZooKeeper node ``/latest_producer_id_block``.

See ``broker_core.txn.pid_block`` for the record and the leasing rules.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
)
from kazoo.protocol.states import KazooState

from broker_core.errors import (
    ProducerIdAllocationError,
)
from broker_core.txn.pid_block import (
    LATEST_PRODUCER_ID_BLOCK_PATH,
    ProducerIdBlock,
    check_broker_id,
    next_block_after,
)
from broker_core.zookeeper import ZK_UNAVAILABLE

log = logging.getLogger("idemlog.pid")

_STATE_TEXT = {
    KazooState.SUSPENDED: "connection lost, reconnecting",
    KazooState.LOST: "session expired or closed",
    "not started": "client not connected yet",
}


class _Unavailable(Exception):
    """Internal: ZooKeeper cannot be reached right now; the lease is retried."""


class ZkProducerIdBlockSource:
    """Leases blocks through the ZooKeeper node ``/latest_producer_id_block``.

    While ZooKeeper is unreachable or the session is being replaced, :meth:`next_block`
    retries with exponential backoff (logged on ``idemlog.pid``) until ``retry_deadline_s``
    has passed, then raises :class:`ProducerIdAllocationError`, which is retriable.
    A conflicting write by another broker is retried at once and is not bounded by a count,
    only by the same deadline: every conflict means somebody else made progress.
    """

    def __init__(
        self,
        client: Any,
        *,
        path: str = LATEST_PRODUCER_ID_BLOCK_PATH,
        retry_deadline_s: float = 30.0,
        initial_backoff_s: float = 0.1,
        max_backoff_s: float = 2.0,
        request_timeout_s: float = 10.0,
    ) -> None:
        if retry_deadline_s <= 0 or initial_backoff_s <= 0 or request_timeout_s <= 0:
            raise ValueError("deadline, backoff and request timeout must be positive")
        self._client = client
        self._path = path
        self._retry_deadline_s = retry_deadline_s
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max(max_backoff_s, initial_backoff_s)
        self._request_timeout_s = request_timeout_s
        self._stats_lock = threading.Lock()
        self._conflict_retries = 0
        self._unavailable_retries = 0
        # Connection state mirrored from kazoo's listener, so that a lease does not queue
        # requests into a disconnected client (kazoo would hold them until it reconnects),
        # and so that a backoff ends as soon as a *new* connection is up.
        self._state_cond = threading.Condition()
        self._connected = False
        self._connection_generation = 0
        self._last_state: str = "not started"
        client.add_listener(self._on_state_change)
        if client.connected:
            self._on_state_change(KazooState.CONNECTED)

    def close(self) -> None:
        """Detach from the client (which stays open; it belongs to the caller)."""
        self._client.remove_listener(self._on_state_change)

    @property
    def path(self) -> str:
        return self._path

    @property
    def conflict_retries(self) -> int:
        """How many times a write lost a race with another writer and was retried."""
        with self._stats_lock:
            return self._conflict_retries

    @property
    def unavailable_retries(self) -> int:
        """How many times a lease waited for ZooKeeper to come back."""
        with self._stats_lock:
            return self._unavailable_retries

    def _on_state_change(self, state: str) -> None:
        # Runs on kazoo's connection thread: must not block (the lock is held for a moment).
        with self._state_cond:
            self._last_state = state
            self._connected = state == KazooState.CONNECTED
            if self._connected:
                self._connection_generation += 1
                self._state_cond.notify_all()

    def _connection_snapshot(self) -> tuple[bool, int, str]:
        with self._state_cond:
            return self._connected, self._connection_generation, self._last_state

    def _backoff(self, delay: float, generation: int) -> None:
        """Wait ``delay``, or less if a connection newer than ``generation`` comes up.

        Only a new connection ends the wait early: if the failure happened on a connection
        that still looks up (kazoo reports the loss a moment later, or the server is slow),
        retrying at once would spin.
        """
        with self._state_cond:
            self._state_cond.wait_for(
                lambda: self._connected and self._connection_generation != generation, delay
            )

    def next_block(self, broker_id: int) -> ProducerIdBlock:
        check_broker_id(broker_id)
        deadline = time.monotonic() + self._retry_deadline_s
        attempt = 0
        while True:
            _, generation, _ = self._connection_snapshot()
            try:
                block = self._try_lease(broker_id, deadline)
            except (BadVersionError, NodeExistsError, NoNodeError) as exc:
                # Somebody else moved the record between our read and our write.
                with self._stats_lock:
                    self._conflict_retries += 1
                log.debug("producer id block lease lost a race (%s), re-reading", exc)
                if time.monotonic() >= deadline:
                    raise ProducerIdAllocationError(
                        f"could not lease a producer id block from ZooKeeper {self._path} "
                        f"within {self._retry_deadline_s:g}s: every write lost a race"
                    ) from exc
                continue
            except _Unavailable as exc:
                attempt += 1
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ProducerIdAllocationError(
                        f"ZooKeeper unavailable for {self._retry_deadline_s:g}s, gave up "
                        f"leasing a producer id block from {self._path} after {attempt} "
                        f"attempts: {exc}"
                    ) from exc
                with self._stats_lock:
                    self._unavailable_retries += 1
                delay = min(
                    self._initial_backoff_s * 2 ** (attempt - 1), self._max_backoff_s, remaining
                )
                log.warning(
                    "ZooKeeper unavailable (%s), retrying producer id block allocation in "
                    "%.2fs (attempt %d)",
                    exc,
                    delay,
                    attempt,
                )
                self._backoff(delay, generation)
                continue
            except KazooException as exc:
                # Not a connectivity problem (e.g. NoAuth): retrying will not help.
                raise ProducerIdAllocationError(
                    f"ZooKeeper refused the producer id block lease on {self._path}: {exc!r}"
                ) from exc
            if attempt:
                log.info(
                    "leased producer id block %d..%d after %d retries",
                    block.start,
                    block.end,
                    attempt,
                )
            return block

    def latest_block(self) -> ProducerIdBlock | None:
        """The most recently leased block (one read, no retry); None before the first lease.

        Raises :class:`ProducerIdAllocationError` (retriable) when ZooKeeper is unavailable.
        """
        try:
            data, _ = self._read_record(time.monotonic() + self._request_timeout_s)
        except _Unavailable as exc:
            raise ProducerIdAllocationError(
                f"cannot read {self._where()}: ZooKeeper unavailable ({exc})"
            ) from exc
        return None if data is None else ProducerIdBlock.from_record(data, self._where())

    def _try_lease(self, broker_id: int, deadline: float) -> ProducerIdBlock:
        """One read-compute-conditional-write round; conflict errors propagate."""
        data, version = self._read_record(deadline)
        previous = None if data is None else ProducerIdBlock.from_record(data, self._where())
        block = next_block_after(previous, broker_id)
        self._write_record(block, version, deadline)
        return block

    def _where(self) -> str:
        chroot = getattr(self._client, "chroot", "") or ""
        return f"in ZooKeeper node {chroot}{self._path}"

    def _read_record(self, deadline: float) -> tuple[bytes | None, int | None]:
        """The record and its znode version, or ``(None, None)`` if the node is absent."""
        try:
            data, stat = self._call(lambda: self._client.get_async(self._path), deadline)
        except NoNodeError:
            return None, None
        return bytes(data), int(stat.version)

    def _write_record(self, block: ProducerIdBlock, version: int | None, deadline: float) -> None:
        """Create the node (``version is None``) or set it if still at ``version``."""
        value = block.to_record()
        if version is None:
            self._call(
                lambda: self._client.create_async(self._path, value, makepath=True), deadline
            )
        else:
            self._call(lambda: self._client.set_async(self._path, value, version=version), deadline)

    def _call(self, request: Callable[[], Any], deadline: float) -> Any:
        """Run one async kazoo request, bounded by the request timeout and the deadline."""
        connected, _, state = self._connection_snapshot()
        if not connected:
            raise _Unavailable(_STATE_TEXT.get(state, f"client {state}"))
        timeout = max(0.0, min(self._request_timeout_s, deadline - time.monotonic()))
        try:
            return request().get(timeout=timeout)
        except ZK_UNAVAILABLE as exc:
            raise _Unavailable(type(exc).__name__) from exc
        except KazooException:
            raise  # conflicts (handled by the caller) and real errors such as NoAuth
        except Exception as exc:
            # The handler's timeout type depends on the kazoo handler in use.
            if isinstance(exc, self._client.handler.timeout_exception):
                # The request stays queued in kazoo. If a write runs later, it is conditional
                # on what was read, so it either fails or records a block nobody was given:
                # a wasted block, never a duplicate.
                raise _Unavailable(f"no reply within {timeout:.1f}s") from exc
            raise
