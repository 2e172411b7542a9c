"""``format("arrowfiles")``: the floor of any Python data-source reader.

A folder of Arrow IPC stream files (``*.arrows``), one Spark task per file, whose batches
the task yields as they are read: no network, no broker, no filtering. What a read costs
with it is what Spark costs any Python data source's batch read (a Python worker per task,
the Arrow hand-over from the worker to the JVM, the JVM turning the batches into rows), so
bench-peers' read part (``benchmarks.arrow_probe``) sets it beside idemlog's reader,
Delta's and a JVM-side columnar scan of the same files (``benchmarks/jvm/ArrowScan.java``).
Like ``benchmarks.discard_sink`` it imports only pyarrow and pyspark's data-source API.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

SCHEMA = "id bigint, key int, value string"


def file_batches(path: str) -> Iterator[pa.RecordBatch]:
    """The record batches of one Arrow IPC stream file, as they are read."""
    with pa.OSFile(path) as source, pa.ipc.open_stream(source) as reader:
        yield from reader


@dataclass
class FilePartition(InputPartition):
    file: str


class ArrowFilesReader(DataSourceReader):
    def __init__(self, path: str) -> None:
        self.path = path

    def partitions(self) -> Sequence[InputPartition]:
        files = sorted(str(f) for f in Path(self.path).glob("*.arrows"))
        if not files:
            raise ValueError(f"arrowfiles: no *.arrows file under path={self.path!r}")
        return [FilePartition(f) for f in files]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilePartition)
        yield from file_batches(partition.file)


class ArrowFilesDataSource(DataSource):
    """``format("arrowfiles")`` with the option ``path``: bench-peers' rows
    (``id bigint, key int, value string``) from the Arrow IPC stream files under it."""

    @classmethod
    def name(cls) -> str:
        return "arrowfiles"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        path = self.options.get("path")
        if not path:
            raise ValueError("arrowfiles: the option path (a folder of *.arrows) is required")
        return ArrowFilesReader(path)
