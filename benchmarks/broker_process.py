"""A benchmark's servers and producers: a broker process (``idemlog broker start``) or the
transport's ceiling (a bare Flight server that answers and discards), and idempotent
producers pipelining Arrow batches to them, each run measured in wall and CPU seconds.
``bench_broker`` (the broker and TLS parts) and the other benchmarks that need a broker
process start theirs here.

    python -m benchmarks.broker_process    # the discard server, as start_discard runs it
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight

from benchmarks.common import MB, cpu_seconds
from benchmarks.data import SCHEMA, distinct_batches
from broker_core.cli.broker_cmd import keep_large_buffers
from broker_core.client.broker_client import BrokerClient
from broker_core.client.produce_stream import ProduceHandle, ProduceStream
from broker_core.client.producer_tokens import ProducerTokenBook
from broker_core.protocol.wire import ProduceRequestMeta, ProduceResponse
from broker_core.security.tls import PLAINTEXT_MATERIAL, TlsMaterial, open_flight_client

REPO = Path(__file__).resolve().parents[1]
ROWS_PER_BATCH = 10_000
VALUE_BYTES = 84
DISTINCT_BATCHES = 8
IN_FLIGHT = 5
MAX_CONNECTIONS = 4
TOPIC = "bench"
GB = 1e9
DISCARD = "flight_discard"


def build_batches() -> list[pa.RecordBatch]:
    return distinct_batches(DISTINCT_BATCHES, ROWS_PER_BATCH, VALUE_BYTES, seed=11)


# -- the transport ceiling: a Flight server that answers and discards ---------------------
class DiscardServer(flight.FlightServerBase):  # type: ignore[misc]
    """Reads every batch of a produce stream and answers it like the broker, storing nothing."""

    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        offset = 0
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return
            meta = ProduceRequestMeta.decode(chunk.app_metadata)
            rows = chunk.data.num_rows
            response = ProduceResponse(meta.correlation_id, 0, offset, offset + rows - 1, 0, False)
            offset += rows
            writer.write(response.encode())


def serve_discard() -> int:
    keep_large_buffers()  # the broker's allocator setting: the same transport underneath
    server = DiscardServer("grpc://127.0.0.1:0")
    print(f"LISTENING 127.0.0.1:{server.port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    os._exit(0)  # open streams must not hold the process (see broker_core.cli.broker_cmd)


# -- server processes ----------------------------------------------------------------------
@dataclass
class Server:
    name: str
    process: subprocess.Popen[str]
    address: str
    tls: TlsMaterial = PLAINTEXT_MATERIAL  # what clients connect with

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def spawn(
    name: str, command: list[str], log_path: Path, env: dict[str, str] | None = None
) -> Server:
    """Start ``command`` (``env``: its environment, default this process's) and wait for
    its ``LISTENING host:port`` line."""
    log = open(log_path, "w")  # noqa: SIM115 -- the child's stderr for its lifetime
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        cwd=REPO,
        start_new_session=True,
        env=env,
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # blocks until the server printed its address
    if not line.startswith("LISTENING "):
        process.kill()
        raise SystemExit(f"{name} did not start; see {log_path}:\n{log_path.read_text()}")
    return Server(name, process, line.split()[1])


def start_broker(
    directory: Path, name: str = "broker", extra: str = "", env: dict[str, str] | None = None
) -> Server:
    """A broker process (``extra``: more properties lines, e.g. its TLS keys; ``env``:
    its environment, e.g. an ``OPENSSL_CONF`` of ``bench_tls --suites``)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "broker.properties"
    config.write_text(f"listener.port=0\nlog.dir={directory / 'data'}\n{extra}")
    command = [
        sys.executable,
        "-m",
        "broker_core.cli.main",
        "broker",
        "start",
        "--config",
        str(config),
    ]
    return spawn(name, command, directory / "broker.log", env)


def start_discard(directory: Path) -> Server:
    command = [sys.executable, "-m", "benchmarks.broker_process"]
    return spawn(DISCARD, command, directory / "discard.log")


# -- producers -----------------------------------------------------------------------------
def produce(
    connection: flight.FlightClient,
    partition: int,
    producer_id: int,
    batches: Sequence[pa.RecordBatch],
    count: int,
    errors: list[BaseException],
    tokens: ProducerTokenBook,
) -> None:
    try:
        # The tokens the admin client was issued with the producer ids (docs/security.md).
        stream = ProduceStream(connection, TOPIC, partition, SCHEMA, tokens=tokens)
        window: deque[ProduceHandle] = deque()
        for i in range(count):
            if len(window) == IN_FLIGHT:
                check(window.popleft().result(120))
            window.append(
                stream.send(
                    batches[i % len(batches)],
                    producer_id=producer_id,
                    producer_epoch=0,
                    base_sequence=i * ROWS_PER_BATCH,
                )
            )
        while window:
            check(window.popleft().result(120))
        stream.close()
    except BaseException as exc:
        errors.append(exc)


def check(response: ProduceResponse) -> None:
    if not response.ok:
        raise RuntimeError(f"batch failed: {response.error()}")


@dataclass(frozen=True)
class Run:
    mb: float  # sent and acknowledged
    seconds: float
    server_cpu: float  # seconds, the server process
    client_cpu: float  # seconds, this process

    @property
    def mbps(self) -> float:
        return self.mb / self.seconds

    def per_gb(self, cpu: float) -> float:
        return cpu / (self.mb * MB / GB)


def run_producers(
    server: Server, producers: int, batches: Sequence[pa.RecordBatch], total_mb: float
) -> Run:
    """One run of ``producers`` threads: what they sent, in what time, at what CPU."""
    batch_bytes = batches[0].nbytes
    per_producer = max(IN_FLIGHT, round(total_mb * MB / batch_bytes / producers))
    stores = server.name != DISCARD
    with BrokerClient(server.address, tls=server.tls) as admin:
        if stores:
            admin.create_topic(TOPIC, producers, schema=SCHEMA)
            pids = [admin.init_producer_id()[0] for _ in range(producers)]
        else:
            pids = list(range(producers))
    connections = [
        open_flight_client(server.address, server.tls)
        for _ in range(min(producers, MAX_CONNECTIONS))
    ]
    errors: list[BaseException] = []
    threads = [
        threading.Thread(
            target=produce,
            args=(
                connections[p % len(connections)],
                p,
                pids[p],
                batches,
                per_producer,
                errors,
                admin.producer_tokens,
            ),
        )
        for p in range(producers)
    ]
    server_start, client_start = cpu_seconds(server.process.pid), time.process_time()
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    client_cpu = time.process_time() - client_start
    server_cpu = cpu_seconds(server.process.pid) - server_start
    for c in connections:
        c.close()
    if errors:
        raise SystemExit(f"{server.name} with {producers} producers failed: {errors[0]!r}")
    if stores:
        with BrokerClient(server.address, tls=server.tls) as admin:
            ends = [admin.list_offsets(TOPIC, p)["log_end_offset"] for p in range(producers)]
            assert ends == [per_producer * ROWS_PER_BATCH] * producers, ends
            admin.delete_topic(TOPIC)  # frees the disk for the next run
    return Run(per_producer * producers * batch_bytes / MB, elapsed, server_cpu, client_cpu)


def init_rate(server: Server, seconds: float, transactional: bool) -> float:
    with BrokerClient(server.address, tls=server.tls) as client:
        calls = 0
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            client.init_producer_id(f"bench-{calls}" if transactional else None)
            calls += 1
    return calls / elapsed


# -- main ----------------------------------------------------------------------------------


if __name__ == "__main__":
    raise SystemExit(serve_discard())
