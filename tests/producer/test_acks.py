"""The producer's ``acks`` key reaches the wire: every produce stream it opens carries it
in its descriptor (seen by a proxy in front of a REAL broker, which decodes it)."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow.flight as flight

from broker_core.client.broker_client import BrokerClient
from broker_core.producer import Producer
from broker_core.producer.producer_batch import TopicPartition
from broker_core.producer.transport import FlightTransport
from broker_core.protocol.requests import ACKS_ALL, ACKS_LEADER
from broker_core.protocol.wire import decode_json
from tests.harness.broker import BrokerProcess
from tests.harness.fault_proxy import FaultProxy
from tests.producer.fakes import table

FAST = {"linger.ms": 2, "retry.backoff.ms": 20}


class DescriptorLog(FaultProxy):
    """A fault proxy (no faults) that records the descriptor of every produce stream."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.descriptors: list[dict[str, Any]] = []
        self._descriptors_lock = threading.Lock()

    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        with self._descriptors_lock:
            self.descriptors.append(decode_json(descriptor.command, "produce descriptor"))
        super().do_put(context, descriptor, reader, writer)

    def acks_sent(self) -> list[int]:
        with self._descriptors_lock:
            return [d["acks"] for d in self.descriptors]


def _rows(client: BrokerClient, topic: str, partitions: int) -> int:
    return sum(b.num_rows for p in range(partitions) for _m, b in client.fetch(topic, p))


def test_the_producer_sends_its_acks_in_every_stream_descriptor(
    broker: BrokerProcess, client: BrokerClient
) -> None:
    client.create_topic("acks", 2)
    with DescriptorLog(broker.address) as proxy:
        with Producer(proxy.address, **FAST) as default:
            default.send("acks", table(100), key="key").result(10)
        assert sorted(proxy.acks_sent()) == [ACKS_ALL, ACKS_ALL]  # one stream per partition
        proxy.descriptors.clear()
        with Producer(proxy.address, **FAST, **{"acks": "1", "enable.idempotence": False}) as one:
            one.send("acks", table(100, start=100), key="key").result(10)
        assert sorted(proxy.acks_sent()) == [ACKS_LEADER, ACKS_LEADER]
        proxy.descriptors.clear()
        with Producer(proxy.address, **FAST, **{"acks": -1, "transactional.id": "a"}) as txn:
            txn.init_transactions()
            txn.begin_transaction()
            txn.send("acks", table(100, start=200), key="key")
            txn.commit_transaction()
        assert sorted(proxy.acks_sent()) == [ACKS_ALL, ACKS_ALL]
    assert _rows(client, "acks", 2) == 300  # the broker took every stream


def test_flight_transport_opens_each_stream_with_its_acks(
    broker: BrokerProcess, client: BrokerClient
) -> None:
    client.create_topic("acks-transport", 1)
    with DescriptorLog(broker.address) as proxy:
        transport = FlightTransport(BrokerClient(proxy.address), acks=ACKS_LEADER)
        try:
            handle = transport.send(
                TopicPartition("acks-transport", 0),
                table(5).to_batches()[0],
                producer_id=-1,
                producer_epoch=-1,
                base_sequence=-1,
                transactional=False,
            )
            assert handle.result(10).error_code == 0
        finally:
            transport.close()
        # With the topic's id, pinned when the transport first learned the topic.
        topic_id = client.topic_id("acks-transport")
        assert proxy.descriptors == [
            {
                "op": "produce",
                "topic": "acks-transport",
                "partition": 0,
                "acks": ACKS_LEADER,
                "topic_id": topic_id,
            }
        ]
    assert _rows(client, "acks-transport", 1) == 5
