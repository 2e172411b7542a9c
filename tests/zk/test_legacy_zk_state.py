"""The previous format's coordinator state, read from a real ZooKeeper as the upgrade
reads it (``txn.state_topic.legacy_zk``): every record back, names checked, absence empty."""

from __future__ import annotations

import pytest

from broker_core.errors import CorruptRecordError
from broker_core.txn.state_topic.legacy_zk import LegacyState, read_legacy_state
from broker_core.txn.state_topic.records import (
    SinkBatchRecord,
    SinkCommitRecord,
    SinkCommitState,
    TransactionMetadata,
    TransactionState,
)
from testkit.zookeeper import ZooKeeperHarness
from tests.harness.legacy_zk_state import write_legacy_state

ROOT = "/idemlog"


def meta(tid: str, epoch: int) -> TransactionMetadata:
    return TransactionMetadata(
        tid, 17, epoch, 60_000, TransactionState.ONGOING, {("payments", 0)}, 5, 6
    )


def test_every_record_is_read_back_whatever_its_name(zk_chroot: ZooKeeperHarness) -> None:
    zk = zk_chroot.client()
    assert not read_legacy_state(zk, ROOT)  # nothing of the previous format: empty
    ids = ["q/0", ".", "..", "ü ß%/x", "plain-id_1"]
    metas = [meta(tid, i) for i, tid in enumerate(ids)]
    sink = SinkCommitRecord("q", 9, SinkCommitState.PREPARE, [("q/0", 17, 0)])
    batch = SinkBatchRecord("q/x", 7, [("payments", 0, 10, 19), ("payments", 1, 3, 8)])
    write_legacy_state(
        zk, ROOT, transactions=metas, sinks=[sink], sink_batches=[batch], coordinator_epoch=4
    )
    assert {"q%2F0", "%2E", "%2E%2E"} <= set(zk.get_children(f"{ROOT}/transactions"))
    assert read_legacy_state(zk, ROOT) == LegacyState(
        {m.transactional_id: m for m in metas}, {"q": sink}, [batch]
    )


def test_a_record_under_another_keys_name_or_unparsable_is_corrupt(
    zk_chroot: ZooKeeperHarness,
) -> None:
    zk = zk_chroot.client()
    zk.create(f"{ROOT}/transactions/other", meta("app", 1).to_json(), makepath=True)
    with pytest.raises(CorruptRecordError, match="record names 'app', not its key 'other'"):
        read_legacy_state(zk, ROOT)
    zk.delete(f"{ROOT}/transactions/other")
    zk.create(f"{ROOT}/sinks/q", b"{not json", makepath=True)
    with pytest.raises(CorruptRecordError, match=f"ZooKeeper node {ROOT}/sinks/q"):
        read_legacy_state(zk, ROOT)
