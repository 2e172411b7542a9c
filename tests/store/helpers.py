"""Shared builders for the log-store tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa

from broker_core.log.config import LogConfig
from broker_core.log.partition_log import IsolationLevel, PartitionLog
from broker_core.log.store import LogStore

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.int32()), ("value", pa.string())])


def rows(n: int, start: int = 0, width: int = 8) -> pa.RecordBatch:
    """``n`` rows with ids start..start+n-1; the id identifies a row across retries."""
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.record_batch(
        [
            pa.array(ids),
            pa.array((ids % 7).astype(np.int32)),
            pa.array([f"{i:0{width}d}" for i in ids]),
        ],
        schema=SCHEMA,
    )


def read_ids(
    log: PartitionLog, isolation: str = "read_committed", start: int | None = None
) -> list[int]:
    """Every id readable from ``start`` (default: log start) to the end, following next_offset."""
    offset = log.log_start_offset if start is None else start
    ids: list[int] = []
    level = IsolationLevel.parse(isolation)
    while True:
        result = log.read(offset, isolation=level, max_bytes=1 << 20)
        for b in result.batches:
            ids.extend(b.records.column("id").to_pylist())
        if result.next_offset == offset:
            return ids
        offset = result.next_offset


def open_store(path: Path, **config: object) -> LogStore:
    return LogStore(path, {k.replace("_", "."): v for k, v in config.items()})


class ManualClock:
    """An injectable millisecond clock that only moves when a test moves it."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


def producer_states(log: PartitionLog) -> dict[int, dict[str, object]]:
    """Every field of every ProducerStateEntry (batches as a list), keyed by producer id."""
    states: dict[int, dict[str, object]] = {}
    for entry in log.state:
        fields: dict[str, object] = {}
        for f in dataclasses.fields(entry):
            value = getattr(entry, f.name)
            fields[f.name] = list(value) if f.name == "batches" else value
        states[entry.producer_id] = fields
    return states


def open_log(path: Path, clock: ManualClock | None = None, **config: object) -> PartitionLog:
    """A bare PartitionLog; config keys as keyword arguments with '_' for '.'."""
    mapping = {k.replace("_", "."): v for k, v in config.items()}
    return PartitionLog(path, LogConfig.from_mapping(mapping), clock=clock)


def rows_with_bad_offsets() -> pa.RecordBatch:
    """``rows(2)`` whose string column's first value ends far past its data buffer (the
    last offset is in bounds): Arrow's cheap checks and an IPC reader take it, only its
    full validation finds it, and a reader that does not validate reads past the buffer."""
    good = rows(2)
    offsets = pa.array([0, 1 << 20, 4], pa.int32()).buffers()[1]
    values = good.column(2).buffers()[2]
    bad = pa.Array.from_buffers(pa.string(), 2, [None, offsets, values])
    return pa.record_batch([good.column(0), good.column(1), bad], schema=SCHEMA)
