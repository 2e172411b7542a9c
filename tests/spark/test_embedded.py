"""The embedded default (spark_sink.embedded) with real broker processes.

Every test works under its own ``tmp_path`` and stops the broker it caused in a fixture
finaliser, so no broker outlives its test. Waiting for a killed broker that is not this
process's child cannot use ``os.waitpid``: :func:`wait_gone` polls ``os.kill(pid, 0)``
against a deadline instead.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.producer import Producer
from spark_sink import embedded
from spark_sink.embedded import (
    CONFIG_FILE,
    DATA_DIR,
    DEFAULT_PATH,
    LOG_FILE,
    broker_pid,
    ensure_broker,
    stop_broker,
)
from spark_sink.errors import EmbeddedBrokerError
from tests.broker.helpers import SCHEMA, ids, rows
from tests.harness.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT_S = 120.0
ENSURE_IN_SUBPROCESS = (
    "import json, sys\n"
    "from spark_sink.embedded import broker_pid, ensure_broker\n"
    "address = ensure_broker(sys.argv[1])\n"
    "print(json.dumps({'address': address, 'pid': broker_pid(sys.argv[1])}))\n"
)


@pytest.fixture
def path(tmp_path: Path) -> Iterator[str]:
    where = str(tmp_path / "embedded")
    try:
        yield where
    finally:
        stop_broker(where)


def alive(pid: int) -> bool:
    """Exists and has not exited (a zombie has: it only waits to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def wait_gone(pid: int, timeout_s: float = 30.0) -> None:
    wait_until(lambda: not alive(pid), f"pid {pid} to exit", timeout=timeout_s)


def ensure_subprocess(path: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", ENSURE_IN_SUBPROCESS, path],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result_of(proc: subprocess.Popen[str]) -> tuple[str, int]:
    out, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, err
    doc = json.loads(out.strip().splitlines()[-1])
    return str(doc["address"]), int(doc["pid"])


def brokers_serving(path: str) -> list[int]:
    """Pids of every live process running a broker with this path's config."""
    config = os.path.join(os.path.abspath(path), CONFIG_FILE)
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "broker_core.cli.main" in args and config in args and alive(int(entry)):
            pids.append(int(entry))
    return pids


def test_default_path_is_under_home() -> None:
    assert os.path.expanduser("~/.idemlog/embedded") == DEFAULT_PATH


def test_first_call_starts_a_broker_that_later_calls_and_processes_reuse(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IDEMLOG_TEST_FAILPOINT", "after_first_marker")
    address = ensure_broker(path)
    pid = broker_pid(path)
    assert pid is not None
    with BrokerClient(address) as client:
        client.create_topic("events", 2)
        assert "broker_id" in client.ping()
        assert [t.name for t in client.describe_topics(["events"])] == ["events"]
    assert Path(path, DATA_DIR, "events", "topic.json").is_file()  # log.dir = <path>/data
    # Its own session (survives its starter's process group); no test hook inherited.
    assert os.getsid(pid) == pid
    assert b"IDEMLOG_TEST_FAILPOINT" not in Path(f"/proc/{pid}/environ").read_bytes()

    assert ensure_broker(path) == address
    assert broker_pid(path) == pid
    assert result_of(ensure_subprocess(path)) == (address, pid)
    assert brokers_serving(path) == [pid]


def _as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, user="nobody", group="nogroup", capture_output=True, text=True, timeout=30
    )


def test_the_brokers_folder_and_files_are_its_owners_only() -> None:
    # Under a world-traversable parent (a 0755 home, a custom path in /tmp), left 0755 by
    # an earlier version: only the broker's own modes can keep another user out.
    base = Path(tempfile.mkdtemp(prefix="idemlog-modes-", dir="/tmp"))
    where = base / "embedded"
    try:
        base.chmod(0o755)
        where.mkdir(mode=0o755)
        with BrokerClient(ensure_broker(str(where))) as client:
            client.create_topic("secret", 1, schema=SCHEMA)
            with client.produce_stream("secret", 0) as stream:
                stream.send(rows(3)).offsets(10)
            assert ids(client, "secret") == [0, 1, 2]
        assert stat.S_IMODE(where.stat().st_mode) == 0o700
        written = list(Path(where, DATA_DIR).rglob("*"))
        segments = [p for p in written if p.suffix == ".log"]
        assert segments, written
        for p in [Path(where, DATA_DIR), *written]:
            assert stat.S_IMODE(p.stat().st_mode) == (0o700 if p.is_dir() else 0o600), p
        token = embedded.token_file(str(where))
        assert stat.S_IMODE(os.stat(token).st_mode) == 0o600
        # Another user: reaches a file of the parent (the switch of user works) ...
        control = base / "control.txt"
        control.write_text("readable")
        control.chmod(0o644)
        assert _as_nobody("cat", str(control)).stdout == "readable"
        # ... but neither lists the broker's folder nor reads a segment.
        for argv in (("ls", str(where)), ("cat", str(segments[0]))):
            denied = _as_nobody(*argv)
            assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied
    finally:
        stop_broker(str(where))
        shutil.rmtree(base)


def test_broker_killed_is_replaced_on_the_same_port_with_its_data(path: str) -> None:
    address = ensure_broker(path)
    with BrokerClient(address) as client:
        client.create_topic("survivor", 3)
    pid = broker_pid(path)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    assert broker_pid(path) is None

    assert ensure_broker(path) == address  # same port: clients keep their address
    new_pid = broker_pid(path)
    assert new_pid is not None and new_pid != pid
    with BrokerClient(address) as client:
        (topic,) = client.describe_topics(["survivor"])
        assert len(topic.partitions) == 3


def test_hung_broker_is_replaced(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "_PING_TIMEOUT_S", 0.5)
    monkeypatch.setattr(embedded, "_TERM_GRACE_S", 0.5)
    address = ensure_broker(path)
    pid = broker_pid(path)
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # alive, but answers nothing (and ignores SIGTERM)
    try:
        assert ensure_broker(path) == address
        new_pid = broker_pid(path)
        assert new_pid is not None and new_pid != pid
        assert not alive(pid)  # SIGKILLed before the new broker opened the data
        assert brokers_serving(path) == [new_pid]
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_concurrent_callers_get_exactly_one_broker(path: str) -> None:
    procs = [ensure_subprocess(path) for _ in range(2)]
    results: list[tuple[str, int | None]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def call() -> None:
        try:
            barrier.wait()
            address = ensure_broker(path)
            results.append((address, broker_pid(path)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(SUBPROCESS_TIMEOUT_S)
    results.extend(result_of(p) for p in procs)
    assert not errors, errors
    assert len(results) == 6
    assert len(set(results)) == 1, results
    (_, pid) = results[0]
    assert pid is not None
    assert brokers_serving(path) == [pid]
    starts = Path(path, LOG_FILE).read_text().count("embedded broker starting")
    assert starts == 1


def test_broker_that_cannot_start_raises_with_path_and_log(path: str) -> None:
    os.makedirs(path)
    Path(path, DATA_DIR).write_text("not a directory\n")  # log.dir unusable
    with pytest.raises(EmbeddedBrokerError) as info:
        ensure_broker(path)
    message = str(info.value)
    assert path in message
    assert LOG_FILE in message
    # The broker's own one-line failure, quoted from broker.log, names the key and cause.
    assert "log.dir=" in message and "File exists" in message
    assert info.value.retriable
    assert broker_pid(path) is None


def test_stop_broker_stops_it_once(path: str) -> None:
    ensure_broker(path)
    pid = broker_pid(path)
    assert pid is not None
    assert stop_broker(path) is True
    wait_gone(pid, timeout_s=5.0)  # stop_broker returned only once it was gone
    assert not alive(pid)
    assert broker_pid(path) is None
    assert "STOPPED" in Path(path, LOG_FILE).read_text()  # a clean shutdown, not a kill
    assert stop_broker(path) is False


def test_stop_broker_of_a_path_never_used(tmp_path: Path) -> None:
    assert stop_broker(str(tmp_path / "nothing-here")) is False


IMPOSTOR = "import sys; print('running', flush=True); sys.stdin.read()"


def impostor(path: str) -> subprocess.Popen[str]:
    """A live process whose command line names the broker module and this path's config,
    as a process that took a dead broker's pid might: it waits until its stdin closes."""
    config = os.path.join(os.path.abspath(path), CONFIG_FILE)
    proc = subprocess.Popen(
        [sys.executable, "-c", IMPOSTOR, "broker_core.cli.main", config],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    # Its first line says it runs (a process caught mid-exec shows an empty command line).
    assert proc.stdout is not None and proc.stdout.readline() == "running\n"
    return proc


def record_state(path: str, pid: int, create_time: float) -> None:
    os.makedirs(path, exist_ok=True)
    state = {"address": "127.0.0.1:1", "pid": pid, "port": None, "create_time": create_time}
    Path(path, embedded.STATE_FILE).write_text(json.dumps(state))


def test_recorded_pid_taken_by_another_process_is_never_signalled(path: str) -> None:
    other = impostor(path)
    try:
        created = psutil.Process(other.pid).create_time()
        # Same pid and command line, another create time: the broker is gone, its pid reused.
        record_state(path, other.pid, created - 60.0)
        assert broker_pid(path) is None
        address = ensure_broker(path)
        new_pid = broker_pid(path)
        assert new_pid is not None and new_pid != other.pid
        assert other.poll() is None  # not signalled
        with BrokerClient(address) as client:
            assert "broker_id" in client.ping()
    finally:
        other.kill()
        other.wait()


def test_recorded_process_with_its_create_time_is_the_broker(path: str) -> None:
    # The control of the test above: with the create time it had at launch, the recorded
    # process is taken for the (unanswering) broker and terminated before a new one starts.
    other = impostor(path)
    try:
        record_state(path, other.pid, psutil.Process(other.pid).create_time())
        assert broker_pid(path) == other.pid
        ensure_broker(path)
        assert other.wait(timeout=SUBPROCESS_TIMEOUT_S) == -signal.SIGTERM
        assert broker_pid(path) not in (None, other.pid)
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()


def test_recorded_zombie_counts_as_gone(path: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"], stdout=subprocess.PIPE)
    try:
        created = psutil.Process(child.pid).create_time()
        assert child.stdout is not None
        child.stdout.read()  # EOF: it is exiting; unreaped, it becomes a zombie
        # A zombie announces itself by no event: its status is polled.
        wait_until(
            lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE,
            f"child {child.pid} to become a zombie",
            timeout=30.0,
        )
        record_state(path, child.pid, created)
        assert broker_pid(path) is None
        assert stop_broker(path) is False
    finally:
        child.wait()


def test_lost_state_racing_callers_adopt_the_broker_holding_the_data(path: str) -> None:
    # broker.json gone while its broker runs: only the data directory's lock still says
    # who owns the data. Two processes racing to start the broker must both end on it.
    address = ensure_broker(path)
    pid = broker_pid(path)
    assert pid is not None
    embedded._forget(path)
    os.unlink(os.path.join(path, embedded.STATE_FILE))
    assert broker_pid(path) is None  # the recorded state no longer names it
    procs = [ensure_subprocess(path) for _ in range(2)]
    assert [result_of(p) for p in procs] == [(address, pid)] * 2
    assert brokers_serving(path) == [pid]
    assert broker_pid(path) == pid  # adopted: recorded again
    assert Path(path, LOG_FILE).read_text().count("embedded broker starting") == 1


def test_second_broker_refused_by_the_data_lock_makes_its_starter_adopt_the_holder(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check before a start can race a broker that takes the lock just after it; the
    # broker then started exits 2 on the lock, and its starter must use the holder, not
    # fail the job. The race is forced: the first check finds nothing.
    address = ensure_broker(path)
    pid = broker_pid(path)
    assert pid is not None
    embedded._forget(path)
    os.unlink(os.path.join(path, embedded.STATE_FILE))
    real = embedded._adopt_lock_holder
    calls: list[bool] = []

    def first_check_misses(*args: object) -> object:
        calls.append(True)
        return None if len(calls) == 1 else real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(embedded, "_adopt_lock_holder", first_check_misses)
    assert ensure_broker(path) == address
    assert len(calls) == 2
    log = Path(path, LOG_FILE).read_text()
    assert log.count("embedded broker starting") == 2  # the second one was started...
    assert f"LOG_DIR_LOCKED (10004): log.dir {os.path.join(path, DATA_DIR)}" in log
    assert f"locked by process {pid}" in log  # ...and refused, naming the holder
    assert brokers_serving(path) == [pid]
    assert broker_pid(path) == pid


IDLE_MS = 2000
TXN_TIMEOUT_MS = 4000
# A producer that opens a transaction, writes into it and then waits to be killed: its
# transaction stays open with no client left (until the coordinator's timeout aborts it).
OPEN_TRANSACTION_THEN_WAIT = (
    "import sys, time, pyarrow as pa\n"
    "from spark_sink.embedded import ensure_broker\n"
    "from broker_core.producer import Producer\n"
    "address = ensure_broker(sys.argv[1])\n"
    "producer = Producer(address, **{'transactional.id': 'left-open',"
    f" 'transaction.timeout.ms': {TXN_TIMEOUT_MS}}})\n"
    "producer.init_transactions()\n"
    "producer.begin_transaction()\n"
    "producer.send('idle', pa.table({'id': pa.array([1, 2, 3], pa.int64())}))\n"
    "producer.flush()\n"
    "print('OPEN', flush=True)\n"
    "time.sleep(600)\n"
)


def _log(path: str) -> str:
    return Path(path, LOG_FILE).read_text(errors="replace")


def test_an_idle_broker_stops_only_with_no_client_and_no_open_transaction(path: str) -> None:
    """``embedded.idle.shutdown.ms``: the broker stops cleanly once idle, never while a
    client holds a call open (a producer's stream) or a transaction is open (its producer
    SIGKILLed: no client at all), and the next caller starts it again on its data."""
    address = ensure_broker(path, idle_shutdown_ms=IDLE_MS)
    assert f"idle.shutdown.ms={IDLE_MS}" in Path(path, CONFIG_FILE).read_text()
    with BrokerClient(address) as client:
        client.create_topic("idle", 1, schema=pa.schema([("id", pa.int64())]))
    pid = broker_pid(path)
    assert pid is not None

    # A client at work: the producer's stream stays open, the broker with it.
    with Producer(address) as producer:
        producer.send("idle", pa.table({"id": pa.array([0], pa.int64())}))
        producer.flush()
        held = time.monotonic()
        while time.monotonic() - held < 3 * IDLE_MS / 1000:
            assert alive(pid), _log(path)[-2000:]
            time.sleep(0.1)  # a span in which the broker must NOT stop: nothing to wait on
        # A transaction opened by another process, which is then SIGKILLed: no client
        # left, and the broker must wait for the coordinator to abort it at its timeout.
        writer = subprocess.Popen(
            [sys.executable, "-c", OPEN_TRANSACTION_THEN_WAIT, path],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None
        line = writer.stdout.readline().strip()
        opened = time.monotonic()
        assert line == "OPEN", writer.stderr.read() if writer.stderr else ""
    writer.kill()
    writer.wait(SUBPROCESS_TIMEOUT_S)
    assert alive(pid) and broker_pid(path) == pid  # the same broker all along
    wait_gone(pid, timeout_s=60)
    stopped_after_s = time.monotonic() - opened
    log = _log(path)
    assert f"idle for idle.shutdown.ms={IDLE_MS}" in log and "STOPPED" in log, log[-3000:]
    # Not before the open transaction was aborted at its timeout.
    assert stopped_after_s >= TXN_TIMEOUT_MS / 1000, (stopped_after_s, log[-3000:])
    aborted = log.index("'left-open': transaction of producer id")
    assert aborted < log.index(f"idle for idle.shutdown.ms={IDLE_MS}"), log[-3000:]

    # The next caller starts it again, on the same port and data: row 0 committed, the
    # killed producer's rows aborted.
    assert ensure_broker(path, idle_shutdown_ms=IDLE_MS) == address
    assert broker_pid(path) not in (None, pid)
    with BrokerClient(address) as client:
        assert ids(client, "idle") == [0]
