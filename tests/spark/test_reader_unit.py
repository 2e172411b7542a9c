"""The readers of spark_sink.reader WITHOUT Spark, against a real broker process.

Each test drives the reader objects the way Spark does (partitions on the "driver", read
on a pickled copy as on an executor, offsets through JSON) and checks the rows against
the offsets the producer was answered with.
"""

from __future__ import annotations

import json
import logging
import pickle
import re
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

import spark_sink.reader as reader_module
from broker_core.client.broker_client import BrokerClient
from broker_core.errors import (
    InvalidConfigError,
    OffsetOutOfRangeError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
)
from broker_core.producer import Producer, SendResult
from spark_sink.driver_retry import RETRY_MARK
from spark_sink.errors import DriverRetriesSpentError
from spark_sink.options import OFFSET_COLUMN, PARTITION_COLUMN, IdemlogOptions, Scope, parse_options
from spark_sink.reader import (
    TOPIC_ID_KEY,
    IdemlogBatchReader,
    IdemlogStreamReader,
    OffsetRangePartition,
    cap_ends,
    output_schema,
)
from spark_sink.schema import normalise
from spark_sink.topics import TopicInfo, require
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.waiting import Recorder, wait_until

FAST = {"linger.ms": 2, "retry.backoff.ms": 20}
SCHEMA = normalise(pa.schema([("id", pa.int64()), ("name", pa.string())]))
TOPIC = "events"
Position = tuple[int, int]  # (partition, offset)


def rows(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "name": [f"n{i}" for i in ids]}, schema=SCHEMA)


def positions(table: pa.Table, result: SendResult) -> dict[int, Position]:
    """id -> (partition, offset) of one round-robin send (its rows stay in order)."""
    ids = iter(table.column("id").to_pylist())
    return {next(ids): (m.partition, m.base_offset + i) for m in result for i in range(m.num_rows)}


@dataclass
class Scenario:
    """Two partitions: a committed transaction, an aborted one, an open one, then a
    committed one above the open one (so above the last stable offset)."""

    committed: dict[int, Position] = field(default_factory=dict)
    aborted: dict[int, Position] = field(default_factory=dict)
    open: dict[int, Position] = field(default_factory=dict)
    after_open: dict[int, Position] = field(default_factory=dict)
    open_producer: Producer | None = None

    def commit_open(self) -> None:
        assert self.open_producer is not None
        self.open_producer.commit_transaction()


def send_all(producer: Producer, tables: list[pa.Table]) -> dict[int, Position]:
    futures = [producer.send(TOPIC, t) for t in tables]
    producer.flush()
    out: dict[int, Position] = {}
    for t, f in zip(tables, futures, strict=True):
        out.update(positions(t, f.result(10)))
    return out


@pytest.fixture
def scenario(broker: BrokerProcess, client: BrokerClient) -> Iterator[Scenario]:
    client.create_topic(TOPIC, 2, schema=SCHEMA)
    s = Scenario()
    with Producer(broker.address, transactional_id="writer", **FAST) as writer:
        writer.init_transactions()
        writer.begin_transaction()
        s.committed = send_all(writer, [rows(i * 10, 10) for i in range(4)])
        writer.commit_transaction()
        writer.begin_transaction()
        s.aborted = send_all(writer, [rows(100, 10), rows(110, 10)])
        writer.abort_transaction()
        opener = Producer(
            broker.address, transactional_id="opener", transaction_timeout_ms=600_000, **FAST
        )
        s.open_producer = opener
        opener.init_transactions()
        opener.begin_transaction()
        s.open = send_all(opener, [rows(200, 10), rows(210, 10)])
        writer.begin_transaction()
        s.after_open = send_all(writer, [rows(300, 10), rows(310, 10)])
        writer.commit_transaction()
    assert {p for p, _o in s.open.values()} == {0, 1}, "the open transaction holds both"
    try:
        yield s
    finally:
        opener.close(0)


def options(broker: BrokerProcess, **extra: str) -> IdemlogOptions:
    return parse_options({"topic": TOPIC, "brokers": broker.address, **extra}, Scope.READ)


def on_executor(obj: Any) -> Any:
    """What Spark does to a reader and a partition before read(): a pickled copy."""
    return pickle.loads(pickle.dumps(obj))


def read_parts(reader: Any, parts: list[OffsetRangePartition]) -> pa.Table:
    executor_reader = on_executor(reader)
    batches = []
    for part in parts:
        for batch in executor_reader.read(on_executor(part)):
            assert isinstance(batch, pa.RecordBatch)
            assert batch.schema.equals(reader.schema), batch.schema
            assert batch.num_rows > 0
            batches.append(batch)
    return pa.Table.from_batches(batches, schema=reader.schema)


def found(table: pa.Table) -> dict[int, Position]:
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "no row twice"
    names = table.column("name").to_pylist()
    assert names == [f"n{i}" for i in ids]
    return dict(
        zip(
            ids,
            zip(
                table.column(PARTITION_COLUMN).to_pylist(),
                table.column(OFFSET_COLUMN).to_pylist(),
                strict=True,
            ),
            strict=True,
        )
    )


def batch_read(broker: BrokerProcess, client: BrokerClient, **extra: str) -> pa.Table:
    opts = options(broker, includeMetadata="true", **extra)
    reader = IdemlogBatchReader(opts, require(client, opts))
    return read_parts(reader, reader.partitions())


# -- batch reader ------------------------------------------------------------------------
def test_output_schema_is_the_topic_schema_plus_non_null_metadata() -> None:
    info = TopicInfo(TOPIC, 1, SCHEMA)
    assert output_schema(info, False).equals(SCHEMA)
    expected = SCHEMA.append(pa.field(PARTITION_COLUMN, pa.int32(), nullable=False)).append(
        pa.field(OFFSET_COLUMN, pa.int64(), nullable=False)
    )
    assert output_schema(info, True).equals(expected)


def test_a_timestamp_column_is_declared_and_written_in_utc() -> None:
    """Spark's TIMESTAMP has an Arrow form only with a zone (pyspark asserts one): the
    sink's schema and the reader's declared one both name UTC."""
    from pyspark.sql.types import StructField, StructType, TimestampType

    from spark_sink.schema import arrow_schema_for

    stamped = pa.schema([pa.field("at", pa.timestamp("us", tz="UTC"))])
    assert output_schema(TopicInfo(TOPIC, 1, stamped), False).equals(stamped)
    assert arrow_schema_for(StructType([StructField("at", TimestampType())])).equals(stamped)


def test_batch_read_committed_returns_committed_rows_once_and_stops_at_the_lso(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    opts = options(broker, includeMetadata="true")
    reader = IdemlogBatchReader(opts, require(client, opts))
    parts = reader.partitions()
    assert [p.partition for p in parts] == [0, 1]
    for part in parts:
        offsets = client.list_offsets(TOPIC, part.partition)
        assert part.start == offsets["log_start_offset"] == 0
        assert part.end == offsets["last_stable_offset"] < offsets["high_watermark"]
        first_open = min(o for p, o in scenario.open.values() if p == part.partition)
        assert part.end == first_open
    # Exactly the committed transaction: not the aborted one, not the open one, not the
    # committed one above the open one; each row at the offset it was written at.
    assert found(read_parts(reader, parts)) == scenario.committed


def test_batch_read_uncommitted_returns_everything_appended(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    everything = {**scenario.committed, **scenario.aborted, **scenario.open, **scenario.after_open}
    assert found(batch_read(broker, client, isolation="read_uncommitted")) == everything


def test_batch_read_after_the_open_transaction_commits_skips_only_the_aborted_rows(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    scenario.commit_open()
    expected = {**scenario.committed, **scenario.open, **scenario.after_open}
    assert found(batch_read(broker, client)) == expected


def test_batch_read_without_metadata_and_of_an_empty_topic(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    opts = options(broker)
    reader = IdemlogBatchReader(opts, require(client, opts))
    table = read_parts(reader, reader.partitions())
    assert table.schema.names == ["id", "name"]
    assert sorted(table.column("id").to_pylist()) == sorted(scenario.committed)

    client.create_topic("empty", 3, schema=SCHEMA)
    empty_opts = parse_options({"topic": "empty", "brokers": broker.address}, Scope.READ)
    empty = IdemlogBatchReader(empty_opts, require(client, empty_opts))
    assert empty.partitions() == []
    assert list(empty.read(None)) == [], "Spark reads None when nothing was planned"


def test_a_range_ending_inside_a_batch_returns_exactly_its_rows(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    opts = options(broker, includeMetadata="true")
    reader = IdemlogBatchReader(opts, require(client, opts))
    in_p0 = sorted(o for p, o in scenario.committed.values() if p == 0)
    # Start and end in the middle of the first and the second batch of partition 0.
    start, end = in_p0[3], in_p0[15]
    table = read_parts(reader, [OffsetRangePartition(0, start, end)])
    assert table.column(OFFSET_COLUMN).to_pylist() == list(range(start, end))
    expected = {
        i: (p, o) for i, (p, o) in scenario.committed.items() if p == 0 and start <= o < end
    }
    assert found(table) == expected


def test_batch_read_takes_starting_and_ending_offsets_as_kafkas_source(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    in_p0 = sorted(o for p, o in scenario.committed.values() if p == 0)
    in_p1 = sorted(o for p, o in scenario.committed.values() if p == 1)
    start, end = in_p0[3], in_p1[7]
    table = batch_read(
        broker,
        client,
        startingOffsets=json.dumps({TOPIC: {"0": start, "1": -2}}),
        endingOffsets=json.dumps({TOPIC: {"0": -1, "1": end}}),
    )
    expected = {
        i: (p, o)
        for i, (p, o) in scenario.committed.items()
        if (p == 0 and o >= start) or (p == 1 and o < end)
    }
    assert found(table) == expected
    # The words: earliest..latest is the default, the whole committed log.
    words = batch_read(broker, client, startingOffsets="EARLIEST", endingOffsets="latest")
    assert found(words) == scenario.committed


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"startingOffsets": "latest"}, "option 'startingOffsets'='latest': a batch read cannot"),
        (
            {"startingOffsets": json.dumps({TOPIC: {"0": -1, "1": 0}})},
            "a batch read cannot start at latest",
        ),
        ({"endingOffsets": "earliest"}, "option 'endingOffsets'='earliest': a batch read cannot"),
        (
            {"startingOffsets": json.dumps({TOPIC: {"0": 0}})},
            f"partitions [1] of topic {TOPIC!r} are missing",
        ),
        (
            {"endingOffsets": json.dumps({TOPIC: {"0": -1, "1": -1, "7": 3}})},
            f"topic {TOPIC!r} has no partitions [7] (it has 2)",
        ),
        (
            {"endingOffsets": json.dumps({TOPIC: {"0": 10_000, "1": -1}})},
            f"option 'endingOffsets': topic {TOPIC!r} partition 0 is readable up to",
        ),
        (
            {
                "startingOffsets": json.dumps({TOPIC: {"0": 5, "1": -2}}),
                "endingOffsets": json.dumps({TOPIC: {"0": 4, "1": -1}}),
            },
            "partition 0 would start at 5, past its end 4",
        ),
    ],
)
def test_a_batch_range_the_log_cannot_serve_is_refused_naming_the_option(
    broker: BrokerProcess,
    client: BrokerClient,
    scenario: Scenario,
    extra: dict[str, str],
    message: str,
) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape(message)):
        batch_read(broker, client, **extra)


def test_fetch_errors_keep_the_brokers_typed_error(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # UNKNOWN_TOPIC_OR_PARTITION is retriable (an election may show it): while the
    # metadata still names the partition the reader retries it for FETCH_FAILOVER_S,
    # then raises the broker's typed error; the bound is shortened so the test checks
    # the error raised past it without waiting the default 30 s.
    monkeypatch.setattr(reader_module, "FETCH_FAILOVER_S", 1.0)
    monkeypatch.setattr(reader_module, "_raise_if_deleted", lambda *_args: None)
    fetches = count_fetches(monkeypatch)
    opts = parse_options({"topic": "missing", "brokers": broker.address}, Scope.READ)
    reader = IdemlogBatchReader(opts, TopicInfo("missing", 1, SCHEMA))
    with pytest.raises(UnknownTopicOrPartitionError):
        list(reader.read(OffsetRangePartition(0, 0, 5)))
    assert fetches[0] > 1  # the failover loop really retried


def test_a_topic_deleted_after_planning_fails_the_read_at_once(
    broker: BrokerProcess, client: BrokerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No failover brings a deleted topic back: the read fails on its first fetch, with
    # one line naming the topic, the partition and the planned offsets, instead of retrying
    # for FETCH_FAILOVER_S (set to an hour here: a retry would hang the test).
    monkeypatch.setattr(reader_module, "FETCH_FAILOVER_S", 3600.0)
    fetches = count_fetches(monkeypatch, limit=3)
    client.create_topic("gone", 2, schema=SCHEMA)
    with Producer(broker.address, **FAST) as producer:
        producer.send("gone", rows(0, 20)).result()
    opts = parse_options({"topic": "gone", "brokers": broker.address}, Scope.READ)
    reader = IdemlogBatchReader(opts, require(client, opts))
    planned = [p for p in reader.partitions() if isinstance(p, OffsetRangePartition)]
    assert planned and all(p.end > p.start for p in planned)
    client.delete_topic("gone")
    # The planned range carries the topic's id: the broker says the id is gone.
    deleted = r"topic 'gone' was deleted: id \w+ no longer exists \(after this read was planned"
    with pytest.raises(UnknownTopicIdError, match=deleted):
        list(reader.read(pickle.loads(pickle.dumps(planned[0]))))
    assert fetches[0] == 1


def count_fetches(monkeypatch: pytest.MonkeyPatch, limit: int | None = None) -> list[int]:
    """Count the reader's fetches (a one-element list); past ``limit`` one fails the test
    (a loop that should not retry)."""
    count = [0]
    fetch = reader_module._fetch

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        if limit is not None and count[0] > limit:
            raise AssertionError(f"the reader fetched {count[0]} times: it retried")
        return fetch(*args, **kwargs)

    monkeypatch.setattr(reader_module, "_fetch", counted)
    return count


# -- stream reader -----------------------------------------------------------------------
def via_json(offsets: Mapping[str, int]) -> dict[str, Any]:
    """Spark keeps offsets as JSON (offset log, Python <-> JVM)."""
    result: dict[str, Any] = json.loads(json.dumps(offsets))
    return result


def at(offset: Mapping[str, Any]) -> dict[str, int]:
    """A stream offset's positions, without the topic id it carries."""
    return {k: int(v) for k, v in offset.items() if k != TOPIC_ID_KEY}


def latest(reader: IdemlogStreamReader, start: dict[str, Any]) -> dict[str, Any]:
    """The next batch's end from ``start`` under the reader's default limit, as Spark asks."""
    return via_json(reader.latestOffset(start, reader.getDefaultReadLimit()))


def run_triggers(
    reader: IdemlogStreamReader,
    start: dict[str, Any],
    on_trigger: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
    limit: int = 200,
) -> tuple[pa.Table, dict[str, Any]]:
    """Micro-batches until the source has nothing new: Spark's driver loop."""
    tables = []
    for _ in range(limit):
        end = latest(reader, start)
        if end == start:
            break
        if on_trigger is not None:
            on_trigger(start, end)
        tables.append(read_parts(reader, reader.partitions(start, end)))
        reader.commit(end)
        start = end
    else:
        raise AssertionError("the stream never caught up")
    if not tables:
        return reader.schema.empty_table(), start
    return pa.concat_tables(tables), start


def stream_reader(broker: BrokerProcess, client: BrokerClient, **extra: str) -> IdemlogStreamReader:
    opts = options(broker, includeMetadata="true", **extra)
    return IdemlogStreamReader(opts, require(client, opts))


def test_stream_initial_and_latest_offsets(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    lso = {str(p): client.list_offsets(TOPIC, p)["last_stable_offset"] for p in (0, 1)}
    hw = {str(p): client.list_offsets(TOPIC, p)["high_watermark"] for p in (0, 1)}
    earliest = stream_reader(broker, client)
    topic_id = client.topic_id(TOPIC)
    initial = via_json(earliest.initialOffset())
    assert initial == {"0": 0, "1": 0, TOPIC_ID_KEY: topic_id}
    assert at(latest(earliest, initial)) == lso
    from_latest = stream_reader(broker, client, startingOffsets="latest")
    assert at(from_latest.initialOffset()) == lso
    uncommitted = stream_reader(
        broker, client, startingOffsets="latest", isolation="read_uncommitted"
    )
    start = via_json(uncommitted.initialOffset())
    assert at(start) == hw == at(latest(uncommitted, start))


def test_stream_starts_at_per_partition_offsets_and_refuses_an_end(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    lso = {str(p): client.list_offsets(TOPIC, p)["last_stable_offset"] for p in (0, 1)}
    reader = stream_reader(broker, client, startingOffsets=json.dumps({TOPIC: {"0": 4, "1": -1}}))
    assert at(reader.initialOffset()) == {"0": 4, "1": lso["1"]}
    table, _ = run_triggers(reader, via_json(reader.initialOffset()))
    expected = {i: (p, o) for i, (p, o) in scenario.committed.items() if p == 0 and o >= 4}
    assert found(table) == expected
    with pytest.raises(InvalidConfigError, match="'endingOffsets'='latest' applies to batch"):
        stream_reader(broker, client, endingOffsets="latest")


def test_stream_with_max_offsets_per_trigger_reads_every_committed_row_once(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    reader = stream_reader(broker, client, maxOffsetsPerTrigger="7")
    start = via_json(reader.initialOffset())
    advances: list[int] = []

    def check(s: dict[str, Any], e: dict[str, Any]) -> None:
        ends, starts = at(e), at(s)
        assert all(ends[k] >= starts.get(k, 0) for k in ends)
        advances.append(sum(ends[k] - starts.get(k, 0) for k in ends))

    table, start = run_triggers(reader, start, check)
    assert found(table) == scenario.committed
    assert max(advances) == 7 and len(advances) >= 4, advances
    assert at(start) == {
        str(p): client.list_offsets(TOPIC, p)["last_stable_offset"] for p in (0, 1)
    }

    scenario.commit_open()  # the LSO moves past the open and the later transaction
    more, start = run_triggers(reader, start, check)
    assert found(more) == {**scenario.open, **scenario.after_open}
    assert max(advances) == 7
    # Offsets only grow within a partition, across triggers.
    whole = pa.concat_tables([table, more])
    for p in (0, 1):
        offs = [o for pp, o in zip(*_meta(whole), strict=True) if pp == p]
        assert offs == sorted(offs) and len(offs) == len(set(offs))


def test_available_now_reads_what_was_there_at_its_start_in_capped_batches(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    """Spark's SupportsTriggerAvailableNow call order: prepare, then latestOffset and
    partitions per batch until the end stops moving."""
    lso = {str(p): client.list_offsets(TOPIC, p)["last_stable_offset"] for p in (0, 1)}
    reader = stream_reader(broker, client, maxOffsetsPerTrigger="7")
    reader.prepareForTriggerAvailableNow()
    scenario.commit_open()  # rows that become readable after the run started
    advances: list[int] = []

    def check(s: dict[str, Any], e: dict[str, Any]) -> None:
        advances.append(sum(at(e)[k] - at(s).get(k, 0) for k in at(e)))

    table, end = run_triggers(reader, via_json(reader.initialOffset()), check)
    assert found(table) == scenario.committed
    assert at(end) == lso, "ends at the target, not at the later end"
    assert max(advances) == 7 and len(advances) >= 4, advances


def test_spark_admission_control_gives_the_start_and_the_limit(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    """Spark calls ``latestOffset(start, limit)`` (admission control) after
    ``prepareForTriggerAvailableNow``: each batch starts where Spark says, a
    ``ReadMaxRows`` caps it (not the option: Spark's limit wins), and ``ReadAllAvailable``
    lifts the cap; ``getDefaultReadLimit`` is the option's limit."""
    assert stream_reader(broker, client, maxOffsetsPerTrigger="7").getDefaultReadLimit() == (
        ReadMaxRows(7)
    )
    assert stream_reader(broker, client).getDefaultReadLimit() == ReadAllAvailable()
    lso = {str(p): client.list_offsets(TOPIC, p)["last_stable_offset"] for p in (0, 1)}
    reader = stream_reader(broker, client, maxOffsetsPerTrigger="7")
    reader.prepareForTriggerAvailableNow()
    scenario.commit_open()  # after the run's start: not read by it
    start = via_json(reader.initialOffset())
    tables, advances = [], []
    for _ in range(200):
        end = via_json(reader.latestOffset(start, ReadMaxRows(5)))
        if end == start:
            break
        advances.append(sum(at(end)[k] - at(start).get(k, 0) for k in at(end)))
        tables.append(read_parts(reader, reader.partitions(start, end)))
        reader.commit(end)
        start = end
    assert found(pa.concat_tables(tables)) == scenario.committed
    assert at(start) == lso and max(advances) == 5 and len(advances) >= 5, advances
    fresh = stream_reader(broker, client, maxOffsetsPerTrigger="7")
    first = via_json(fresh.initialOffset())
    everything = {str(p): client.list_offsets(TOPIC, p)["last_stable_offset"] for p in (0, 1)}
    assert at(fresh.latestOffset(first, ReadAllAvailable())) == everything


def _meta(table: pa.Table) -> tuple[list[int], list[int]]:
    return table.column(PARTITION_COLUMN).to_pylist(), table.column(OFFSET_COLUMN).to_pylist()


def test_stream_from_latest_reads_only_what_is_committed_later(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    reader = stream_reader(broker, client, startingOffsets="latest")
    start = via_json(reader.initialOffset())
    nothing, start = run_triggers(reader, start)
    assert nothing.num_rows == 0
    scenario.commit_open()
    table, _ = run_triggers(reader, start)
    assert found(table) == {**scenario.open, **scenario.after_open}


def test_restarted_stream_caps_from_the_checkpointed_offsets(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    scenario.commit_open()
    first = stream_reader(broker, client, maxOffsetsPerTrigger="9")
    start = via_json(first.initialOffset())
    end = latest(first, start)
    done = read_parts(first, first.partitions(start, end))
    # A new reader (a restarted query): Spark's setLatestSeenOffset plans (seen, seen),
    # then asks for the next end from the checkpoint's.
    restarted = stream_reader(broker, client, maxOffsetsPerTrigger="9")
    assert restarted.partitions(end, end) == []
    following = latest(restarted, end)
    assert sum(at(following)[k] - at(end)[k] for k in at(end)) == 9
    rest, _ = run_triggers(restarted, end)
    expected = {**scenario.committed, **scenario.open, **scenario.after_open}
    assert found(pa.concat_tables([done, rest])) == expected


def test_checkpoint_past_the_log_end_is_an_error_not_a_stall(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    reader = stream_reader(broker, client)
    foreign = {"0": 10_000, "1": 0}  # a foreign checkpoint
    reader.partitions(foreign, foreign)
    with pytest.raises(OffsetOutOfRangeError, match="partition 0 at 10000 but its log ends at"):
        reader.latestOffset(foreign, reader.getDefaultReadLimit())


def test_offsets_carry_the_topic_id_and_a_checkpoint_of_another_id_is_refused(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    topic_id = client.topic_id(TOPIC)
    first = stream_reader(broker, client)
    start = via_json(first.initialOffset())
    end = latest(first, start)
    assert start[TOPIC_ID_KEY] == end[TOPIC_ID_KEY] == topic_id
    parts = first.partitions(start, end)
    assert parts and {p.topic_id for p in parts} == {topic_id}
    # A checkpoint written before ids (no "topic_id"): adopted, and planned on with the id.
    adopted = stream_reader(broker, client)
    assert adopted.partitions(at(end), at(end)) == []
    assert latest(adopted, at(end))[TOPIC_ID_KEY] == topic_id
    # A checkpoint of a topic of the same name deleted since: refused, naming the topic.
    stale = {**end, TOPIC_ID_KEY: "0" * 32}
    restarted = stream_reader(broker, client)
    with pytest.raises(UnknownTopicIdError) as refused:
        restarted.partitions(stale, stale)
    assert f"topic {TOPIC!r} was recreated since the streaming query" in refused.value.message
    assert f"id {'0' * 32} is now {topic_id}" in refused.value.message
    # The option topicId pins an id: another one is refused when the read is planned.
    with pytest.raises(UnknownTopicIdError, match="option 'topicId' pinned it"):
        require(client, options(broker, topicId="0" * 32))
    assert require(client, options(broker, topicId=topic_id)).topic_id == topic_id


def test_stream_partitions_plan_missing_and_unchanged_partitions() -> None:
    # A partition added to the topic after `start` was planned starts at 0.
    opts = parse_options({"topic": TOPIC, "brokers": "127.0.0.1:1"}, Scope.READ)
    reader = IdemlogStreamReader(opts, TopicInfo(TOPIC, 1, SCHEMA))  # connects to nothing
    assert reader.partitions({"0": 5}, {"0": 5, "1": 3}) == [OffsetRangePartition(1, 0, 3)]
    assert reader.partitions({"0": 5, "1": 3}, {"0": 9, "1": 3}) == [OffsetRangePartition(0, 5, 9)]


def test_a_pickled_stream_reader_plans_and_reads_as_the_original(
    broker: BrokerProcess, client: BrokerClient, scenario: Scenario
) -> None:
    reader = stream_reader(broker, client, maxOffsetsPerTrigger="5")
    start = via_json(reader.initialOffset())
    end = latest(reader, start)
    parts = reader.partitions(start, end)
    copy = on_executor(reader)
    assert latest(copy, start) == latest(reader, start)
    assert read_parts(copy, parts).num_rows == 5


# -- data loss ---------------------------------------------------------------------------
def test_reading_offsets_deleted_by_retention_names_topic_partition_and_offsets(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory({"log.retention.check.interval.ms": 50})
    with BrokerClient(broker.address) as client:
        client.create_topic(
            TOPIC,
            1,
            schema=SCHEMA,
            config={"segment.bytes": 4096, "max.message.bytes": 4096, "retention.bytes": 4096},
        )
        with Producer(broker.address, **FAST) as producer:
            for i in range(20):
                producer.send(TOPIC, rows(i * 50, 50)).result(10)
        # Retention runs every 50 ms: wait until it deleted and has nothing more to delete
        # (the same log start over ten of its runs), so the batch read below is not raced.
        seen = [-1]

        def settled() -> bool:
            seen.append(client.list_offsets(TOPIC, 0)["log_start_offset"])
            return seen[-1] > 0 and seen[-1] == seen[-2]

        wait_until(
            settled,
            lambda: f"retention to settle (log starts seen: {seen})",
            timeout=30,
            interval=0.5,
        )

        reader = stream_reader(broker, client)
        end = latest(reader, {"0": 0})
        with pytest.raises(OffsetOutOfRangeError) as info:
            list(on_executor(reader).read(reader.partitions({"0": 0}, end)[0]))
        message = str(info.value)
        assert f"topic {TOPIC!r} partition 0" in message
        assert f"[0, {end['0']})" in message and "deleted" in message
        assert "the log now holds [" in message

        # A batch read plans from the log start: what is left reads fine.
        offsets = batch_read(broker, client).column(OFFSET_COLUMN).to_pylist()
        assert offsets == list(range(offsets[0], end["0"])) and offsets[0] > 0


# -- maxOffsetsPerTrigger split ----------------------------------------------------------
@pytest.mark.parametrize(
    ("base", "ends", "budget", "expected"),
    [
        ({"0": 0, "1": 0}, {"0": 90, "1": 10}, 10, {"0": 9, "1": 1}),
        ({"0": 0, "1": 0}, {"0": 1000, "1": 1}, 10, {"0": 9, "1": 1}),
        ({"0": 0, "1": 0, "2": 0}, {"0": 50, "1": 5, "2": 5}, 2, {"0": 1, "1": 1, "2": 0}),
        ({"0": 10, "1": 20}, {"0": 15, "1": 22}, 100, {"0": 15, "1": 22}),
        ({"0": 10, "1": 20}, {"0": 15, "1": 22}, 0, {"0": 15, "1": 22}),
        ({"0": 10}, {"0": 10, "1": 30}, 6, {"0": 10, "1": 6}),
        ({"0": 0, "1": 0, "2": 0}, {"0": 10, "1": 10, "2": 10}, 7, {"0": 3, "1": 2, "2": 2}),
    ],
)
def test_cap_ends_splits_the_budget_by_backlog(
    base: dict[str, int], ends: dict[str, int], budget: int, expected: dict[str, int]
) -> None:
    assert cap_ends(base, ends, budget) == expected


def test_cap_ends_plans_exactly_the_budget_within_each_backlog() -> None:
    rng = np.random.default_rng(7)
    for _ in range(500):
        n = int(rng.integers(1, 6))
        base = {str(p): int(rng.integers(0, 100)) for p in range(n)}
        ends = {k: v + int(rng.integers(0, 50)) for k, v in base.items()}
        budget = int(rng.integers(1, 120))
        capped = cap_ends(base, ends, budget)
        assert all(base[k] <= capped[k] <= ends[k] for k in ends)
        backlog = sum(ends[k] - base[k] for k in ends)
        assert sum(capped[k] - base[k] for k in ends) == min(budget, backlog)
        if budget >= sum(1 for k in ends if ends[k] > base[k]):
            assert all(capped[k] > base[k] for k in ends if ends[k] > base[k])


# -- a broker restart under a running stream -------------------------------------------------
class _RetryLog(logging.Handler):
    """The driver's retried calls as they are logged (``driver_retry.RETRY_MARK``)."""

    def __init__(self) -> None:
        super().__init__()
        self.retries = Recorder()

    def emit(self, record: logging.LogRecord) -> None:
        if RETRY_MARK in record.getMessage():
            self.retries.record(record.getMessage())


@pytest.fixture
def retry_log() -> Iterator[_RetryLog]:
    handler = _RetryLog()
    logger = logging.getLogger("idemlog.sink")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def test_a_streams_next_offsets_wait_for_its_broker_to_come_back(
    broker: BrokerProcess, retry_log: _RetryLog
) -> None:
    """Issue 37: a running stream's latestOffset meets its broker SIGTERMed; the driver
    asks again (logged) instead of ending the query, and once the broker is back on its
    port (same data) answers the offsets the stopped broker held, every row read once."""
    with BrokerClient(broker.address) as client:
        client.create_topic(TOPIC, 1, schema=SCHEMA)
        reader = stream_reader(broker, client)
    with Producer(broker.address, **FAST) as producer:
        producer.send(TOPIC, rows(0, 100)).result(10)
    start = via_json(reader.initialOffset())
    old_pid = broker.pid
    assert broker.kill(signal.SIGTERM) == 0, broker.log_tail()
    answer: list[dict[str, Any]] = []
    planning = threading.Thread(target=lambda: answer.append(latest(reader, start)))
    planning.start()
    retry_log.retries.wait(lambda seen: len(seen) > 0, "the next offsets asked again")
    assert planning.is_alive() and not answer, "the plan ended while its broker was down"
    broker.restart()
    planning.join(timeout=120)
    assert not planning.is_alive() and broker.pid != old_pid
    (end,) = answer
    assert end["0"] == 100 and end[TOPIC_ID_KEY] == start[TOPIC_ID_KEY]
    read = read_parts(reader, reader.partitions(start, end))
    assert sorted(read.column("id").to_pylist()) == list(range(100))
    seen = retry_log.retries.values
    assert all(f"next offsets of the read of topic {TOPIC!r}" in str(m) for m in seen), seen
    print(f"next offsets asked {len(seen) + 1} times across the restart: {end}")


def test_a_stream_whose_broker_stays_down_fails_naming_the_option(
    broker: BrokerProcess, retry_log: _RetryLog
) -> None:
    with BrokerClient(broker.address) as client:
        client.create_topic(TOPIC, 1, schema=SCHEMA)
        reader = stream_reader(broker, client, **{"driver.retry.timeout.ms": "1500"})
    start = reader.initialOffset()
    broker.stop()
    with pytest.raises(DriverRetriesSpentError) as info:
        reader.latestOffset(start, reader.getDefaultReadLimit())
    message = str(info.value)
    assert f"next offsets of the read of topic {TOPIC!r}" in message, message
    assert "driver.retry.timeout.ms=1500 ms" in message, message
    assert len(retry_log.retries) >= 1
