"""Topic ids (docs/protocol.md, "Topic ids"): chosen at creation, stored with the topic,
carried by the requests that name a partition, refused with UNKNOWN_TOPIC_ID when stale."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest

from broker_core.cluster.metadata import ClusterMetadata
from broker_core.cluster.records import PartitionState, TopicAssignment
from broker_core.errors import (
    CorruptRecordError,
    InvalidRequestError,
    NotLeaderOrFollowerError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from broker_core.log.store import LogStore
from broker_core.protocol.admin_requests import ListOffsetsRequest
from broker_core.protocol.data_requests import FetchRequest, ProduceDescriptor
from broker_core.protocol.replica import (
    OffsetsForLeaderEpochRequest,
    ReplicaFetchRequest,
    ReplicaLogStartRequest,
)
from broker_core.protocol.topics import new_topic_id
from broker_core.protocol.txn_requests import AddPartitionsToTxnRequest, PrepareSinkTxnRequest
from broker_core.server.replication.partition import Partition, Role
from broker_core.server.replication.topic_ids import check_topic_id
from tests.store.helpers import open_log, rows

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


class _Cluster:
    """The two reads ``check_topic_id`` makes: the cached view and the store's."""

    def __init__(self, cached: str | None, stored: str | None) -> None:
        self.cached, self.stored = cached, stored
        self.store_reads = 0

    def _assignment(self, topic_id: str | None) -> TopicAssignment:
        if topic_id is None:
            raise UnknownTopicOrPartitionError("topic 't' does not exist")
        return TopicAssignment.of("t", {0: PartitionState.single(1)}, None, {}, topic_id)

    def topic(self, name: str) -> TopicAssignment:
        return self._assignment(self.cached)

    def read_topic(self, name: str) -> TopicAssignment:
        self.store_reads += 1
        return self._assignment(self.stored)


def _check(cluster: _Cluster, asked: str | None, held: str = "") -> None:
    check_topic_id(cast(ClusterMetadata, cluster), 1, "t", asked, held)


def test_the_current_id_is_served_without_reading_the_store() -> None:
    cluster = _Cluster(OLD, OLD)
    _check(cluster, OLD, OLD)
    _check(cluster, None, OLD)  # an older client
    assert cluster.store_reads == 0


def test_a_client_ahead_of_the_broker_is_served_after_the_store_is_read() -> None:
    cluster = _Cluster(OLD, NEW)  # the broker's cache has not seen the recreate yet
    _check(cluster, NEW)
    assert cluster.store_reads == 1


def test_a_stale_id_is_refused_non_retriable_naming_both_ids_after_the_store_agrees() -> None:
    cluster = _Cluster(NEW, NEW)
    with pytest.raises(UnknownTopicIdError) as refused:
        _check(cluster, OLD, NEW)
    assert refused.value.message == f"topic 't' was recreated: id {OLD} is now {NEW}"
    assert cluster.store_reads == 1
    gone = _Cluster(None, None)
    with pytest.raises(UnknownTopicIdError, match=f"topic 't' was deleted: id {OLD}"):
        _check(gone, OLD)


def test_a_local_copy_of_the_previous_incarnation_is_retriable_for_the_current_id() -> None:
    with pytest.raises(NotLeaderOrFollowerError, match=f"copy of topic 't' is of id {OLD}"):
        _check(_Cluster(NEW, NEW), NEW, OLD)
    with pytest.raises(NotLeaderOrFollowerError):  # an older client, once the cache knows
        _check(_Cluster(NEW, NEW), None, OLD)


def test_the_store_keeps_the_id_with_the_copy_and_a_copy_from_before_ids_adopts_one(
    tmp_path: Path,
) -> None:
    with LogStore(tmp_path / "a") as store:
        store.create_topic("t", 2, topic_id=OLD)
        store.create_topic("legacy", 1)
    with LogStore(tmp_path / "a") as store:
        assert store.topic("t").topic_id == OLD
        legacy = store.topic("legacy")
        assert legacy.topic_id == ""
        legacy.adopt_id(NEW)
        with pytest.raises(CorruptRecordError, match=f"holds topic id {NEW}, not {OLD}"):
            legacy.adopt_id(OLD)
    with LogStore(tmp_path / "a") as store:
        assert store.topic("legacy").topic_id == NEW
    doc = json.loads((tmp_path / "a" / "t" / "topic.json").read_text())
    assert doc["topic_id"] == OLD


def test_a_removed_replica_refuses_appends_and_wakes_its_waiters(tmp_path: Path) -> None:
    partition = Partition("t", 0, open_log(tmp_path / "t-0"), broker_id=1, topic_id=OLD)
    partition.apply(PartitionState((1, 2), 1, 0, (1, 2)))
    result = partition.append_as_leader(lambda log_: log_.append(rows(10)), True)
    partition.remove()
    assert partition.role is Role.REMOVED
    with pytest.raises(NotLeaderOrFollowerError, match="topic was deleted or replaced"):
        partition.append_as_leader(lambda log_: log_.append(rows(10, start=10)), True)
    with pytest.raises(NotLeaderOrFollowerError):
        partition.wait_replicated(result.last_offset + 1, 5.0, 0)
    with pytest.raises(RuntimeError, match="cannot go"):
        partition.apply(PartitionState((1, 2), 1, 1, (1, 2)))  # removed is for good
