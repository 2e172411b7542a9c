"""The transaction-coordinator state in ZooKeeper (cluster mode): ``ZkTxnStateStore``.

One znode per transactional id and per sink, so a new controller can take over, and one
per held-back sink batch (docs/design.md §7). Given a :class:`ZkEpochFence` (the
controller epoch node at the version this controllership's bump left it), every write is
one ZooKeeper multi that checks that version: once a newer controller has bumped the
epoch, a deposed coordinator's write fails atomically in ZooKeeper
(:class:`CoordinatorEpochFencedError`), whatever it believes and however long it was
paused (docs/failure-model.md, the row "controller paused"). Every write is also
conditional on the znode version this store last saw, and each znode names the
coordinator epoch that wrote it: a lower epoch never overwrites a higher one's state.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
)

from broker_core.errors import (
    ConcurrentTransactionsError,
    CorruptRecordError,
    InvalidRequestError,
    NotCoordinatorError,
    RequestTimedOutError,
)
from broker_core.security import zk_acl
from broker_core.txn.state import SinkBatchRecord, SinkCommitRecord, TransactionMetadata
from broker_core.txn.state_store import CoordinatorEpochFencedError, TxnState, check_key
from broker_core.zookeeper import ZkSession, ZkUnavailable

log = logging.getLogger("idemlog.txn")

# -- cluster: ZooKeeper ----------------------------------------------------------------------

# ZooKeeper's default jute.maxbuffer is 1 MiB per request; stay clear of it.
MAX_ZNODE_BYTES = 1_000_000
# Writes of one put_transactions in flight at once (a sink commit's COMPLETE_COMMITs).
_PARALLEL_PUTS = 8
_CONFLICT = (BadVersionError, NodeExistsError, NoNodeError)


COORDINATOR_EPOCH_FIELD = "coordinator_epoch"


@dataclass(frozen=True, slots=True)
class _Seen:
    version: int
    coordinator_epoch: int


@dataclass(frozen=True, slots=True)
class ZkEpochFence:
    """What fences a coordinator's writes inside ZooKeeper: the node ``path`` that keeps
    the epoch (the controller epoch), at ``version`` as the bump that made
    ``coordinator_epoch`` left it. The cluster layer's controllership hands it over
    (``server/roles.py``); the store never reads or writes that node itself, except to
    check it in the same multi as each of its writes."""

    path: str
    version: int
    coordinator_epoch: int

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise InvalidRequestError(f"epoch fence path {self.path!r} must start with '/'")
        for name in ("version", "coordinator_epoch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidRequestError(f"epoch fence {name}={value!r} must be an int >= 0")


def stamp_coordinator_epoch(record: bytes, coordinator_epoch: int) -> bytes:
    """The record's JSON with the writer's coordinator epoch added.

    Omitted for epoch 0, so that nodes of coordinators without an epoch (and all nodes
    written before epochs were kept) read the same: absent means 0.
    """
    if coordinator_epoch == 0:
        return record
    doc = json.loads(record)
    doc[COORDINATOR_EPOCH_FIELD] = coordinator_epoch
    return json.dumps(doc, separators=(",", ":")).encode()


def coordinator_epoch_of(data: bytes, where: str = "ZooKeeper node") -> int:
    """The coordinator epoch stamped on a node's data (0 when absent)."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptRecordError(f"{where}: not JSON ({exc})") from None
    epoch = doc.get(COORDINATOR_EPOCH_FIELD, 0) if isinstance(doc, dict) else None
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise CorruptRecordError(f"{where}: {COORDINATOR_EPOCH_FIELD}={epoch!r} is not an int >= 0")
    return epoch


def _fenced(what: str, path: str, writer: int, mine: int) -> CoordinatorEpochFencedError:
    return CoordinatorEpochFencedError(
        f"state of {what} in ZooKeeper node {path} was changed by another coordinator of "
        f"coordinator epoch {writer}, newer than this one's {mine}: this coordinator was "
        "replaced (fenced); not overwriting it"
    )


def _epoch_moved(what: str, fence: ZkEpochFence, exc: Exception) -> CoordinatorEpochFencedError:
    return CoordinatorEpochFencedError(
        f"state of {what} not written: the epoch node {fence.path} is no longer at version "
        f"{fence.version} (coordinator epoch {fence.coordinator_epoch}): a newer controller "
        f"has taken over and this coordinator was replaced (fenced) ({type(exc).__name__})"
    )


def znode_name(key: str) -> str:
    """``key`` as one znode name: URL-quoted, '.' too, so '/', '.' and '..' cannot occur."""
    return quote(key, safe="").replace(".", "%2E")


class ZkTxnStateStore:
    """One JSON znode per transactional id and per sink under ``root``::

        <root>/transactions/<quoted transactional id>
        <root>/sinks/<quoted sink id>
        <root>/sink_batches/<quoted sink id>/<batch id>   (held-back batches, design.md §7)

    With ``fence`` every write is a multi that checks the epoch node at the fence's
    version, and only the fence's coordinator epoch may write through this store; without
    one (tools, tests of the layout) only the znodes' own versions are checked.

    While ZooKeeper is unreachable a request is retried (reconnects end the wait early)
    until ``retry_deadline_s``, then :class:`RequestTimedOutError` (retriable) is raised.
    The version cache holds one entry per znode loaded or written: bounded by the number
    of transactional ids, sinks and held-back sink batches, as the coordinator's own maps.
    """

    def __init__(
        self,
        client: Any,
        root: str = "/idemlog",
        *,
        fence: ZkEpochFence | None = None,
        retry_deadline_s: float = 15.0,
        request_timeout_s: float = 5.0,
    ) -> None:
        if not root.startswith("/"):
            raise InvalidRequestError(f"ZooKeeper root {root!r} must start with '/'")
        root = root.rstrip("/")
        self._client = client
        self._root = root or "/"
        self._fence = fence
        self.transactions_path = f"{root}/transactions"
        self.sinks_path = f"{root}/sinks"
        self.sink_batches_path = f"{root}/sink_batches"
        self._retry_deadline_s = retry_deadline_s
        self._versions_lock = threading.Lock()
        # znode path -> the version this store last saw and the coordinator epoch that wrote it
        self._versions: dict[str, _Seen] = {}
        # Parents created so far: a multi cannot create missing parents (no makepath).
        self._parents: set[str] = set()
        self._session = ZkSession(client, request_timeout_s=request_timeout_s)
        # Held while a request is queued: close() waits for it (see _call).
        self._send_lock = threading.Lock()
        self._closed = False
        # put_transactions' writes in flight at once; threads start on first use.
        self._pool = ThreadPoolExecutor(_PARALLEL_PUTS, thread_name_prefix="zk-txn-puts")

    def close(self) -> None:
        """Detach from the client (which belongs to the caller and stays open). A write
        still retrying fails with NotCoordinatorError at its next attempt instead of
        waiting out ``retry_deadline_s`` (one already sent is up to the fence)."""
        with self._send_lock:
            self._closed = True
        self._pool.shutdown(wait=True)
        self._session.close()

    def transaction_path(self, transactional_id: str) -> str:
        return f"{self.transactions_path}/{znode_name(transactional_id)}"

    def sink_path(self, sink_id: str) -> str:
        return f"{self.sinks_path}/{znode_name(sink_id)}"

    def sink_batch_path(self, sink_id: str, batch_id: int) -> str:
        return f"{self.sink_batches_path}/{znode_name(sink_id)}/{batch_id}"

    # -- many transactions, sink batches' records (docs/design.md §6, §7) --------------------
    def put_transactions(
        self, metas: Sequence[TransactionMetadata], *, coordinator_epoch: int = 0
    ) -> None:
        """One conditional write per record, each fenced as ``put_transaction``, up to
        _PARALLEL_PUTS at once (their round trips overlap); every write is waited for,
        then the first error is raised."""
        if len(metas) <= 1:
            for meta in metas:
                self.put_transaction(meta, coordinator_epoch=coordinator_epoch)
            return
        futures = [
            self._pool.submit(self.put_transaction, meta, coordinator_epoch=coordinator_epoch)
            for meta in metas
        ]
        wait(futures)
        for future in futures:
            future.result()

    def put_sink_batch(self, record: SinkBatchRecord, *, coordinator_epoch: int = 0) -> None:
        what = f"sink {record.sink_id!r} batch {record.batch_id}"
        path = self.sink_batch_path(record.sink_id, record.batch_id)
        self._write(path, record.to_json(), what, coordinator_epoch)

    def delete_sink_batch(self, sink_id: str, batch_id: int, *, coordinator_epoch: int = 0) -> None:
        what = f"sink {sink_id!r} batch {batch_id}"
        path = self.sink_batch_path(sink_id, batch_id)
        with self._versions_lock:
            seen = path in self._versions
        # The coordinator deletes only records it wrote or loaded: one it never saw here
        # is one this store deleted already.
        if seen:
            self._delete(path, what, coordinator_epoch)

    def load_sink_batches(self) -> list[SinkBatchRecord]:
        def load(deadline: float) -> tuple[list[SinkBatchRecord], dict[str, _Seen]]:
            found, versions = [], {}
            for sink, sink_path, _, _ in self._children(self.sink_batches_path, deadline):
                for name, path, data, version in self._children(sink_path, deadline):
                    where = f"ZooKeeper node {path}"
                    record = SinkBatchRecord.from_json(data, where)
                    named = f"{znode_name(record.sink_id)}/{record.batch_id}"
                    check_key(named, f"{sink}/{name}", where)
                    found.append(record)
                    versions[path] = _Seen(version, coordinator_epoch_of(data, path))
            return found, versions

        records, versions = self._retrying(load, "the sink batches' records")
        with self._versions_lock:
            self._versions.update(versions)
        result: list[SinkBatchRecord] = records
        return result

    # -- writes ------------------------------------------------------------------------
    def put_transaction(self, meta: TransactionMetadata, *, coordinator_epoch: int = 0) -> None:
        path = self.transaction_path(meta.transactional_id)
        what = f"transactional id {meta.transactional_id!r}"
        self._write(path, meta.to_json(), what, coordinator_epoch)

    def put_sink(self, record: SinkCommitRecord, *, coordinator_epoch: int = 0) -> None:
        what = f"sink {record.sink_id!r}"
        self._write(self.sink_path(record.sink_id), record.to_json(), what, coordinator_epoch)

    def _write(self, path: str, record: bytes, what: str, coordinator_epoch: int) -> None:
        if isinstance(coordinator_epoch, bool) or not isinstance(coordinator_epoch, int):
            raise InvalidRequestError(f"coordinator_epoch={coordinator_epoch!r} is not an int")
        if coordinator_epoch < 0:
            raise InvalidRequestError(f"coordinator_epoch={coordinator_epoch} must be >= 0")
        fence = self._fence
        if fence is not None and coordinator_epoch != fence.coordinator_epoch:
            raise InvalidRequestError(
                f"coordinator_epoch={coordinator_epoch} writing through a store fenced at "
                f"coordinator epoch {fence.coordinator_epoch}"
            )
        data = stamp_coordinator_epoch(record, coordinator_epoch)
        if len(data) > MAX_ZNODE_BYTES:
            raise InvalidRequestError(
                f"state of {what} is {len(data)} bytes, over the {MAX_ZNODE_BYTES} bytes a "
                "ZooKeeper node may hold"
            )
        with self._versions_lock:
            seen = self._versions.get(path)
        if seen is not None and seen.coordinator_epoch > coordinator_epoch:
            raise _fenced(what, path, seen.coordinator_epoch, coordinator_epoch)
        expected = None if seen is None else seen.version
        version = self._retrying(
            lambda deadline: self._write_once(
                path, data, expected, what, coordinator_epoch, deadline
            ),
            what,
        )
        with self._versions_lock:
            current = self._versions.get(path)
            # A concurrent write through this store by a newer coordinator stays recorded.
            if current is None or current.version < version:
                self._versions[path] = _Seen(version, coordinator_epoch)

    def _write_once(
        self,
        path: str,
        data: bytes,
        expected: int | None,
        what: str,
        coordinator_epoch: int,
        deadline: float,
    ) -> int:
        """Create the node (``expected is None``) or set it if still at ``expected``; with
        a fence, in one multi that first checks the epoch node."""
        try:
            if self._fence is not None:
                return self._multi_once(self._fence, path, data, expected, what, deadline)
            if expected is None:
                self._call(
                    lambda: zk_acl.create_async(self._client, path, data, makepath=True), deadline
                )
                return 0
            stat = self._call(
                lambda: self._client.set_async(path, data, version=expected), deadline
            )
            return int(stat.version)
        except _CONFLICT as exc:
            # After a lost connection an earlier attempt may have been applied unseen: a
            # conflict with exactly these bytes is that write, not another coordinator's.
            current = self._read(path, deadline)
            if current is not None and current[0] == data:
                return current[1]
            if current is not None:
                writer = coordinator_epoch_of(current[0])
                if writer > coordinator_epoch:
                    raise _fenced(what, path, writer, coordinator_epoch) from exc
            # Not newer: an earlier write of this epoch applied after its reply was lost
            # (a timed-out request still queued), or a writer without the fence. Remember
            # what is there now, so the next request for this id goes on from it instead
            # of failing on a stale version for good.
            self._remember(path, current)
            seen = "absent" if expected is None else f"at version {expected}"
            raise ConcurrentTransactionsError(
                f"state of {what} in ZooKeeper node {path} was changed by another coordinator "
                f"(this one saw it {seen}); not overwriting it; a retry goes on from the "
                f"node as it is now ({type(exc).__name__})"
            ) from exc

    def _multi_once(
        self,
        fence: ZkEpochFence,
        path: str,
        data: bytes,
        expected: int | None,
        what: str,
        deadline: float,
    ) -> int:
        """One multi: check the epoch node at the fence's version, then create or set the
        node. Raises CoordinatorEpochFencedError when the check failed, the node's own
        conflict (for :meth:`_write_once`) when that failed."""
        if expected is None:
            self._ensure_parent(path.rsplit("/", 1)[0], deadline)
        transaction = self._client.transaction()
        transaction.check(fence.path, fence.version)
        if expected is None:
            zk_acl.transaction_create(self._client, transaction, path, data)
        else:
            transaction.set_data(path, data, version=expected)
        checked, written = self._call(transaction.commit_async, deadline)
        # A failed multi reports the ops before the failing one as RolledBackError: only
        # the check's own failure means the epoch moved (BadVersion; NoNode: deleted).
        if isinstance(checked, Exception) and not isinstance(checked, RolledBackError):
            raise _epoch_moved(what, fence, checked)
        if isinstance(written, Exception):
            raise written
        return 0 if expected is None else int(written.version)

    def _ensure_parent(self, parent: str, deadline: float) -> None:
        if parent in self._parents:
            return
        self._call(lambda: zk_acl.ensure_path_async(self._client, parent), deadline)
        self._parents.add(parent)

    def _remember(self, path: str, current: tuple[bytes, int] | None) -> None:
        with self._versions_lock:
            if current is None:
                self._versions.pop(path, None)
            else:
                self._versions[path] = _Seen(current[1], coordinator_epoch_of(current[0], path))

    # -- deletes (expiry) --------------------------------------------------------------
    # Kept apart from _write/_write_once: a delete is conditional on the version this
    # store saw, as a write is, and is fenced the same way by the coordinator epoch.
    def delete_transaction(self, transactional_id: str, *, coordinator_epoch: int = 0) -> None:
        what = f"transactional id {transactional_id!r}"
        self._delete(self.transaction_path(transactional_id), what, coordinator_epoch)

    def delete_sink(self, sink_id: str, *, coordinator_epoch: int = 0) -> None:
        self._delete(self.sink_path(sink_id), f"sink {sink_id!r}", coordinator_epoch)

    def _delete(self, path: str, what: str, coordinator_epoch: int) -> None:
        """Delete ``path`` if it is still at the version this store saw.

        Raises ConcurrentTransactionsError when this store never saw the node or another
        coordinator changed it since (BadVersion), and CoordinatorEpochFencedError when
        that coordinator's epoch is newer. A node already gone counts as deleted (an
        earlier attempt applied unseen before a lost connection)."""
        with self._versions_lock:
            seen = self._versions.get(path)
        if seen is None:
            raise ConcurrentTransactionsError(
                f"state of {what} in ZooKeeper node {path}: this coordinator never saw the "
                "node, so it cannot delete it conditionally; not deleting it"
            )
        if seen.coordinator_epoch > coordinator_epoch:
            raise _fenced(what, path, seen.coordinator_epoch, coordinator_epoch)
        self._retrying(
            lambda deadline: self._delete_once(
                path, seen.version, what, coordinator_epoch, deadline
            ),
            what,
        )
        with self._versions_lock:
            if self._versions.get(path) == seen:
                del self._versions[path]

    def _delete_once(
        self, path: str, expected: int, what: str, coordinator_epoch: int, deadline: float
    ) -> None:
        try:
            if self._fence is not None:
                self._delete_multi_once(self._fence, path, expected, what, deadline)
            else:
                self._call(lambda: self._client.delete_async(path, version=expected), deadline)
        except NoNodeError:
            log.info("ZooKeeper node %s of %s was already deleted", path, what)
        except BadVersionError as exc:
            current = self._read(path, deadline)
            if current is not None and coordinator_epoch_of(current[0]) > coordinator_epoch:
                raise _fenced(
                    what, path, coordinator_epoch_of(current[0]), coordinator_epoch
                ) from exc
            raise ConcurrentTransactionsError(
                f"state of {what} in ZooKeeper node {path} was changed by another coordinator "
                f"(this one saw version {expected}); not deleting it"
            ) from exc

    def _delete_multi_once(
        self, fence: ZkEpochFence, path: str, expected: int, what: str, deadline: float
    ) -> None:
        """One multi: check the epoch node at the fence's version, then delete the node at
        ``expected``, so a deposed coordinator's delete fails in ZooKeeper as its writes do."""
        transaction = self._client.transaction()
        transaction.check(fence.path, fence.version)
        transaction.delete(path, version=expected)
        checked, deleted = self._call(transaction.commit_async, deadline)
        if isinstance(checked, Exception) and not isinstance(checked, RolledBackError):
            raise _epoch_moved(what, fence, checked)
        if isinstance(deleted, Exception):
            raise deleted

    # -- reads -------------------------------------------------------------------------
    def load(self) -> TxnState:
        """Every transactional id's and sink's state, read after a ``sync``: the server
        answering is at least as recent as the leader was when the load began, so a
        coordinator loading after its controllership's epoch bump sees every write that
        an older coordinator got through its fence."""
        txns, sinks, versions = self._retrying(self._load_once, "the transaction state")
        with self._versions_lock:
            self._versions = versions
        return txns, sinks

    def _load_once(
        self, deadline: float
    ) -> tuple[dict[str, TransactionMetadata], dict[str, SinkCommitRecord], dict[str, _Seen]]:
        txns: dict[str, TransactionMetadata] = {}
        sinks: dict[str, SinkCommitRecord] = {}
        versions: dict[str, _Seen] = {}
        self._call(lambda: self._client.sync_async(self._root), deadline)
        for child, path, data, version in self._children(self.transactions_path, deadline):
            meta = TransactionMetadata.from_json(data, f"ZooKeeper node {path}")
            check_key(znode_name(meta.transactional_id), child, f"ZooKeeper node {path}")
            txns[meta.transactional_id] = meta
            versions[path] = _Seen(version, coordinator_epoch_of(data, path))
        for child, path, data, version in self._children(self.sinks_path, deadline):
            record = SinkCommitRecord.from_json(data, f"ZooKeeper node {path}")
            check_key(znode_name(record.sink_id), child, f"ZooKeeper node {path}")
            sinks[record.sink_id] = record
            versions[path] = _Seen(version, coordinator_epoch_of(data, path))
        return txns, sinks, versions

    def _children(self, parent: str, deadline: float) -> list[tuple[str, str, bytes, int]]:
        try:
            names = self._call(lambda: self._client.get_children_async(parent), deadline)
        except NoNodeError:
            return []
        found = []
        for name in sorted(names):
            path = f"{parent}/{name}"
            current = self._read(path, deadline)
            if current is not None:  # deleted since the listing: nothing to load
                found.append((name, path, current[0], current[1]))
        return found

    def _read(self, path: str, deadline: float) -> tuple[bytes, int] | None:
        try:
            data, stat = self._call(lambda: self._client.get_async(path), deadline)
        except NoNodeError:
            return None
        return bytes(data), int(stat.version)

    # -- connection handling -----------------------------------------------------------
    def _retrying(self, attempt: Callable[[float], Any], what: str) -> Any:
        """``attempt(deadline)`` retried while ZooKeeper is unavailable, for up to
        ``retry_deadline_s``; then RequestTimedOutError (retriable)."""

        def on_retry(exc: ZkUnavailable, attempts: int, delay: float) -> None:
            log.warning("ZooKeeper unavailable (%s) for %s, retrying", exc, what)

        def give_up(exc: ZkUnavailable, attempts: int) -> RequestTimedOutError:
            return RequestTimedOutError(
                f"ZooKeeper unavailable for {self._retry_deadline_s:g}s while writing "
                f"or reading {what}: {exc}"
            )

        return self._session.retrying(
            attempt,
            deadline=time.monotonic() + self._retry_deadline_s,
            give_up=give_up,
            backoff_s=0.05,
            max_backoff_s=1.0,
            on_retry=on_retry,
        )

    def _call(self, request: Callable[[], Any], deadline: float) -> Any:
        # Never queued into a disconnected client: ZkUnavailable instead (retried above).
        return self._session.call(lambda: self._queue(request), deadline=deadline)

    def _queue(self, request: Callable[[], Any]) -> Any:
        """``request()`` (queueing it in kazoo) unless this store is closed, atomically
        with :meth:`close`. ZooKeeper runs one session's requests in order, so a write
        queued before close() returned precedes every request a store opened afterwards
        on the same client sends (the next coordinator's load, when this broker regains
        control in the same session, at the same epoch, which the fence cannot tell
        apart); after close() nothing more is queued."""
        with self._send_lock:
            if self._closed:
                raise NotCoordinatorError(
                    "the coordinator's ZooKeeper state store was closed (it lost its "
                    "controllership or stopped): nothing more is read or written through it"
                )
            return request()
