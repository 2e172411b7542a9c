"""``__transaction_state`` written by the old code (schema version 1, value not null) is
upgraded on open to version 2 (tombstones), and a crash at any step of the upgrade leaves
one readable state (broker_core/txn/state_topic/schema.py, docs/storage.md).

The data directories are built the way the old code wrote them: a topic of the version-1
schema holding JSON records without the fields added since (a sink's ``last_update_ms``
and ``batch_job``). The crash states are built as each step leaves them: every step is
fsynced before the next begins, so a crash leaves exactly one of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_core.errors import CorruptRecordError
from broker_core.log.store import LogStore
from broker_core.txn.state_topic.records import (
    SinkCommitRecord,
    SinkCommitState,
    TransactionMetadata,
    TransactionState,
)
from broker_core.txn.state_topic.schema import (
    MIGRATION_TOPIC,
    TOPIC_CONFIG,
    TXN_STATE_SCHEMA,
    TXN_STATE_SCHEMA_V1,
    TXN_STATE_TOPIC,
    Row,
    append_rows,
    read_rows,
)
from broker_core.txn.state_topic.store import KIND_SINK, KIND_TRANSACTION
from testkit.state_store import local_state_store
from tests.store.test_txn_coordinator import P0, Producer, start_broker

S = TransactionState
JOB = "batch-0123456789abcdef0123456789abcdef"


def meta(tid: str, epoch: int, state: TransactionState) -> TransactionMetadata:
    return TransactionMetadata(tid, 40 + len(tid), epoch, 60_000, state, set(), -1, 5 + epoch)


def old_sink(sink_id: str, batch: int) -> bytes:
    """A sink record as the old code wrote it: no last_update_ms, no batch_job."""
    doc = json.loads(SinkCommitRecord(sink_id, batch, SinkCommitState.COMPLETE, []).to_json())
    del doc["last_update_ms"], doc["batch_job"]
    return json.dumps(doc).encode()


OLD_ROWS: list[Row] = [
    (KIND_TRANSACTION, "app-1", meta("app-1", 0, S.EMPTY).to_json()),
    (KIND_SINK, "query-1", old_sink("query-1", 3)),
    (KIND_TRANSACTION, "app-1", meta("app-1", 1, S.COMPLETE_COMMIT).to_json()),
    (KIND_TRANSACTION, "query-1/0", meta("query-1/0", 4, S.COMPLETE_COMMIT).to_json()),
    (KIND_SINK, "query-1", old_sink("query-1", 4)),
    (KIND_SINK, JOB, old_sink(JOB, 0)),
]
NEWEST = {
    "app-1": meta("app-1", 1, S.COMPLETE_COMMIT),
    "query-1/0": meta("query-1/0", 4, S.COMPLETE_COMMIT),
}


def old_data_dir(path: Path) -> None:
    """``__transaction_state`` as the old code left it (plus the data topics)."""
    store = LogStore(path / "data")
    store.create_topic(TXN_STATE_TOPIC, 1, schema=TXN_STATE_SCHEMA_V1, config=TOPIC_CONFIG)
    for row in OLD_ROWS:
        append_rows(store.partition(TXN_STATE_TOPIC, 0), [row], TXN_STATE_SCHEMA_V1)
    store.create_topic("payments", 2)
    store.create_topic("audit", 1)
    store.close()


def migration_topic(path: Path, rows: list[Row], complete: bool) -> None:
    """``.migrating`` as step 1 leaves it: the newest rows, then the completion row."""
    store = LogStore(path / "data")
    store.create_topic(MIGRATION_TOPIC, 1, schema=TXN_STATE_SCHEMA, config=TOPIC_CONFIG)
    append_rows(store.partition(MIGRATION_TOPIC, 0), rows, TXN_STATE_SCHEMA)
    if complete:
        done: Row = ("migration", "complete", str(len(rows)).encode())
        append_rows(store.partition(MIGRATION_TOPIC, 0), [done], TXN_STATE_SCHEMA)
    store.close()


def newest_rows() -> list[Row]:
    return [OLD_ROWS[2], OLD_ROWS[3], OLD_ROWS[4], OLD_ROWS[5]]


def check_upgraded(path: Path) -> None:
    """Opening upgrades the topic: the newest record per key, once, and it works on."""
    broker = start_broker(path)
    store = broker.store
    assert store.topic(TXN_STATE_TOPIC).schema.equals(TXN_STATE_SCHEMA)
    assert MIGRATION_TOPIC not in store.topics()
    assert not (store.data_dir / MIGRATION_TOPIC).exists()
    rows = [row for _, row in read_rows(store.partition(TXN_STATE_TOPIC, 0))]
    assert sorted(rows) == sorted(newest_rows())  # nothing twice, nothing lost
    txns, sinks = broker.state.load()
    assert txns == NEWEST
    assert sinks["query-1"].batch_id == 4 and not sinks["query-1"].batch_job
    assert sinks[JOB].batch_job  # inferred from the job's sink id form
    assert broker.coordinator.last_committed_batch("query-1") == 4
    # The upgraded topic takes tombstones and new records.
    broker.state.delete_transaction("app-1")
    p = Producer(broker, "app-2").init()
    p.send(P0, range(3))
    p.commit()
    assert set(broker.state.load()[0]) == {"query-1/0", "app-2"}
    assert broker.committed(P0) == [0, 1, 2]
    store.close()


def test_an_old_schema_topic_is_upgraded_on_open(tmp_path: Path) -> None:
    old_data_dir(tmp_path)
    check_upgraded(tmp_path)
    reopened = start_broker(tmp_path)  # a second open changes nothing
    assert set(reopened.state.load()[0]) == {"query-1/0", "app-2"}


def test_a_crash_while_copying_restarts_from_the_old_topic(tmp_path: Path) -> None:
    old_data_dir(tmp_path)
    migration_topic(tmp_path, newest_rows()[:2], complete=False)
    check_upgraded(tmp_path)


def test_a_crash_after_the_copy_resumes_from_it(tmp_path: Path) -> None:
    """Crashes after step 1 (old topic still there), inside step 2 (its directory half
    deleted, its metadata gone) and inside step 3 (the new topic half written)."""
    for case in ("old topic kept", "old topic half deleted", "new topic half written"):
        path = tmp_path / case.replace(" ", "-")
        old_data_dir(path)
        migration_topic(path, newest_rows(), complete=True)
        store = LogStore(path / "data")
        if case != "old topic kept":
            store.delete_topic(TXN_STATE_TOPIC)
        if case == "old topic half deleted":
            (store.data_dir / TXN_STATE_TOPIC / "0").mkdir(parents=True)
        if case == "new topic half written":
            store.create_topic(TXN_STATE_TOPIC, 1, schema=TXN_STATE_SCHEMA, config=TOPIC_CONFIG)
            append_rows(store.partition(TXN_STATE_TOPIC, 0), newest_rows()[:3], TXN_STATE_SCHEMA)
        store.close()
        check_upgraded(path)


def test_a_topic_of_an_unknown_schema_is_refused_by_name(tmp_path: Path) -> None:
    store = LogStore(tmp_path / "data")
    odd = TXN_STATE_SCHEMA_V1.append(TXN_STATE_SCHEMA_V1.field("key").with_name("extra"))
    store.create_topic(TXN_STATE_TOPIC, 1, schema=odd, config=TOPIC_CONFIG)
    with pytest.raises(CorruptRecordError, match="neither version 1") as refused:
        local_state_store(store)
    assert TXN_STATE_TOPIC in refused.value.message
