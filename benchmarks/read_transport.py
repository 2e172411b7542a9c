"""What idemlog's read costs outside Spark: the fetch transport against local Arrow files.

    python -m benchmarks.read_transport [--rows 20000000] [--repeats 3]

A broker process (embedded mode) with bench-peers' rows in a topic of 4 partitions
(``broker_core.producer.Producer``, ``key="key"``, 40,000-row sends), and the same rows
as the Arrow IPC stream files of bench-peers' ``arrowpy``/``arrowjvm`` references
(``benchmarks.arrow_probe``). Then ``--repeats`` interleaved rounds, in this one process,
of every row read: ``idemlog`` -- each partition's stable range through
``spark_sink.reader.read_range`` (read_committed), as a read task runs it, without Spark;
``files`` -- the files' batches through ``pyarrow.ipc``. Per read: wall s, this
process's CPU s and the broker's (psutil). The difference is what a task of
``spark.read.format("idemlog")`` pays that the floor of a Python data source
(``arrowpy``) does not: the Flight stream's receive in the task and the broker's serving
(benchmarks/README.md, "Reads").
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa

from benchmarks.arrow_files_source import file_batches
from benchmarks.arrow_probe import FILES, write_arrow_files
from benchmarks.common import cpu_seconds, print_table
from benchmarks.data import iter_peers_batches
from broker_core.client.broker_client import BrokerClient
from broker_core.producer import Producer
from spark_sink.embedded import broker_pid, ensure_broker, stop_broker
from spark_sink.options import Scope, parse_options
from spark_sink.read_split import OffsetRangePartition
from spark_sink.reader import read_range

TOPIC = "rows"
SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.int32()), ("value", pa.string())])
SEND_ROWS = 40_000


def _fill(address: str, rows: int) -> dict[int, int]:
    """The rows written to :data:`TOPIC`; each partition's last stable offset after."""
    with BrokerClient(address) as client:
        client.create_topic(TOPIC, FILES, schema=SCHEMA)
    producer = Producer(address)
    try:
        for batch in iter_peers_batches(rows, SEND_ROWS):
            producer.send(TOPIC, pa.Table.from_batches([batch.cast(SCHEMA)]), key="key")
        producer.flush()
    finally:
        producer.close()
    with BrokerClient(address) as client:
        return {p: client.list_offsets(TOPIC, p)["last_stable_offset"] for p in range(FILES)}


def _idemlog(embedded: str, ends: dict[int, int]) -> Iterator[pa.RecordBatch]:
    options = parse_options({"path": embedded, "topic": TOPIC}, Scope.READ)
    for partition, end in ends.items():
        yield from read_range(options, TOPIC, SCHEMA, OffsetRangePartition(partition, 0, end))


def _files(directory: Path) -> Iterator[pa.RecordBatch]:
    for path in sorted(directory.glob("*.arrows")):
        yield from file_batches(str(path))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="read-transport-"))
    embedded = str(scratch / "embedded")
    runs: dict[str, list[tuple[float, float, float]]] = {"idemlog": [], "files": []}
    try:
        ends = _fill(ensure_broker(embedded), args.rows)
        write_arrow_files(scratch / "arrow", args.rows)
        broker = broker_pid(embedded)
        if broker is None:
            raise SystemExit(f"read-transport: no broker running for {embedded}")
        me = os.getpid()
        for round_ in range(args.repeats):
            for name in runs:
                source = (
                    _idemlog(embedded, ends) if name == "idemlog" else _files(scratch / "arrow")
                )
                own, served, start = cpu_seconds(me), cpu_seconds(broker), time.perf_counter()
                rows = sum(batch.num_rows for batch in source)
                run = (
                    time.perf_counter() - start,
                    cpu_seconds(me) - own,
                    cpu_seconds(broker) - served,
                )
                if rows != args.rows:
                    raise SystemExit(f"read-transport: {name} read {rows} rows, not {args.rows}")
                runs[name].append(run)
                print(
                    f"  round {round_ + 1} {name}: {run[0]:.2f} s, CPU s {run[1]:.2f} "
                    f"+ broker {run[2]:.2f}",
                    flush=True,
                )
    finally:
        stop_broker(embedded)
        shutil.rmtree(scratch, ignore_errors=True)
    medians = {n: [statistics.median(r[i] for r in rs) for i in range(3)] for n, rs in runs.items()}
    print_table(
        ["read", "wall s", "reader CPU s", "broker CPU s"],
        [[n, f"{m[0]:.2f}", f"{m[1]:.2f}", f"{m[2]:.2f}"] for n, m in medians.items()],
    )
    extra = medians["idemlog"][1] + medians["idemlog"][2] - medians["files"][1]
    print(f"read_transport_cpu_s_per_10m={extra * 1e7 / args.rows:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
