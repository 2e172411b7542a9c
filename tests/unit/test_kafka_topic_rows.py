"""Kafka records as a Kafka-shaped topic's rows (server/kafka/topic_rows.py): each
column of the topic's schema cast from the decoded records, a string column's bytes
checked as UTF-8, and every refusal naming the topic, the column and what was wrong."""

from __future__ import annotations

import pyarrow as pa
import pytest

from broker_core.errors import InvalidRecordError
from broker_core.kafka.record_batch import HEADERS_TYPE, decode_batches, encode_batch
from broker_core.server.kafka.topic_rows import topic_rows

WHERE = "Produce to t-0"


def decoded(
    keys: list[bytes | None], values: list[bytes | None], headers: bool = False
) -> pa.RecordBatch:
    columns = {
        "key": pa.array(keys, pa.binary()),
        "value": pa.array(values, pa.binary()),
        "timestamp": pa.array(
            [1_700_000_000_123 + i for i in range(len(values))], pa.timestamp("ms")
        ),
    }
    if headers:
        columns["headers"] = pa.array([[{"key": "h", "value": b"1"}] for _ in values], HEADERS_TYPE)
    (batch,) = decode_batches(encode_batch(pa.RecordBatch.from_pydict(columns), base_offset=0))
    return batch.rows


def test_columns_take_the_topics_types() -> None:
    schema = pa.schema(
        [
            ("value", pa.large_string()),
            ("key", pa.string()),
            ("timestamp", pa.timestamp("s", tz="UTC")),
        ]
    )
    rows = topic_rows("t", schema, decoded([b"k", None], ["é".encode(), b"v"]), WHERE)
    assert rows.schema == schema
    assert rows.column("value").to_pylist() == ["é", "v"]
    assert rows.column("key").to_pylist() == ["k", None]
    # Seconds: the millisecond timestamp truncated, not refused.
    assert [t.timestamp() for t in rows.column("timestamp").to_pylist()] == [1_700_000_000] * 2


def test_a_topic_without_a_schema_takes_the_decoded_rows() -> None:
    rows = decoded([b"k"], [b"v"])
    assert topic_rows("t", None, rows, WHERE) is rows


def test_int64_timestamps_are_milliseconds_and_headers_kept() -> None:
    schema = pa.schema(
        [("value", pa.binary()), ("timestamp", pa.int64()), ("headers", HEADERS_TYPE)]
    )
    rows = topic_rows("t", schema, decoded([None], [b"v"], headers=True), WHERE)
    assert rows.column("timestamp").to_pylist() == [1_700_000_000_123]
    assert rows.column("headers").to_pylist() == [[{"key": "h", "value": b"1"}]]


@pytest.mark.parametrize(
    ("schema", "rows", "message"),
    [
        (
            pa.schema([("id", pa.int64())]),
            decoded([None], [b"v"]),
            r"topic 't' \(id: int64\) cannot hold Kafka records: columns \['id'\]",
        ),
        (pa.schema([("key", pa.binary())]), decoded([None], [b"v"]), "no 'value' column"),
        (pa.schema([("value", pa.int32())]), decoded([None], [b"v"]), "column 'value' is int32"),
        (pa.schema([("value", pa.string())]), decoded([None], [b"\xff"]), "value is not UTF-8"),
        (
            pa.schema([("value", pa.binary())]),
            decoded([b"k"], [b"v"]),
            "carries a key but topic 't'",
        ),
        (
            pa.schema([("value", pa.binary())]),
            decoded([None], [b"v"], headers=True),
            "carries headers but",
        ),
        (
            pa.schema([pa.field("value", pa.binary(), nullable=False)]),
            decoded([None], [None]),
            "value is null",
        ),
    ],
)
def test_what_cannot_be_held_is_refused_naming_it(
    schema: pa.Schema, rows: pa.RecordBatch, message: str
) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        topic_rows("t", schema, rows, WHERE)
