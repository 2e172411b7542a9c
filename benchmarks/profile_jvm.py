"""The JVM's side of a batch read: idemlog's against Delta's, sampled with JDK Flight Recorder.

    python -m benchmarks.profile_jvm [--rows 20000000] [--runs 2] [--top 15]

One ``local[2,1]`` session with Delta's extension; bench-peers' rows (``spark_workload.source``)
written once to an idemlog topic (embedded broker, ``key="key"``, 4 partitions) and to a
Delta table. Each reader's DataFrame (every column, as bench-peers' read part) goes into
``noop`` once to warm up, then ``--runs`` times plainly (their wall times and the JVM's
CPU seconds per run, psutil), then ``--runs`` times under a JFR recording of the driver's
JVM (``jcmd <pid> JFR.start settings=profile``, stopped after the runs: Java execution
samples about every 10-20 ms per running thread). Printed per reader: those figures and
the share of the Spark task threads' samples in each of the ``--top`` frames, self and
inclusive.

What it showed (benchmarks/README.md, "Reads"): on the idemlog read, Spark's JVM turns each
Arrow batch from the Python worker into rows one at a time (``ArrowColumnVector`` null
checks with Arrow's bounds checks, an ``UnsafeProjection`` copying every value, the
iterators and the Python source's metrics map every 100 rows); that row conversion alone
takes about as much JVM CPU as Delta's whole read, Parquet decoding included.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from benchmarks.common import print_table
from benchmarks.spark_workload import source
from spark_sink import local_session
from spark_sink.embedded import stop_broker
from spark_sink.export.delta import delta_conf

TASK_THREAD = "Executor task launch worker"
SAMPLE = re.compile(r"jdk\.ExecutionSample \{(.*?)\n\}", re.S)
THREAD = re.compile(r'sampledThread = "([^"]*)')
FRAME = re.compile(r"^\s+([\w$.<>]+)\(.*?\)\s+line:", re.M)


def _jvm() -> psutil.Process:
    for child in psutil.Process().children(recursive=True):
        try:
            if "java" in " ".join(child.cmdline()[:1]):
                return child
        except psutil.NoSuchProcess:
            continue
    raise SystemExit("profile-jvm: no JVM under this process")


def _jcmd(pid: int, *command: str) -> None:
    subprocess.run(["jcmd", str(pid), *command], check=True, capture_output=True, timeout=120)


def _cpu(process: psutil.Process) -> float:
    t = process.cpu_times()
    return t.user + t.system


def _samples(recording: Path) -> list[list[str]]:
    """The frames (innermost first) of every execution sample of a Spark task thread."""
    printed = subprocess.run(
        ["jfr", "print", "--events", "jdk.ExecutionSample", str(recording)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    stacks = []
    for event in SAMPLE.findall(printed):
        thread = THREAD.search(event)
        if thread and thread.group(1).startswith(TASK_THREAD):
            stacks.append(FRAME.findall(event))
    return stacks


def _profile(
    jvm: psutil.Process, action: Callable[[], None], runs: int, recording: Path
) -> tuple[list[float], float, list[list[str]]]:
    """``runs`` plain runs (their wall times and the JVM's CPU s per run: the figures),
    then as many under a recording (its samples only: starting one costs the JVM CPU)."""
    action()  # warm: the Python workers, the JIT
    before = _cpu(jvm)
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        walls.append(time.perf_counter() - start)
    used = (_cpu(jvm) - before) / runs
    _jcmd(jvm.pid, "JFR.start", "name=profile-jvm", "settings=profile")
    try:
        for _ in range(runs):
            action()
    finally:
        _jcmd(jvm.pid, "JFR.stop", "name=profile-jvm", f"filename={recording}")
    return walls, used, _samples(recording)


def _shares(stacks: list[list[str]], top: int) -> tuple[Counter[str], Counter[str]]:
    own: Counter[str] = Counter(s[0] for s in stacks if s)
    inclusive: Counter[str] = Counter()
    for stack in stacks:
        inclusive.update(set(stack))
    return Counter(dict(own.most_common(top))), Counter(dict(inclusive.most_common(top)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="profile-jvm-"))
    embedded = str(directory / "embedded")
    spark = local_session("profile-jvm", cores=2, max_failures=1, conf=delta_conf(), quiet=True)
    results = {}
    try:
        df = source(spark, args.rows)
        df.write.format("idemlog").option("path", embedded).option("topic", "rows").option(
            "key", "key"
        ).mode("append").save()
        df.write.format("delta").save(str(directory / "delta"))
        readers = {
            "idemlog": spark.read.format("idemlog")
            .option("path", embedded)
            .option("topic", "rows")
            .load(),
            "delta": spark.read.format("delta").load(str(directory / "delta")),
        }
        jvm = _jvm()
        for name, frame in readers.items():
            results[name] = _profile(
                jvm,
                frame.write.format("noop").mode("overwrite").save,
                args.runs,
                directory / f"{name}.jfr",
            )
    finally:
        spark.stop()
        stop_broker(embedded)
        shutil.rmtree(directory, ignore_errors=True)

    for name, (walls, used, stacks) in results.items():
        print(
            f"\n{name}: {args.rows} rows, runs "
            + ", ".join(f"{w:.2f}" for w in walls)
            + f" s; JVM {used:.2f} CPU s per run; {len(stacks)} task-thread samples"
        )
        own, inclusive = _shares(stacks, args.top)
        total = max(len(stacks), 1)
        print_table(
            ["frame (self)", "%"],
            [[frame, f"{100 * n / total:.1f}"] for frame, n in own.most_common()],
        )
        print_table(
            ["frame (inclusive)", "%"],
            [[frame, f"{100 * n / total:.1f}"] for frame, n in inclusive.most_common()],
        )
    jvm_ratio = results["delta"][1] / results["idemlog"][1]
    print(f"\njvm_cpu_delta_vs_idemlog_read={jvm_ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
