"""A compressed month of a stream: is the coordinator's state bounded by what is alive?

    python -m benchmarks.bench_soak [--batches 100000] [--jobs 10000] [--tasks 4]
                                    [--partitions 4] [--broker-config KEY=VALUE ...]
                                    [--profile DIR]

(``make bench-soak``.) One real broker process (embedded mode, the default of a Spark
job) and the sink protocol driven through the broker client exactly as Spark's tasks
and driver drive it (``spark_sink.writer`` / ``commit``), without Spark, so that a
month of micro-batches fits in an hour or a few:

- a **streaming sink** (one query id, one run) commits ``--batches`` micro-batches, each
  of ``--tasks`` tasks writing one small Arrow batch into each of ``--partitions``
  partitions: InitProducerId for its attempt, AddPartitions, the rows, prepare; then the
  driver's commit;
- every ``batches / jobs`` micro-batches, a **``df.write`` job** (sink id
  ``batch-<run id>``, as ``spark_sink.writer`` names a job's, batch 0, the same tasks):
  ``--jobs`` of them, each leaving ``--tasks`` transactional ids, a sink record and
  ``tasks x partitions`` producer states in the stream's topic behind, all to expire;
- at every tenth of the run the broker is **restarted** (SIGTERM and SIGKILL in turn),
  and the time from its start to its coordinator's first answer is the **load time**.

At each tenth it prints (one row, flushed as the tenth ends): ``__transaction_state``
bytes on disk after the stop, and the smallest and largest of 20 samples taken during
the tenth; the load time; the broker's RSS and, of it, the mapped files' pages (its
libraries and segment maps); with ``--profile`` the bytes ``tracemalloc`` traced (the
broker then runs under ``benchmarks.soak_profile``, several times slower, and dumps a
snapshot and object counts per type at each tenth's end and after each restart); the
commit p50/p95 of that tenth, the coordinator's count of transactional ids and the
producer states the stream's topic holds (over its partitions). The goal
(docs/design.md, the coordinator's state): flat -- every figure of the last three
tenths at most 1.2 x that of tenths 2-4 (the first pays warm-up). Expiry must be short
enough for the ids of finished jobs to expire during the run (the defaults below set it).

Last lines (``name=value``): ``soak_state_bytes_growth``, ``soak_state_max_growth``,
``soak_load_s_growth``, ``soak_rss_growth``, ``soak_commit_p50_growth`` (each the last
three tenths' mean over that of tenths 2-4; ``soak_<figure>_last_over_second``, one sample
each, for comparison), ``soak_transactional_ids_last``,
``soak_state_segment_mb`` (``transaction.state.log.segment.bytes``: the active segment
the cleaner never touches, what the state holds beyond its live and dirty records),
``soak_flat`` (1 when every growth is <= 1.2).
"""

from __future__ import annotations

import argparse
import json
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
from broker_core.protocol.txn_inputs import batch_job_sink_id
from broker_core.protocol.wire import SinkAttempt

REPO = Path(__file__).resolve().parents[1]
TOPIC = "soak"
STATE_TOPIC = "__transaction_state"
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("key", pa.int32())])
ROWS_PER_SEND = 8
GOAL_GROWTH = 1.2
# How long a --profile dump (a snapshot of every traced block) may take.
PROFILE_TIMEOUT_S = 600
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
    # The stream topic's producer.id.expiration.ms is 20 s: checked as often as the ids.
    "producer.id.expiration.check.interval.ms": "2000",
}


@dataclass
class Broker:
    """A broker process on ``directory``, restarted in place."""

    directory: Path
    config: dict[str, str]
    process: subprocess.Popen[str] | None = None
    address: str = ""
    # --profile: the broker runs under benchmarks.soak_profile, dumping here on request.
    profile_dir: Path | None = None

    def start(self) -> float:
        """Start it; returns the seconds until its coordinator answered."""
        lines = ["listener.port=0", f"log.dir={self.directory / 'data'}"]
        lines += [f"{k}={v}" for k, v in self.config.items()]
        (self.directory / "broker.properties").write_text("\n".join(lines) + "\n")
        command = [sys.executable, "-m", "broker_core.cli.main"]
        if self.profile_dir is not None:
            command = [sys.executable, "-m", "benchmarks.soak_profile", str(self.profile_dir)]
        command += ["broker", "start"]
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

    def dump(self, tag: str) -> dict[str, object]:
        """With --profile: the broker's tracemalloc snapshot and object counts, written
        to ``profile_dir/<tag>.snapshot`` and ``<tag>.json``; returns the latter."""
        assert self.profile_dir is not None
        (self.profile_dir / f"request-{tag}").touch()
        answer = self.profile_dir / f"{tag}.json"
        deadline = time.monotonic() + PROFILE_TIMEOUT_S
        while not answer.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"the broker wrote no profile {answer} in {PROFILE_TIMEOUT_S} s")
            time.sleep(0.1)
        info: dict[str, object] = json.loads(answer.read_text())
        return info

    def rss_mb(self) -> tuple[float, float]:
        """The broker's RSS and, of it, the pages of mapped files (its segments' maps and
        its libraries: Linux's RssFile + RssShmem), both in MiB."""
        assert self.process is not None
        memory = psutil.Process(self.process.pid).memory_info()
        return float(memory.rss) / 2**20, float(memory.shared) / 2**20


# The table's columns: name, width, format. "state MB" is __transaction_state on disk
# after the tenth's stop; "min"/"max" the smallest and largest of STATE_SAMPLES samples
# taken during the tenth. "file MB" is the part of the RSS that is mapped files.
COLUMNS = [
    ("tenth", 5, ""),
    ("batches", 8, ""),
    ("jobs", 6, ""),
    ("state MB", 8, ".2f"),
    ("min", 5, ".2f"),
    ("max", 5, ".2f"),
    ("load s", 6, ".2f"),
    ("RSS MB", 6, ".0f"),
    ("file MB", 7, ".0f"),
    ("traced MB", 9, ".1f"),
    ("commit p50 ms", 13, ".2f"),
    ("p95 ms", 6, ".2f"),
    ("txn ids", 7, ""),
    ("producers", 9, ""),
]
STATE_SAMPLES = 20


@dataclass
class Tenth:
    batches: int
    jobs: int
    state_bytes: int
    load_s: float
    rss_mb: float
    file_mb: float = float("nan")
    commit_ms: list[float] = field(default_factory=list)
    transactional_ids: int = 0
    # Producer states in the stream topic's partitions at the tenth's end (all partitions).
    producers: int = 0
    # With --profile: the bytes tracemalloc traced in the broker at the tenth's end.
    traced_mb: float = float("nan")
    # __transaction_state bytes on disk, sampled STATE_SAMPLES times during the tenth.
    state_samples: list[int] = field(default_factory=list)

    @property
    def state_min_mb(self) -> float:
        return min(self.state_samples, default=0) / 2**20

    @property
    def state_max_mb(self) -> float:
        return max(self.state_samples, default=0) / 2**20

    def row(self, number: int) -> str:
        values = {
            "tenth": number,
            "batches": self.batches,
            "jobs": self.jobs,
            "state MB": self.state_bytes / 2**20,
            "min": self.state_min_mb,
            "max": self.state_max_mb,
            "load s": self.load_s,
            "RSS MB": self.rss_mb,
            "file MB": self.file_mb,
            "traced MB": self.traced_mb,
            "commit p50 ms": self.p50,
            "p95 ms": self.p95,
            "txn ids": self.transactional_ids,
            "producers": self.producers,
        }
        return " ".join(f"{values[name]:>{width}{spec}}" for name, width, spec in COLUMNS)

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
        # One stream per task and partition: a stream names its transactional id.
        self._streams: dict[tuple[str, int], ProduceStream] = {}

    def close(self) -> None:
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()

    def _stream(self, tid: str, partition: int) -> ProduceStream:
        key = (tid, partition)
        if key not in self._streams:
            self._streams[key] = self._client.produce_stream(TOPIC, partition, transactional_id=tid)
        return self._streams[key]

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
                handle = self._stream(tid, p).send(
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


def last_over_second(tenths: Sequence[Tenth], figure: str) -> float:
    """The last tenth's figure over the second's: one sample each, so it moves with the
    cleaner's phase and the machine's noise (``growth`` averages three)."""
    second = float(getattr(tenths[1], figure))
    return float(getattr(tenths[-1], figure)) / second if second else float("inf")


def args_config(args: argparse.Namespace) -> dict[str, str]:
    """The broker's configuration: the defaults above, then ``--broker-config``."""
    config = dict(DEFAULT_BROKER_CONFIG)
    config.update(dict(kv.split("=", 1) for kv in args.broker_config))
    return config


def run(args: argparse.Namespace, directory: Path) -> list[Tenth]:
    config = args_config(args)
    broker = Broker(directory, config, profile_dir=args.profile)
    broker.start()
    try:
        with BrokerClient(broker.address) as admin:
            admin.create_topic(TOPIC, args.partitions, schema=SCHEMA, config=TOPIC_CONFIG)
        jobs_every = max(1, args.batches // max(1, args.jobs)) if args.jobs else 0
        per_tenth = max(1, args.batches // TENTHS)
        tenths: list[Tenth] = []
        batch = jobs = 0
        print(" ".join(f"{name:>{width}}" for name, width, _ in COLUMNS), flush=True)
        sample_every = max(1, per_tenth // STATE_SAMPLES)
        for tenth in range(TENTHS):
            client = BrokerClient(broker.address)
            driver = SinkDriver(client, args.tasks, args.partitions)
            current = Tenth(0, 0, 0, 0.0, 0.0)
            try:
                for _ in range(per_tenth):
                    current.commit_ms.append(driver.batch("soak-stream", "run-1", batch))
                    batch += 1
                    if batch % sample_every == 0:
                        current.state_samples.append(state_bytes(directory))
                    if jobs_every and batch % jobs_every == 0 and jobs < args.jobs:
                        # Named as spark_sink.writer names a df.write job, so the
                        # coordinator knows its record is a job's (it expires).
                        run_id = f"soak-job-{jobs}"
                        driver.batch(batch_job_sink_id(run_id), run_id, 0)
                        jobs += 1
                metrics = client.metrics()
                current.transactional_ids = int(
                    (metrics.get("transactions") or {}).get("transactional_ids", -1)
                )
                current.producers = sum(
                    int(p["producers"]) for p in metrics["partitions"] if p["topic"] == TOPIC
                )
            finally:
                driver.close()
                client.close()
            current.batches, current.jobs = batch, jobs
            current.rss_mb, current.file_mb = broker.rss_mb()
            if broker.profile_dir is not None:
                info = broker.dump(f"tenth-{tenth + 1:02d}")
                current.traced_mb = float(info["traced_bytes"]) / 2**20  # type: ignore[arg-type]
            broker.stop(signal.SIGKILL if tenth % 2 else signal.SIGTERM)
            current.state_bytes = state_bytes(directory)
            current.load_s = broker.start()
            if broker.profile_dir is not None:
                broker.dump(f"loaded-{tenth + 1:02d}")
            tenths.append(current)
            print(current.row(tenth + 1), flush=True)
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
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="run the broker under tracemalloc (benchmarks.soak_profile) and dump a "
        "snapshot and object counts into DIR at each tenth's end and after each restart",
    )
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
        "soak_state_max_growth": growth(tenths, "state_max_mb"),
        "soak_load_s_growth": growth(tenths, "load_s"),
        "soak_rss_growth": growth(tenths, "rss_mb"),
        "soak_commit_p50_growth": growth(tenths, "p50"),
    }
    for name, value in figures.items():
        print(f"{name}={value:.2f}")
    # The issue's own measure, one sample each: the last tenth over the second.
    for name in ("state_bytes", "load_s", "rss_mb", "p50"):
        print(f"soak_{name}_last_over_second={last_over_second(tenths, name):.2f}")
    print(f"soak_transactional_ids_last={tenths[-1].transactional_ids}")
    segment = int(args_config(args)["transaction.state.log.segment.bytes"])
    # What the state may hold beyond its live records: the active segment, which the
    # cleaner never touches, and the dirty part below min.cleanable.dirty.ratio.
    print(f"soak_state_segment_mb={segment / 2**20:.2f}")
    print(f"soak_flat={int(all(v <= GOAL_GROWTH for v in figures.values()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
