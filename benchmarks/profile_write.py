"""Where a batch write's time goes: py-spy samples of the Python processes under Spark and
of the embedded broker while ``df.write.format("idemlog")`` writes bench-peers' rows.

    python -m benchmarks.profile_write [--rows 5000000] [--rate 97] [--out DIR] [--gil]
                                       [--read]

``--read`` profiles ``spark.read.format("idemlog")`` of the written rows into ``noop``
(after one warm read) instead of the write.

One ``local[2,1]`` session as bench-peers' (``spark_workload.source``'s rows, ``key="key"``,
a fresh topic of the default 4 partitions on an embedded broker, default configuration).
A warm-up write of 100,000 rows first, so the Python workers (reused, Spark's default)
and the broker exist; then two ``py-spy record --nonblocking --format raw`` run while one
write of ``--rows`` rows is timed: one on this process and its descendants
(``--subprocesses``: the driver, the JVM's Python daemon and its workers; py-spy skips the
JVM), one on the broker (it runs in a session of its own, no descendant). Stopped with
SIGINT once the write returns; the collapsed stacks are kept in ``--out``
(``workers.txt``, ``broker.txt``: flamegraph.pl's input) and summarised: for each process
kind, the share of its on-CPU samples (py-spy drops idle threads) in each part
(``PARTS``), then the heaviest frames of the project's, Spark's and pyarrow's code,
inclusive. The CPU seconds of Spark's processes and of the broker during the unprofiled
and the profiled write are printed too: the shares are of those. py-spy samples in its
blocking mode (it pauses a process for each sample): in ``--nonblocking`` mode it cannot
tell an idle thread from a busy one (it guesses; a thread blocked in native code, as the
broker's Flight reader waiting for the next chunk, counts as busy), which made the first
profiles of this module wrong. The pauses slow the write a little (both times printed).
Even in blocking mode, on this machine py-spy counted the broker's waiting threads as
busy (1,567 samples in 11 s from a broker that used 0.8 CPU s): read the shares as thread
time, waits included, and weigh them with the CPU seconds; ``--gil`` samples only the
thread holding the GIL, i.e. Python's own CPU time (native code that releases the GIL,
Arrow's kernels and IPC writer, gRPC, is then missing).
Needs ``py-spy`` (``.venv/bin/pip install py-spy``) and permission to trace the broker
(root, or ptrace_scope 0).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from benchmarks.bench_spark import WARMUP_ROWS, Bench, Cpu
from benchmarks.spark_workload import source
from spark_sink import local_session
from spark_sink.embedded import broker_pid, stop_broker
from spark_sink.session import REPO

PY_SPY = Path(sys.executable).parent / "py-spy"
PY_SPY_STOP_TIMEOUT_S = 60.0
TOP_FRAMES = 18
PY_SPY_ATTACH_S = 1.0  # py-spy attaches before the write starts

# (part, texts): a sample belongs to the part of its leaf-most frame that contains one of a
# part's texts (the parts are tried in order on each frame, leaf first), so time in
# pyarrow's or the standard library's code goes to the project's or Spark's caller.
PARTS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "task": (
        ("Spark: task set-up (importlib.invalidate_caches re-reads zips)", ("zipimport",)),
        ("Spark: its Arrow serializer (a write's input, a read's output)", ("serializers.py",)),
        ("reader: the fetch's stream received (_read_fetch)", ("_read_fetch",)),
        ("reader: other (read_range, _to_output)", ("spark_sink/reader.py",)),
        ("Spark: the daemon's loop (fork, gc.collect)", ("daemon.py",)),
        ("producer: partitioning (hash, take)", ("partitioner.py",)),
        ("producer: merge chunks into one batch (freeze)", ("ProducerBatch.freeze",)),
        (
            "producer: Flight stream (IPC encode + send, acks)",
            ("produce_stream.py", "transport.py"),
        ),
        ("producer: the sender's wait (woken by events)", ("MessageAccumulator.wait",)),
        ("producer: accumulator, sender, futures", ("broker_core/producer/",)),
        (
            "sink: writer, task set-up (options, producer id, prepare)",
            ("spark_sink/", "broker_core/"),
        ),
        ("Spark: worker, other", ("pyspark/",)),
    ),
    "driver": (
        ("sink: commit (driver)", ("spark_sink/commit.py",)),
        ("sink: planning, topic check (driver)", ("spark_sink/", "broker_core/")),
        ("Spark: driver-side Python processes", ("pyspark/",)),
    ),
    "broker": (
        ("broker: read the Flight stream (IPC decode)", ("_chunks",)),
        # The leaf-most frame _produce itself: its writer.write of each batch's answer.
        ("broker: answer each batch (the ack's write)", ("IdemlogFlightServer._produce (",)),
        (
            "broker: validation (sequence, epoch, batch checks)",
            ("validator.py", "producer_state.py"),
        ),
        ("broker: flush (the write-back of a roll or a flush action)", ("flush",)),
        (
            "broker: append to the segment, indexes",
            ("segment.py", "indexes.py", "partition_log.py", "partition.py", "store.py"),
        ),
        ("broker: transactions, coordinator, markers", ("txn/", "coordinator")),
        ("broker: Flight handler, metadata, other", ("broker_core/",)),
    ),
}


def _stacks(path: Path) -> list[tuple[str, list[str], int]]:
    """py-spy's raw output as (process, frames root first, samples)."""
    out = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        # With --subprocesses each sample starts with its process's ancestry, one frame
        # per process: the last of them is the sampled process.
        processes = [f for f in frames if f.startswith("process ")]
        out.append((processes[-1] if processes else "", frames, int(count)))
    return out


def _kind(process: str) -> str:
    """From py-spy's process frame: broker; task (a Spark Python worker, ``pyspark.worker``:
    the write tasks); driver (this process and the data source's driver-side Python
    processes, ``pyspark.sql.worker.*``: planning and the commit)."""
    if "broker start" in process:
        return "broker"
    if "pyspark.worker" in process:
        return "task"
    return "driver"


def summarise(path: Path, default_kind: str, kinds: Sequence[str]) -> None:
    """Print each process kind's shares of its samples by part, and its heaviest frames."""
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    frames_by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    totals: Counter[str] = Counter()
    for process, frames, count in _stacks(path):
        kind = _kind(process) if process else default_kind
        if kind not in kinds:
            continue
        totals[kind] += count
        by_kind[kind][_part(kind, frames)] += count
        seen = set()
        for frame in frames:
            # "function (path/to/file.py:line)": keep function and file, drop the line.
            match = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame)
            if not match:
                continue
            name = f"{match.group(1)} ({_short(match.group(2))})"
            if name not in seen and any(
                s in match.group(2) for s in ("spark_sink", "broker_core", "pyarrow", "pyspark")
            ):
                seen.add(name)
                frames_by_kind[kind][name] += count
    for kind in sorted(totals):
        total = totals[kind]
        print(f"\n{kind}: {total} on-CPU samples")
        for part, count in by_kind[kind].most_common():
            print(f"  {100 * count / total:5.1f}%  {part}")
        print("  heaviest frames (inclusive):")
        for name, count in frames_by_kind[kind].most_common(TOP_FRAMES):
            print(f"    {100 * count / total:5.1f}%  {name}")


def _part(kind: str, frames: list[str]) -> str:
    for frame in reversed(frames):
        for part, needles in PARTS.get(kind, ()):
            if any(n in frame for n in needles):
                return part
    return "other (the interpreter, threads' start)"


def _short(path: str) -> str:
    for root in ("site-packages/", str(REPO) + "/"):
        if root in path:
            return path.split(root, 1)[1]
    return path


def _record(
    pid: int, output: Path, rate: int, subprocesses: bool, gil: bool
) -> subprocess.Popen[bytes]:
    command = [str(PY_SPY), "record", "--pid", str(pid), "--rate", str(rate)]
    if gil:
        command.append("--gil")
    command += ["--format", "raw", "--output", str(output)]
    if subprocesses:
        command.append("--subprocesses")
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _stop(recorder: subprocess.Popen[bytes], what: str) -> None:
    recorder.send_signal(signal.SIGINT)
    try:
        _, err = recorder.communicate(timeout=PY_SPY_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        recorder.kill()
        raise SystemExit(f"profile-write: py-spy of the {what} did not stop") from None
    if recorder.returncode not in (0, -signal.SIGINT):
        print(f"profile-write: py-spy of the {what}: {err.decode().strip()}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--rate", type=int, default=97, help="samples a second per process")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "profile-write")
    parser.add_argument(
        "--read",
        action="store_true",
        help="profile spark.read.format('idemlog') of the rows (into noop) instead",
    )
    parser.add_argument(
        "--gil",
        action="store_true",
        help="only samples of the thread holding the GIL: Python's own CPU time",
    )
    args = parser.parse_args(argv)
    if not PY_SPY.exists():
        raise SystemExit(f"profile-write: {PY_SPY} is missing: .venv/bin/pip install py-spy")
    args.out.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="profile-write-"))
    embedded = str(directory / "embedded")
    spark = local_session("profile-write", cores=2, max_failures=1, quiet=True)
    try:
        bench = Bench(spark, directory, embedded)
        bench.write("idemlog", source(spark, WARMUP_ROWS), WARMUP_ROWS)
        topic = bench.fresh("profiled")
        written = source(spark, args.rows).write.format("idemlog").mode("append")
        written = written.option("path", embedded).option("topic", topic).option("key", "key")
        if args.read:
            written.save()
            read = spark.read.format("idemlog").option("path", embedded).option("topic", topic)
            frame = read.load()
            action = frame.write.format("noop").mode("overwrite").save
            action()  # warm: the read's Python workers
        else:
            action = written.save
        plain, cpu = _timed(embedded, action if args.read else _fresh_write(bench, spark, args))
        broker = broker_pid(embedded)
        if broker is None:
            raise SystemExit("profile-write: the embedded broker is not running")
        workers = _record(
            os.getpid(), args.out / "workers.txt", args.rate, subprocesses=True, gil=args.gil
        )
        brokers = _record(
            broker, args.out / "broker.txt", args.rate, subprocesses=False, gil=args.gil
        )
        time.sleep(PY_SPY_ATTACH_S)
        try:
            profiled, used = _timed(embedded, action)
        finally:
            # Before the check and the topic's deletion, which are not the write's.
            _stop(workers, "workers")
            _stop(brokers, "broker")
        if not args.read:
            bench.check_topic(topic, args.rows, source(spark, 1).rdd.getNumPartitions())
        bench.delete_topic(topic)
    finally:
        spark.stop()
        stop_broker(embedded)
        shutil.rmtree(directory, ignore_errors=True)
    print(
        f"profile-write: {'read' if args.read else 'write'} of {args.rows} rows, "
        f"{plain:.2f} s unprofiled (CPU s: Spark's processes "
        f"{cpu.spark:.1f}, broker {cpu.broker:.1f}), {profiled:.2f} s profiled (CPU s: "
        f"{used.spark:.1f} with py-spy's own, broker {used.broker:.1f}); stacks in {args.out}"
    )
    report(args.out)
    return 0


def _timed(embedded: str, action: Callable[[], object]) -> tuple[float, Cpu]:
    before = Cpu.now(embedded)
    start = time.perf_counter()
    action()
    return time.perf_counter() - start, Cpu.now(embedded) - before


def _fresh_write(bench: Bench, spark: SparkSession, args: argparse.Namespace) -> Callable[[], None]:
    """The unprofiled write: to a topic of its own, deleted after."""

    def write() -> None:
        topic = bench.fresh("plain")
        source(spark, args.rows).write.format("idemlog").mode("append").option(
            "path", bench.embedded
        ).option("topic", topic).option("key", "key").save()
        bench.delete_topic(topic)

    return write


def report(out: Path) -> None:
    """The summary of the stacks a run left in ``out``."""
    # The broker is sampled by a py-spy of its own (it may not be a descendant).
    summarise(out / "workers.txt", "task", ("task", "driver"))
    summarise(out / "broker.txt", "broker", ("broker",))


if __name__ == "__main__":
    raise SystemExit(main())
