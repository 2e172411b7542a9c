"""``format("discard")``: the floor of any Python data-source writer.

Its tasks iterate the Arrow batches Spark hands them and return their row count; the
driver's commit checks it (batch) or does nothing (stream). What a micro-batch costs
with it is what Spark costs any Python sink: the JVM -> Python worker Arrow transfer, the
Python processes Spark starts on the driver to plan the writer and to commit, and the
job. It lives in a module of its own that imports only pyarrow, pyspark's data-source API
and ``benchmarks.trace_hooks`` (with ``spark_sink.hooks``, small), so those processes pay
for nothing of idemlog's writer.

It is traced like idemlog's writer (``benchmarks.trace_hooks``: ``plan_writer``,
``task``, ``commit``), so ``benchmarks.bench_microbatch`` sets the two breakdowns side by
side.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from benchmarks.trace_hooks import span


@dataclass
class DiscardCommitMessage(WriterCommitMessage):
    rows: int


def _count(iterator: Iterator[pa.RecordBatch]) -> DiscardCommitMessage:
    return DiscardCommitMessage(rows=sum(batch.num_rows for batch in iterator))


class DiscardBatchWriter(DataSourceArrowWriter):
    def __init__(self, expected_rows: int) -> None:
        self.expected_rows = expected_rows

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DiscardCommitMessage:
        return _count(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, DiscardCommitMessage))
        if self.expected_rows >= 0 and rows != self.expected_rows:
            raise RuntimeError(f"discard: the tasks saw {rows} rows, not {self.expected_rows}")


class DiscardStreamWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> DiscardCommitMessage:
        with span("task"):
            return _count(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        with span("commit", batch=batchId):
            pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class DiscardDataSource(DataSource):
    """``format("discard")``: counts the rows and drops them (option ``expected_rows``:
    the batch job fails unless its tasks saw exactly that many)."""

    @classmethod
    def name(cls) -> str:
        return "discard"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return DiscardBatchWriter(int(self.options.get("expected_rows", "-1")))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        with span("plan_writer"):
            return DiscardStreamWriter()
