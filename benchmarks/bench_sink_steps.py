"""A micro-batch's sink steps without Spark: what idemlog itself costs per micro-batch.

    python -m benchmarks.bench_sink_steps [--batches 60] [--rows 100000]

Runs, in this one process against the embedded broker, the three steps the sink makes
per streaming micro-batch, as Spark calls them in a reused Python process:
``streamWriter()`` (options, the topic check), one task's writer (``writer._write_task``:
the producer, InitProducerId, the rows keyed by ``key``, flush, prepare; the heartbeat
registration) and the driver's ``commit_batch``; ``--batches`` times, the first three
left out. It prints each step's p50 (ms), the broker requests per micro-batch by kind
(counted at ``BrokerClient._send``, plus the embedded broker's liveness pings), and the
cost of a task's heartbeat registration (enter and exit, µs). Without Spark the figures
are steady enough to see a change of a millisecond, which bench-microbatch's p50s (±10 ms
on this shared machine) cannot; bench-microbatch says what a micro-batch costs in Spark.
Last lines::

    sink_steps_plan_ms_p50, sink_steps_task_ms_p50, sink_steps_commit_ms_p50,
    sink_steps_requests_per_batch, heartbeat_register_us_p50
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from benchmarks.data import distinct_batches
from broker_core.client import broker_client
from broker_core.protocol.wire import SinkAttempt
from spark_sink import commit, embedded, writer
from spark_sink.datasource import IdemlogDataSource
from spark_sink.options import Scope, parse_options

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("key", IntegerType()),
        StructField("value", StringType()),
    ]
)
SKIPPED = 3  # the first micro-batches: the broker's start, first connections


def count_requests(counts: Counter[str]) -> Callable[[], None]:
    """Count every broker request by kind (and the embedded broker's pings) into
    ``counts``; the returned function undoes it."""
    send = broker_client.BrokerClient._send
    ping = embedded._ping

    def counting_send(self: broker_client.BrokerClient, address: str, request: Any) -> Any:
        counts[type(request).__name__] += 1
        return send(self, address, request)

    def counting_ping(client: broker_client.BrokerClient) -> bool:
        counts["(embedded liveness ping)"] += 1
        return ping(client)

    broker_client.BrokerClient._send = counting_send  # type: ignore[method-assign]
    embedded._ping = counting_ping

    def undo() -> None:
        broker_client.BrokerClient._send = send  # type: ignore[method-assign]
        embedded._ping = ping

    return undo


def heartbeat_register_us(options: Any, bootstrap: str, times: int = 2000) -> float:
    """p50 µs of entering and leaving a task's heartbeat registration (the code before
    spark_sink.heartbeat too: a thread and a client per task, ``writer._Heartbeat``)."""
    try:
        from spark_sink.heartbeat import HEARTBEATS

        def registration() -> Any:
            return HEARTBEATS.beating(options, bootstrap, "sink", "run")
    except ImportError:  # a checkout from before it, measured for comparison

        def registration() -> Any:
            old: Any = vars(writer)["_Heartbeat"]
            return old(options, bootstrap, "sink", "run")

    spent = []
    for _ in range(times):
        started = time.perf_counter()
        with registration():
            pass
        spent.append((time.perf_counter() - started) * 1e6)
    return statistics.median(spent[times // 10 :])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--rows", type=int, default=100_000, help="rows per micro-batch")
    args = parser.parse_args(argv)
    if args.batches <= SKIPPED or args.rows < 10_000:
        parser.error(f"--batches must be over {SKIPPED} and --rows at least 10000")
    directory = tempfile.mkdtemp(prefix="bench-sink-steps-")
    path = f"{directory}/embedded"
    source = IdemlogDataSource({"path": path, "topic": "steps", "key": "key"})
    rows = distinct_batches(args.rows // 10_000, 10_000, 40, seed=1)
    sink, run = str(uuid.uuid4()), uuid.uuid4().hex
    spent: dict[str, list[float]] = {"plan": [], "task": [], "commit": []}
    counts: Counter[str] = Counter()
    undo: Callable[[], None] | None = None
    try:
        for batch in range(args.batches):
            if batch == SKIPPED:
                undo = count_requests(counts)
            t0 = time.perf_counter()
            options, arrow, topic_id, hooks = source._write_side(SCHEMA)
            t1 = time.perf_counter()
            message = writer._write_task(
                options, arrow, SinkAttempt(sink, run, batch), iter(rows), 0, 0, topic_id, hooks
            )
            t2 = time.perf_counter()
            commit.commit_batch(options, None, run, batch, [message])
            t3 = time.perf_counter()
            if batch >= SKIPPED:
                spent["plan"].append((t1 - t0) * 1000)
                spent["task"].append((t2 - t1) * 1000)
                spent["commit"].append((t3 - t2) * 1000)
        if undo is not None:
            undo()
        measured = args.batches - SKIPPED
        print(f"bench-sink-steps: {measured} micro-batches of {args.rows} rows, embedded broker")
        print(f"{'step':<10}{'p50 ms':>8}{'min':>8}{'max':>8}")
        for step, values in spent.items():
            print(
                f"{step:<10}{statistics.median(values):>8.2f}{min(values):>8.2f}{max(values):>8.2f}"
            )
        print("broker requests per micro-batch:")
        for kind, n in sorted(counts.items()):
            print(f"  {kind:<32}{n / measured:>6.2f}")
        # Nothing is sent within a registration this short: any address does.
        beat_options = parse_options({"brokers": "127.0.0.1:9", "topic": "steps"}, Scope.WRITE)
        hb = heartbeat_register_us(beat_options, "127.0.0.1:9")
        print()
        for step, values in spent.items():
            print(f"sink_steps_{step}_ms_p50={statistics.median(values):.2f}")
        print(f"sink_steps_requests_per_batch={sum(counts.values()) / measured:.2f}")
        print(f"heartbeat_register_us_p50={hb:.1f}")
    finally:
        embedded.stop_broker(path)
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
