"""Which brokers run on this host: one small file per broker started by ``idemlog broker
start`` (as Spark's embedded broker is too), for ``idemlog broker list|stop``.

A broker writes ``<registry>/<pid>.json`` once it serves and removes it at its clean
stop; a broker that crashed leaves its file, which the next listing reports as ``stale``
and removes (as does the next broker's start). Bound: one file per live broker, plus one
per broker that died since the last listing or start. The directory is
``$IDEMLOG_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/idemlog/brokers``, else
``<tmp>/idemlog-<uid>/brokers``; mode 0700, one user's brokers only.

A recorded process counts as the broker only while it runs with the recorded create time
(a pid reused by another process is never signalled); signals go through a pidfd opened
after that check, so they reach that process or none (docs/broker.md, "Brokers on this
host").
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any

import psutil

from broker_core.cli.failures import Unreachable
from broker_core.security.local_token import (
    EMBEDDED_STATE_FILE,
    discover_embedded,
    embedded_record,
)

REGISTRY_ENV = "IDEMLOG_RUNTIME_DIR"
# spark_sink.embedded's files next to the config it writes (read, never written, here).
_SPARK_STATE_FILE = EMBEDDED_STATE_FILE
_CREATE_TIME_TOLERANCE_S = 0.001  # psutil's create time after a round trip through JSON


def registry_dir() -> Path:
    """Where this user's brokers register (see the module's docstring)."""
    explicit = os.environ.get(REGISTRY_ENV)
    if explicit:
        return Path(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "idemlog" / "brokers"
    return Path(tempfile.gettempdir()) / f"idemlog-{os.getuid()}" / "brokers"


class Liveness(Enum):
    ALIVE = "alive"
    STALE = "stale"  # the recorded process is gone (crashed, killed) or its pid reused


@dataclass(frozen=True, slots=True)
class RegisteredBroker:
    """One registered broker, as ``idemlog broker list --json`` prints it."""

    pid: int
    address: str
    log_dir: str
    mode: str  # "embedded" (no ZooKeeper) or "zookeeper"
    started_by: str  # "spark" (spark_sink.embedded's broker.json names it) or "idemlog"
    started_at: str  # ISO 8601, UTC
    config: str
    create_time: float
    status: Liveness
    # host:port of its Prometheus endpoint (metrics.port, the port bound); None: no
    # endpoint, or a broker registered before the endpoint was recorded.
    metrics: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "address": self.address,
            "log_dir": self.log_dir,
            "mode": self.mode,
            "started_by": self.started_by,
            "started_at": self.started_at,
            "config": self.config,
            "status": self.status.value,
            "metrics": self.metrics,
        }


def register(
    *, address: str, log_dir: Path, zookeeper: bool, config: str, metrics: str | None = None
) -> Path:
    """Record this process as a serving broker (``metrics``: its Prometheus endpoint's
    host:port, if it serves one); returns the file (removed by :func:`unregister`).
    Raises OSError if the directory cannot be written."""
    directory = registry_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    list_brokers(prune=True)  # each start also drops files of brokers that died
    pid = os.getpid()
    doc = {
        "pid": pid,
        "create_time": psutil.Process(pid).create_time(),
        "address": address,
        "log_dir": str(Path(log_dir).absolute()),
        "mode": "zookeeper" if zookeeper else "embedded",
        "config": str(Path(config).absolute()),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "metrics": metrics,
    }
    target = directory / f"{pid}.json"
    tmp = directory / f".{pid}.json.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, target)  # a reader never sees half a file
    return target


def unregister(entry: Path) -> None:
    """Remove this broker's file (at its clean stop); a file already gone is fine."""
    with contextlib.suppress(FileNotFoundError):
        entry.unlink()


def _process(pid: int, create_time: float | None) -> psutil.Process | None:
    """The live process ``pid`` if it is the one recorded (same create time, no zombie;
    any process of that pid when no create time was recorded)."""
    try:
        proc = psutil.Process(pid)
        if (
            create_time is not None
            and abs(proc.create_time() - create_time) >= _CREATE_TIME_TOLERANCE_S
        ):
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return proc


def _started_by(config: str, pid: int) -> str:
    state = Path(config).parent / _SPARK_STATE_FILE
    try:
        if int(json.loads(state.read_text())["pid"]) == pid:
            return "spark"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return "idemlog"


def list_brokers(*, prune: bool = True) -> list[RegisteredBroker]:
    """Every registered broker, by start time, each ``alive`` or ``stale``; ``prune``
    removes the stale files after reading them (they are reported this once). Files that
    cannot be parsed are skipped (and pruned): they name no broker."""
    directory = registry_dir()
    if not directory.is_dir():
        return []
    found = []
    for path in sorted(directory.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
            pid, create_time = int(doc["pid"]), float(doc["create_time"])
            config = str(doc["config"])
            entry = RegisteredBroker(
                pid=pid,
                address=str(doc["address"]),
                log_dir=str(doc["log_dir"]),
                mode=str(doc["mode"]),
                started_by=_started_by(config, pid),
                started_at=str(doc["started_at"]),
                config=config,
                create_time=create_time,
                status=Liveness.ALIVE if _process(pid, create_time) else Liveness.STALE,
                metrics=str(doc["metrics"]) if doc.get("metrics") else None,
            )
        except FileNotFoundError:
            continue  # removed by its broker's clean stop meanwhile
        except (OSError, ValueError, KeyError, TypeError):
            if prune:
                unregister(path)
            continue
        if entry.status is Liveness.STALE and prune:
            unregister(path)
        found.append(entry)
    return sorted(found, key=lambda b: (b.started_at, b.pid))


def embedded_bootstrap(path: str) -> str:
    """The address of the embedded broker serving the directory ``path`` (the Spark option
    ``path``, as ``--path``), its token registered for this process's calls. Raises
    Unreachable naming ``--path`` when no broker has served there or the one recorded in
    its state file no longer runs (a pid reused by another process counts as gone)."""
    record = embedded_record(path)
    if record is None or record.address is None:
        raise Unreachable(
            f"--path {path}: no embedded broker runs there (no address in "
            f"{Path(path) / EMBEDDED_STATE_FILE}: none started there, or it was stopped); "
            f"a Spark job with the option path={path} starts one"
        )
    if _process(record.pid, record.create_time) is None:
        raise Unreachable(
            f"--path {path}: its embedded broker (pid {record.pid}, {record.address}) is not "
            f"running; the next Spark job with the option path={path} starts it again"
        )
    discover_embedded(record.address, path)
    return record.address


class StopOutcome(Enum):
    STOPPED = "stopped"  # exited after SIGTERM within the timeout (a clean shutdown)
    KILLED = "killed"  # still there after the timeout: SIGKILLed
    GONE = "gone"  # not running when asked (a stale entry, removed)


def stop(broker: RegisteredBroker, timeout_s: float, kill_wait_s: float = 10.0) -> StopOutcome:
    """SIGTERM the broker (it flushes, snapshots and unregisters), SIGKILL it if it is
    still there after ``timeout_s``, as the embedded supervisor does; returns once it is
    gone. Raises TimeoutError naming the pid if it survives SIGKILL for ``kill_wait_s``."""
    entry = registry_dir() / f"{broker.pid}.json"
    proc = _process(broker.pid, broker.create_time)
    if proc is None:
        unregister(entry)
        return StopOutcome.GONE
    try:
        pidfd = os.pidfd_open(broker.pid)
    except ProcessLookupError:
        unregister(entry)
        return StopOutcome.GONE
    try:
        # Checked again with the pidfd held: signals now reach this process or nothing.
        if _process(broker.pid, broker.create_time) is None:
            unregister(entry)
            return StopOutcome.GONE
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        if _exited(pidfd, timeout_s):
            outcome = StopOutcome.STOPPED
        else:
            # A stopped (SIGSTOP) or hung broker: SIGKILL works on it regardless.
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            if not _exited(pidfd, kill_wait_s):
                raise TimeoutError(f"pid {broker.pid} still runs {kill_wait_s:g} s after SIGKILL")
            outcome = StopOutcome.KILLED
    finally:
        os.close(pidfd)
    unregister(entry)  # a killed broker could not remove its own
    return outcome


def _exited(pidfd: int, timeout_s: float) -> bool:
    """Whether the process exited within ``timeout_s``: its pidfd becomes readable when
    it exits (reaped or not), so no polling of a process that is not our child."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        readable, _, _ = select.select([pidfd], [], [], max(left, 0))
        if readable:
            return True
        if left <= 0:
            return False
