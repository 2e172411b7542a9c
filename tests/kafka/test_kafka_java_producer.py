"""Kafka's own Java producer (kafka-clients 4.1, jars/kafka-broker), idempotent, with
snappy (in xerial's framing, which only the Java client writes), writes through the Kafka
listener behind a proxy that resets and stalls its connections
mid-stream (KafkaIdempotentProducer.java, run by the JVM's single-file launcher): every
record it was acknowledged is in the log exactly once, in order per partition, at the
offset it was acknowledged at, and the broker answered duplicates; the proxy's own
counters say the faults fired."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.kafka_node import broker_jars
from broker_core.client.broker_client import BrokerClient
from tests.broker.test_kafka_fetch import KAFKA_SCHEMA
from tests.broker.test_kafka_listener import KAFKA_ON, kafka_address
from tests.broker.test_kafka_produce import duplicates, over_flight
from tests.harness.broker import BrokerFactory
from tests.harness.kafka_fault_proxy import KafkaFaultProxy

pytestmark = pytest.mark.slow  # a JVM compiles and runs the producer (~5 s)

PROGRAM = Path(__file__).with_name("KafkaIdempotentProducer.java")
COUNT = 100


def test_the_java_idempotent_producer_through_resets_and_stalls_writes_each_record_once(
    broker_factory: BrokerFactory,
) -> None:
    with KafkaFaultProxy(reset_every=4, stall_every=10, stall_s=1.2) as proxy:
        broker = broker_factory(
            {**KAFKA_ON, "kafka.advertised.listener": f"PLAINTEXT://{proxy.address}"}
        )
        proxy.point_at(kafka_address(broker))
        with BrokerClient(broker.address, timeout_s=20.0) as client:
            client.create_topic("java", 2, schema=KAFKA_SCHEMA)
            proxy.armed.set()
            classpath = ":".join(str(p) for p in broker_jars())
            done = subprocess.run(
                [
                    *("java", "-cp", classpath, str(PROGRAM)),
                    *(proxy.address, "java", str(COUNT), "2", "snappy"),
                ],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            proxy.armed.clear()
            assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
            acked = sorted(
                (int(p), int(o), None, v.encode())
                for _, p, o, v in (line.split() for line in done.stdout.splitlines())
            )
            assert len(acked) == COUNT
            assert proxy.resets > 0 and proxy.stalls > 0  # the faults fired
            for partition in (0, 1):
                log = over_flight(client, "java", partition)
                assert log == [r for r in acked if r[0] == partition]  # once each, in order
                sent = [b"j%d-%s" % (i, b"x" * 40) for i in range(COUNT) if i % 2 == partition]
                assert [r[3] for r in log] == sent
            assert duplicates(client) > 0
