"""Durable transaction-coordinator state: where TransactionMetadata and SinkCommitRecords live.

Two stores implement :class:`TxnStateStore`:

* :class:`LogTxnStateStore` (embedded mode): records appended to the internal topic
  ``__transaction_state`` of the broker's own LogStore, one partition, rows
  ``(kind, key, value)``; the last record per key wins when the topic is replayed.
* :class:`ZkTxnStateStore` (cluster mode): one znode per transactional id and per sink, so
  a new controller can take over. Every write is conditional on the znode version this
  store last saw: a coordinator that lost a race (a newer controller wrote meanwhile)
  fails with :class:`ConcurrentTransactionsError` instead of overwriting. Each znode also
  names the coordinator epoch that wrote it, and a coordinator of a lower epoch never
  overwrites it (:class:`CoordinatorEpochFencedError`), even through a store instance
  that saw the newer write.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import pyarrow as pa
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
)

from broker_core.errors import (
    ConcurrentTransactionsError,
    CorruptRecordError,
    InvalidRequestError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
)
from broker_core.log.partition_log import IsolationLevel, PartitionLog
from broker_core.log.store import LogStore
from broker_core.txn.state import SinkBatchRecord, SinkCommitRecord, TransactionMetadata
from broker_core.zookeeper import ZkSession, ZkUnavailable

log = logging.getLogger("idemlog.txn")

TxnState = tuple[dict[str, TransactionMetadata], dict[str, SinkCommitRecord]]


class TxnStateStore(Protocol):
    def load(self) -> TxnState: ...

    def put_transaction(self, meta: TransactionMetadata, *, coordinator_epoch: int = 0) -> None:
        """Durable before it returns; ``coordinator_epoch`` is the writing coordinator's."""

    def put_sink(self, record: SinkCommitRecord, *, coordinator_epoch: int = 0) -> None:
        """Durable before it returns; ``coordinator_epoch`` is the writing coordinator's."""

    def put_transactions(
        self, metas: Sequence[TransactionMetadata], *, coordinator_epoch: int = 0
    ) -> None:
        """Every record durable before it returns (in as few writes as the store allows);
        on an error some may be stored, each whole."""

    def put_sink_batch(self, record: SinkBatchRecord, *, coordinator_epoch: int = 0) -> None:
        """Durable before it returns; writing the same batch again is a no-op."""

    def delete_sink_batch(self, sink_id: str, batch_id: int, *, coordinator_epoch: int = 0) -> None:
        """The batch's record gone (durably) before it returns; absent is fine."""

    def load_sink_batches(self) -> list[SinkBatchRecord]:
        """Every stored SinkBatchRecord not deleted."""


class CoordinatorEpochFencedError(ConcurrentTransactionsError):
    """A coordinator of a higher epoch has taken over: it wrote the state this one was
    about to overwrite (or, raised by the coordinator, a partition refused this one's
    markers with TRANSACTION_COORDINATOR_FENCED).

    Still a CONCURRENT_TRANSACTIONS (51) on the wire, as the stores have always answered a
    lost race, so the client retries; the coordinator recognises the type and stops
    serving, and the retry gets NOT_COORDINATOR and finds the new one.
    """


# -- embedded: the internal topic ----------------------------------------------------------

TXN_STATE_TOPIC = "__transaction_state"
TXN_STATE_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("value", pa.binary(), nullable=False),
    ]
)
KIND_TRANSACTION = "transaction"
KIND_SINK = "sink"
# A sink batch's own visibility record, and its removal (a distinct kind rather than a
# null value: the topic's schema stays as it is).
KIND_SINK_BATCH = "sink_batch"
KIND_SINK_BATCH_SETTLED = "sink_batch_settled"
_SINK_BATCH_KINDS = frozenset({KIND_SINK_BATCH, KIND_SINK_BATCH_SETTLED})
# Rows of one append of put_transactions (one fsync for all): under max.message.bytes.
_MAX_APPEND_BYTES = 512 * 1024
# Retention must never delete coordinator state (the topic is not compacted either).
_TOPIC_CONFIG: dict[str, object] = {"retention.ms": -1, "retention.bytes": -1}
_LOAD_READ_BYTES = 4 * 1024 * 1024


class LogTxnStateStore:
    """State records in the internal topic ``__transaction_state`` of ``store``.

    Each put appends one row and fsyncs the partition before returning. A torn or corrupt
    tail after a crash is cut by the log's own recovery, so :meth:`load` sees every record
    whose put returned.
    """

    def __init__(self, store: LogStore) -> None:
        self._store = store
        with contextlib.suppress(TopicAlreadyExistsError):
            store.create_topic(TXN_STATE_TOPIC, 1, schema=TXN_STATE_SCHEMA, config=_TOPIC_CONFIG)
        topic = store.topic(TXN_STATE_TOPIC)
        if topic.partitions != 1 or (
            topic.schema is not None and not topic.schema.equals(TXN_STATE_SCHEMA)
        ):
            raise CorruptRecordError(
                f"internal topic {TXN_STATE_TOPIC!r} has {topic.partitions} partitions and "
                f"schema {topic.schema}; expected 1 partition of {TXN_STATE_SCHEMA}"
            )

    def _log(self) -> PartitionLog:
        return self._store.partition(TXN_STATE_TOPIC, 0)

    def _append(self, kind: str, key: str, value: bytes) -> None:
        self._append_rows([(kind, key, value)])

    def _append_rows(self, rows: Sequence[tuple[str, str, bytes]]) -> None:
        """Rows in appends of at most _MAX_APPEND_BYTES, then one fsync."""
        partition = self._log()
        start = 0
        while start < len(rows):
            end, size = start, 0
            while end < len(rows) and (
                end == start or size + len(rows[end][2]) <= _MAX_APPEND_BYTES
            ):
                size += len(rows[end][2])
                end += 1
            chunk = rows[start:end]
            batch = pa.record_batch(
                [
                    pa.array([r[0] for r in chunk]),
                    pa.array([r[1] for r in chunk]),
                    pa.array([r[2] for r in chunk], pa.binary()),
                ],
                schema=TXN_STATE_SCHEMA,
            )
            partition.append(batch)
            start = end
        partition.flush()

    # One broker, one coordinator at a time: no older coordinator can write here.
    def put_transaction(self, meta: TransactionMetadata, *, coordinator_epoch: int = 0) -> None:
        self._append(KIND_TRANSACTION, meta.transactional_id, meta.to_json())

    def put_sink(self, record: SinkCommitRecord, *, coordinator_epoch: int = 0) -> None:
        self._append(KIND_SINK, record.sink_id, record.to_json())

    def put_transactions(
        self, metas: Sequence[TransactionMetadata], *, coordinator_epoch: int = 0
    ) -> None:
        """One append (a few past _MAX_APPEND_BYTES) and one fsync for all of them."""
        self._append_rows([(KIND_TRANSACTION, m.transactional_id, m.to_json()) for m in metas])

    def put_sink_batch(self, record: SinkBatchRecord, *, coordinator_epoch: int = 0) -> None:
        self._append(KIND_SINK_BATCH, record.key, record.to_json())

    def delete_sink_batch(self, sink_id: str, batch_id: int, *, coordinator_epoch: int = 0) -> None:
        gone = SinkBatchRecord(sink_id, batch_id, [])
        self._append(KIND_SINK_BATCH_SETTLED, gone.key, gone.to_json())

    def load_sink_batches(self) -> list[SinkBatchRecord]:
        found: dict[str, SinkBatchRecord] = {}
        for kind, key, value, where in self._replay():
            if kind == KIND_SINK_BATCH:
                record = SinkBatchRecord.from_json(value, where)
                _check_key(record.key, key, where)
                found[key] = record
            elif kind == KIND_SINK_BATCH_SETTLED:
                found.pop(key, None)
        return list(found.values())

    def _replay(self) -> Iterator[tuple[str, str, bytes, str]]:
        """Every row of the topic, oldest first, with where it is for error messages."""
        partition = self._log()
        offset = partition.log_start_offset
        while True:
            result = partition.read(
                offset, isolation=IsolationLevel.READ_UNCOMMITTED, max_bytes=_LOAD_READ_BYTES
            )
            for batch in result.batches:
                columns = [batch.records.column(n).to_pylist() for n in ("kind", "key", "value")]
                for i, (kind, key, value) in enumerate(zip(*columns, strict=True)):
                    yield kind, key, value, f"{partition.name} offset {batch.base_offset + i}"
            if result.next_offset == offset:
                return
            offset = result.next_offset

    def load(self) -> TxnState:
        txns: dict[str, TransactionMetadata] = {}
        sinks: dict[str, SinkCommitRecord] = {}
        partition = self._log()
        offset = partition.log_start_offset
        while True:
            result = partition.read(
                offset, isolation=IsolationLevel.READ_UNCOMMITTED, max_bytes=_LOAD_READ_BYTES
            )
            for batch in result.batches:
                columns = [batch.records.column(n).to_pylist() for n in ("kind", "key", "value")]
                for i, (kind, key, value) in enumerate(zip(*columns, strict=True)):
                    where = f"{partition.name} offset {batch.base_offset + i} (key {key!r})"
                    if kind == KIND_TRANSACTION:
                        meta = TransactionMetadata.from_json(value, where)
                        _check_key(meta.transactional_id, key, where)
                        txns[key] = meta
                    elif kind == KIND_SINK:
                        record = SinkCommitRecord.from_json(value, where)
                        _check_key(record.sink_id, key, where)
                        sinks[key] = record
                    elif kind in _SINK_BATCH_KINDS:
                        continue  # load_sink_batches reads those
                    else:
                        raise CorruptRecordError(f"{where}: unknown record kind {kind!r}")
            if result.next_offset == offset:
                return txns, sinks
            offset = result.next_offset


def _check_key(stored: str, key: str, where: str) -> None:
    if stored != key:
        raise CorruptRecordError(f"{where}: record names {stored!r}, not its key {key!r}")


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


def znode_name(key: str) -> str:
    """``key`` as one znode name: URL-quoted, '.' too, so '/', '.' and '..' cannot occur."""
    return quote(key, safe="").replace(".", "%2E")


class ZkTxnStateStore:
    """One JSON znode per transactional id and per sink under ``root``::

        <root>/transactions/<quoted transactional id>
        <root>/sinks/<quoted sink id>

    While ZooKeeper is unreachable a request is retried (reconnects end the wait early)
    until ``retry_deadline_s``, then :class:`RequestTimedOutError` (retriable) is raised.
    """

    def __init__(
        self,
        client: Any,
        root: str = "/idemlog",
        *,
        retry_deadline_s: float = 15.0,
        request_timeout_s: float = 5.0,
    ) -> None:
        if not root.startswith("/"):
            raise InvalidRequestError(f"ZooKeeper root {root!r} must start with '/'")
        root = root.rstrip("/")
        self._client = client
        self.transactions_path = f"{root}/transactions"
        self.sinks_path = f"{root}/sinks"
        self.sink_batches_path = f"{root}/sink_batches"
        self._retry_deadline_s = retry_deadline_s
        self._versions_lock = threading.Lock()
        # znode path -> the version this store last saw and the coordinator epoch that wrote it
        self._versions: dict[str, _Seen] = {}
        self._session = ZkSession(client, request_timeout_s=request_timeout_s)
        # put_transactions' writes in flight at once; threads start on first use.
        self._pool = ThreadPoolExecutor(_PARALLEL_PUTS, thread_name_prefix="zk-txn-puts")

    def close(self) -> None:
        """Detach from the client (which belongs to the caller and stays open)."""
        self._pool.shutdown(wait=True)
        self._session.close()

    def transaction_path(self, transactional_id: str) -> str:
        return f"{self.transactions_path}/{znode_name(transactional_id)}"

    def sink_path(self, sink_id: str) -> str:
        return f"{self.sinks_path}/{znode_name(sink_id)}"

    def sink_batch_path(self, sink_id: str, batch_id: int) -> str:
        return f"{self.sink_batches_path}/{znode_name(sink_id)}/{batch_id}"

    # -- sink batches' visibility records (docs/design.md §7) -----------------------------
    # Create-once and delete-once: a batch's ranges never change, so a node that exists
    # already is this very record, and no version is kept. Not fenced by the coordinator
    # epoch, and need not be: an older coordinator's record only makes readers' cut
    # track a batch longer (it is below the LSOs: it changes no cut), and a batch is
    # deleted only once markers showed every partition's LSO past it, which stays so.
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
        path = self.sink_batch_path(record.sink_id, record.batch_id)
        data = stamp_coordinator_epoch(record.to_json(), coordinator_epoch)
        if len(data) > MAX_ZNODE_BYTES:
            raise InvalidRequestError(
                f"sink {record.sink_id!r} batch {record.batch_id}: its ranges are {len(data)} "
                f"bytes, over the {MAX_ZNODE_BYTES} bytes a ZooKeeper node may hold"
            )

        def create(deadline: float) -> None:
            with contextlib.suppress(NodeExistsError):
                self._call(lambda: self._client.create_async(path, data, makepath=True), deadline)

        self._retrying(create, f"sink {record.sink_id!r} batch {record.batch_id}")

    def delete_sink_batch(self, sink_id: str, batch_id: int, *, coordinator_epoch: int = 0) -> None:
        path = self.sink_batch_path(sink_id, batch_id)

        def delete(deadline: float) -> None:
            with contextlib.suppress(NoNodeError):
                self._call(lambda: self._client.delete_async(path), deadline)

        self._retrying(delete, f"sink {sink_id!r} batch {batch_id}")

    def load_sink_batches(self) -> list[SinkBatchRecord]:
        def load(deadline: float) -> list[SinkBatchRecord]:
            found = []
            for sink, sink_path, _, _ in self._children(self.sink_batches_path, deadline):
                for name, path, data, _ in self._children(sink_path, deadline):
                    where = f"ZooKeeper node {path}"
                    record = SinkBatchRecord.from_json(data, where)
                    _check_key(
                        f"{znode_name(record.sink_id)}/{record.batch_id}", f"{sink}/{name}", where
                    )
                    found.append(record)
            return found

        result: list[SinkBatchRecord] = self._retrying(load, "the sink batches' records")
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
        """Create the node (``expected is None``) or set it if still at ``expected``."""
        try:
            if expected is None:
                self._call(lambda: self._client.create_async(path, data, makepath=True), deadline)
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
            seen = "absent" if expected is None else f"at version {expected}"
            raise ConcurrentTransactionsError(
                f"state of {what} in ZooKeeper node {path} was changed by another coordinator "
                f"(this one saw it {seen}); not overwriting it ({type(exc).__name__})"
            ) from exc

    # -- reads -------------------------------------------------------------------------
    def load(self) -> TxnState:
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
        for child, path, data, version in self._children(self.transactions_path, deadline):
            meta = TransactionMetadata.from_json(data, f"ZooKeeper node {path}")
            _check_key(znode_name(meta.transactional_id), child, f"ZooKeeper node {path}")
            txns[meta.transactional_id] = meta
            versions[path] = _Seen(version, coordinator_epoch_of(data, path))
        for child, path, data, version in self._children(self.sinks_path, deadline):
            record = SinkCommitRecord.from_json(data, f"ZooKeeper node {path}")
            _check_key(znode_name(record.sink_id), child, f"ZooKeeper node {path}")
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
        return self._session.call(request, deadline=deadline)
