"""``make bench-metrics``: what one default metrics document costs with 10 idempotent
producers and with many (issue 26: 280 B and 29 us per producer when it listed them all).

Two broker processes, one kept at 10 producers; on the other, producers are made for
real (InitProducerId, then one batch each through a pipelined produce stream; the first
10 and a tenth of the others answered a duplicate too, so the top 10 is full on both)
until ``--producers`` exist or ``--create-seconds`` have passed, whichever comes first
(the table says how many). Then the default document (aggregates and the top 10
producers, ``idemlog metrics``) is fetched ``--repeat`` times from each broker in turn,
so the machine's load falls on both alike: its bytes as JSON and the median time of the
call. ``default_doc_size_ratio`` and ``default_doc_time_ratio`` are the large count's
over the small one's (goal: about 1). The per-producer detail (every page, ``idemlog
metrics --producers``) is timed once at the large count, for scale.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from benchmarks.broker_process import Server, start_broker
from benchmarks.common import cpu_seconds
from broker_core.client.broker_client import BrokerClient
from broker_core.client.produce_stream import ProduceHandle

TOPIC = "bench-metrics"
PARTITIONS = 4
SMALL = 10
WINDOW = 256  # batches in flight on one stream
TICK_MS = 10.0  # /proc's CPU time granularity: no ratio over less than one tick
BATCH = pa.RecordBatch.from_pydict({"id": pa.array([1], pa.int64())})


def add_producers(client: BrokerClient, count: int, deadline: float, every: int) -> int:
    """``count`` more idempotent producers with one batch each (every ``every``-th answered
    a duplicate too), stopping early at ``deadline``; how many were made."""
    made = 0
    streams = [client.produce_stream(TOPIC, p) for p in range(PARTITIONS)]
    window: deque[ProduceHandle] = deque()
    try:
        while made < count and time.monotonic() < deadline:
            pid, epoch = client.init_producer_id()
            stream = streams[made % PARTITIONS]
            sends = 2 if made % every == 0 else 1  # the second: a duplicate, answered as one
            for _ in range(sends):
                window.append(
                    stream.send(BATCH, producer_id=pid, producer_epoch=epoch, base_sequence=0)
                )
            while len(window) > WINDOW:
                check(window.popleft())
            made += 1
        while window:
            check(window.popleft())
    finally:
        for stream in streams:
            stream.close()
    return made


def check(handle: ProduceHandle) -> None:
    error = handle.result(120).error()
    if error is not None:
        raise error


def fetch_ms(client: BrokerClient) -> tuple[float, dict[str, object]]:
    """One default document from the client's broker: the ms it took, and the document."""
    start = time.perf_counter()
    (doc,) = client.metrics_per_broker()
    return (time.perf_counter() - start) * 1000, doc


Figures = tuple[int, float, float, int]  # doc bytes, median ms, broker CPU ms, producers


def measure(
    servers: Sequence[Server], clients: Sequence[BrokerClient], repeat: int
) -> list[Figures]:
    """Per broker: the default document's JSON bytes, the median ms of fetching it, the
    broker's CPU ms per fetch (less sensitive to the machine's load than wall time; the
    brokers do nothing else meanwhile), its producers. The brokers are asked in turn, so
    the load falls on each alike."""
    times: list[list[float]] = [[] for _ in clients]
    docs: list[dict[str, object]] = [{} for _ in clients]
    cpu_before = [cpu_seconds(s.process.pid) for s in servers]
    for _ in range(repeat):
        for i, client in enumerate(clients):
            ms, docs[i] = fetch_ms(client)
            times[i].append(ms)
    cpu = [cpu_seconds(s.process.pid) - b for s, b in zip(servers, cpu_before, strict=True)]
    result = []
    for doc, ms_list, cpu_s in zip(docs, times, cpu, strict=True):
        tracked = doc["producers_tracked"]
        assert isinstance(tracked, int)
        size = len(json.dumps(doc, separators=(",", ":")).encode())
        result.append((size, statistics.median(ms_list), cpu_s * 1000 / repeat, tracked))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producers", type=int, default=300_000, help="the large count")
    parser.add_argument(
        "--create-seconds", type=float, default=120.0, help="most time to make producers"
    )
    parser.add_argument("--repeat", type=int, default=201, help="document fetches per broker")
    parser.add_argument("--dir", default=None, help="where the brokers' directories go")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix=".bench-metrics-", dir=args.dir))
    servers: list[Server] = []
    try:
        servers.append(start_broker(workdir / "small", "small"))
        servers.append(start_broker(workdir / "large", "large"))
        with BrokerClient(servers[0].address) as few, BrokerClient(servers[1].address) as many:
            for client in (few, many):
                client.create_topic(TOPIC, PARTITIONS)
                add_producers(client, SMALL, float("inf"), 1)  # a full top 10 on both
            started = time.monotonic()
            more = add_producers(many, args.producers - SMALL, started + args.create_seconds, 10)
            create_s = time.monotonic() - started
            small, large = measure(servers, [few, many], args.repeat)
            start = time.perf_counter()
            detail = many.producer_metrics(page_size=1000)
            detail_s = time.perf_counter() - start
        detail_bytes = len(json.dumps(detail, separators=(",", ":")).encode())
        print()
        print(
            f"default metrics document (aggregates + top 10 producers): two brokers, one "
            f"with {SMALL} producers, one with {SMALL + more} (made in {create_s:.0f} s, "
            f"{more / create_s:.0f}/s); {args.repeat} fetches each, in turn (median)"
        )
        print(f"{'producers':>9}  {'doc bytes':>9}  {'doc ms':>7}  {'broker CPU ms':>13}")
        for size, ms, cpu_ms, tracked in (small, large):
            print(f"{tracked:>9}  {size:>9}  {ms:>7.2f}  {cpu_ms:>13.2f}")
        print(
            f"{'ratio':>9}  {large[0] / small[0]:>9.2f}  {large[1] / small[1]:>7.2f}  "
            f"{large[2] / max(small[2], TICK_MS / args.repeat):>13.2f}"
        )
        print(
            f"every producer, paged by 1000 (--producers): {len(detail)} rows, "
            f"{detail_bytes / 1e6:.1f} MB, {detail_s:.2f} s"
        )
        print()
        print(f"producers_small={small[3]}")
        print(f"producers_large={large[3]}")
        print(f"default_doc_bytes_small={small[0]}")
        print(f"default_doc_bytes_large={large[0]}")
        print(f"default_doc_ms_small={small[1]:.2f}")
        print(f"default_doc_ms_large={large[1]:.2f}")
        print(f"default_doc_size_ratio={large[0] / small[0]:.2f}")
        print(f"default_doc_time_ratio={large[1] / small[1]:.2f}")
        print(f"default_doc_broker_cpu_ms_small={small[2]:.2f}")
        print(f"default_doc_broker_cpu_ms_large={large[2]:.2f}")
        print(f"default_doc_broker_cpu_ratio={large[2] / max(small[2], TICK_MS / args.repeat):.2f}")
        print(f"detail_s={detail_s:.2f}")
        print(f"detail_rows={len(detail)}")
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
