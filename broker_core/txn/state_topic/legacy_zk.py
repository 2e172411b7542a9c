"""The previous format's coordinator state in ZooKeeper, read once for the upgrade.

Before issue 23 (idemlog 0.1) the controller ran the transaction coordinator and kept its
state in one JSON znode per transactional id, per sink and per held-back sink batch::

    <root>/transactions/<quoted transactional id>
    <root>/sinks/<quoted sink id>
    <root>/sink_batches/<quoted sink id>/<batch id>

Each node's JSON is the record's own (``TransactionMetadata``, ``SinkCommitRecord``,
``SinkBatchRecord``), with the writer's coordinator epoch (the controller epoch) in a
``coordinator_epoch`` field when it was not 0. Nothing writes these nodes any more: the
coordinator's state is the ``__transaction_state`` topic, and the first coordinator of
each of its partitions copies its share of them once (``server/coordination/state_migration.py``).
They stay in ZooKeeper so a downgrade could still read them; this module only reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kazoo.exceptions import NoNodeError

from broker_core.errors import InvalidRequestError, RequestTimedOutError
from broker_core.txn.state_topic.records import (
    SinkBatchRecord,
    SinkCommitRecord,
    TransactionMetadata,
)
from broker_core.txn.state_topic.store import check_key
from broker_core.zookeeper import ZkSession, ZkUnavailable

log = logging.getLogger("idemlog.txn")


def znode_name(key: str) -> str:
    """``key`` as the previous format named its node: URL-quoted, '.' too."""
    return quote(key, safe="").replace(".", "%2E")


@dataclass(frozen=True, slots=True)
class LegacyState:
    """Everything the previous format holds: what the upgrade copies."""

    transactions: dict[str, TransactionMetadata]
    sinks: dict[str, SinkCommitRecord]
    sink_batches: list[SinkBatchRecord]

    def __bool__(self) -> bool:
        return bool(self.transactions or self.sinks or self.sink_batches)


def read_legacy_state(
    client: Any,
    root: str = "/idemlog",
    *,
    retry_deadline_s: float = 15.0,
    request_timeout_s: float = 5.0,
) -> LegacyState:
    """Every node of the previous format under ``root``, read after a ``sync`` (so the
    answer is at least as new as the ZooKeeper leader when the read began); absent parents
    read as empty. ``client`` (a started kazoo client) stays the caller's.

    Raises CorruptRecordError for a node that cannot be parsed or is stored under another
    key's name, and RequestTimedOutError (retriable) when ZooKeeper stays unreachable for
    ``retry_deadline_s``.
    """
    if not root.startswith("/"):
        raise InvalidRequestError(f"ZooKeeper root {root!r} must start with '/'")
    root = root.rstrip("/")
    session = ZkSession(client, request_timeout_s=request_timeout_s)
    try:
        return _retrying(
            session, lambda deadline: _read_once(session, client, root, deadline), retry_deadline_s
        )
    finally:
        session.close()


def _read_once(session: ZkSession, client: Any, root: str, deadline: float) -> LegacyState:
    def call(request: Callable[[], Any]) -> Any:
        return session.call(request, deadline=deadline)

    def children(parent: str) -> list[tuple[str, str, bytes]]:
        try:
            names = call(lambda: client.get_children_async(parent))
        except NoNodeError:
            return []
        found = []
        for name in sorted(names):
            path = f"{parent}/{name}"
            data = read(path)
            if data is not None:  # else deleted since the listing
                found.append((name, path, data))
        return found

    def read(path: str) -> bytes | None:
        try:
            data, _ = call(lambda: client.get_async(path))
        except NoNodeError:
            return None
        return bytes(data)

    call(lambda: client.sync_async(root or "/"))
    txns: dict[str, TransactionMetadata] = {}
    for name, path, data in children(f"{root}/transactions"):
        meta = TransactionMetadata.from_json(data, f"ZooKeeper node {path}")
        check_key(znode_name(meta.transactional_id), name, f"ZooKeeper node {path}")
        txns[meta.transactional_id] = meta
    sinks: dict[str, SinkCommitRecord] = {}
    for name, path, data in children(f"{root}/sinks"):
        record = SinkCommitRecord.from_json(data, f"ZooKeeper node {path}")
        check_key(znode_name(record.sink_id), name, f"ZooKeeper node {path}")
        sinks[record.sink_id] = record
    batches: list[SinkBatchRecord] = []
    for sink, sink_path, _ in children(f"{root}/sink_batches"):
        for name, path, data in children(sink_path):
            batch = SinkBatchRecord.from_json(data, f"ZooKeeper node {path}")
            named = f"{znode_name(batch.sink_id)}/{batch.batch_id}"
            check_key(named, f"{sink}/{name}", f"ZooKeeper node {path}")
            batches.append(batch)
    return LegacyState(txns, sinks, batches)


def _retrying(
    session: ZkSession, attempt: Callable[[float], LegacyState], retry_deadline_s: float
) -> LegacyState:
    def on_retry(exc: ZkUnavailable, attempts: int, delay: float) -> None:
        log.warning("ZooKeeper unavailable (%s) reading the previous format's state, retrying", exc)

    def give_up(exc: ZkUnavailable, attempts: int) -> RequestTimedOutError:
        return RequestTimedOutError(
            f"ZooKeeper unavailable for {retry_deadline_s:g}s while reading the previous "
            f"format's coordinator state: {exc}"
        )

    result: LegacyState = session.retrying(
        attempt,
        deadline=time.monotonic() + retry_deadline_s,
        give_up=give_up,
        backoff_s=0.05,
        max_backoff_s=1.0,
        on_retry=on_retry,
    )
    return result
