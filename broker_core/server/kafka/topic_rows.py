"""Kafka records as the rows of a Kafka-shaped topic, for the Kafka listener's Produce.

A decoded Kafka batch (``kafka.record_batch.DECODED_SCHEMA``: binary key and value,
millisecond timestamp, headers) becomes rows of the topic's own schema, column by column
(casts, never a Python step per record): the shape the listener's Fetch serves
(``records.py``), as Spark's Kafka sink writes it. ``value`` binary or string, ``key``
too and optional, ``timestamp`` (any unit, or int64 milliseconds) and ``headers``
optional. A string column takes the UTF-8 of the records' bytes: bytes that are not UTF-8
are refused, never replaced. A record carrying what the topic has no column for (a key,
headers) is refused rather than stripped; a Kafka timestamp without a column is dropped
(the reader then shows the append time, as on a Kafka topic of LogAppendTime). A topic of
any other schema is refused, naming its columns. A topic without a schema yet takes the
decoded one.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from broker_core.errors import InvalidRecordError

_BYTES_TYPES = (pa.binary(), pa.large_binary(), pa.string(), pa.large_string())
KAFKA_COLUMNS = ("key", "value", "timestamp", "headers")


def _shape_problem(schema: pa.Schema) -> str | None:
    """Why ``schema`` cannot hold Kafka records, or None."""
    unknown = [n for n in schema.names if n not in KAFKA_COLUMNS]
    if unknown:
        return f"columns {unknown} are not Kafka's"
    if "value" not in schema.names:
        return "it has no 'value' column"
    if len(set(schema.names)) != len(schema.names):
        return "a column name is repeated"
    for name in ("key", "value"):
        if name in schema.names and schema.field(name).type not in _BYTES_TYPES:
            return f"column {name!r} is {schema.field(name).type}, not binary or string"
    if "timestamp" in schema.names:
        kind = schema.field("timestamp").type
        if not (pa.types.is_timestamp(kind) or pa.types.is_int64(kind)):
            return f"column 'timestamp' is {kind}, not a timestamp or int64 milliseconds"
    if "headers" in schema.names:
        kind = schema.field("headers").type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not (
            pa.types.is_struct(kind.value_type)
            and sorted(f.name for f in kind.value_type) == ["key", "value"]
        ):
            return f"column 'headers' is {kind}, not list<struct<key: string, value: binary>>"
    return None


def describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def check_kafka_shaped(topic: str, schema: pa.Schema | None) -> None:
    """InvalidRecordError naming ``topic``'s columns unless Kafka records fit them."""
    if schema is None:
        return
    problem = _shape_problem(schema)
    if problem is not None:
        raise InvalidRecordError(
            f"topic {topic!r} ({describe(schema)}) cannot hold Kafka records: {problem}; a "
            "Kafka-shaped topic has 'value' (binary or string), optional 'key' (binary or "
            "string), 'timestamp' and 'headers' (docs/kafka.md)"
        )


def topic_rows(
    topic: str, schema: pa.Schema | None, decoded: pa.RecordBatch, where: str
) -> pa.RecordBatch:
    """``decoded`` (a Kafka batch's rows) as rows of ``schema`` (``topic``'s; None: the
    decoded shape). InvalidRecordError, naming ``where`` and the column, for a topic that
    is not Kafka-shaped, bytes that are not UTF-8 for a string column, a null in a column
    that allows none, or a key or headers the topic has no column for."""
    if schema is None:
        return decoded
    check_kafka_shaped(topic, schema)
    for dropped in ("key", "headers"):
        if dropped in schema.names:
            continue
        column = decoded.column(dropped)
        carried = (
            column.null_count < len(column)
            if dropped == "key"
            else pc.sum(pc.list_value_length(column)).as_py() or 0
        )
        if carried:
            raise InvalidRecordError(
                f"{where}: a record carries {'a key' if dropped == 'key' else 'headers'} "
                f"but topic {topic!r} "
                f"({describe(schema)}) has no {dropped!r} column"
            )
    columns = []
    for field in schema:
        source = decoded.column(field.name)
        try:
            column = source.cast(field.type, safe=field.name != "timestamp")
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            problem = (
                "is not UTF-8"
                if pa.types.is_string(field.type) or pa.types.is_large_string(field.type)
                else f"does not convert ({exc})"
            )
            raise InvalidRecordError(
                f"{where}: a record's {field.name} {problem}: topic {topic!r}'s column is "
                f"{field.type}"
            ) from None
        if not field.nullable and column.null_count:
            raise InvalidRecordError(
                f"{where}: a record's {field.name} is null: topic {topic!r}'s column "
                f"{field.name!r} allows no null"
            )
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)
