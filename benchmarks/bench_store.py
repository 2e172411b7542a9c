"""Log-store append throughput against raw file writes, validator cost, crash recovery.

    python -m benchmarks.bench_store [--gb 2.0] [--fsync os|batch|ms:N|messages:N]
                                     [--repeat 2] [--dir DIR]

What it measures (MB = 10^6 bytes, GB = 10^9 bytes):

- store: ``PartitionLog.append`` of pre-built Arrow batches (10k rows x ~100 B: id int64,
  key int32, an 84-byte string) to one partition as an idempotent producer (one producer
  id, epoch 0, increasing sequences), default segment.bytes (1 GiB, so 2 GB rolls once and
  takes a snapshot). It runs in a child process, which is SIGKILLed at the end without
  close(); the parent then times ``LogStore(...)`` + ``partition()``: crash recovery.
- raw: the same encoded batches (``encode_data(...).to_buffer()``, the bytes the store writes) with
  ``os.write`` to one plain file, fsynced by the same policy.
- validator: ``ProducerStateManager.check_append`` + ``on_data_batch`` over the same
  batch headers in a tight loop, without any I/O.

Beside the wall-clock MB/s, each run's CPU time (user + system, all threads of the process
that does the work: ``time.process_time()`` around the loop, so the store's background
checksum and fsync threads count) per GB written is printed: CPU s/GB, lower is better.
For the recovery runs it is the appending child's CPU, which the child reports before it
is killed. The kernel's own writeback threads count for neither side.

Runs alternate raw, store, raw, ... (``--repeat`` store runs, one more raw run) and the best
of each counts (highest MB/s, lowest CPU s/GB); the spread between runs is printed. The
data lives in a temporary directory on the same disk as the repository and is deleted at
the end.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from broker_core.config import LONG_MAX
from broker_core.fileutil import write_all
from broker_core.log.config import LogConfig
from broker_core.log.partition_log import PartitionLog
from broker_core.log.producer_state import AppendOrigin, ProducerStateManager, producer_fields
from broker_core.log.snapshot import list_snapshots
from broker_core.log.store import LogStore
from broker_core.record.batch import decode_header, encode_data, ipc_stream_size

REPO = Path(__file__).resolve().parents[1]
ROWS_PER_BATCH = 10_000
VALUE_BYTES = 84  # + 8 (id) + 4 (key) + 4 (string offset) = 100 bytes a row
DISTINCT_VALUES = 8  # value columns cycled over the batches (ids differ in every batch)
PRODUCER_ID = 1
TOPIC = "bench"
MB = 1e6
GB = 1e9
TARGET_RATIO = 0.8
TARGET_VALIDATOR_US = 20.0
TARGET_RECOVERY_S_PER_GB = 1.0
SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.int32()), ("value", pa.string())])


@dataclass(frozen=True)
class FsyncPolicy:
    """When to fsync: the store's flush.messages / flush.ms, mirrored for the raw file."""

    name: str
    messages: int = LONG_MAX
    ms: int = LONG_MAX

    @classmethod
    def parse(cls, text: str) -> FsyncPolicy:
        kind, _, value = text.partition(":")
        try:
            if kind == "os" and not value:
                return cls(text)
            if kind == "batch" and not value:
                return cls(text, messages=1)
            if kind == "messages":
                return cls(text, messages=int(value))
            if kind == "ms":
                return cls(text, ms=int(value))
        except ValueError:
            pass
        raise argparse.ArgumentTypeError(
            f"--fsync {text!r}: expected os (the store default), batch, messages:N or ms:N"
        )

    def store_config(self) -> dict[str, object]:
        return {"flush.messages": self.messages, "flush.ms": self.ms}


def build_batches(gb: float) -> list[pa.RecordBatch]:
    """Enough 10k-row batches for ``gb``; ids run on across batches."""
    count = max(1, round(gb * GB / (ROWS_PER_BATCH * 100)))
    rng = np.random.default_rng(7)
    offsets = pa.py_buffer(
        np.arange(0, (ROWS_PER_BATCH + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32)
    )
    values = [
        pa.StringArray.from_buffers(
            ROWS_PER_BATCH,
            offsets,
            pa.py_buffer(rng.integers(97, 123, ROWS_PER_BATCH * VALUE_BYTES, dtype=np.uint8)),
        )
        for _ in range(DISTINCT_VALUES)
    ]
    batches = []
    for i in range(count):
        ids = np.arange(i * ROWS_PER_BATCH, (i + 1) * ROWS_PER_BATCH, dtype=np.int64)
        keys = (ids % 1009).astype(np.int32)
        batches.append(
            pa.RecordBatch.from_arrays(
                [pa.array(ids), pa.array(keys), values[i % DISTINCT_VALUES]], schema=SCHEMA
            )
        )
    return batches


def encode_all(batches: Sequence[pa.RecordBatch]) -> list[pa.Buffer]:
    """The batches as the store lays them out (same header fields but the timestamps)."""
    encoded = []
    offset = 0
    for seq, batch in enumerate(batches):
        encoded.append(
            encode_data(
                batch,
                base_offset=offset,
                producer_id=PRODUCER_ID,
                producer_epoch=0,
                base_sequence=seq * ROWS_PER_BATCH,
            ).to_buffer()
        )
        offset += batch.num_rows
    return encoded


# -- raw file ----------------------------------------------------------------------------
def raw_run(
    directory: Path,
    encoded: Sequence[pa.Buffer],
    policy: FsyncPolicy,
    segment_bytes: int | None,
) -> tuple[int, float, float]:
    """(bytes, seconds, CPU seconds) of writing ``encoded`` to fresh files, fsynced by ``policy``.

    With ``segment_bytes`` it also does what the store's roll does to the disk: start a
    new file when the next batch would pass segment.bytes and fsync the full one from a
    background thread. None: one file, fsynced by the policy alone.
    """
    files: list[Path] = []
    fds: list[int] = []
    flushers: list[threading.Thread] = []

    def next_file() -> int:
        files.append(directory / f"raw-{len(files)}.bin")
        fds.append(os.open(files[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        return fds[-1]

    written = size = unflushed = 0
    try:
        fd = next_file()
        cpu_start = time.process_time()
        start = last_flush = time.perf_counter()
        for buf in encoded:
            if segment_bytes is not None and size and size + buf.size > segment_bytes:
                flusher = threading.Thread(target=os.fsync, args=(fd,), daemon=True)
                flusher.start()
                flushers.append(flusher)
                fd, size = next_file(), 0
            write_all(fd, memoryview(buf))
            size += buf.size
            written += buf.size
            unflushed += 1
            now = time.perf_counter()
            if unflushed >= policy.messages or (now - last_flush) * 1000 >= policy.ms:
                os.fsync(fd)
                unflushed, last_flush = 0, time.perf_counter()
        elapsed = time.perf_counter() - start
    finally:
        for flusher in flushers:
            flusher.join()
        cpu = time.process_time() - cpu_start
        for fd in fds:
            os.close(fd)
        for path in files:
            path.unlink()
    return written, elapsed, cpu


# -- store (in process, for throughput) --------------------------------------------------
def append_all(
    store: LogStore, batches: Sequence[pa.RecordBatch]
) -> tuple[PartitionLog, float, float]:
    """Create the topic and append every batch as one idempotent producer.

    Returns the log, the seconds and the CPU seconds (this process, all threads) taken.
    """
    store.create_topic(TOPIC, 1, schema=SCHEMA)
    log = store.partition(TOPIC, 0)
    append = log.append
    cpu_start = time.process_time()
    start = time.perf_counter()
    for seq, batch in enumerate(batches):
        append(batch, producer_id=PRODUCER_ID, producer_epoch=0, base_sequence=seq * ROWS_PER_BATCH)
    elapsed = time.perf_counter() - start
    return log, elapsed, time.process_time() - cpu_start


def store_inprocess_run(
    directory: Path, batches: Sequence[pa.RecordBatch], policy: FsyncPolicy
) -> tuple[int, float, float]:
    """Append every batch in this process, on the same warm memory the raw runs use.

    (A child process would pay first-touch page faults for its own copy of the data,
    which on this VM costs more than the store itself and would be measured as such.)
    """
    store = LogStore(directory, policy.store_config())
    log, elapsed, cpu = append_all(store, batches)
    written = log.size_bytes
    store.close()
    shutil.rmtree(directory)
    return written, elapsed, cpu


# -- store (child process, killed: for recovery) -----------------------------------------
def store_child(directory: Path, gb: float, policy: FsyncPolicy) -> int:
    """Append, report, then wait to be SIGKILLed (never closes the store)."""
    batches = build_batches(gb)
    store = LogStore(directory, policy.store_config())
    log, elapsed, cpu = append_all(store, batches)
    print(f"RESULT {log.size_bytes} {elapsed:.6f} {log.log_end_offset} {cpu:.6f}", flush=True)
    sys.stdin.read()  # the parent kills us; EOF only if it died first
    return 0


@dataclass(frozen=True)
class StoreRun:
    written: int
    seconds: float
    cpu_seconds: float  # the child's, appending
    recovery_seconds: float
    segments: int
    had_snapshot: bool


def store_run(directory: Path, gb: float, policy: FsyncPolicy, expected_rows: int) -> StoreRun:
    cmd = [sys.executable, "-m", "benchmarks.bench_store", "--child-store", str(directory)]
    cmd += ["--gb", repr(gb), "--fsync", policy.name]
    child = subprocess.Popen(
        cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # blocks until the appends are done: the event
        word, written, seconds, end, cpu = [*line.split(), "", "", "", "", ""][:5]
        if word != "RESULT":
            raise RuntimeError(f"store child failed (exit {child.wait()}): {line!r}")
    finally:
        child.kill()  # SIGKILL: no close(), no final snapshot, no clean-shutdown marker
        child.wait()
    if int(end) != expected_rows:
        raise RuntimeError(f"store child wrote {end} rows, expected {expected_rows}")
    partition_dir = directory / TOPIC / "0"
    had_snapshot = bool(list_snapshots(partition_dir))

    start = time.perf_counter()
    store = LogStore(directory, policy.store_config())
    log = store.partition(TOPIC, 0)
    recovery = time.perf_counter() - start

    entry = log.state.get(PRODUCER_ID)
    # Sequences count rows from 0 here (one producer, never wrapping).
    if log.log_end_offset != expected_rows or entry is None or entry.last_seq != int(end) - 1:
        raise RuntimeError(f"recovered log is wrong: end {log.log_end_offset}, state {entry}")
    segments = len(log.segments)
    store.close()
    shutil.rmtree(directory)
    return StoreRun(int(written), float(seconds), float(cpu), recovery, segments, had_snapshot)


def profile_appends(
    directory: Path, batches: Sequence[pa.RecordBatch], policy: FsyncPolicy, top: int = 14
) -> str:
    """cProfile of in-process appends: where the store's time goes beyond the write."""
    store = LogStore(directory, policy.store_config())
    store.create_topic(TOPIC, 1, schema=SCHEMA)
    log = store.partition(TOPIC, 0)
    profiler = cProfile.Profile()
    profiler.enable()
    for seq, batch in enumerate(batches):
        log.append(
            batch, producer_id=PRODUCER_ID, producer_epoch=0, base_sequence=seq * ROWS_PER_BATCH
        )
    profiler.disable()
    store.close()
    shutil.rmtree(directory)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


# -- validator -----------------------------------------------------------------------------
def validator_us_per_batch(encoded: Sequence[pa.Buffer], rounds: int = 20) -> list[float]:
    """µs per batch of check_append + on_data_batch, one list entry per round."""
    headers = [decode_header(memoryview(buf)) for buf in encoded]
    batches = [(producer_fields(h), h.base_offset, h.last_offset, h.max_timestamp) for h in headers]
    results = []
    for _ in range(rounds):
        state = ProducerStateManager(window=5, expiration_ms=86_400_000)
        check, record, origin = state.check_append, state.on_data_batch, AppendOrigin.CLIENT
        start = time.perf_counter()
        for pbatch, first, last, ts in batches:
            if check(pbatch, origin) is not None:
                raise RuntimeError("unexpected duplicate")
            record(pbatch, first, last, ts)
        results.append((time.perf_counter() - start) / len(batches) * 1e6)
    return results


# -- driver ------------------------------------------------------------------------------
def scratch_root(requested: str | None) -> Path:
    """A directory on the repository's disk: the system temp dir if it is, else the repo's."""
    if requested:
        return Path(requested)
    tmp = Path(tempfile.gettempdir())
    if os.stat(tmp).st_dev == os.stat(REPO).st_dev:
        return tmp
    return REPO / "bench"  # ignored by git


def spread(values: Sequence[float], best: Callable[[Sequence[float]], float]) -> str:
    b = best(values)
    if len(values) < 2 or b == 0:
        return "n/a (one run)"
    lo, hi = min(values), max(values)
    return f"{(hi - lo) / b * 100:.1f}% (min {lo:.2f}, max {hi:.2f})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=2.0, help="data to append (10^9 bytes)")
    parser.add_argument(
        "--fsync",
        type=FsyncPolicy.parse,
        default=FsyncPolicy("os"),
        help="os (store default: the OS flushes), batch, messages:N or ms:N",
    )
    parser.add_argument("--repeat", type=int, default=2, help="store runs (raw runs: one more)")
    parser.add_argument("--dir", help="scratch directory (default: temp dir on the repo's disk)")
    parser.add_argument(
        "--profile", action="store_true", help="print a cProfile of appends (auto on a miss)"
    )
    parser.add_argument("--child-store", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    policy: FsyncPolicy = args.fsync
    if args.child_store:
        return store_child(Path(args.child_store), args.gb, policy)

    root = scratch_root(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-store-", dir=root))
    try:
        return run(args.gb, policy, args.repeat, scratch, args.profile)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run(gb: float, policy: FsyncPolicy, repeat: int, scratch: Path, profile: bool) -> int:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"bench-store: {gb} GB, fsync={policy.name}, scratch {scratch}, {os.cpu_count()} CPUs, "
        f"load average {load}",
        flush=True,
    )
    t0 = time.perf_counter()
    batches = build_batches(gb)
    encoded = encode_all(batches)
    rows = sum(b.num_rows for b in batches)
    payload = ipc_stream_size(batches[0])
    print(
        f"data: {len(batches)} batches x {ROWS_PER_BATCH} rows, {payload / ROWS_PER_BATCH:.1f} "
        f"B/row in Arrow IPC, {sum(b.size for b in encoded) / GB:.3f} GB encoded "
        f"(built in {time.perf_counter() - t0:.1f}s, not measured)",
        flush=True,
    )

    segment_bytes = LogConfig.from_mapping(policy.store_config()).segment_bytes
    print(f"{'run':<12}{'GB':>8}{'seconds':>10}{'MB/s':>10}{'CPU s/GB':>10}  notes", flush=True)

    def row(label: str, written: int, seconds: float, mbps: str, cpu: float, note: str) -> float:
        """Prints a table row; returns the CPU seconds per GB."""
        per_gb = cpu / (written / GB)
        print(
            f"{label:<12}{written / GB:>8.3f}{seconds:>10.3f}{mbps:>10}{per_gb:>10.3f}  {note}",
            flush=True,
        )
        return per_gb

    def raw_row(label: str, segments: int | None, note: str) -> tuple[float, float]:
        """(MB/s, CPU s/GB) of one raw run."""
        # Each run starts with no dirty pages (ours are deleted after each run; this
        # flushes everyone else's): past ~2 GB dirty, kernel writeback slows writers down.
        os.sync()
        written, seconds, cpu = raw_run(scratch, encoded, policy, segments)
        mbps = written / MB / seconds
        return mbps, row(label, written, seconds, f"{mbps:.1f}", cpu, note)

    # The first pass over fresh memory pays for first-touch page faults (a VM artefact).
    raw_row("warm-up", segment_bytes, "not counted")
    raw_mbps: list[float] = []
    store_mbps: list[float] = []
    raw_cpu: list[float] = []  # CPU s/GB
    store_cpu: list[float] = []
    child_cpu: list[float] = []
    recovery: list[float] = []
    roll_note = f"new file + background fsync every {segment_bytes / 2**30:g} GiB, as a roll"
    for i in range(repeat + 1):
        mbps, cpu = raw_row(f"raw {i + 1}", segment_bytes, roll_note)
        raw_mbps.append(mbps)
        raw_cpu.append(cpu)
        if i == repeat:
            break
        os.sync()
        written, seconds, cpu = store_inprocess_run(scratch / f"store-{i}", batches, policy)
        store_mbps.append(written / MB / seconds)
        store_cpu.append(
            row(
                f"store {i + 1}",
                written,
                seconds,
                f"{store_mbps[-1]:.1f}",
                cpu,
                "same process and memory as raw",
            )
        )
    for i in range(repeat):
        os.sync()
        result = store_run(scratch / f"recovery-{i}", gb, policy, rows)
        recovery.append(result.recovery_seconds / (result.written / GB))
        child_cpu.append(
            row(
                f"recovery {i + 1}",
                result.written,
                result.recovery_seconds,
                "",
                result.cpu_seconds,
                f"reopen after SIGKILL of a child that appended it ({result.segments} segments, "
                f"snapshot: {'yes' if result.had_snapshot else 'no'}); CPU: the child's appends",
            )
        )
    raw_row("raw no-roll", None, "one file, no fsync at roll points: for reference only")

    validator = validator_us_per_batch(encoded)
    best_store, best_raw = max(store_mbps), max(raw_mbps)
    ratio = best_store / best_raw
    print()
    print(f"store MB/s spread: {spread(store_mbps, max)}")
    print(f"raw MB/s spread:   {spread(raw_mbps, max)}")
    print(f"recovery s/GB spread: {spread(recovery, min)}")
    print(f"store CPU s/GB spread: {spread(store_cpu, min)}")
    print(f"raw CPU s/GB spread:   {spread(raw_cpu, min)}")
    print(f"validator us/batch spread: {spread(validator, min)}")
    verdicts = [
        ("store_vs_raw_ratio", ratio >= TARGET_RATIO, f">= {TARGET_RATIO}"),
        (
            "validator_us_per_batch",
            min(validator) < TARGET_VALIDATOR_US,
            f"< {TARGET_VALIDATOR_US}",
        ),
        (
            "recovery_s_per_GB",
            min(recovery) < TARGET_RECOVERY_S_PER_GB,
            f"< {TARGET_RECOVERY_S_PER_GB}",
        ),
    ]
    for name, ok, target in verdicts:
        print(f"target {name} {target}: {'met' if ok else 'MISSED'}")
    if profile or ratio < TARGET_RATIO:
        sample = batches[: min(len(batches), 300)]
        print(f"\ncProfile of {len(sample)} in-process appends (where the store time goes):")
        print(profile_appends(scratch / "profile", sample, policy))
    print(f"store_append_MBps={best_store:.1f}")
    print(f"raw_write_MBps={best_raw:.1f}")
    print(f"store_vs_raw_ratio={ratio:.3f}")
    print(f"validator_us_per_batch={min(validator):.2f}")
    print(f"recovery_s_per_GB={min(recovery):.3f}")
    print(f"store_cpu_s_per_gb={min(store_cpu):.3f}")
    print(f"raw_cpu_s_per_gb={min(raw_cpu):.3f}")
    print(f"store_vs_raw_cpu_ratio={min(store_cpu) / min(raw_cpu):.3f}")
    print(f"store_child_cpu_s_per_gb={min(child_cpu):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
