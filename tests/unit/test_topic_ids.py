"""Topic ids (docs/protocol.md, "Topic ids"): chosen at creation, stored with the topic,
carried by the requests that name a partition, refused with UNKNOWN_TOPIC_ID when stale."""

from __future__ import annotations

import json

import pytest

from broker_core.cluster.metadata import PartitionState, TopicAssignment
from broker_core.errors import (
    CorruptRecordError,
    InvalidRequestError,
    UnknownTopicIdError,
    error_for_code,
)
from broker_core.protocol.admin_requests import ListOffsetsRequest
from broker_core.protocol.data_requests import FetchRequest, ProduceDescriptor
from broker_core.protocol.replica import (
    OffsetsForLeaderEpochRequest,
    ReplicaFetchRequest,
    ReplicaLogStartRequest,
)
from broker_core.protocol.topics import new_topic_id
from broker_core.protocol.txn_requests import AddPartitionsToTxnRequest, PrepareSinkTxnRequest

WHERE = "/idemlog/topics/t"
OLD, NEW = "a" * 32, "b" * 32


def test_new_ids_are_32_hex_digits_and_differ() -> None:
    ids = {new_topic_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) == 32 and int(i, 16) >= 0 and i == i.lower() for i in ids)


def test_the_error_is_code_100_non_retriable_and_names_the_topic_and_both_ids() -> None:
    error = UnknownTopicIdError.recreated("orders", OLD, NEW)
    assert error.code == 100 and not error.retriable
    assert error.message == f"topic 'orders' was recreated: id {OLD} is now {NEW}"
    assert "was deleted" in UnknownTopicIdError.recreated("orders", OLD, "").message
    again = error_for_code(100, error.message)  # as the client rebuilds it off the wire
    assert isinstance(again, UnknownTopicIdError) and again.message == error.message


def test_an_assignment_keeps_its_id_through_the_stored_form_and_state_changes() -> None:
    states = {0: PartitionState((1, 2), 1, 0, (1, 2))}
    topic = TopicAssignment.of("t", states, None, {}, OLD)
    doc = json.loads(json.dumps(topic.to_doc()))
    assert doc["topic_id"] == OLD
    assert TopicAssignment.from_doc("t", doc, WHERE) == topic
    moved = topic.with_states({0: PartitionState((1, 2), 2, 1, (2,))})
    assert moved.topic_id == OLD


def test_a_document_from_before_ids_reads_without_one_and_is_upgraded_with_one() -> None:
    states = {0: PartitionState.single(1)}
    doc = TopicAssignment.of("t", states, None, {}).to_doc()
    assert "topic_id" not in doc
    old = TopicAssignment.from_doc("t", doc, WHERE)
    assert old.topic_id == ""
    assert old.with_topic_id(NEW).topic_id == NEW
    with pytest.raises(InvalidRequestError, match="not a topic id"):
        old.with_topic_id("Z" * 32)


@pytest.mark.parametrize("bad", ["", "x" * 32, "A" * 32, 7])
def test_a_stored_bad_id_is_corrupt_naming_the_node(bad: object) -> None:
    doc = {**TopicAssignment.of("t", {0: PartitionState.single(1)}, None, {}).to_doc()}
    doc["topic_id"] = bad
    if bad == "":
        assert TopicAssignment.from_doc("t", doc, WHERE).topic_id == ""
        return
    with pytest.raises(CorruptRecordError, match=f"{WHERE}.*topic_id"):
        TopicAssignment.from_doc("t", doc, WHERE)


def test_every_request_naming_a_partition_carries_an_optional_topic_id() -> None:
    singles = [
        ProduceDescriptor("t", 0, topic_id=OLD),
        FetchRequest("t", 0, 5, topic_id=OLD),
        ListOffsetsRequest("t", 0, OLD),
        ReplicaFetchRequest("t", 0, 2, 5, 1, 1024, 10, OLD),
        ReplicaLogStartRequest("t", 0, 2, 1, OLD),
        OffsetsForLeaderEpochRequest("t", 0, 1, 0, OLD),
    ]
    for request in singles:
        doc = json.loads(json.dumps(request.to_doc()))
        assert doc["topic_id"] == OLD
        assert type(request).from_doc(doc) == request
        without = {k: v for k, v in doc.items() if k != "topic_id"}
        assert type(request).from_doc(without).topic_id is None  # an older client
    add = AddPartitionsToTxnRequest("x", 1, 0, (("t", 0), ("u", 1)), {"t": OLD, "u": NEW})
    prepare = PrepareSinkTxnRequest("x", 1, 0, 3, (("t", 0, 0, 9),), {"t": OLD})
    for multi in (add, prepare):
        doc = json.loads(json.dumps(multi.to_doc()))
        again = type(multi).from_doc(doc)
        assert again.topic_ids == multi.topic_ids
        del doc["topic_ids"]
        assert type(multi).from_doc(doc).topic_ids == {}


def test_a_malformed_topic_id_is_refused_naming_the_action_and_field() -> None:
    doc = FetchRequest("t", 0, 5).to_doc()
    with pytest.raises(InvalidRequestError, match=r"fetch ticket: field 'topic_id'.*'nope'"):
        FetchRequest.from_doc({**doc, "topic_id": "nope"})
    add = AddPartitionsToTxnRequest("x", 1, 0, (("t", 0),)).to_doc()
    with pytest.raises(InvalidRequestError, match=r"topic_ids\['t'\]"):
        AddPartitionsToTxnRequest.from_doc({**add, "topic_ids": {"t": "G" * 32}})
