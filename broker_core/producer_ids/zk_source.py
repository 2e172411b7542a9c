"""Producer-id blocks leased from ZooKeeper node ``/latest_producer_id_block``.

See ``broker_core.producer_ids.block`` for the record and the leasing rules.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
)

from broker_core.errors import (
    ProducerIdAllocationError,
)
from broker_core.producer_ids.block import (
    LATEST_PRODUCER_ID_BLOCK_PATH,
    ProducerIdBlock,
    check_broker_id,
    next_block_after,
)
from broker_core.security import zk_acl
from broker_core.zookeeper import ZkSession, ZkUnavailable

log = logging.getLogger("idemlog.pid")


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
        self._stats_lock = threading.Lock()
        self._conflict_retries = 0
        self._unavailable_retries = 0
        self._session = ZkSession(client, request_timeout_s=request_timeout_s)

    def close(self) -> None:
        """Detach from the client (which stays open; it belongs to the caller)."""
        self._session.close()

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

    def next_block(self, broker_id: int) -> ProducerIdBlock:
        """Lease the next block for ``broker_id`` (see the class doc for the retries).

        Raises :class:`ProducerIdAllocationError` (retriable) when ZooKeeper stayed
        unavailable or every write lost a race until the deadline, or when ZooKeeper
        refused the request (e.g. NoAuth).
        """
        check_broker_id(broker_id)
        deadline = time.monotonic() + self._retry_deadline_s
        retried = 0  # waits for ZooKeeper, over all conflict rounds

        def on_retry(exc: ZkUnavailable, attempts: int, delay: float) -> None:
            nonlocal retried
            retried += 1
            with self._stats_lock:
                self._unavailable_retries += 1
            log.warning(
                "ZooKeeper unavailable (%s), retrying producer id block allocation in "
                "%.2fs (attempt %d)",
                exc,
                delay,
                retried,
            )

        def give_up(exc: ZkUnavailable, attempts: int) -> ProducerIdAllocationError:
            return ProducerIdAllocationError(
                f"ZooKeeper unavailable for {self._retry_deadline_s:g}s, gave up "
                f"leasing a producer id block from {self._path} after {retried + 1} "
                f"attempts: {exc}"
            )

        while True:
            try:
                block = self._session.retrying(
                    lambda d: self._try_lease(broker_id, d),
                    deadline=deadline,
                    give_up=give_up,
                    backoff_s=self._initial_backoff_s,
                    max_backoff_s=self._max_backoff_s,
                    on_retry=on_retry,
                )
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
            except KazooException as exc:
                # Not a connectivity problem (e.g. NoAuth): retrying will not help.
                raise ProducerIdAllocationError(
                    f"ZooKeeper refused the producer id block lease on {self._path}: {exc!r}"
                ) from exc
            if retried:
                log.info(
                    "leased producer id block %d..%d after %d retries",
                    block.start,
                    block.end,
                    retried,
                )
            return block

    def latest_block(self) -> ProducerIdBlock | None:
        """The most recently leased block (one read, no retry); None before the first lease.

        Raises :class:`ProducerIdAllocationError` (retriable) when ZooKeeper is unavailable.
        """
        try:
            data, _ = self._read_record(time.monotonic() + self._session.request_timeout_s)
        except ZkUnavailable as exc:
            raise ProducerIdAllocationError(
                f"cannot read {self._where()}: ZooKeeper unavailable ({exc})"
            ) from exc
        return None if data is None else ProducerIdBlock.from_record(data, self._where())

    def _try_lease(self, broker_id: int, deadline: float) -> ProducerIdBlock:
        """One read-compute-conditional-write round; conflict errors propagate.

        A write whose reply timed out stays queued in kazoo; if it runs later, it is
        conditional on what was read, so it either fails or records a block nobody was
        given: a wasted block, never a duplicate.
        """
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
            data, stat = self._session.call(
                lambda: self._client.get_async(self._path), deadline=deadline
            )
        except NoNodeError:
            return None, None
        return bytes(data), int(stat.version)

    def _write_record(self, block: ProducerIdBlock, version: int | None, deadline: float) -> None:
        """Create the node (``version is None``) or set it if still at ``version``."""
        value = block.to_record()
        if version is None:
            self._session.call(
                lambda: zk_acl.create_async(self._client, self._path, value, makepath=True),
                deadline=deadline,
            )
        else:
            self._session.call(
                lambda: self._client.set_async(self._path, value, version=version),
                deadline=deadline,
            )
