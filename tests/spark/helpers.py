"""Shared code of the Spark fault tests (``test_faults.py``): replayable input, the driver
child process, and the one proof docs/design.md §8 asks for -- read the topic back
``read_committed`` and compare with the input.

Input: ``files`` parquet files of ``rows`` rows each; ``id`` increases globally (file
``f`` holds ``f * rows .. (f + 1) * rows - 1``), ``account = id % ACCOUNTS`` is the key,
so within a key ids increase with the file index -- the order a stream processes them
with ``maxFilesPerTrigger=1`` (modification times are set increasing too).

Driver children (``driver_child.py``) run in their own session: the test can SIGKILL the
whole process group, and a ``kill_driver`` failpoint kills exactly that group. Spark's
Python daemon puts itself into a group of its own, so teardown also sweeps every process
carrying this launch's ``IDEMLOG_TEST_DRIVER_TAG`` in its environment (the embedded
broker, which may inherit it when a task restarts it, is left to ``stop_broker``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from broker_core.client.broker_client import BrokerClient
from broker_core.security.tls import PLAINTEXT_MATERIAL, TlsMaterial
from spark_sink.embedded import ensure_broker

REPO = Path(__file__).resolve().parents[2]
DRIVER_CHILD = Path(__file__).resolve().with_name("driver_child.py")
ACCOUNTS = 37
SPARK_PARTITIONS = 4
DRIVER_TIMEOUT_S = 300.0
TAG_ENV = "IDEMLOG_TEST_DRIVER_TAG"
EXIT_FAILED = 3  # driver_child.EXIT_FAILED
BROKER_MODULE = "broker_core.cli.main"

# A batch's tasks prepared, no heartbeat covers the time until the driver's commit
# request (the tasks' end, Spark's job end, the commit's Python process): on the shared
# 2-core machine under a CI run that took over 20 s once, and the default
# transaction.timeout.ms aborted the batch. For tests whose faults never need the
# timeout to fire (a retry or a restart fences what a dead attempt left open).
ROOMY_TIMEOUT = {"transaction.timeout.ms": "60000"}


# -- input -----------------------------------------------------------------------------------


@contextlib.contextmanager
def delta_test_session(app_name: str) -> Iterator[Any]:
    """A Spark session with Delta (the project's jars), stopped at the end; fails, never
    skips, when the jars are missing."""
    import pytest

    from spark_sink.export.delta import delta_session
    from spark_sink.session import project_jars

    if not any("delta-spark" in jar for jar in project_jars()):
        pytest.fail("no Delta jars in jars/: run `make jars` (scripts/fetch_jars.sh)")
    session = delta_session(app_name, quiet=True)
    try:
        yield session
    finally:
        session.stop()


def make_input(src: Path, files: int, rows: int) -> list[int]:
    """Write the parquet files; returns every id, in order."""
    src.mkdir(parents=True, exist_ok=True)
    base = time.time() - 10 * files
    for f in range(files):
        ids = pa.array(range(f * rows, (f + 1) * rows), pa.int64())
        table = pa.table(
            {
                "id": ids,
                "account": pa.array([i % ACCOUNTS for i in ids.to_pylist()], pa.int64()),
                "amount": pa.array([(i * 7919) % 100_000 for i in ids.to_pylist()], pa.int64()),
            }
        )
        path = src / f"part-{f:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + 2 * f, base + 2 * f))  # file order == id order
    return list(range(files * rows))


# -- read-back -------------------------------------------------------------------------------
@dataclass
class ReadBack:
    """What ``read_committed`` readers see of a topic, per log partition."""

    partitions: dict[int, pa.Table | None]
    offsets: dict[int, dict[str, int]]

    def column(self, name: str) -> list[int]:
        out: list[int] = []
        for table in self.partitions.values():
            if table is not None:
                out.extend(table.column(name).to_pylist())
        return out

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in self.partitions.values() if t is not None)


def read_back(
    store: str,
    topic: str,
    *,
    isolation: str = "read_committed",
    brokers: str | None = None,
    tls: TlsMaterial = PLAINTEXT_MATERIAL,
) -> ReadBack:
    """The topic as the embedded broker of ``store`` serves it, or the cluster at
    ``brokers`` (a bootstrap list, reached under ``tls``)."""
    with BrokerClient(brokers or ensure_broker(store), timeout_s=60.0, tls=tls) as client:
        (doc,) = client.describe_topics([topic])
        count = len(doc.partitions)
        tables = {p: client.read_table(topic, p, isolation=isolation) for p in range(count)}
        offsets = {p: client.list_offsets(topic, p) for p in range(count)}
    return ReadBack(tables, offsets)


def transaction_metrics(store: str) -> dict[str, Any]:
    with BrokerClient(ensure_broker(store), timeout_s=60.0) as client:
        txns = client.metrics()["transactions"]
    assert txns is not None, "the broker reports no transaction coordinator metrics"
    return dict(txns)


def assert_one_copy(
    store: str,
    topic: str,
    expected_ids: Sequence[int],
    *,
    brokers: str | None = None,
    tls: TlsMaterial = PLAINTEXT_MATERIAL,
) -> ReadBack:
    """Every expected id exactly once, nothing else; each key in one partition with its
    ids increasing in offset order; the last stable offset not stuck behind the log end.
    Read from the embedded broker of ``store``, or the cluster at ``brokers``."""
    back = read_back(store, topic, brokers=brokers, tls=tls)
    ids = back.column("id")
    counts: dict[int, int] = defaultdict(int)
    for i in ids:
        counts[i] += 1
    expected = set(expected_ids)
    dupes = sorted(i for i, n in counts.items() if n > 1)
    missing = sorted(expected - counts.keys())
    extra = sorted(counts.keys() - expected)
    assert not dupes, f"{len(dupes)} ids appear more than once, e.g. {dupes[:10]}"
    assert not missing, f"{len(missing)} ids missing, e.g. {missing[:10]}"
    assert not extra, f"{len(extra)} unexpected ids, e.g. {extra[:10]}"
    assert len(ids) == len(expected_ids)

    home: dict[int, int] = {}
    for p, table in back.partitions.items():
        if table is None:
            continue
        last: dict[int, int] = {}
        accounts = table.column("account").to_pylist()
        for i, account in zip(table.column("id").to_pylist(), accounts, strict=True):
            assert account == i % ACCOUNTS, f"id {i} came back with account {account}"
            assert home.setdefault(account, p) == p, (
                f"key {account} is in partitions {home[account]} and {p}"
            )
            assert i > last.get(account, -1), (
                f"partition {p}: key {account} has id {i} after id {last[account]}"
            )
            last[account] = i
        amounts = table.column("amount").to_pylist()
        bad = [
            i
            for i, a in zip(table.column("id").to_pylist(), amounts, strict=True)
            if a != (i * 7919) % 100_000
        ]
        assert not bad, f"partition {p}: wrong amount for ids {bad[:10]}"
    assert_lso_not_stuck(back)
    return back


def assert_lso_not_stuck(back: ReadBack) -> None:
    for p, off in back.offsets.items():
        assert off["last_stable_offset"] == off["log_end_offset"], (
            f"partition {p}: last stable offset {off['last_stable_offset']} is stuck behind "
            f"the log end {off['log_end_offset']} (an open transaction): {off}"
        )


# -- processes ------------------------------------------------------------------------------
def wait_gone(pid: int, timeout_s: float = 30.0) -> None:
    """Block until ``pid`` has exited (pidfd: an event, not a poll)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        assert ready, f"pid {pid} still alive {timeout_s} s after its signal"
    finally:
        os.close(fd)


# -- driver child ----------------------------------------------------------------------------
@dataclass
class DriverRun:
    """One launch of ``driver_child.py``; ``lines`` are its stdout lines so far."""

    proc: subprocess.Popen[bytes]
    tag: str
    log_path: Path
    lines: list[str] = field(default_factory=list)
    events: queue.Queue[str | None] = field(default_factory=queue.Queue)
    reader: threading.Thread | None = None
    started: float = field(default_factory=time.monotonic)
    times: list[float] = field(default_factory=list)  # seconds from start, per line
    elapsed: float | None = None  # seconds from start to exit

    def start_reader(self) -> None:
        def pump() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                self.lines.append(line)
                self.times.append(time.monotonic() - self.started)
                self.events.put(line)
            self.events.put(None)  # EOF

        self.reader = threading.Thread(target=pump, name=f"driver-{self.proc.pid}", daemon=True)
        self.reader.start()

    def wait_for_line(self, prefix: str, predicate: Any = None, timeout_s: float = 180.0) -> str:
        """Block until a stdout line starting with ``prefix`` (and passing ``predicate``)
        arrives; fails if the child's stdout ends first or the deadline passes."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {prefix!r} line after {timeout_s} s:\n{self.describe()}"
            try:
                line = self.events.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"driver exited before {prefix!r}:\n{self.describe()}")
            if line.startswith(prefix) and (predicate is None or predicate(line)):
                return line

    def wait(self, timeout_s: float = DRIVER_TIMEOUT_S) -> int:
        try:
            rc = self.proc.wait(timeout=timeout_s)
            self.elapsed = time.monotonic() - self.started
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"driver child did not finish in {timeout_s} s:\n{self.describe()}"
            ) from None
        if self.reader is not None:
            self.reader.join(timeout=30)
        # The JVM and the Python daemon's workers may still be on their way out.
        self.kill()
        return rc

    def kill(self) -> None:
        """SIGKILL the child's process group and every process carrying its tag."""
        if self.proc.returncode is None:
            # Not reaped yet, so the group id is still the child's (never a reused pid).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        kill_tagged(self.tag)  # the JVM and the Python daemon's group, if still there
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text[-lines:])

    def timeline(self) -> str:
        """``<seconds> <line>`` per stdout line: where a launch spent its time."""
        pairs = zip(self.times, self.lines, strict=False)
        return "\n".join(f"{t:7.1f}s {line[:160]}" for t, line in pairs)

    def describe(self) -> str:
        return (
            f"pid {self.proc.pid} rc {self.proc.returncode} after {self.elapsed} s\nstdout:\n"
            + "\n".join(self.timeline().splitlines()[-30:])
            + f"\nstderr tail ({self.log_path}):\n{self.log_tail()}"
        )

    def progress_batches(self) -> list[int]:
        return [
            int(line.split()[1].split("=")[1]) for line in self.lines if line.startswith("PROGRESS")
        ]


def _environ_of(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _cmdline_of(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def kill_tagged(tag: str) -> list[int]:
    """SIGKILL every process of this user whose environment holds ``TAG_ENV=tag``, except
    an embedded broker (it belongs to the store fixture)."""
    needle = f"{TAG_ENV}={tag}".encode()
    killed = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        if needle not in _environ_of(pid).split(b"\0"):
            continue
        if BROKER_MODULE in _cmdline_of(pid):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


class DriverLauncher:
    """Starts driver children and kills whatever is left of them at teardown."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.runs: list[DriverRun] = []

    def start(
        self,
        spec: Mapping[str, Any],
        *,
        failpoints: Iterable[str] = (),
        failpoints_dir: Path | None = None,
        launcher: Callable[[list[str]], list[str]] | None = None,
        test_hooks: bool = True,
    ) -> DriverRun:
        """Start a driver child; ``launcher`` wraps its command line (e.g. ``Host.command``
        of the multi-host test bed: the driver on a host of its own). With ``failpoints``
        its writes name the hooks that fire them (the option ``hooks``,
        ``testkit.spark_failpoints``) unless ``test_hooks`` is False (the gate's own test:
        the variables set, the option not)."""
        tag = uuid.uuid4().hex
        env = {k: v for k, v in os.environ.items() if not k.startswith("IDEMLOG_")}
        env[TAG_ENV] = tag
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        entries = ";".join(failpoints)
        if entries:
            assert failpoints_dir is not None, "failpoints need a marker directory"
            failpoints_dir.mkdir(parents=True, exist_ok=True)
            env["IDEMLOG_SPARK_FAILPOINTS"] = entries
            env["IDEMLOG_SPARK_FAILPOINTS_DIR"] = str(failpoints_dir)
            # The job's opt-in to the variable (docs/security.md, Test hooks): without the
            # hooks that read it nothing fires, and the test's check that it did fails.
            spec = {**spec, "test_hooks": test_hooks}
        log_path = self.workdir / f"driver-{len(self.runs):02d}.log"
        with open(log_path, "wb") as log:
            argv = [sys.executable, str(DRIVER_CHILD), json.dumps(dict(spec))]
            proc = subprocess.Popen(
                launcher(argv) if launcher is not None else argv,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        run = DriverRun(proc, tag, log_path)
        run.start_reader()
        self.runs.append(run)
        return run

    def run(self, spec: Mapping[str, Any], **kwargs: Any) -> DriverRun:
        """Start a driver and wait for it to exit."""
        run = self.start(spec, **kwargs)
        run.wait()
        return run

    def close(self) -> None:
        for run in self.runs:
            run.kill()


def stream_spec(
    src: Path, store: str, topic: str, checkpoint: Path, files: int, **extra: Any
) -> dict[str, Any]:
    return {
        "mode": "stream",
        "src": str(src),
        "store": store,
        "topic": topic,
        "checkpoint": str(checkpoint),
        "files": files,
        "spark_partitions": SPARK_PARTITIONS,
        **extra,
    }


def batch_spec(src: Path, store: str, topic: str, **extra: Any) -> dict[str, Any]:
    return {
        "mode": "batch",
        "src": str(src),
        "store": store,
        "topic": topic,
        "spark_partitions": SPARK_PARTITIONS,
        **extra,
    }


def assert_succeeded(run: DriverRun) -> None:
    assert run.proc.returncode == 0, f"driver child failed:\n{run.describe()}"
    assert any(line.startswith("DONE") for line in run.lines), run.describe()
