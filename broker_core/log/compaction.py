"""What compaction knows about rows: their keys, tombstones, and a schema's fitness.

A compacted topic (``cleanup.policy`` with ``compact``) names its key columns in
``compaction.key.columns``; a row's key is the tuple of those columns' values, and a row
whose other columns are all null is a tombstone. See docs/storage.md, Compaction.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from broker_core.errors import InvalidConfigError
from broker_core.log.config import LogConfig


def check_key_columns(topic: str, config: LogConfig, schema: pa.Schema) -> None:
    """Raise InvalidConfigError naming the topic, the key and the column when ``schema``
    lacks a key column of a compacted topic, or one of ``kafka.key.columns``."""
    for column in config.kafka_keys:
        if schema.get_field_index(column) < 0:
            raise InvalidConfigError(
                f"topic {topic!r}: kafka.key.columns={config.kafka_key_columns!r} names "
                f"column {column!r}, which the schema ({', '.join(schema.names)}) does not have"
            )
    if not config.policy.compacts:
        return
    for column in config.key_columns:
        if schema.get_field_index(column) < 0:
            raise InvalidConfigError(
                f"topic {topic!r}: compaction.key.columns={config.compaction_key_columns!r} "
                f"names column {column!r}, which the schema ({', '.join(schema.names)}) "
                "does not have"
            )


def row_keys(rows: pa.RecordBatch, key_columns: Sequence[str]) -> list[Hashable]:
    """Each row's key: the tuple of its key columns' values (Python objects)."""
    columns = [rows.column(rows.schema.get_field_index(c)).to_pylist() for c in key_columns]
    return list(zip(*columns, strict=True))


def tombstones(rows: pa.RecordBatch, key_columns: Sequence[str]) -> list[bool]:
    """Per row: True when every column outside the key is null. A schema with no column
    outside the key has no tombstones (a row of keys alone is a value, not a delete)."""
    others = [i for i, name in enumerate(rows.schema.names) if name not in key_columns]
    if not others:
        return [False] * rows.num_rows
    mask = pc.is_null(rows.column(others[0]))
    for i in others[1:]:
        mask = pc.and_(mask, pc.is_null(rows.column(i)))
    return [bool(v) for v in mask.to_pylist()]
