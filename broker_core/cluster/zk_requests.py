"""ZooKeeper requests for the cluster metadata (:mod:`broker_core.cluster.zk`).

The bounded requests themselves are :class:`broker_core.zookeeper.ZkSession`'s: each is
waited for at most the request timeout, and one that cannot be answered because ZooKeeper
is away raises :class:`ZkUnavailable` rather than queueing in kazoo until it reconnects.
Background work retries on :class:`ZkUnavailable`; requests made for a caller turn it into
typed errors (:meth:`ZkRequests.admin`), and writes made for a caller are retried across a
dropped connection (:meth:`ZkRequests.write_once`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
)
from kazoo.retry import ForceRetryError, KazooRetry, RetryFailedError

from broker_core.errors import IdemlogError, RequestTimedOutError, UnknownServerError
from broker_core.zookeeper import ZkSession, ZkUnavailable

log = logging.getLogger("idemlog.cluster")

__all__ = ["MAX_CONFLICTS", "ZkRequests", "ZkUnavailable"]

T = TypeVar("T")

# How many times a read-modify-write is redone after losing a race to another writer of the
# same node. Writers of one topic node are few (its leaders, the controller), so this many
# losses in a row means something keeps writing: better to fail retriably than spin.
MAX_CONFLICTS = 10


class ZkRequests:
    """The cluster's requests over ``session`` (which stays the caller's to close)."""

    def __init__(self, session: ZkSession) -> None:
        self.session = session
        self.client = session.client
        self.timeout_s = session.request_timeout_s

    def call(self, request: Callable[[], Any]) -> Any:
        """One async request, bounded by ``timeout_s``; never queued into a disconnected
        client (kazoo would hold it until it reconnects). Raises ZkUnavailable."""
        return self.session.call(request)

    def wait(self, request: Any) -> Any:
        """The result of an async request already sent. Raises ZkUnavailable."""
        return self.session.wait(request)

    def admin(self, what: str, request: Callable[[], Any]) -> Any:
        """A request for a caller: ZooKeeper trouble becomes a typed, named error.

        Raises RequestTimedOutError (retriable) while ZooKeeper is unavailable, NoNodeError
        and NodeExistsError as they are, UnknownServerError for any other refusal.
        """
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
        check_open: Callable[[], None],
    ) -> None:
        """Run a create/delete; retried across a dropped connection within ``timeout_s``.

        A write whose reply was lost may have been applied, so a ``conflict`` on the retry
        is success when ``resolved_after_lost_reply()`` says so, else ``error``. Raises
        RequestTimedOutError when ZooKeeper stayed unavailable for ``timeout_s``.
        ``check_open()`` runs before each retry and raises if the caller was closed.
        """
        ambiguous = False

        def attempt(deadline: float) -> None:
            try:
                self.admin(what, request)
            except RequestTimedOutError as exc:
                # The write may have been applied: a conflict from now on may be ours.
                nonlocal ambiguous
                ambiguous = True
                raise ZkUnavailable(str(exc.__cause__ or exc)) from exc
            except conflict:
                if ambiguous and resolved_after_lost_reply():
                    return
                raise error from None

        def give_up(exc: ZkUnavailable, attempts: int) -> RequestTimedOutError:
            return RequestTimedOutError(f"ZooKeeper unavailable while {what}: {exc}")

        self.session.retrying(
            attempt,
            deadline=time.monotonic() + self.timeout_s,
            give_up=give_up,
            on_retry=lambda *_: check_open(),
        )

    def read_modify_write(
        self, what: str, attempt: Callable[[], T], check_open: Callable[[], None]
    ) -> T:
        """Run ``attempt()``: a read, a decision and a version-conditional write, which
        raises BadVersionError when another write of the node came in between.

        A conflict redoes the attempt (re-reading) up to :data:`MAX_CONFLICTS` times, with
        kazoo's ``KazooRetry`` backoff (short, jittered, so racing writers spread out);
        ZkUnavailable redoes it until ``timeout_s`` has passed. A write whose reply was lost
        is redone too: the next read shows it applied, so ``attempt`` must decide from what
        it reads. Raises RequestTimedOutError (retriable) when ZooKeeper stayed unavailable
        or the conflicts did not stop; any other error of ``attempt`` as it is.
        ``check_open()`` runs before each retry after ZkUnavailable.
        """

        def once() -> T:
            try:
                return attempt()
            except BadVersionError as exc:
                raise ForceRetryError(f"conflicting write while {what}") from exc

        def until_no_conflict(deadline: float) -> T:
            conflicts = KazooRetry(
                max_tries=MAX_CONFLICTS,
                delay=0.01,
                backoff=2,
                max_delay=0.2,
                max_jitter=0.5,
                ignore_expire=False,
            )
            try:
                result: T = conflicts(once)
            except RetryFailedError as exc:
                raise RequestTimedOutError(
                    f"{what}: the node kept changing under {MAX_CONFLICTS + 1} attempts "
                    "(concurrent writers); retry"
                ) from exc
            return result

        def give_up(exc: ZkUnavailable, attempts: int) -> RequestTimedOutError:
            return RequestTimedOutError(f"ZooKeeper unavailable while {what}: {exc}")

        return self.session.retrying(
            until_no_conflict,
            deadline=time.monotonic() + self.timeout_s,
            give_up=give_up,
            on_retry=lambda *_: check_open(),
        )

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
