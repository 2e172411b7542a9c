"""Rows of any schema as Kafka records: the row as a JSON object, its key columns as the key.

A topic that is not Kafka-shaped (``record_batch.is_kafka_shaped``) is served to Kafka
clients in the format its ``kafka.format`` key names; ``json`` (the default) is this
module's. For each row:

* **value**: a JSON object of every column, in the schema's order, as Spark's
  ``to_json`` writes one: numbers as numbers (a float that is not finite as ``null``),
  booleans, strings escaped, timestamps as ISO-8601 strings in UTC (``...Z``; a zone-less
  one taken as UTC), dates as ``YYYY-MM-DD``, decimals as numbers, binary as base64
  strings, nested values (lists, structs, maps) as JSON arrays and objects, nulls as
  ``null``;
* **key**: the ``kafka.key.columns`` (none: a null key): one string or binary column gives
  its bytes as they are (a Kafka key is usually such a string); any other single column
  its JSON text; several a JSON object of them;
* **timestamp**: a ``timestamp`` column's, else the batch's (``record_batch``'s rule).

Column-wise: each column is turned into JSON text with Arrow's compute kernels and the
pieces joined per row in one kernel call; no Python runs per row for numbers, booleans,
strings, timestamps and dates. Binary and nested columns, and the rare string holding a
control character other than ``\\n``, ``\\r``, ``\\t``, ``\\b``, ``\\f``, are encoded value
by value (``json.dumps``): a cost such topics pay, stated in docs/kafka.md.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from broker_core.errors import InvalidConfigError

_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))
_MORE_ESCAPES = (("\b", "\\b"), ("\f", "\\f"))
_CONTROL = "[\\x00-\\x1f]"
KEY_COLUMNS_KEY = "kafka.key.columns"


def _quoted(strings: pa.Array) -> pa.Array:
    """JSON string literals of ``strings`` (utf8), nulls kept."""
    text = strings
    for old, new in _ESCAPES + _MORE_ESCAPES:
        text = pc.replace_substring(text, old, new)
    left = pc.match_substring_regex(text, _CONTROL)
    if pc.any(left).as_py():
        # Rare control characters: those values alone through json.dumps.
        values = strings.to_pylist()
        flags = left.to_pylist()
        fixed = [
            json.dumps(v)[1:-1] if flag else t
            for v, t, flag in zip(values, text.to_pylist(), flags, strict=True)
        ]
        text = pa.array(fixed, pa.string())
    return pc.binary_join_element_wise('"', text, '"', "")


def _json_column(column: pa.Array) -> pa.Array:
    """Each value of ``column`` as JSON text (utf8); a null as ``null``."""
    kind = column.type
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(kind):
        return _json_column(column.dictionary_decode())
    if pa.types.is_null(kind):
        text = pa.nulls(len(column), pa.string())
    elif pa.types.is_boolean(kind):
        text = pc.if_else(column, "true", "false")
    elif pa.types.is_integer(kind) or pa.types.is_decimal(kind):
        text = pc.cast(column, pa.string())
    elif pa.types.is_floating(kind):
        finite = pc.is_finite(column)
        text = pc.if_else(finite, pc.cast(column, pa.string()), pa.scalar(None, pa.string()))
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = _quoted(pc.cast(column, pa.string()))
    elif pa.types.is_timestamp(kind):
        utc = column if kind.tz is None else pc.cast(column, pa.timestamp(kind.unit))
        text = _quoted(pc.binary_join_element_wise(pc.strftime(utc, "%Y-%m-%dT%H:%M:%S"), "Z", ""))
    elif pa.types.is_date(kind):
        text = _quoted(pc.strftime(column, "%Y-%m-%d"))
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        text = pa.array(
            [None if v is None else base64.b64encode(v).decode() for v in column.to_pylist()],
            pa.string(),
        )
        text = _quoted(text)
    else:  # lists, structs, maps, times, durations: value by value
        text = pa.array([_dumps(v) for v in column.to_pylist()], pa.string())
    return pc.fill_null(text, "null")


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(_plain(value), separators=(",", ":"))


def _plain(value: Any) -> Any:
    """``value`` (from ``to_pylist``) with what JSON cannot hold made JSON's."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        # A map column's entries come as (key, value) pairs: an object.
        if value and all(isinstance(e, tuple) and len(e) == 2 for e in value):
            return {str(k): _plain(v) for k, v in value}
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and (value != value or abs(value) == float("inf")):
        return None
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


def _object(rows: pa.RecordBatch, names: Sequence[str]) -> pa.Array:
    """A JSON object of the columns ``names`` per row (utf8)."""
    pieces: list[Any] = []
    for i, name in enumerate(names):
        pieces.append(("{" if i == 0 else ",") + json.dumps(name) + ":")
        pieces.append(_json_column(rows.column(name)))
    if not names:
        return pa.array(["{}"] * rows.num_rows, pa.string())
    pieces.append("}")
    return pc.binary_join_element_wise(*pieces, "")


class JsonRecords:
    """Rows of ``schema`` as Kafka-shaped columns, keyed by ``key_columns`` (each a
    column of the schema: InvalidConfigError naming ``kafka.key.columns`` otherwise)."""

    def __init__(self, schema: pa.Schema, key_columns: Sequence[str]) -> None:
        missing = [c for c in key_columns if c not in schema.names]
        if missing:
            raise InvalidConfigError(
                f"{KEY_COLUMNS_KEY}={','.join(key_columns)}: the topic has no column "
                f"{', '.join(missing)} (its columns: {', '.join(schema.names)})"
            )
        self.schema = schema
        self.key_columns = tuple(key_columns)

    def to_kafka(self, rows: pa.RecordBatch) -> pa.RecordBatch:
        """``rows`` as ``key`` (binary), ``value`` (binary) and, if the rows have a
        timestamp column, ``timestamp``."""
        value = pc.cast(_object(rows, rows.schema.names), pa.binary())
        columns: dict[str, pa.Array] = {"key": self._key(rows), "value": value}
        if "timestamp" in rows.schema.names:
            columns["timestamp"] = rows.column("timestamp")
        return pa.RecordBatch.from_pydict(columns)

    def _key(self, rows: pa.RecordBatch) -> pa.Array:
        if not self.key_columns:
            return pa.nulls(rows.num_rows, pa.binary())
        if len(self.key_columns) == 1:
            column = rows.column(self.key_columns[0])
            kind = column.type
            if pa.types.is_string(kind) or pa.types.is_large_string(kind):
                return pc.cast(pc.cast(column, pa.string()), pa.binary())
            if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
                return pc.cast(column, pa.binary())
            text = _json_column(column)
            # A null key column is a null key, not the text "null".
            return pc.cast(
                pc.if_else(pc.is_valid(column), text, pa.scalar(None, pa.string())), pa.binary()
            )
        return pc.cast(_object(rows, self.key_columns), pa.binary())
