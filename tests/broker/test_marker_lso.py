"""WRITE_TXN_MARKERS answers each partition's last stable offset just after its marker, and
the coordinator's RoutingMarkerWriter gives it back as the same map as LocalMarkerWriter."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.cluster.records import BrokerInfo
from broker_core.errors import InvalidRequestError, UnknownServerError
from broker_core.protocol.txn_requests import WriteTxnMarkersResponse
from broker_core.protocol.wire import Action
from broker_core.server.coordination.marker_client import LedPartitions, RoutingMarkerWriter
from broker_core.txn.coordinator.markers import MarkerWriter, ProducerMarkers
from tests.broker.helpers import ids, rows
from tests.harness.broker import BrokerProcess

ClientFor = Callable[..., BrokerClient]
REMOTE = 1  # the real broker's id as the stub coordinator broker sees it


def _begin(client: BrokerClient, txn_id: str, partitions: list[int], start: int) -> tuple[int, int]:
    pid, epoch = client.init_producer_id(txn_id)
    client.add_partitions_to_txn(txn_id, pid, epoch, [("lso", p) for p in partitions])
    for p in partitions:
        with client.produce_stream("lso", p, transactional_id=txn_id) as stream:
            stream.send(
                rows(2, start=start + 100 * p), producer_id=pid, producer_epoch=epoch,
                base_sequence=0, transactional=True,
            ).offsets(10)  # fmt: skip
    return pid, epoch


def _remote_writer(leader: BrokerProcess) -> RoutingMarkerWriter:
    """A coordinator broker's writer to which every partition is led by ``leader``."""
    assert leader.host is not None and leader.port is not None
    info = BrokerInfo(REMOTE, leader.host, leader.port)
    topics = SimpleNamespace(assignment=lambda topic: SimpleNamespace(leader=lambda p: REMOTE))
    no_local = SimpleNamespace()  # no partition is local: never called
    return RoutingMarkerWriter(
        REMOTE + 1,
        cast(LedPartitions, topics),
        cast(MarkerWriter, no_local),
        lambda: [info],
    )


def test_markers_over_the_wire_report_the_lso_after_the_marker(
    shared_broker: BrokerProcess, client_for: ClientFor
) -> None:
    client = client_for(shared_broker)
    client.create_topic("lso", 2)
    coordinator_epoch = client.metrics()["transactions"]["coordinator_epoch"]
    a_pid, a_epoch = _begin(client, "lso-a", [0], 0)  # lso-0: A at 0-1
    b_pid, b_epoch = _begin(client, "lso-b", [0, 1], 10)  # lso-0: B at 2-3; lso-1: B at 0-1

    # The coordinator's writer to a remote leader, B's markers: lso-0 stays held at A's
    # open transaction, lso-1 is stable up to its end.
    writer = _remote_writer(shared_broker)
    try:
        b_markers = ProducerMarkers(b_pid, b_epoch, (("lso", 0), ("lso", 1)))
        stable = writer.write_markers([b_markers], True, coordinator_epoch)
    finally:
        writer.close()
    assert stable == {("lso", 0): 0, ("lso", 1): 3}
    assert client.list_offsets("lso", 1)["high_watermark"] == 3

    # The action itself, A's marker (at 5): nothing is open, the LSO is the high watermark.
    answer = client.action(
        shared_broker.address,
        Action.WRITE_TXN_MARKERS,
        {
            "producer_id": a_pid,
            "producer_epoch": a_epoch,
            "commit": True,
            "coordinator_epoch": coordinator_epoch,
            "partitions": [["lso", 0]],
        },
    )
    assert answer == {"last_stable_offsets": [{"topic": "lso", "partition": 0, "lso": 6}]}
    offsets = client.list_offsets("lso", 0)
    assert offsets["high_watermark"] == offsets["last_stable_offset"] == 6
    assert ids(client, "lso", 0) == [0, 1, 10, 11]
    # The coordinator ends them too (its markers again, harmless): nothing left open.
    client.end_txn("lso-a", a_pid, a_epoch, commit=True)
    client.end_txn("lso-b", b_pid, b_epoch, commit=True)
    assert ids(client, "lso", 1) == [110, 111]


def test_stable_offsets_wire_form_round_trips_and_is_checked() -> None:
    stable = {("b", 1): 7, ("a", 0): 0}
    doc = WriteTxnMarkersResponse(stable).to_doc()
    assert doc["last_stable_offsets"][0] == {"topic": "a", "partition": 0, "lso": 0}
    assert WriteTxnMarkersResponse.from_doc(doc, "answer").stable == stable
    assert WriteTxnMarkersResponse.from_doc({"last_stable_offsets": []}, "answer").stable == {}
    bad: list[tuple[dict[str, Any], str]] = [
        ({}, "missing field 'last_stable_offsets'"),
        ({"last_stable_offsets": [["a", 0, 1]]}, r"last_stable_offsets\[0\] must be an object"),
        ({"last_stable_offsets": [{"topic": "a", "partition": 0}]}, "missing field 'lso'"),
        ({"last_stable_offsets": [{"topic": "a", "partition": True, "lso": 1}]}, "must be int"),
        ({"last_stable_offsets": [{"topic": "a", "partition": 0, "lso": -1}]}, "must be >= 0"),
    ]
    for body, message in bad:
        with pytest.raises(InvalidRequestError, match=message):
            WriteTxnMarkersResponse.from_doc(body, "answer")


def _answering(body: bytes) -> Callable[[str, object, object], list[SimpleNamespace]]:
    """A DoAction whose WRITE_TXN_MARKERS answer is ``body`` (a peer of another kind)."""

    def call_action(address: str, action: object, options: object) -> list[SimpleNamespace]:
        return [SimpleNamespace(body=pa.py_buffer(body))]

    return call_action


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{}", "missing field 'last_stable_offsets'"),
        (b"[]", "must be a JSON object"),
        (
            b'{"last_stable_offsets": [{"topic": "x", "partition": 0, "lso": 1}]}',
            r"offsets of partitions not asked for: \[\('x', 0\)\]",
        ),
    ],
)
def test_a_remote_answer_without_the_offsets_is_a_server_error(
    shared_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch, body: bytes, message: str
) -> None:
    writer = _remote_writer(shared_broker)
    monkeypatch.setattr(writer._connections, "call_action", _answering(body))
    with pytest.raises(UnknownServerError, match=message) as info:
        writer.write_markers([ProducerMarkers(5, 0, (("lso", 0),))], True, 0)
    assert not info.value.retriable
