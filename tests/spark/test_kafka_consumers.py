"""Issue 39, test 1: Kafka consumers read what a Spark stream writes, exactly once.

A group of librdkafka consumers (``confluent-kafka``, ``isolation.level=read_committed``,
offsets committed after processing) reads a topic through the broker's Kafka listener
while a Spark stream writes it exactly once and its driver is SIGKILLed twice (once with
a task's transaction prepared, once inside the commit), then restarted. Members join and
leave while it runs (two at first, a third once rows flow, one leaving after the first
kill). The topic's rows (``id``, ``account``, ``amount``) are not Kafka-shaped, so each
record is the row as JSON keyed by ``account`` (``kafka.key.columns``). Checked: every
row the stream committed is consumed once across the group's rebalances, no row of an
aborted transaction (the killed runs' leftovers) is seen, and the group's committed
offsets reach the end (lag 0).
"""

from __future__ import annotations

import io
import json
import signal
import threading
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from broker_core.client.broker_client import BrokerClient
from tests.broker.test_kafka_listener import kafka_address
from tests.harness.broker import BrokerFactory
from tests.harness.group_member import member_config
from tests.harness.waiting import wait_until
from tests.spark.helpers import (
    DriverLauncher,
    assert_one_copy,
    make_input,
    stream_spec,
)
from tests.spark.test_faults import fired

FILES, ROWS, PARTITIONS = 5, 400, 4
TOPIC, GROUP = "kafka_read", "downstream"
KILLS = ["after_prepare@1/0=kill_driver", "inside_commit@3=kill_driver"]


class Member:
    """A read_committed member of ``GROUP`` on a thread; :meth:`leave` closes it
    (LeaveGroup)."""

    def __init__(self, bootstrap: str) -> None:
        config = member_config(bootstrap, GROUP, "range")
        config["isolation.level"] = "read_committed"  # the harness's default is not
        self.consumer = Consumer(config)
        self.consumer.subscribe([TOPIC])
        self.out = io.StringIO()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._consume_one()

    def _consume_one(self) -> None:
        """Poll one record; count it only once its commit was acknowledged (a commit
        refused by a rebalance leaves it to the partition's next owner)."""
        message = self.consumer.poll(0.2)
        if message is None or message.error() is not None:
            return
        try:
            self.consumer.commit(message=message, asynchronous=False)
        except KafkaException:
            return
        value = message.value()
        assert value is not None
        self.out.write(f"{message.partition()} {message.offset()} {value.decode()}\n")

    def commit_position(self) -> None:
        """Commit where the member stands: past the last markers too, which a commit of
        a consumed record's offset + 1 stops before."""
        with self._lock:
            self.consumer.commit(asynchronous=False)

    def leave(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()

    def ids(self) -> list[int]:
        with self._lock:
            lines = self.out.getvalue().splitlines()
        return [json.loads(line.split(" ", 2)[2])["id"] for line in lines]


@pytest.mark.slow
def test_a_consumer_group_reads_a_spark_stream_with_driver_kills_once(
    tmp_path: Path, broker_factory: BrokerFactory, launcher: DriverLauncher
) -> None:
    broker = broker_factory(
        {
            "kafka.listener": "PLAINTEXT://127.0.0.1:0",
            "group.min.session.timeout.ms": 1_000,
            "group.initial.rebalance.delay.ms": 500,
        }
    )
    client = BrokerClient(broker.address)
    client.create_topic(TOPIC, PARTITIONS, config={"kafka.key.columns": "account"})
    bootstrap = kafka_address(broker)
    ids = make_input(tmp_path / "src", FILES, ROWS)
    marks = tmp_path / "failpoints"
    spec = stream_spec(
        tmp_path / "src",
        "",
        TOPIC,
        tmp_path / "ck",
        FILES,
        sink_options={"brokers": broker.address},
    )
    members = [Member(bootstrap), Member(bootstrap)]
    left: list[Member] = []
    try:

        def consumed() -> list[int]:
            return [i for m in members + left for i in m.ids()]

        codes = []
        for launch in range(len(KILLS) + 1):
            run = launcher.run(spec, failpoints=KILLS, failpoints_dir=marks)
            codes.append(run.proc.returncode)
            if launch == 0:
                # Rows committed before the first kill reach the group; a third joins.
                wait_until(lambda: consumed(), "the first rows consumed", timeout=60)
                members.append(Member(bootstrap))
            elif launch == 1:
                gone = members.pop(0)
                gone.leave()
                left.append(gone)
            if run.proc.returncode == 0:
                break
            assert run.proc.returncode == -signal.SIGKILL, run.describe()
        assert codes == [-signal.SIGKILL, -signal.SIGKILL, 0], codes
        assert fired(marks) == set(KILLS)
        assert_one_copy("", TOPIC, ids, brokers=broker.address)
        txns = dict(client.metrics()["transactions"])
        assert txns["transactions_aborted"] >= 1, txns  # the killed runs' rows, aborted

        wait_until(lambda: len(consumed()) >= len(ids), "every row consumed", timeout=120)
        seen = consumed()
        assert sorted(seen) == sorted(ids), (len(seen), len(ids))  # once each, none aborted
        ends = {p: client.list_offsets(TOPIC, p)["last_stable_offset"] for p in range(PARTITIONS)}
        for m in members:
            m.commit_position()
        committed = members[-1].consumer.committed(
            [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], 10
        )
        assert {c.partition: c.offset for c in committed} == ends  # lag 0
    finally:
        for m in members:
            m.leave()
