"""A compressed month of a stream: is the coordinator's state bounded by what is alive?

    python -m benchmarks.bench_soak [--batches 100000] [--jobs 10000] [--tasks 4]
                                    [--partitions 4] [--broker-config KEY=VALUE ...]

(``make bench-soak``.) One real broker process (embedded mode, the default of a Spark
job) and the sink protocol driven through the broker client exactly as Spark's tasks
and driver drive it (``spark_sink.writer`` / ``commit``), without Spark, so that a
month of micro-batches fits in an hour:

- a **streaming sink** (one query id, one run) commits ``--batches`` micro-batches, each
  of ``--tasks`` tasks writing one small Arrow batch into each of ``--partitions``
  partitions: InitProducerId for its attempt, AddPartitions, the rows, prepare; then the
  driver's commit;
- every ``batches / jobs`` micro-batches, a **``df.write`` job** (a new sink id of its
  own, batch 0, the same tasks): ``--jobs`` of them, each leaving ``--tasks``
  transactional ids and a sink record behind;
- at every tenth of the run the broker is **restarted** (SIGTERM and SIGKILL in turn),
  and the time from its start to its coordinator's first answer is the **load time**.

At each tenth it prints: ``__transaction_state`` bytes on disk, the coordinator's load
time, the broker's RSS, the commit p50/p95 of that tenth and the coordinator's count of
transactional ids. The goal (docs/design.md, the coordinator's state): flat — every
figure of the last three tenths at most 1.2 x that of tenths 2-4 (the first pays warm-up).
Expiry must be short enough for the ids of finished jobs to expire during the run
(``--broker-config transactional.id.expiration.ms=...``; the defaults below set it).

Last lines (``name=value``): ``soak_state_bytes_growth``, ``soak_load_s_growth``,
``soak_rss_growth``, ``soak_commit_p50_growth`` (each the last three tenths' mean over
that of tenths 2-4),
``soak_transactional_ids_last``, ``soak_flat`` (1 when every growth is <= 1.2).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pyarrow as pa

from broker_core.client.broker_client import BrokerClient
from broker_core.client.produce_stream import ProduceStream
from broker_core.errors import IdemlogError
from broker_core.protocol.wire import SinkAttempt

REPO = Path(__file__).resolve().parents[1]
TOPIC = "soak"
STATE_TOPIC = "__transaction_state"
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("key", pa.int32())])
ROWS_PER_SEND = 8
GOAL_GROWTH = 1.2
TENTHS = 10
# Short enough that finished jobs' ids expire several times over in a run of minutes.
# Every duration is compressed alike: 7 days of id expiry become 20 s, a day of tombstone
# retention 3 s, 100 MiB state segments 1 MiB.
# The stream's own topic is bounded as a month-long stream's would be, by retention, and
# its producers' state expires like the coordinator's ids: what the figures then show is
# what the broker keeps beyond that.
TOPIC_CONFIG: dict[str, object] = {
    "segment.bytes": 4 * 1024 * 1024,
    "max.message.bytes": 1024 * 1024,
    "retention.bytes": 16 * 1024 * 1024,
    "producer.id.expiration.ms": 20_000,
}
DEFAULT_BROKER_CONFIG = {
    "transactional.id.expiration.ms": "20000",
    "transaction.state.log.delete.retention.ms": "3000",
    "transaction.state.log.segment.bytes": str(1024 * 1024),
    "log.cleaner.backoff.ms": "1000",
    "transaction.remove.expired.transaction.cleanup.interval.ms": "2000",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
}


@dataclass
class Broker:
    """A broker process on ``directory``, restarted in place."""

    directory: Path
    config: dict[str, str]
    process: subprocess.Popen[str] | None = None
    address: str = ""

    def start(self) -> float:
        """Start it; returns the seconds until its coordinator answered."""
        lines = ["listener.port=0", f"log.dir={self.directory / 'data'}"]
        lines += [f"{k}={v}" for k, v in self.config.items()]
        (self.directory / "broker.properties").write_text("\n".join(lines) + "\n")
        command = [sys.executable, "-m", "broker_core.cli.main", "broker", "start"]
        command += ["--config", str(self.directory / "broker.properties")]
        began = time.perf_counter()
        log = open(self.directory / "broker.log", "a")  # noqa: SIM115 -- the child's stderr
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("LISTENING "):
            raise SystemExit(f"broker did not start; see {self.directory / 'broker.log'}")
        self.address = line.split()[1]
        with BrokerClient(self.address) as client:
            deadline = time.monotonic() + 300
            while True:  # the coordinator answers once it has loaded its state
                try:
                    client.init_producer_id("soak-probe")
                    break
                except IdemlogError as exc:
                    if not exc.retriable or time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
        return time.perf_counter() - began

    def stop(self, sig: int) -> None:
        if self.process is None:
            return
        self.process.send_signal(sig)
        self.process.wait(120)
        self.process = None

    def rss_mb(self) -> float:
        assert self.process is not None
        return float(psutil.Process(self.process.pid).memory_info().rss) / 2**20


@dataclass
class Tenth:
    batches: int
    jobs: int
    state_bytes: int
    load_s: float
    rss_mb: float
    commit_ms: list[float] = field(default_factory=list)
    transactional_ids: int = 0

    @property
    def p50(self) -> float:
        return statistics.median(self.commit_ms) if self.commit_ms else float("nan")

    @property
    def p95(self) -> float:
        if len(self.commit_ms) < 2:
            return self.p50
        return statistics.quantiles(self.commit_ms, n=20)[-1]


class SinkDriver:
    """The sink protocol as Spark's tasks and driver run it, over one client."""

    def __init__(self, client: BrokerClient, tasks: int, partitions: int) -> None:
        self._client = client
        self._tasks = tasks
        self._partitions = partitions
        self._next_id = 0
        self._streams: dict[int, ProduceStream] = {}

    def close(self) -> None:
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()

    def _stream(self, partition: int) -> ProduceStream:
        if partition not in self._streams:
            self._streams[partition] = self._client.produce_stream(TOPIC, partition)
        return self._streams[partition]

    def batch(self, sink: str, run: str, batch: int) -> float:
        """One batch of ``sink``: every task prepared, then the commit; returns the
        commit's milliseconds."""
        txns = []
        for task in range(self._tasks):
            tid = f"{sink}/{task}"
            pid, epoch, _ = self._client.init_sink_producer(
                tid, None, SinkAttempt(sink, run, batch)
            )
            parts = list(range(self._partitions))
            self._client.add_partitions_to_txn(tid, pid, epoch, [(TOPIC, p) for p in parts])
            ranges = []
            for p in parts:
                rows = pa.record_batch(
                    [
                        pa.array(range(self._next_id, self._next_id + ROWS_PER_SEND), pa.int64()),
                        pa.array([task] * ROWS_PER_SEND, pa.int32()),
                    ],
                    schema=SCHEMA,
                )
                self._next_id += ROWS_PER_SEND
                handle = self._stream(p).send(
                    rows, producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True
                )
                first, last = handle.offsets(60)
                ranges.append((TOPIC, p, first, last))
            self._client.prepare_sink_txn(tid, pid, epoch, batch, ranges)
            txns.append((tid, pid, epoch))
        began = time.perf_counter()
        if not self._client.commit_sink_batch(sink, batch, txns, run):
            raise SystemExit(f"sink {sink} batch {batch} was reported committed before")
        return (time.perf_counter() - began) * 1000


def state_bytes(directory: Path) -> int:
    return sum(
        f.stat().st_size
        for d in (directory / "data").glob(f"{STATE_TOPIC}*")
        for f in d.rglob("*")
        if f.is_file()
    )


def growth(tenths: Sequence[Tenth], figure: str) -> float:
    """The mean of the last three tenths over that of tenths 2-4 (the first pays the
    warm-up). Means of three, because one sample moves with where the active segment of
    __transaction_state happens to be (it fills up to transaction.state.log.segment.bytes
    before the cleaner may touch it) and with the machine's noise."""
    early = statistics.fmean(float(getattr(t, figure)) for t in tenths[1:4])
    late = statistics.fmean(float(getattr(t, figure)) for t in tenths[-3:])
    return late / early if early else float("inf")


def run(args: argparse.Namespace, directory: Path) -> list[Tenth]:
    config = dict(DEFAULT_BROKER_CONFIG)
    config.update(dict(kv.split("=", 1) for kv in args.broker_config))
    broker = Broker(directory, config)
    broker.start()
    try:
        with BrokerClient(broker.address) as admin:
            admin.create_topic(TOPIC, args.partitions, schema=SCHEMA, config=TOPIC_CONFIG)
        jobs_every = max(1, args.batches // max(1, args.jobs)) if args.jobs else 0
        per_tenth = max(1, args.batches // TENTHS)
        tenths: list[Tenth] = []
        batch = jobs = 0
        print(
            f"{'tenth':>5} {'batches':>8} {'jobs':>6} {'state MB':>9} {'load s':>7} "
            f"{'RSS MB':>7} {'commit p50 ms':>13} {'p95 ms':>7} {'txn ids':>8}",
            flush=True,
        )
        for tenth in range(TENTHS):
            client = BrokerClient(broker.address)
            driver = SinkDriver(client, args.tasks, args.partitions)
            current = Tenth(0, 0, 0, 0.0, 0.0)
            try:
                for _ in range(per_tenth):
                    current.commit_ms.append(driver.batch("soak-stream", "run-1", batch))
                    batch += 1
                    if jobs_every and batch % jobs_every == 0 and jobs < args.jobs:
                        driver.batch(f"soak-job-{jobs}", f"job-run-{jobs}", 0)
                        jobs += 1
                current.transactional_ids = int(
                    (client.metrics().get("transactions") or {}).get("transactional_ids", -1)
                )
            finally:
                driver.close()
                client.close()
            current.batches, current.jobs = batch, jobs
            current.rss_mb = broker.rss_mb()
            broker.stop(signal.SIGKILL if tenth % 2 else signal.SIGTERM)
            current.state_bytes = state_bytes(directory)
            current.load_s = broker.start()
            tenths.append(current)
            print(
                f"{tenth + 1:>5} {current.batches:>8} {current.jobs:>6} "
                f"{current.state_bytes / 2**20:>9.2f} {current.load_s:>7.2f} "
                f"{current.rss_mb:>7.0f} {current.p50:>13.2f} {current.p95:>7.2f} "
                f"{current.transactional_ids:>8}",
                flush=True,
            )
    finally:
        broker.stop(signal.SIGTERM)  # also when a step failed: never leave it running
    return tenths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=100_000, help="streaming micro-batches")
    parser.add_argument("--jobs", type=int, default=10_000, help="df.write jobs, spread evenly")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per batch")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the topic")
    parser.add_argument(
        "--broker-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker key (repeatable); defaults: "
        + ", ".join(f"{k}={v}" for k, v in DEFAULT_BROKER_CONFIG.items()),
    )
    parser.add_argument("--dir", type=Path, default=REPO, help="parent of the temporary dir")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    args = parser.parse_args(argv)
    if args.batches < 2 * TENTHS:
        parser.error(f"--batches must be at least {2 * TENTHS} (two per tenth)")
    bad = [kv for kv in args.broker_config if "=" not in kv]
    if bad:
        parser.error(f"--broker-config takes KEY=VALUE, not {bad[0]!r}")
    directory = Path(tempfile.mkdtemp(prefix="bench-soak-", dir=args.dir))
    try:
        tenths = run(args, directory)
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    figures = {
        "soak_state_bytes_growth": growth(tenths, "state_bytes"),
        "soak_load_s_growth": growth(tenths, "load_s"),
        "soak_rss_growth": growth(tenths, "rss_mb"),
        "soak_commit_p50_growth": growth(tenths, "p50"),
    }
    for name, value in figures.items():
        print(f"{name}={value:.2f}")
    print(f"soak_transactional_ids_last={tenths[-1].transactional_ids}")
    print(f"soak_flat={int(all(v <= GOAL_GROWTH for v in figures.values()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
