"""Bounded ZooKeeper requests for the cluster metadata (:mod:`broker_core.cluster.zk`).

Every request is sent asynchronously and waited for at most ``timeout_s``; one that cannot
be answered because ZooKeeper is away raises :class:`ZkUnavailable` rather than queueing in
kazoo until it reconnects (which would hold a caller for as long as the outage lasts).
Background work retries on :class:`ZkUnavailable`; requests made for a caller turn it into
typed errors (:meth:`ZkRequests.admin`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import (
    KazooException,
    NodeExistsError,
    NoNodeError,
)

from broker_core.errors import IdemlogError, RequestTimedOutError, UnknownServerError
from broker_core.zookeeper import ZK_UNAVAILABLE

log = logging.getLogger("idemlog.cluster")

CONNECTION_ERRORS = ZK_UNAVAILABLE


class ZkUnavailable(Exception):
    """Internal: ZooKeeper cannot be reached right now."""


class ZkRequests:
    """Requests on ``client`` (a started kazoo client), each bounded by ``timeout_s``."""

    def __init__(self, client: Any, timeout_s: float) -> None:
        self.client = client
        self.timeout_s = timeout_s

    def call(self, request: Callable[[], Any]) -> Any:
        """One async request, bounded by ``timeout_s``; never queued into a disconnected
        client (kazoo would hold it until it reconnects)."""
        if not self.client.connected:
            raise ZkUnavailable("not connected to ZooKeeper")
        return self.wait(request())

    def wait(self, request: Any) -> Any:
        """The result of an async request already sent."""
        try:
            return request.get(timeout=self.timeout_s)
        except CONNECTION_ERRORS as exc:
            raise ZkUnavailable(type(exc).__name__) from exc
        except KazooException:
            raise
        except Exception as exc:
            if isinstance(exc, self.client.handler.timeout_exception):
                raise ZkUnavailable(f"no reply within {self.timeout_s:g}s") from exc
            raise

    def admin(self, what: str, request: Callable[[], Any]) -> Any:
        """A request for a caller: ZooKeeper trouble becomes a typed, named error."""
        try:
            return self.call(request)
        except ZkUnavailable as exc:
            raise RequestTimedOutError(f"ZooKeeper unavailable while {what}: {exc}") from exc
        except (NoNodeError, NodeExistsError):
            raise
        except KazooException as exc:
            raise UnknownServerError(f"ZooKeeper refused {what}: {exc!r}") from exc

    def write_once(
        self,
        what: str,
        request: Callable[[], Any],
        conflict: type[KazooException],
        resolved_after_lost_reply: Callable[[], bool],
        error: IdemlogError,
        wait_connected: Callable[[float], bool],
    ) -> None:
        """Run a create/delete; retried across a dropped connection within the timeout.

        A write whose reply was lost may have been applied, so a ``conflict`` on the retry
        is success when ``resolved_after_lost_reply()`` says so, else ``error``.
        ``wait_connected(timeout)`` waits for the connection to come back (False: it did
        not within ``timeout``); it raises if the caller is closed meanwhile.
        """
        deadline = time.monotonic() + self.timeout_s
        ambiguous = False
        while True:
            try:
                self.admin(what, request)
                return
            except RequestTimedOutError:
                ambiguous = True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not wait_connected(remaining):
                    raise
            except conflict:
                if ambiguous and resolved_after_lost_reply():
                    return
                raise error from None

    def delete_own(self, path: str, session: int) -> None:
        """Delete ``path`` if it is an ephemeral node of ``session``; best effort."""
        try:
            _, stat = self.call(lambda: self.client.get_async(path))
            if stat.ephemeralOwner == session:
                self.call(lambda: self.client.delete_async(path, version=stat.version))
        except NoNodeError:
            pass
        except (ZkUnavailable, KazooException) as exc:
            log.warning("could not delete %s (%r); it goes when the session ends", path, exc)
