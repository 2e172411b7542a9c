"""Rows of any schema as Kafka records (broker_core/kafka/json_records.py): each value a
JSON object that json.loads reads back to the row, keys by kafka.key.columns."""

from __future__ import annotations

import base64
import datetime
import decimal
import json

import pyarrow as pa
import pytest

from broker_core.errors import InvalidConfigError
from broker_core.kafka.json_records import JsonRecords

ROWS = pa.RecordBatch.from_pydict(
    {
        "id": pa.array([1, None, 3], pa.int64()),
        "name": pa.array(['quote " backslash \\ newline \n', None, "bell \x07 tab \t"]),
        "f": pa.array([1.5, float("nan"), -2e20]),
        "ok": pa.array([True, False, None]),
        "ts": pa.array(
            [datetime.datetime(2024, 1, 2, 3, 4, 5, 123000), None, datetime.datetime(1970, 1, 1)],
            pa.timestamp("ms"),
        ),
        "day": pa.array([datetime.date(2024, 1, 2), None, None]),
        "raw": pa.array([b"\x00\xff", None, b""]),
        "dec": pa.array(
            [decimal.Decimal("1.25"), None, decimal.Decimal("-3.00")], pa.decimal128(5, 2)
        ),
        "tags": pa.array([[1, 2], None, []]),
        "nested": pa.array([{"a": 1, "b": "x"}, None, {"a": None, "b": None}]),
    }
)


def test_each_value_is_the_row_as_a_json_object() -> None:
    out = JsonRecords(ROWS.schema, []).to_kafka(ROWS)
    values = [json.loads(v) for v in out.column("value").to_pylist()]
    assert values[0] == {
        "id": 1,
        "name": 'quote " backslash \\ newline \n',
        "f": 1.5,
        "ok": True,
        "ts": "2024-01-02T03:04:05.123Z",
        "day": "2024-01-02",
        "raw": base64.b64encode(b"\x00\xff").decode(),
        "dec": 1.25,
        "tags": [1, 2],
        "nested": {"a": 1, "b": "x"},
    }
    assert values[1] == {name: (False if name == "ok" else None) for name in ROWS.schema.names}
    assert values[2]["name"] == "bell \x07 tab \t" and values[2]["f"] == -2e20
    assert list(values[0]) == ROWS.schema.names  # the schema's order
    assert out.column("key").to_pylist() == [None, None, None]
    assert out.schema.names == ["key", "value"]  # no timestamp column: the batch's time


def test_keys_by_kafka_key_columns() -> None:
    by_id = JsonRecords(ROWS.schema, ["id"]).to_kafka(ROWS).column("key").to_pylist()
    assert by_id == [b"1", None, b"3"]  # a null key column: a null key
    by_name = JsonRecords(ROWS.schema, ["name"]).to_kafka(ROWS).column("key").to_pylist()
    assert by_name[0] == b'quote " backslash \\ newline \n'  # a string: its bytes
    both = JsonRecords(ROWS.schema, ["id", "ok"]).to_kafka(ROWS).column("key").to_pylist()
    assert [json.loads(k) for k in both] == [
        {"id": 1, "ok": True}, {"id": None, "ok": False}, {"id": 3, "ok": None},
    ]  # fmt: skip


def test_a_timestamp_column_is_the_records_time() -> None:
    rows = pa.RecordBatch.from_pydict(
        {"n": pa.array([1]), "timestamp": pa.array([5], pa.timestamp("ms"))}
    )
    out = JsonRecords(rows.schema, []).to_kafka(rows)
    assert out.column("timestamp").cast(pa.int64()).to_pylist() == [5]


def test_a_key_column_the_schema_lacks_is_refused_naming_it() -> None:
    with pytest.raises(InvalidConfigError, match=r"kafka.key.columns=idx: .* no column idx"):
        JsonRecords(ROWS.schema, ["idx"])
