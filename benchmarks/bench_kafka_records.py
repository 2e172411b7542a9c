"""``make bench-kafka-records``: Kafka's record batch v2 (``broker_core.kafka``) encoded
from and decoded into Arrow columns, in records/s and CPU seconds.

``--rows`` Kafka-shaped rows (a 16-byte key, a ``--value-bytes`` value, a timestamp; no
headers, like most topics) cut into batches of ``--batch-rows`` (10,000 100-byte rows: a
1 MB batch, Kafka's default ``max.request.size``) are encoded, then the encoded batches
decoded, ``--repeats`` times each; the best run counts. The decoded rows are checked
against the input, so a run that is fast and wrong fails. Then the same rows as
``--request-batch-rows`` batches (150: a Java producer's 16 KiB default) joined into 1 MB
buffers, as Produce requests for many partitions carry them, decoded buffer by buffer;
and those small batches encoded about 1 MB per ``encode_batches`` call, as a Fetch
answer carries them (checked equal to the same batches encoded one by one).
Beside them, for scale, the same per-record work done by kafka-python's builder and
reader (pure Python, one record at a time) on ``--peer-rows`` rows: the cost the
column-wise code avoids. The ratios are
of records per CPU second, which a shared machine's other load disturbs less than wall
time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import pyarrow as pa

from benchmarks.common import print_table
from broker_core.kafka.record_batch import (
    BatchToEncode,
    decode_batches,
    encode_batch,
    encode_batches,
)

T = TypeVar("T")


def make_batches(rows: int, value_bytes: int, batch_rows: int) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(39)
    values = rng.integers(0, 256, rows * value_bytes, dtype=np.uint8)
    value_offsets = np.arange(rows + 1, dtype=np.int32) * value_bytes
    keys = rng.integers(0, 256, rows * 16, dtype=np.uint8)
    key_offsets = np.arange(rows + 1, dtype=np.int32) * 16
    table = pa.RecordBatch.from_arrays(
        [
            pa.Array.from_buffers(
                pa.binary(), rows, [None, pa.py_buffer(key_offsets), pa.py_buffer(keys)]
            ),
            pa.Array.from_buffers(
                pa.binary(), rows, [None, pa.py_buffer(value_offsets), pa.py_buffer(values)]
            ),
            pa.array(1_700_000_000_000 + np.arange(rows, dtype=np.int64), pa.timestamp("ms")),
        ],
        names=["key", "value", "timestamp"],
    )
    return [table.slice(start, batch_rows) for start in range(0, rows, batch_rows)]


def timed(work: Callable[[], T]) -> tuple[float, float, T]:
    """Wall and CPU seconds of ``work()`` in this process, and its result."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def encode_all(batches: Sequence[pa.RecordBatch]) -> list[bytes]:
    out = []
    offset = 0
    for batch in batches:
        out.append(encode_batch(batch, base_offset=offset, producer_id=1, producer_epoch=0))
        offset += batch.num_rows
    return out


def decode_all(encoded: Sequence[bytes]) -> list[pa.RecordBatch]:
    return [batch.rows for blob in encoded for batch in decode_batches(blob)]


def encode_together(batches: Sequence[pa.RecordBatch], per_call: int) -> list[bytes]:
    """``per_call`` batches per ``encode_batches`` call: a Fetch answer's records."""
    specs = []
    offset = 0
    for batch in batches:
        specs.append(BatchToEncode(batch, offset, producer_id=1, producer_epoch=0))
        offset += batch.num_rows
    return [encode_batches(specs[i : i + per_call]) for i in range(0, len(specs), per_call)]


def produce_requests(encoded: Sequence[bytes], size: int = 1_000_000) -> list[bytes]:
    """The batches joined into buffers of about ``size`` bytes: Produce requests' records
    (a request of many partitions' batches, Kafka's max.request.size 1 MB)."""
    requests: list[bytes] = []
    pending: list[bytes] = []
    pending_bytes = 0
    for blob in encoded:
        pending.append(blob)
        pending_bytes += len(blob)
        if pending_bytes >= size:
            requests.append(b"".join(pending))
            pending, pending_bytes = [], 0
    if pending:
        requests.append(b"".join(pending))
    return requests


def kafka_python_round_trip(
    batches: Sequence[pa.RecordBatch],
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Wall and CPU seconds for kafka-python to build, then to read, the same rows."""
    # kafka-python ships no type information
    from kafka.record.default_records import (  # type: ignore[import-untyped]
        DefaultRecordBatch,
        DefaultRecordBatchBuilder,
    )

    columns = [b.to_pydict() for b in batches]

    def build() -> list[bytes]:
        built = []
        for column in columns:
            builder = DefaultRecordBatchBuilder(2, 0, False, 1, 0, 0, batch_size=1 << 30)
            timestamps = [int(t.timestamp() * 1000) for t in column["timestamp"]]
            for i, (key, value) in enumerate(zip(column["key"], column["value"], strict=True)):
                builder.append(i, timestamps[i], key, value, [])
            built.append(bytes(builder.build()))
        return built

    build_wall, build_cpu, built = timed(build)

    def read() -> int:
        return sum(len(list(DefaultRecordBatch(blob))) for blob in built)

    read_wall, read_cpu, count = timed(read)
    assert count == sum(b.num_rows for b in batches)
    return (build_wall, build_cpu), (read_wall, read_cpu)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each (the best counts)")
    parser.add_argument("--peer-rows", type=int, default=100_000, help="rows for kafka-python")
    parser.add_argument(
        "--request-batch-rows",
        type=int,
        default=150,
        help="rows per batch of the Produce-shaped decode (16 KiB: a Java producer's batch)",
    )
    args = parser.parse_args(argv)

    batches = make_batches(args.rows, args.value_bytes, args.batch_rows)
    encodes = [timed(lambda: encode_all(batches)) for _ in range(args.repeats)]
    encoded = encodes[0][2]
    decodes = [timed(lambda: decode_all(encoded)) for _ in range(args.repeats)]
    decoded = decodes[0][2]
    for original, back in zip(batches, decoded, strict=True):
        if not (
            back.column("key").equals(original.column("key"))
            and back.column("value").equals(original.column("value"))
            and back.column("timestamp").equals(original.column("timestamp"))
        ):
            print("decoded rows differ from the encoded ones")
            return 1
    small = make_batches(args.rows, args.value_bytes, args.request_batch_rows)
    per_call = max(1, 1_000_000 // (args.request_batch_rows * (args.value_bytes + 27)))
    fetch_encodes = [timed(lambda: encode_together(small, per_call)) for _ in range(args.repeats)]
    fetch_wall, fetch_cpu, answers = min(fetch_encodes, key=lambda r: r[0])
    requests = produce_requests(encode_all(small))
    if b"".join(answers) != b"".join(requests):
        print("batches encoded together differ from the same batches encoded alone")
        return 1
    request_decodes = [timed(lambda: decode_all(requests)) for _ in range(args.repeats)]
    if sum(b.num_rows for b in request_decodes[0][2]) != args.rows:
        print("the Produce-shaped buffers decoded to another row count")
        return 1
    request_wall, request_cpu, _ = min(request_decodes, key=lambda r: r[0])
    encode_wall, encode_cpu, _ = min(encodes, key=lambda r: r[0])
    decode_wall, decode_cpu, _ = min(decodes, key=lambda r: r[0])
    peer_batches = make_batches(min(args.peer_rows, args.rows), args.value_bytes, args.batch_rows)
    peer_rows = sum(b.num_rows for b in peer_batches)
    (peer_build_s, peer_build_cpu), (peer_read_s, peer_read_cpu) = kafka_python_round_trip(
        peer_batches
    )
    mb = sum(len(blob) for blob in encoded) / 1e6

    print(
        f"{args.rows:,} rows, {args.value_bytes}-byte values, batches of {args.batch_rows:,} "
        f"rows ({mb:.0f} MB encoded); best of {args.repeats}"
    )
    print_table(
        ["", "records/s", "records/CPU s", "MB/s", "wall s", "CPU s"],
        [
            [
                "idemlog encode",
                f"{args.rows / encode_wall:,.0f}",
                f"{args.rows / encode_cpu:,.0f}",
                f"{mb / encode_wall:,.0f}",
                f"{encode_wall:.3f}",
                f"{encode_cpu:.3f}",
            ],
            [
                "idemlog decode",
                f"{args.rows / decode_wall:,.0f}",
                f"{args.rows / decode_cpu:,.0f}",
                f"{mb / decode_wall:,.0f}",
                f"{decode_wall:.3f}",
                f"{decode_cpu:.3f}",
            ],
            [
                f"idemlog encode, {args.request_batch_rows}-row batches, ~1 MB per call",
                f"{args.rows / fetch_wall:,.0f}",
                f"{args.rows / fetch_cpu:,.0f}",
                f"{mb / fetch_wall:,.0f}",
                f"{fetch_wall:.3f}",
                f"{fetch_cpu:.3f}",
            ],
            [
                f"idemlog decode, {args.request_batch_rows}-row batches in 1 MB buffers",
                f"{args.rows / request_wall:,.0f}",
                f"{args.rows / request_cpu:,.0f}",
                f"{mb / request_wall:,.0f}",
                f"{request_wall:.3f}",
                f"{request_cpu:.3f}",
            ],
            [
                f"kafka-python build ({peer_rows:,} rows)",
                f"{peer_rows / peer_build_s:,.0f}",
                f"{peer_rows / peer_build_cpu:,.0f}",
                "",
                f"{peer_build_s:.3f}",
                f"{peer_build_cpu:.3f}",
            ],
            [
                f"kafka-python read ({peer_rows:,} rows)",
                f"{peer_rows / peer_read_s:,.0f}",
                f"{peer_rows / peer_read_cpu:,.0f}",
                "",
                f"{peer_read_s:.3f}",
                f"{peer_read_cpu:.3f}",
            ],
        ],
    )
    print(f"kafka_encode_records_per_s={args.rows / encode_wall:.0f}")
    print(f"kafka_decode_records_per_s={args.rows / decode_wall:.0f}")
    print(f"kafka_encode_fetch_records_per_s={args.rows / fetch_wall:.0f}")
    print(f"kafka_decode_requests_records_per_s={args.rows / request_wall:.0f}")
    print(f"kafka_encode_cpu_s={encode_cpu:.3f}")
    print(f"kafka_decode_cpu_s={decode_cpu:.3f}")
    encode_ratio = (args.rows / encode_cpu) / (peer_rows / peer_build_cpu)
    decode_ratio = (args.rows / decode_cpu) / (peer_rows / peer_read_cpu)
    print(f"kafka_encode_vs_kafka_python_ratio={encode_ratio:.1f}")
    print(f"kafka_decode_vs_kafka_python_ratio={decode_ratio:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
