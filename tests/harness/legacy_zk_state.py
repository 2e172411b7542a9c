"""Writes coordinator state in the previous format (idemlog 0.1's znodes), as the
controller's coordinator left it, for the upgrade's tests: the product only reads it
(``broker_core.txn.state_topic.legacy_zk``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from broker_core.txn.state_topic.legacy_zk import znode_name
from broker_core.txn.state_topic.records import (
    SinkBatchRecord,
    SinkCommitRecord,
    TransactionMetadata,
)


def stamped(record: bytes, coordinator_epoch: int) -> bytes:
    """The record's JSON as the previous format stored it: the writer's coordinator epoch
    in ``coordinator_epoch``, left out for epoch 0."""
    if coordinator_epoch == 0:
        return record
    doc = json.loads(record)
    doc["coordinator_epoch"] = coordinator_epoch
    return json.dumps(doc, separators=(",", ":")).encode()


def write_legacy_state(
    zk: Any,
    root: str = "/idemlog",
    *,
    transactions: Iterable[TransactionMetadata] = (),
    sinks: Iterable[SinkCommitRecord] = (),
    sink_batches: Iterable[SinkBatchRecord] = (),
    coordinator_epoch: int = 0,
) -> None:
    """One znode per record under ``root`` (a started kazoo client's), created with its
    parents."""
    for meta in transactions:
        path = f"{root}/transactions/{znode_name(meta.transactional_id)}"
        zk.create(path, stamped(meta.to_json(), coordinator_epoch), makepath=True)
    for sink in sinks:
        path = f"{root}/sinks/{znode_name(sink.sink_id)}"
        zk.create(path, stamped(sink.to_json(), coordinator_epoch), makepath=True)
    for batch in sink_batches:
        path = f"{root}/sink_batches/{znode_name(batch.sink_id)}/{batch.batch_id}"
        zk.create(path, stamped(batch.to_json(), coordinator_epoch), makepath=True)
