"""The transaction state machine and the coordinator's state records
(broker_core.txn.state_topic.records)."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from broker_core.errors import CorruptRecordError, InvalidTxnStateError
from broker_core.txn.state_topic.records import (
    NO_TXN_START,
    SinkCommitRecord,
    SinkCommitState,
    TransactionMetadata,
    TransactionState,
)

S = TransactionState

# Written out independently of the module's table: Kafka's TransactionState, where
# EMPTY -> EMPTY and COMPLETE_* -> EMPTY are epoch bumps and ONGOING -> ONGOING adds
# partitions; DEAD is terminal.
LEGAL = {
    (S.EMPTY, S.EMPTY),
    (S.EMPTY, S.ONGOING),
    (S.EMPTY, S.DEAD),
    (S.ONGOING, S.ONGOING),
    (S.ONGOING, S.PREPARE_COMMIT),
    (S.ONGOING, S.PREPARE_ABORT),
    (S.PREPARE_COMMIT, S.COMPLETE_COMMIT),
    (S.PREPARE_ABORT, S.COMPLETE_ABORT),
    (S.COMPLETE_COMMIT, S.ONGOING),
    (S.COMPLETE_COMMIT, S.EMPTY),
    (S.COMPLETE_COMMIT, S.DEAD),
    (S.COMPLETE_ABORT, S.ONGOING),
    (S.COMPLETE_ABORT, S.EMPTY),
    (S.COMPLETE_ABORT, S.DEAD),
}
ALL_PAIRS = list(itertools.product(TransactionState, repeat=2))


def meta(state: TransactionState = S.EMPTY, **changes: object) -> TransactionMetadata:
    m = TransactionMetadata(
        transactional_id="sink-1/3",
        producer_id=4242,
        producer_epoch=7,
        timeout_ms=60_000,
        state=state,
        partitions={("payments", 0), ("audit", 2)} if state is S.ONGOING else set(),
        txn_start_ms=500 if state is not S.EMPTY else NO_TXN_START,
        last_update_ms=600,
    )
    for name, value in changes.items():
        setattr(m, name, value)
    return m


def test_the_table_has_every_state() -> None:
    assert {s.name for s in TransactionState} == {
        "EMPTY",
        "ONGOING",
        "PREPARE_COMMIT",
        "PREPARE_ABORT",
        "COMPLETE_COMMIT",
        "COMPLETE_ABORT",
        "DEAD",
    }
    assert len(ALL_PAIRS) == 49


@pytest.mark.parametrize(
    ("old", "new"), ALL_PAIRS, ids=[f"{a.name}->{b.name}" for a, b in ALL_PAIRS]
)
def test_transition(old: TransactionState, new: TransactionState) -> None:
    legal = (old, new) in LEGAL
    assert old.can_transition_to(new) is legal
    m = meta(old)
    before = m.copy()
    if legal:
        m.transition(new, 9_999)
        assert m.state is new
        assert m.last_update_ms == 9_999
        assert (m.producer_id, m.producer_epoch) == (before.producer_id, before.producer_epoch)
    else:
        with pytest.raises(InvalidTxnStateError) as info:
            m.transition(new, 9_999)
        assert info.value.code == 48
        assert f"from {old.name} to {new.name}" in info.value.message
        assert "sink-1/3" in info.value.message
        assert m == before  # nothing changed


def test_a_new_transaction_starts_its_clock_and_partition_set() -> None:
    m = meta(S.COMPLETE_COMMIT, partitions={("old", 1)}, txn_start_ms=5)
    m.transition(S.ONGOING, 1_000)
    assert (m.txn_start_ms, m.partitions) == (1_000, set())
    m.partitions.add(("payments", 1))
    m.transition(S.ONGOING, 2_000)  # adding partitions keeps the transaction
    assert (m.txn_start_ms, m.partitions) == (1_000, {("payments", 1)})
    m.transition(S.PREPARE_ABORT, 3_000)
    assert m.partitions == {("payments", 1)}  # the markers still need them
    m.transition(S.COMPLETE_ABORT, 4_000)
    assert m.partitions == set()
    assert m.txn_start_ms == 1_000


def test_copy_does_not_share_the_partition_set() -> None:
    m = meta(S.ONGOING)
    c = m.copy()
    c.partitions.add(("x", 9))
    assert ("x", 9) not in m.partitions


def test_metadata_json_round_trip_keeps_every_field() -> None:
    m = meta(S.PREPARE_COMMIT, partitions={("b", 1), ("a", 10), ("a", 2)}, previous_producer_id=9)
    data = m.to_json()
    doc = json.loads(data)
    assert doc["partitions"] == [["a", 2], ["a", 10], ["b", 1]]  # stable order
    assert doc["state"] == "PREPARE_COMMIT"
    assert TransactionMetadata.from_json(data, "here") == m


def test_sink_record_json_round_trip() -> None:
    r = SinkCommitRecord("query-1", 17, SinkCommitState.PREPARE, [("query-1/0", 5, 2)])
    assert r.is_pending
    back = SinkCommitRecord.from_json(r.to_json(), "here")
    assert back == r
    assert not SinkCommitRecord("q", 1, "COMPLETE", []).is_pending


def test_sink_record_rejects_an_unknown_state() -> None:
    with pytest.raises(ValueError, match="'DONE' is not one of PREPARE, COMPLETE"):
        SinkCommitRecord("q", 1, "DONE", [])


def _doc(**changes: object) -> bytes:
    doc = json.loads(meta(S.ONGOING).to_json())
    doc.update(changes)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (_doc(version=2), "unsupported version 2"),
        (_doc(state="PENDING"), "unknown state 'PENDING'"),
        (_doc(producer_epoch="7"), "field 'producer_epoch' is missing or not int"),
        (_doc(producer_id=True), "field 'producer_id' is missing or not int"),
        (_doc(partitions=[["a"]]), "partition ['a'] is not [topic, partition]"),
    ],
)
def test_corrupt_metadata_is_refused_naming_where(data: bytes, problem: str) -> None:
    with pytest.raises(CorruptRecordError) as info:
        TransactionMetadata.from_json(data, "node /x/y")
    assert info.value.message.startswith("node /x/y: ")
    assert problem in info.value.message


def test_corrupt_sink_record_is_refused() -> None:
    good = json.loads(SinkCommitRecord("q", 1, "PREPARE", [("q/0", 1, 0)]).to_json())
    cases: list[tuple[dict[str, object], str]] = [
        ({"state": "MAYBE"}, "unknown sink state 'MAYBE'"),
        ({"transactions": [["q/0", 1]]}, "is not [transactional_id, pid, epoch]"),
        ({"batch_id": None}, "field 'batch_id' is missing or not int"),
    ]
    for change, problem in cases:
        doc = {**good, **change}
        with pytest.raises(CorruptRecordError, match=re.escape(problem)):
            SinkCommitRecord.from_json(json.dumps(doc).encode(), "offset 3")
