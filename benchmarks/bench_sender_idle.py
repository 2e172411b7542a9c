"""CPU time of an idle producer's sender while one batch waits for its answer, and the
round trip of one small send at a time to a real broker.

    python -m benchmarks.bench_sender_idle [--seconds 5] [--repeat 3] [--sends 300]

A ``Sender`` thread over a transport that never answers (no broker: only the sender's own
waiting is measured) sends one batch, then the process's CPU time is taken over
``--seconds`` of waiting for the answer. Before the sender was woken by answers it polled
every 2 ms while a batch was in flight; woken, it steps only at its ``IDLE_S`` bound (timeouts).
Output: a table of runs, then ``sender_idle_cpu_ms_per_s=<median>`` and
``sender_idle_steps_per_s=<median>``.

Then (``--sends`` > 0) a broker process (embedded mode) and a ``Producer`` with
``linger.ms=0`` sending one 10-row batch at a time, each waited for before the next:
``send_roundtrip_p50_ms`` / ``_p95_ms`` from ``send()`` to its future's result. A polling
sender adds up to its poll period to each; a woken one adds nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa

from benchmarks.broker_process import start_broker
from broker_core.client.broker_client import BrokerClient
from broker_core.errors import IdemlogError
from broker_core.producer import Producer
from broker_core.producer.config import ProducerConfig
from broker_core.producer.futures import SendCollector
from broker_core.producer.message_accumulator import MessageAccumulator
from broker_core.producer.metrics import ProducerMetrics
from broker_core.producer.producer_batch import TopicPartition
from broker_core.producer.sender import Sender
from broker_core.producer.transaction_manager import TransactionManager
from broker_core.protocol.wire import ProduceResponse

TP = TopicPartition("idle", 0)


class _Unanswered:
    """A send handle whose answer never comes."""

    def done(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> ProduceResponse:
        raise TimeoutError("never answered")

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        pass  # never called: there is no answer


class _Silent:
    """A transport that takes every batch and never answers it."""

    def __init__(self) -> None:
        self.sent = threading.Event()

    def partitions_for(self, topic: str) -> int:
        return 1

    def send(self, tp: TopicPartition, batch: pa.RecordBatch, **_kwargs: object) -> _Unanswered:
        self.sent.set()
        return _Unanswered()

    def reset(self, tp: TopicPartition, error: IdemlogError) -> None:
        pass

    def init_producer_id(self, *_args: object) -> tuple[int, int]:
        return 1, 0

    def close(self) -> None:
        pass


class _Counted(Sender):
    steps = 0

    def run_once(self) -> float:
        self.steps += 1
        return super().run_once()


def measure(seconds: float) -> tuple[float, float]:
    """(CPU ms per second, sender steps per second) with one batch in flight."""
    # request.timeout.ms above the window: no timeout reset while measuring.
    config = ProducerConfig(linger_ms=0, request_timeout_ms=int(seconds * 1000) + 60_000)
    accumulator = MessageAccumulator.from_config(config)
    txn = TransactionManager(None)
    txn.set_producer_id(1, 0)
    transport = _Silent()
    sender = _Counted(accumulator, txn, transport, config, ProducerMetrics())  # type: ignore[arg-type]
    sender.start()
    try:
        collector = SendCollector("idle")
        accumulator.append(TP, pa.record_batch({"id": pa.array([1, 2, 3], pa.int64())}), collector)
        collector.seal()
        if not transport.sent.wait(10):
            raise RuntimeError("the sender never sent the batch")
        steps, cpu, wall = sender.steps, time.process_time(), time.monotonic()
        threading.Event().wait(seconds)  # the window measured: nothing happens in it
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        return cpu * 1000 / wall, (sender.steps - steps) / wall
    finally:
        sender.stop()


def roundtrips(sends: int) -> list[float]:
    """Milliseconds from ``send()`` to the result, one 10-row batch at a time."""
    with tempfile.TemporaryDirectory(prefix="bench-sender-") as tmp:
        server = start_broker(Path(tmp) / "broker")
        try:
            with BrokerClient(server.address) as admin:
                admin.create_topic("roundtrip", 1)
            batch = pa.table({"id": pa.array(range(10), pa.int64())})
            times = []
            with Producer(server.address, config=ProducerConfig(linger_ms=0)) as producer:
                for i in range(sends + 20):
                    start = time.perf_counter()
                    producer.send("roundtrip", batch).result(30)
                    if i >= 20:  # the first ones warm the connection and the stream
                        times.append((time.perf_counter() - start) * 1000)
            return times
        finally:
            server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=5.0, help="the window per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs (the median counts)")
    parser.add_argument("--sends", type=int, default=300, help="round trips measured (0: none)")
    args = parser.parse_args(argv)
    runs = [measure(args.seconds) for _ in range(args.repeat)]
    print(f"{'run':>4} {'cpu ms/s':>10} {'steps/s':>10}")
    for i, (cpu, steps) in enumerate(runs, 1):
        print(f"{i:>4} {cpu:>10.2f} {steps:>10.1f}")
    print(f"sender_idle_cpu_ms_per_s={statistics.median(r[0] for r in runs):.2f}")
    print(f"sender_idle_steps_per_s={statistics.median(r[1] for r in runs):.1f}")
    if args.sends > 0:
        times = sorted(roundtrips(args.sends))
        print(f"send_roundtrip_p50_ms={statistics.median(times):.2f}")
        print(f"send_roundtrip_p95_ms={times[int(len(times) * 0.95) - 1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
