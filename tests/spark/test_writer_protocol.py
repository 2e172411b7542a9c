"""The driver side of the sink protocol and the schema rules, without Spark."""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import SchemaMismatchError
from broker_core.producer import Producer
from broker_core.protocol.wire import SinkAttempt
from spark_sink.commit import IdemlogCommitMessage, commit_batch, query_id_of_checkpoint
from spark_sink.errors import SinkStateLostError
from spark_sink.options import Scope, parse_options
from spark_sink.schema import check_compatible, conform, normalise
from spark_sink.writer import (
    SPARK_BATCH_ID,
    SPARK_QUERY_ID,
    SPARK_RUN_ID,
    IdemlogStreamWriter,
    stream_attempt,
)
from tests.harness.broker import BrokerProcess

SCHEMA = pa.schema([("id", pa.int64())])


def test_commit_waits_out_a_broker_restart_and_commits_once(
    broker: BrokerProcess, client: BrokerClient
) -> None:
    client.create_topic("w", 1, schema=SCHEMA)
    options = parse_options({"topic": "w", "brokers": broker.address}, Scope.WRITE)
    with Producer(broker.address, **{"transactional.id": "s/0"}) as producer:
        assert producer.init_sink_transaction(SinkAttempt("s", "r", 3)) == "new"
        producer.begin_transaction()
        sent = producer.send("w", pa.table({"id": list(range(10))}))
        producer.flush()
        (meta,) = sent.result()
        producer.prepare_sink_transaction(3, [("w", 0, meta.base_offset, meta.last_offset)])
        pid, epoch = producer.producer_id_and_epoch
    message = IdemlogCommitMessage("s", "r", 3, 0, 0, "s/0", pid, epoch, "new", 10, 1, 0, 0, 1.0)
    broker.kill()
    result: list[bool] = []
    committer = threading.Thread(
        target=lambda: result.append(commit_batch(options, None, "r", 3, [message]))
    )
    committer.start()  # fails retriably while the broker is down, and retries
    broker.restart()
    committer.join(timeout=120)
    assert result == [True]
    with BrokerClient(broker.address) as fresh:
        table = fresh.read_table("w", 0)
        assert table is not None and table.column("id").to_pylist() == list(range(10))
        # The same commit again (Spark re-commits after a driver restart): not twice.
        assert commit_batch(options, None, "r", 3, [message]) is False
        assert fresh.read_table("w", 0).num_rows == 10  # type: ignore[union-attr]


def test_time_zone_and_nullability_do_not_change_the_topic_schema() -> None:
    spark_a = pa.schema([pa.field("t", pa.timestamp("us", tz="Etc/UTC"), nullable=False)])
    spark_b = pa.schema([pa.field("t", pa.timestamp("us", tz="Europe/Paris"))])
    assert normalise(spark_a).equals(normalise(spark_b))
    check_compatible("topic", normalise(spark_a), normalise(spark_b))
    batch = pa.record_batch([pa.array([1, 2], pa.timestamp("us", tz="Europe/Paris"))], ["t"])
    assert conform(batch, normalise(spark_a)).schema.equals(normalise(spark_a))
    with pytest.raises(SchemaMismatchError, match=r"changed types t \(timestamp"):
        check_compatible("topic", normalise(spark_a), normalise(pa.schema([("t", pa.int64())])))


class FakeTaskContext:
    """A Spark task's context with the given local properties (stream_attempt reads them)."""

    def __init__(self, properties: dict[str, str]) -> None:
        self.properties = properties

    def getLocalProperty(self, key: str) -> str | None:
        return self.properties.get(key)


STREAM_PROPERTIES = {SPARK_BATCH_ID: "4", SPARK_QUERY_ID: "query-a", SPARK_RUN_ID: "run-a"}


def test_stream_writer_refuses_a_task_without_spark_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyspark

    monkeypatch.setattr(pyspark.TaskContext, "get", lambda: FakeTaskContext(STREAM_PROPERTIES))
    assert stream_attempt() == SinkAttempt("query-a", "run-a", 4)
    for missing in STREAM_PROPERTIES:
        props = {k: v for k, v in STREAM_PROPERTIES.items() if k != missing}
        monkeypatch.setattr(pyspark.TaskContext, "get", lambda p=props: FakeTaskContext(p))
        with pytest.raises(RuntimeError, match=rf"has no {re.escape(missing)} "):
            stream_attempt()
    bad = {**STREAM_PROPERTIES, SPARK_BATCH_ID: "four"}
    monkeypatch.setattr(pyspark.TaskContext, "get", lambda: FakeTaskContext(bad))
    with pytest.raises(RuntimeError, match="batchId='four' is not a number"):
        stream_attempt()


def message(run: str, batch: int, task: int = 0, sink: str = "s") -> IdemlogCommitMessage:
    return IdemlogCommitMessage(
        sink, run, batch, task, 0, f"{sink}/{task}", 1, 0, "new", 1, 1, 0, 0, 1.0
    )


def test_driver_commit_refuses_messages_of_another_batch_run_or_sink() -> None:
    options = parse_options({"topic": "w", "brokers": "127.0.0.1:1"}, Scope.WRITE)
    cases = [
        ([message("r", 3), message("r", 2, 1)], "task 1 reported batch 2 of run r"),
        ([message("r", 3), message("other", 3, 1)], "task 1 reported batch 3 of run other"),
        ([message("r", 3), message("r", 3, 1, sink="t")], r"different sinks \['s', 't'\]"),
        ([message("r", 3), None], r"tasks \[1\] returned no message"),
    ]
    for messages, error in cases:
        # Refused before any request: the broker address is not even reachable.
        with pytest.raises(RuntimeError, match=error):
            commit_batch(options, None, "r", 3, messages)
    with pytest.raises(RuntimeError, match="none of its 2 tasks returned a message"):
        IdemlogStreamWriter(options, SCHEMA).commit([None, None], 3)


def test_stream_abort_without_messages_fences_the_query_found_in_the_checkpoint(
    broker: BrokerProcess, client: BrokerClient, tmp_path: Path
) -> None:
    """Every task of the batch failed (all messages None): the driver's abort still ends
    what they left open, finding the query id in the checkpoint's metadata file."""
    client.create_topic("w", 1, schema=SCHEMA)
    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": "query-b"}) + "\n")
    assert query_id_of_checkpoint(str(checkpoint)) == "query-b"
    assert query_id_of_checkpoint(str(tmp_path / "none")) is None
    with Producer(broker.address, **{"transactional.id": "query-b/0"}) as producer:
        producer.init_sink_transaction(SinkAttempt("query-b", "run-b", 5))
        producer.begin_transaction()
        producer.send("w", pa.table({"id": list(range(10))}))
        producer.flush()
    offsets = client.list_offsets("w", 0)
    assert offsets["last_stable_offset"] < offsets["log_end_offset"]  # left open
    options = parse_options(
        {"topic": "w", "brokers": broker.address, "checkpointLocation": str(checkpoint)},
        Scope.WRITE,
    )
    IdemlogStreamWriter(options, SCHEMA).abort([None, None], 5)
    offsets = client.list_offsets("w", 0)
    assert offsets["last_stable_offset"] == offsets["log_end_offset"]
    assert client.read_table("w", 0) is None  # aborted, nothing visible


def prepared_batch(address: str, run: str, batch: int, tasks: int) -> list[IdemlogCommitMessage]:
    """Each task of a sink ``s`` batch written and prepared, as Spark's tasks do: their
    messages for the driver's commit (task t writes ids 10t..10t+9)."""
    messages = []
    for task in range(tasks):
        with Producer(address, **{"transactional.id": f"s/{task}"}) as producer:
            assert producer.init_sink_transaction(SinkAttempt("s", run, batch)) == "new"
            producer.begin_transaction()
            sent = producer.send("lost", pa.table({"id": list(range(10 * task, 10 * task + 10))}))
            producer.flush()
            ranges = [("lost", m.partition, m.base_offset, m.last_offset) for m in sent.result()]
            producer.prepare_sink_transaction(batch, ranges)
            pid, epoch = producer.producer_id_and_epoch
        messages.append(
            IdemlogCommitMessage(
                "s", run, batch, task, 0, f"s/{task}", pid, epoch, "new", 10, 1, 0, 0, 1.0
            )
        )
    return messages


def test_a_commit_whose_coordinator_lost_its_state_fails_loudly_and_the_operator_recovers(
    broker: BrokerProcess, client: BrokerClient
) -> None:
    """Issue 35: the coordinator comes back without the state of a prepared batch (its
    ``__transaction_state`` lost). The driver's commit raises SinkStateLostError naming
    the batch, its open transactions and the way out, instead of Spark re-running the
    batch on top of them; ``find_hanging_transactions`` (``idemlog transactions
    find-hanging``) lists them, the abort ends them, and the batch run again is read once
    and whole."""
    client.create_topic("lost", 1, schema=SCHEMA)
    options = parse_options({"topic": "lost", "brokers": broker.address}, Scope.WRITE)
    messages = prepared_batch(broker.address, "r", 5, 2)
    broker.kill()
    state = broker.log_dir / "__transaction_state"
    assert state.is_dir()
    shutil.rmtree(state)  # the coordinator's state, lost
    broker.restart()
    with BrokerClient(broker.address) as fresh:
        held = fresh.list_offsets("lost", 0)
        assert held["last_stable_offset"] == 0 < held["log_end_offset"] == 20, held

        with pytest.raises(SinkStateLostError) as failed:
            commit_batch(options, None, "r", 5, messages)
        text = str(failed.value)
        print(text)
        assert failed.value.retriable is False
        assert "sink s batch 5" in text and "idemlog transactions find-hanging" in text
        pids = {m.producer_id for m in messages}
        assert all(f"producer id {pid} from offset" in text for pid in pids)

        hanging = fresh.find_hanging_transactions("lost")
        assert {h.producer_id for h in hanging} == pids
        for h in hanging:
            fresh.abort_hanging_transaction(
                "lost", h.partition, producer_id=h.producer_id, producer_epoch=h.producer_epoch
            )
        after = fresh.list_offsets("lost", 0)
        assert after["last_stable_offset"] == after["log_end_offset"] == 22, after

        # Spark runs the batch again, as a new run: committed, read once and whole.
        assert commit_batch(options, None, "r2", 5, prepared_batch(broker.address, "r2", 5, 2))
        table = fresh.read_table("lost", 0)
        assert table is not None and sorted(table.column("id").to_pylist()) == list(range(20))
