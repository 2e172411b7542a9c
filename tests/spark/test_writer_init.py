"""The task's InitProducerId, sent on a thread of its own while the task pulls its first
rows (spark_sink/writer.py, docs/design.md "The sink protocol"): it really overlaps the
pull, its failure fails the task with its typed error, and a task whose rows fail while
it runs leaves nothing behind that the retry or a reader could see. Real broker processes;
the task's steps are ``writer._write_task`` without Spark (as bench_sink_steps runs them).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import InvalidTransactionTimeoutError
from broker_core.producer.transport import FlightTransport
from broker_core.protocol.wire import SinkAttempt
from spark_sink import writer
from spark_sink.commit import commit_batch
from spark_sink.heartbeat import HEARTBEATS
from spark_sink.options import IdemlogOptions, Scope, parse_options
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.waiting import wait_until

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.int32())])
PARTITIONS = 2
SPARK_BATCHES = 4  # Spark hands a task its rows as 10k-row Arrow batches
ROWS_PER_BATCH = 10_000


def spark_batch(index: int) -> pa.RecordBatch:
    start = index * ROWS_PER_BATCH
    ids = pa.array(range(start, start + ROWS_PER_BATCH), pa.int64())
    keys = pa.array([i % 97 for i in range(ROWS_PER_BATCH)], pa.int32())
    return pa.record_batch([ids, keys], schema=SCHEMA)


def sink_options(broker: BrokerProcess, topic: str) -> IdemlogOptions:
    return parse_options({"topic": topic, "brokers": broker.address, "key": "key"}, Scope.WRITE)


def init_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "idemlog-init"]


def log_end_offsets(client: BrokerClient, topic: str) -> list[int]:
    return [client.list_offsets(topic, p)["log_end_offset"] for p in range(PARTITIONS)]


def committed_ids(client: BrokerClient, topic: str) -> list[int]:
    ids: list[int] = []
    for partition in range(PARTITIONS):
        table = client.read_table(topic, partition)
        if table is not None:
            ids.extend(table.column("id").to_pylist())
    return sorted(ids)


def test_the_init_is_out_while_the_first_rows_are_pulled(
    broker: BrokerProcess, client: BrokerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order, not a timing: the coordinator's answer to the init is held until the
    task pulled its first rows. Had the task waited for the answer before pulling (the
    order before issue 27), the pull would never come and the held init would fail the
    task."""
    client.create_topic("overlap", PARTITIONS, schema=SCHEMA)
    options = sink_options(broker, "overlap")
    events: list[str] = []
    init_requested, first_pulled = threading.Event(), threading.Event()
    real_init = FlightTransport.init_sink_producer

    def held_init(self: FlightTransport, *args: Any, **kwargs: Any) -> Any:
        events.append("init requested")
        init_requested.set()
        if not first_pulled.wait(10):
            events.append("no rows pulled while the init was out")
            raise AssertionError("the task pulled no rows while its init was out")
        answer = real_init(self, *args, **kwargs)
        events.append("init answered")
        return answer

    beaten_runs_at_pull: list[int] = []

    def rows() -> Iterator[pa.RecordBatch]:
        wait_until(init_requested.is_set, "the task's InitProducerId was requested")
        events.append("first rows pulled")
        # Spark may take long to hand over the first rows: the run is beaten meanwhile.
        beaten_runs_at_pull.append(HEARTBEATS.registered())
        first_pulled.set()
        for index in range(SPARK_BATCHES):
            yield spark_batch(index)

    monkeypatch.setattr(FlightTransport, "init_sink_producer", held_init)
    attempt = SinkAttempt("sink-overlap", "run-1", 7)
    message = writer._write_task(options, SCHEMA, attempt, rows(), 0, 0, "")

    assert events == ["init requested", "first rows pulled", "init answered"]
    assert beaten_runs_at_pull == [1]
    assert message.status == "new" and message.rows == SPARK_BATCHES * ROWS_PER_BATCH
    assert not init_threads()
    assert commit_batch(options, None, "run-1", 7, [message]) is True
    assert committed_ids(client, "overlap") == list(range(SPARK_BATCHES * ROWS_PER_BATCH))


def test_a_failing_init_fails_the_task_with_its_error_and_writes_nothing(
    broker_factory: BrokerFactory,
) -> None:
    """The broker refuses the init (the sink's transaction.timeout.ms of 20 s is over the
    broker's transaction.max.timeout.ms): the task raises the broker's typed error, after
    it pulled its first rows meanwhile, and not one row reaches the log."""
    broker = broker_factory({"transaction.max.timeout.ms": 5000})
    with BrokerClient(broker.address) as client:
        client.create_topic("refused", PARTITIONS, schema=SCHEMA)
        options = sink_options(broker, "refused")
        pulled: list[int] = []

        def rows() -> Iterator[pa.RecordBatch]:
            for index in range(SPARK_BATCHES):
                pulled.append(index)
                yield spark_batch(index)

        attempt = SinkAttempt("sink-refused", "run-1", 0)
        with pytest.raises(InvalidTransactionTimeoutError, match="timeout") as raised:
            writer._write_task(options, SCHEMA, attempt, rows(), 0, 0, "")

        assert raised.value.code == 50  # Kafka's INVALID_TRANSACTION_TIMEOUT
        assert not raised.value.retriable
        assert pulled, "the task pulled no rows while its init was out"
        assert not init_threads()
        assert log_end_offsets(client, "refused") == [0] * PARTITIONS


class SparkIteratorBroke(RuntimeError):
    """What Spark's iterator raises when the JVM side fails mid-task."""


def test_rows_failing_while_the_init_runs_fail_the_task_and_the_retry_writes_once(
    broker: BrokerProcess, client: BrokerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's iterator raises while the init is out: the task raises that error only
    once its init ended (so it can never overtake the retry's), writes nothing, and the
    retry (attempt 1) fences it and writes the rows once."""
    client.create_topic("broken", PARTITIONS, schema=SCHEMA)
    options = sink_options(broker, "broken")
    init_requested, init_answered = threading.Event(), threading.Event()
    real_init = FlightTransport.init_sink_producer

    def observed_init(self: FlightTransport, *args: Any, **kwargs: Any) -> Any:
        init_requested.set()
        answer = real_init(self, *args, **kwargs)
        init_answered.set()
        return answer

    def broken_rows() -> Iterator[pa.RecordBatch]:
        wait_until(init_requested.is_set, "the task's InitProducerId was requested")
        yield spark_batch(0)
        raise SparkIteratorBroke("the JVM's rows stopped")

    monkeypatch.setattr(FlightTransport, "init_sink_producer", observed_init)
    attempt = SinkAttempt("sink-broken", "run-1", 3)
    with pytest.raises(SparkIteratorBroke):
        writer._write_task(options, SCHEMA, attempt, broken_rows(), 0, 0, "")
    assert init_answered.is_set(), "the failed task returned before its init ended"
    assert not init_threads()
    assert log_end_offsets(client, "broken") == [0] * PARTITIONS

    retry = writer._write_task(
        options, SCHEMA, attempt, iter([spark_batch(i) for i in range(SPARK_BATCHES)]), 1, 0, ""
    )
    assert retry.status == "new" and retry.attempt == 1
    assert commit_batch(options, None, "run-1", 3, [retry]) is True
    assert committed_ids(client, "broken") == list(range(SPARK_BATCHES * ROWS_PER_BATCH))
