"""The typed wire requests: each round-trips through its JSON body, and a bad body is an
InvalidRequestError naming the action and the field."""

from __future__ import annotations

import base64
import json
from typing import Any, get_type_hints

import pyarrow as pa
import pytest

from broker_core.errors import InvalidRequestError, InvalidRequiredAcksError
from broker_core.log.partition_log import IsolationLevel
from broker_core.protocol import replica as rp
from broker_core.protocol import stable_cut as sc
from broker_core.protocol.admin_requests import (
    AbortHangingTransactionRequest,
    AbortHangingTransactionResponse,
    AbortTransactionRequest,
    AbortTransactionResponse,
    BrokerAddress,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteTopicRequest,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTopicsRequest,
    DescribeTopicsResponse,
    FindCoordinatorRequest,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
    MetadataRequest,
    MetadataResponse,
    MetricsRequest,
    PartitionInfo,
    PartitionOffsets,
    PingRequest,
    PingResponse,
    ProducerDescription,
    TopicDescription,
)
from broker_core.protocol.data_requests import (
    FETCH_ISOLATION_LEVELS,
    FetchRequest,
    ProduceDescriptor,
)
from broker_core.protocol.metrics import MetricsResponse
from broker_core.protocol.requests import ACKS_LEADER, EmptyResponse
from broker_core.protocol.txn_requests import (
    AbortSinkBatchRequest,
    AbortSinkRunRequest,
    AbortSinkRunResponse,
    AddPartitionsToTxnRequest,
    CommitSinkBatchRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    InitProducerIdResponse,
    PrepareSinkTxnRequest,
    SinkBatchResponse,
    SinkHeartbeatRequest,
    StableEndsRequest,
    StableEndsResponse,
    WriteTxnMarkersRequest,
)
from broker_core.protocol.wire import PROTOCOL_VERSION, Action, SinkAttempt, SinkTxnStatus
from broker_core.server.requests.handlers import ActionHandlers

ROUND_TRIP: list[Any] = [
    CreateTopicRequest("t", 3, b"\x00ipc", {"retention.ms": 5}),
    CreateTopicRequest("t", 1),
    DeleteTopicRequest("t"),
    DescribeTopicsRequest(("a", "b")),
    DescribeTopicsRequest(),
    ListOffsetsRequest("t", 2),
    MetadataRequest(("t",)),
    FindCoordinatorRequest("tx"),
    InitProducerIdRequest(),
    InitProducerIdRequest("tx", 1000),
    InitProducerIdRequest("s/0", None, SinkAttempt("s", "run-1", 4)),
    AddPartitionsToTxnRequest("tx", 7, 1, (("t", 0), ("u", 3))),
    EndTxnRequest("tx", 7, 1, True),
    PrepareSinkTxnRequest("s/0", 7, 1, 4, (("t", 0, 10, 19),)),
    WriteTxnMarkersRequest(((7, 1, (("t", 0),)),), False, 3),
    WriteTxnMarkersRequest(((7, 1, (("t", 0),)), (8, 0, (("t", 0), ("u", 2)))), True, 3),
    CommitSinkBatchRequest("s", 4, (("s/0", 7, 1),), "run-1"),
    CommitSinkBatchRequest("s", 4, ()),
    AbortSinkBatchRequest("s", 4, (("s/0", 7, 1),)),
    AbortSinkRunRequest(4, "run-1"),
    AbortSinkRunRequest(4, None, "s"),
    SinkHeartbeatRequest("s", "run-1"),
    StableEndsRequest("t"),
    sc.TrackedBatchesRequest("t"),
    sc.TrackedBatchesRequest("t", 12),
    ListTransactionsRequest(500),
    AbortTransactionRequest("tx"),
    DescribeProducersRequest("t", 2),
    AbortHangingTransactionRequest("t", 2, producer_id=7, producer_epoch=3),
    AbortHangingTransactionRequest("t", 2, start_offset=40),
    ProduceDescriptor("t", 1),
    FetchRequest("t", 1, 5, 1024, "read_uncommitted", 9),
    FetchRequest("t", 1, 5),
    ProduceDescriptor("t", 1, ACKS_LEADER),
    rp.ReplicaFetchRequest("t", 1, 2, 100, 3, 1024, 500),
    rp.OffsetsForLeaderEpochRequest("t", 1, 3, 2),
    rp.ReplicaLogStartRequest("t", 1, 2, 3),
    rp.ElectLeadersRequest(("t",)),
    rp.ElectLeadersRequest(),
]


@pytest.mark.parametrize("request_", ROUND_TRIP, ids=lambda r: type(r).__name__)
def test_round_trip_through_json(request_: Any) -> None:
    doc = json.loads(json.dumps(request_.to_doc()))  # what travels on the wire
    assert type(request_).from_doc(doc) == request_


def test_every_action_has_a_request() -> None:
    actions = {r.ACTION for r in ROUND_TRIP if hasattr(r, "ACTION")}
    actions |= {MetricsRequest.ACTION, PingRequest.ACTION}
    assert actions == set(Action)


def test_wire_field_names_stay_as_they_were() -> None:
    assert InitProducerIdRequest("s/0", 9, SinkAttempt("s", "r", 2)).to_doc() == {
        "transactional_id": "s/0",
        "sink_batch_id": 2,
        "sink_id": "s",
        "sink_run_id": "r",
        "transaction_timeout_ms": 9,
    }
    assert WriteTxnMarkersRequest(((7, 1, (("t", 0),)),), True, 0).to_doc() == {
        "producer_id": 7,
        "producer_epoch": 1,
        "commit": True,
        "coordinator_epoch": 0,
        "partitions": [["t", 0]],
    }
    assert FetchRequest("t", 0, 3).to_doc()["op"] == "fetch"


def test_fetch_isolation_levels_are_the_logs() -> None:
    assert set(FETCH_ISOLATION_LEVELS) == {level.value for level in IsolationLevel}


@pytest.mark.parametrize(
    ("cls", "doc", "message"),
    [
        (EndTxnRequest, {"transactional_id": "a", "producer_id": 1, "producer_epoch": 0},
         "end_txn: missing field 'commit'"),
        (EndTxnRequest, {"transactional_id": "a", "producer_id": 1, "producer_epoch": 40000,
                            "commit": True}, "end_txn: field 'producer_epoch' must be in 0.."),
        (AddPartitionsToTxnRequest, {"transactional_id": "a", "producer_id": 1,
                                        "producer_epoch": 0, "partitions": [["t", True]]},
         "add_partitions_to_txn: field 'partitions[0]' must be [topic: str, partition: int]"),
        (PrepareSinkTxnRequest, {"transactional_id": "a", "producer_id": 1,
                                    "producer_epoch": 0, "batch_id": 0, "ranges": [["t", 0, 1]]},
         "prepare_sink_txn: field 'ranges[0]' must be [topic: str, partition: int"),
        (AbortSinkBatchRequest, {"sink_id": "", "batch_id": 0, "transactions": []},
         "abort_sink_batch: field 'sink_id' must not be empty"),
        (InitProducerIdRequest, {"sink_batch_id": 1}, "field 'sink_batch_id' needs a"),
        (InitProducerIdRequest, {"transactional_id": "s/0", "sink_batch_id": 1,
                                    "sink_id": "s"},
         "init_producer_id: missing field 'sink_run_id'"),
        (CreateTopicRequest, {"name": "t", "partitions": 1, "schema": "%%"},
         "create_topic: field 'schema' is not base64"),
        (MetadataRequest, {"topics": ["a", 1]}, "metadata: field 'topics[1]' must be str"),
        (ProduceDescriptor, {"op": "fetch"}, "produce descriptor: field 'op' must be 'produce'"),
        (FetchRequest, {"op": "fetch", "topic": "t", "partition": 0, "offset": 0,
                           "isolation": "dirty"}, "fetch ticket: field 'isolation' must be one of"),
        (FetchRequest, {"op": "fetch", "topic": "t", "partition": 0, "offset": 0,
                           "max_bytes": 0}, "fetch ticket: field 'max_bytes' must be in 1.."),
        (AbortHangingTransactionRequest, {"topic": "t", "partition": 0},
         "abort_hanging_transaction: give 'producer_id' or 'start_offset' (exactly one"),
        (AbortHangingTransactionRequest, {"topic": "t", "partition": 0, "producer_id": 1,
                                             "start_offset": 4}, "(exactly one of them)"),
        (AbortHangingTransactionRequest, {"topic": "t", "partition": 0, "start_offset": 4,
                                             "producer_epoch": 1},
         "field 'producer_epoch' needs a 'producer_id'"),
        (AbortHangingTransactionRequest, {"topic": "t", "partition": 0, "producer_id": -1},
         "field 'producer_id' must be >= 0, got -1"),
        (sc.TrackedBatchesRequest, {"topic": "t", "since": -2},
         "tracked_batches: field 'since' must be >= -1, got -2"),
        (sc.TrackedBatchesRequest, {"topic": "t"}, "tracked_batches: missing field 'since'"),
        (sc.TrackedBatches, {"incarnation": "i", "generation": 0, "evicted_through": 0,
                             "evicted_high": {}, "batches": [[[0, 1]]]},
         "tracked_batches answer: malformed 'batches' or 'evicted_high'"),
    ],
)  # fmt: skip
def test_a_bad_body_names_the_action_and_the_field(cls: Any, doc: Any, message: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        cls.from_doc(doc)
    assert message in info.value.message


def test_responses_round_trip() -> None:
    answer = InitProducerIdResponse(7, 2, SinkTxnStatus.PREPARED)
    assert InitProducerIdResponse.from_doc(answer.to_doc()) == answer
    ends = StableEndsResponse({0: 5, 1: 0})
    assert StableEndsResponse.from_doc(json.loads(json.dumps(ends.to_doc()))) == ends
    tracked = sc.TrackedBatches("inc", 9, 3, {0: 41, 2: 7}, [[(0, 1, 5), (1, 2, 2)], [(2, 0, 0)]])
    assert sc.TrackedBatches.from_doc(json.loads(json.dumps(tracked.to_doc()))) == tracked
    producers = DescribeProducersResponse(
        "t",
        1,
        (ProducerDescription(7, 3, 11, 1_000, -1, 40), ProducerDescription(8, 0, 4, 9, 2, -1)),
        60,
        40,
    )
    assert (
        DescribeProducersResponse.from_doc(json.loads(json.dumps(producers.to_doc()))) == producers
    )
    assert [p.has_open_transaction for p in producers.producers] == [True, False]
    aborted = AbortHangingTransactionResponse("t", 1, 7, 40, 61, 4, 62)
    assert AbortHangingTransactionResponse.from_doc(aborted.to_doc()) == aborted
    with pytest.raises(InvalidRequestError, match=r"describe_producers answer: producers\[0\]"):
        DescribeProducersResponse.from_doc({**producers.to_doc(), "producers": [1]})
    batch = SinkBatchResponse(None, False)
    assert SinkBatchResponse.from_doc(batch.to_doc()) == batch
    with pytest.raises(InvalidRequestError, match="field 'sink_status' is 'maybe'"):
        InitProducerIdResponse.from_doc({"producer_id": 1, "producer_epoch": 0,
                                            "sink_status": "maybe"})  # fmt: skip


def test_a_replica_fetch_answer_round_trips_and_a_short_one_is_named() -> None:
    answer = rp.ReplicaFetchResponse(10, 0, 12, b"\x01batches")
    assert rp.ReplicaFetchResponse.decode(answer.encode()) == answer
    with pytest.raises(InvalidRequestError, match="replica_fetch answer"):
        rp.ReplicaFetchResponse.decode(answer.encode()[:6])
    with pytest.raises(InvalidRequestError, match="'fetch_offset' must be >= 0"):
        rp.ReplicaFetchRequest.from_doc(
            {**rp.ReplicaFetchRequest("t", 0, 1, 0, 0, 1, 0).to_doc(), "fetch_offset": -1}
        )
    start = rp.ReplicaLogStartResponse(100, 120, -1, b"IDPS snapshot")
    assert rp.ReplicaLogStartResponse.decode(start.encode()) == start
    for bad in (
        rp.ReplicaLogStartResponse(100, 99, 0, b"s"),  # below the log start
        rp.ReplicaLogStartResponse(100, 100, -2, b"s"),
        rp.ReplicaLogStartResponse(100, 100, 0, b""),  # no snapshot
    ):
        with pytest.raises(InvalidRequestError, match="replica_log_start answer"):
            rp.ReplicaLogStartResponse.decode(bad.encode())
    with pytest.raises(InvalidRequiredAcksError, match="acks=2"):
        ProduceDescriptor.from_doc({"op": "produce", "topic": "t", "partition": 0, "acks": 2})


SCHEMA = pa.schema([("id", pa.int64())])
TOPIC = TopicDescription(
    "t", SCHEMA, {"retention.ms": "-1"}, (PartitionInfo(0, 2, (2, 1), (2,), 3),), "id-1"
)
# Each answer a handler builds, with the document it has always sent (field for field).
ANSWERS: list[tuple[Any, dict[str, Any]]] = [
    (EmptyResponse(), {}),
    (CreateTopicResponse("t", (1, 2)), {"name": "t", "partitions": [1, 2]}),
    (
        DescribeTopicsResponse((TOPIC,)),
        {
            "topics": [
                {
                    "name": "t",
                    "topic_id": "id-1",
                    "partitions": [
                        {"partition": 0, "leader": 2, "replicas": [2, 1], "isr": [2],
                         "leader_epoch": 3}
                    ],
                    "schema": base64.b64encode(SCHEMA.serialize().to_pybytes()).decode(),
                    "config": {"retention.ms": "-1"},
                }
            ]
        },
    ),
    (
        ListOffsetsResponse("t", 1, PartitionOffsets(0, 9, 8, 7)),
        {"topic": "t", "partition": 1, "log_start_offset": 0, "log_end_offset": 9,
         "high_watermark": 8, "last_stable_offset": 7},
    ),
    (
        MetadataResponse((BrokerAddress(1, "h", 9),), None, {"t": (1, 1)}, {"t": "id-1"}),
        {"brokers": [{"broker_id": 1, "host": "h", "port": 9}], "controller": None,
         "topics": {"t": [1, 1]}, "topic_ids": {"t": "id-1"}},
    ),
    (
        ListTransactionsResponse(({"transactional_id": "x", "state_partition": 0},), (0, 2)),
        {"transactions": [{"transactional_id": "x", "state_partition": 0}],
         "state_partitions": [0, 2]},
    ),
    (AbortTransactionResponse(True), {"aborted": True}),
    (AbortSinkRunResponse(("s/0",), (1,)), {"aborted": ["s/0"], "state_partitions": [1]}),
    (rp.OffsetsForLeaderEpochResponse(2, 40), {"epoch": 2, "end_offset": 40}),
    (rp.ElectLeadersResponse({"t": {0: 2}}), {"moved": {"t": {"0": 2}}}),
    (MetricsResponse({"broker_id": 1, "totals": {}}), {"broker_id": 1, "totals": {}}),
    (PingResponse(3), {"broker_id": 3, "version": PROTOCOL_VERSION}),
]  # fmt: skip


@pytest.mark.parametrize("answer,doc", ANSWERS, ids=lambda a: type(a).__name__)
def test_an_answer_sends_its_document_and_reads_it_back(answer: Any, doc: dict[str, Any]) -> None:
    assert answer.to_doc() == doc
    assert type(answer).from_doc(json.loads(json.dumps(doc))) == answer


def test_every_handler_answers_a_typed_response() -> None:
    """Every JSON action's handler is annotated with a class that writes and reads its
    document; only the replication fetches answer bytes."""
    for action in Action:
        answer = get_type_hints(getattr(ActionHandlers, action.value))["return"]
        if action in (Action.REPLICA_FETCH, Action.REPLICA_LOG_START):
            assert answer is bytes, action
            continue
        assert isinstance(answer, type), (action, answer)
        assert callable(getattr(answer, "to_doc", None)), (action, answer)
        assert callable(getattr(answer, "from_doc", None)), (action, answer)
