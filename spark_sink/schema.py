"""Spark schema <-> the topic's Arrow schema, checked on the driver before any task runs.

A topic has one Arrow schema, fixed at creation (the broker rejects batches of another).
Spark's Arrow batches vary in ways that do not change the data: nullability follows the
plan, and timestamps carry the session time zone. The sink therefore stores a
*normalised* schema (every field nullable, timestamps in UTC) and casts each batch to it
without copying, so the same DataFrame written from two sessions lands in one topic.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from broker_core.errors import InvalidConfigError, SchemaMismatchError

from .options import OFFSET_COLUMN, PARTITION_COLUMN

_UTC = "UTC"


def _normal_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t) and t.tz is not None:
        return pa.timestamp(t.unit, tz=_UTC)  # same instants, one zone name
    return t


def normalise(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, _normal_type(f.type), nullable=True) for f in schema])


def arrow_schema_for(spark_schema: StructType) -> pa.Schema:
    """The topic schema of a DataFrame; an unsupported column is named with its type."""
    names = [f.name for f in spark_schema.fields]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SchemaMismatchError(f"column names appear twice: {', '.join(duplicates)}")
    for name in names:
        if name in (PARTITION_COLUMN, OFFSET_COLUMN):
            raise SchemaMismatchError(
                f"column {name!r} is reserved for the reader's metadata (includeMetadata)"
            )
    fields = []
    for f in spark_schema.fields:
        try:
            # A zone for Spark's TIMESTAMP (pyspark asserts one): instants, named UTC.
            fields.append(to_arrow_schema(StructType([f]), timezone=_UTC)[0])
        except Exception as exc:  # pyspark raises several types for unsupported ones
            raise SchemaMismatchError(
                f"column {f.name!r} of type {f.dataType.simpleString()} cannot be written "
                f"to idemlog (no Arrow form: {str(exc).splitlines()[0]})"
            ) from None
    return normalise(pa.schema(fields))


def check_key(schema: pa.Schema, key: str | None) -> None:
    if key is None:
        return
    if schema.get_field_index(key) < 0:
        raise InvalidConfigError(
            f"option 'key'={key!r} names no column; columns: {', '.join(schema.names)}"
        )
    t = schema.field(key).type
    hashable = (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_temporal(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )
    if not hashable:
        raise InvalidConfigError(
            f"option 'key'={key!r}: column type {t} cannot be hashed (use an integer, float, "
            "boolean, date/timestamp, string or binary column)"
        )


def check_compatible(topic: str, existing: pa.Schema, incoming: pa.Schema) -> None:
    """Raise naming every column that differs between the topic and the DataFrame."""
    existing = normalise(existing)
    if existing.equals(incoming, check_metadata=False):
        return
    problems = []
    old = {f.name: f.type for f in existing}
    new = {f.name: f.type for f in incoming}
    missing = [n for n in old if n not in new]
    extra = [n for n in new if n not in old]
    changed = [f"{n} ({old[n]} -> {new[n]})" for n in old if n in new and old[n] != new[n]]
    if missing:
        problems.append(f"missing columns {', '.join(missing)}")
    if extra:
        problems.append(f"new columns {', '.join(extra)}")
    if changed:
        problems.append(f"changed types {', '.join(changed)}")
    if not problems and existing.names != incoming.names:
        problems.append(f"column order {incoming.names} instead of {existing.names}")
    raise SchemaMismatchError(
        f"the DataFrame's schema does not match topic {topic!r}: {'; '.join(problems)} "
        f"(topic schema: {', '.join(f'{f.name} {f.type}' for f in existing)})"
    )


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` under the topic schema: a relabel of the same buffers, no copy."""
    if batch.schema.equals(schema, check_metadata=False):
        return batch
    columns = [
        col if col.type == f.type else col.cast(f.type)
        for col, f in zip(batch.columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def spark_schema_for(schema: pa.Schema, include_metadata: bool) -> StructType:
    result = from_arrow_schema(schema)
    if include_metadata:
        result = StructType(
            [
                *result.fields,
                StructField(PARTITION_COLUMN, IntegerType(), False),
                StructField(OFFSET_COLUMN, LongType(), False),
            ]
        )
    return result
