"""The embedded default: a local broker started on first use, shared by everything after.

A Spark sink without a ``brokers`` option should work with no command run by hand. So the
first task (or driver-side commit) that needs a broker starts one -- ``python -m
broker_core.cli.main broker start`` serving ``<path>/data`` on 127.0.0.1 -- and every later
task, commit and Spark session on the same machine reuses it, because they all find it
through files under ``path`` (the sink option ``path``, default :data:`DEFAULT_PATH`):

* ``broker.lock``: an exclusive ``flock`` held over the whole check-and-start, so
  concurrent tasks, Python workers and drivers never start two brokers on one data
  directory (two processes appending to the same logs would corrupt them). The kernel
  drops the lock when its holder dies, so a killed task cannot wedge the others;
* ``broker.json``: ``{"address", "pid", "port", "create_time", "metrics"}`` of the
  broker last started (``metrics``: its Prometheus endpoint's ``host:port`` as bound, or
  null; see "Metrics endpoint" below). The pid is written as soon as the process exists,
  before it serves, so a broker whose starter was killed half-way is still found (and
  replaced) instead of left running beside a new one. A recorded process counts only
  while psutil finds it running (not a zombie) with the recorded create time and the
  broker's command line, so a pid reused by another process is never signalled;
* ``broker.properties``: the configuration written for each start;
* ``broker.log``: the broker's stdout and stderr, appended; quoted in errors;
* ``broker.token``: a random token the broker writes at each start, mode 0600, and
  requires on every call (``listener.token.file``, ``broker_core.security.local_token``):
  other local users, who cannot read it, are refused. Every process registers it for the
  broker's address before its first call (:func:`ensure_broker`), so every client of this
  process (the sink's tasks and driver, the readers) sends it;
* ``data/.lock``: the broker's own data-directory lock (docs/storage.md), held by the
  broker process for its life. It is the last word on which process owns the data: a
  broker running there that ``broker.json`` does not name (the file lost or rewritten, a
  broker started by hand on this config) is found through it and adopted, never joined
  by a second one; a second broker started anyway exits at once (status 2) and its
  starter adopts the holder instead of failing the job.

The broker runs in its own session (``start_new_session``) so it outlives the worker or
driver that happened to start it and is not killed with that process group. Readiness is
read from a pipe (``broker start --ready-fd``): the address, then EOF; EOF alone means
the broker died before serving. After a crash the next :func:`ensure_broker` starts a new
broker on the same port when it is free, so clients holding the address reconnect, and
on the same data directory, so topics and transactions survive.

Metrics endpoint: the sink option ``embedded.metrics.port`` (``metrics_port`` here; -1
none, the default; 0 any free port) becomes the broker's ``metrics.port`` when this
caller is the one that starts it. The broker logs the port it bound and sends it on the
ready pipe (``metrics host:port``), recorded in ``broker.json`` and in the broker's own
entry that ``idemlog broker list`` shows. A broker already running keeps what it was
started with: a caller asking for no endpoint (-1) takes it as it is; a caller asking
for one it does not have (none, or another port; 0 is satisfied by any) is refused with
InvalidConfigError naming the option, the running endpoint and how to restart the
broker, never silently given something else (docs/spark.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import psutil

import broker_core
from broker_core.client.broker_client import BrokerClient
from broker_core.errors import InvalidConfigError
from broker_core.security.local_token import (
    DEFAULT_EMBEDDED_DIR,
    EMBEDDED_STATE_FILE,
    EMBEDDED_TOKEN_FILE,
    TOKEN_FILE_KEY,
    register,
)
from spark_sink.embedded_process import KILL_WAIT_S as _KILL_WAIT_S
from spark_sink.embedded_process import POLL_S as _POLL_S
from spark_sink.embedded_process import listening_addresses as _listening_addresses
from spark_sink.embedded_process import lock_holder_once_exited as _lock_holder_once_exited
from spark_sink.embedded_process import read_until_eof as _read_until_eof
from spark_sink.embedded_process import running as _running
from spark_sink.embedded_process import same_time as _same_time
from spark_sink.embedded_process import terminate as _terminate
from spark_sink.embedded_process import wait_gone as _wait_gone
from spark_sink.errors import EmbeddedBrokerError

DEFAULT_PATH: str = DEFAULT_EMBEDDED_DIR
"""Default of the sink option ``path``: where the embedded broker keeps its files."""

LOCK_FILE = "broker.lock"
STATE_FILE = EMBEDDED_STATE_FILE
CONFIG_FILE = "broker.properties"
LOG_FILE = "broker.log"
TOKEN_FILE = EMBEDDED_TOKEN_FILE  # rewritten at each start, mode 0600 (local_token.py)
DATA_DIR = "data"

BROKER_MODULE = "broker_core.cli.main"
# Test hooks meant for one process must not leak into a broker that outlives the test.
_DROPPED_ENV = ("IDEMLOG_TEST_FAILPOINT", "IDEMLOG_SPARK_FAILPOINTS")
_PING_TIMEOUT_S = 5.0
_TERM_GRACE_S = 10.0  # a broker that answers no ping gets this long to shut down cleanly
_LOG_TAIL_LINES = 20
METRICS_OFF = -1  # metrics_port (the option embedded.metrics.port): no endpoint
METRICS_ANY_PORT = 0  # metrics_port: any free port, chosen by the broker
METRICS_OPTION = "embedded.metrics.port"
# The sink option: the broker's idle.shutdown.ms when a caller starts it (0: never stops).
IDLE_SHUTDOWN_OPTION = "embedded.idle.shutdown.ms"
IDLE_SHUTDOWN_DEFAULT_MS = 30 * 60 * 1000
# The ready pipe's optional second line (broker_core.cli.broker_cmd.READY_METRICS).
_READY_METRICS = "metrics"

# path -> (address, process, client, metrics): a process that already found the broker checks it
# with one ping over a kept connection instead of taking the file lock and reading files.
_cache: dict[str, tuple[str, psutil.Process, BrokerClient, str | None]] = {}
_cache_lock = threading.Lock()


class _State(NamedTuple):
    """broker.json: the broker last started for a path."""

    address: str | None  # None while it starts (or if it never served)
    pid: int
    port: int | None  # the port to ask for again at a restart; None: any free one
    # psutil's create time of the process, recorded at launch: a pid alone may be reused.
    create_time: float | None = None  # None in a broker.json from before it was recorded
    metrics: str | None = None  # host:port of its metrics endpoint; None: none (or unknown)


# -- public API ------------------------------------------------------------------------------
def ensure_broker(
    path: str,
    *,
    metrics_port: int = METRICS_OFF,
    idle_shutdown_ms: int = IDLE_SHUTDOWN_DEFAULT_MS,
    start_timeout_s: float = 60.0,
) -> str:
    """``host:port`` of a live broker serving ``<path>/data``, started if none is running.

    Safe to call from any number of threads and processes at once: one broker results.
    ``metrics_port`` is the broker's ``metrics.port`` if this call starts it (-1: no
    endpoint; 0: any free port), ``idle_shutdown_ms`` its ``idle.shutdown.ms`` (it stops
    after that long with no call and no open transaction; 0: never; a running broker
    keeps what it started with). ``start_timeout_s`` bounds each start attempt (a broker
    recovering a large log after a crash takes a while before it serves). Raises
    :class:`EmbeddedBrokerError` if the broker cannot be started, InvalidConfigError if
    the running one lacks the metrics endpoint asked for (see the module's docstring).
    """
    path = os.path.abspath(path)
    cached = _cached_address(path)
    if cached is not None:
        _check_metrics(path, metrics_port, *cached)
        return cached[0]
    _private_dir(path)
    with _locked(path):
        config_path = os.path.join(path, CONFIG_FILE)
        state = _read_state(path)
        previous_port: int | None = None
        if state is not None:
            recorded, previous_port = state.address, state.port
            proc = _broker_process(state, config_path)
            if proc is not None:
                client = _answering_client(recorded, path) if recorded else None
                if recorded and client is not None:
                    _remember(path, recorded, proc, client, state.metrics)
                    _check_metrics(path, metrics_port, recorded, state.metrics)
                    return recorded
                # Alive but not answering (hung, or never got to serve): it holds the data
                # directory, so it must be gone before another broker opens it.
                _terminate(proc, _TERM_GRACE_S)
        adopted = _adopt_lock_holder(path, config_path, start_timeout_s)
        address, proc, metrics = adopted or _start(
            path, previous_port, _Settings(metrics_port, idle_shutdown_ms), start_timeout_s
        )
        register(address, token_file(path))
        client = BrokerClient(address, timeout_s=_PING_TIMEOUT_S)
        _remember(path, address, proc, client, metrics)
        _check_metrics(path, metrics_port, address, metrics)
        return address


def metrics_address(path: str) -> str | None:
    """``host:port`` of the Prometheus endpoint of the embedded broker recorded for
    ``path`` (``broker.json``) if that broker is alive and serves one; None otherwise."""
    path = os.path.abspath(path)
    state = _read_state(path)
    if state is None or _broker_process(state, os.path.join(path, CONFIG_FILE)) is None:
        return None
    return state.metrics


def _check_metrics(path: str, wanted: int, address: str, running: str | None) -> None:
    """Refuse a caller whose ``embedded.metrics.port`` the running broker does not honour:
    InvalidConfigError naming the option, what runs and the way out. -1 (no wish) takes
    any broker; 0 takes any endpoint; a port takes that port only."""
    if wanted == METRICS_OFF:
        return
    if running is not None and (
        wanted == METRICS_ANY_PORT or running.rpartition(":")[2] == str(wanted)
    ):
        return
    has = f"its metrics endpoint at {running}" if running else "no metrics endpoint"
    raise InvalidConfigError(
        f"option {METRICS_OPTION!r}={wanted}: the embedded broker of {path} already runs "
        f"at {address} with {has} (it keeps the settings it started with); use "
        f"{'that endpoint' if running else f'{METRICS_OPTION}=-1'}, or stop it "
        f"(idemlog broker stop --log-dir {os.path.join(path, DATA_DIR)}) so that the next "
        "start takes this option"
    )


def stop_broker(path: str, timeout_s: float = 30.0) -> bool:
    """Stop the broker serving ``path`` (SIGTERM: a clean shutdown; SIGKILL after
    ``timeout_s``) and forget it. Returns whether one was running. Raises
    :class:`EmbeddedBrokerError` if the broker survives SIGKILL."""
    path = os.path.abspath(path)
    _forget(path)
    if not os.path.isdir(path):
        return False
    with _locked(path):
        state = _read_state(path)
        running = False
        if state is not None:
            proc = _broker_process(state, os.path.join(path, CONFIG_FILE))
            running = proc is not None
            if proc is not None:
                _terminate(proc, timeout_s)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, STATE_FILE))
        return running


def broker_pid(path: str) -> int | None:
    """The pid of the broker recorded for ``path`` if that process is alive and is the
    broker (not a reused pid); None otherwise."""
    path = os.path.abspath(path)
    state = _read_state(path)
    if state is None:
        return None
    proc = _broker_process(state, os.path.join(path, CONFIG_FILE))
    return None if proc is None else proc.pid


def token_file(path: str) -> str:
    """The token file of the embedded broker of ``path`` (the sink option)."""
    return os.path.join(os.path.abspath(path), TOKEN_FILE)


# -- in-process cache ------------------------------------------------------------------------
def _cached_address(path: str) -> tuple[str, str | None] | None:
    """(address, metrics endpoint) of the broker this process found before, if it still
    answers; None otherwise (forgotten)."""
    with _cache_lock:
        entry = _cache.get(path)
    if entry is None:
        return None
    address, proc, client, metrics = entry
    if _running(proc) and _ping(client):
        return address, metrics
    _forget(path)
    return None


def _remember(
    path: str, address: str, proc: psutil.Process, client: BrokerClient, metrics: str | None
) -> None:
    with _cache_lock:
        old = _cache.get(path)
        _cache[path] = (address, proc, client, metrics)
    if old is not None and old[2] is not client:
        old[2].close()


def _forget(path: str) -> None:
    with _cache_lock:
        entry = _cache.pop(path, None)
    if entry is not None:
        entry[2].close()


# -- files -----------------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    # flock, not a lock file's existence: the kernel releases it when the holder dies.
    # Each call opens its own descriptor, so threads of one process exclude each other too.
    # os.open's descriptor is not inherited (O_CLOEXEC), so the broker never holds the lock.
    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _read_state(path: str) -> _State | None:
    """broker.json; None if missing or unreadable (a state we cannot read is one we
    cannot trust)."""
    try:
        with open(os.path.join(path, STATE_FILE)) as f:
            doc = json.load(f)
        pid = int(doc["pid"])
        address = doc.get("address")
        port = doc.get("port")
        created = doc.get("create_time")
        create_time = None if created is None else float(created)
        metrics = doc.get("metrics")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid <= 0:
        return None
    return _State(
        str(address) if address else None,
        pid,
        port if isinstance(port, int) and port > 0 else None,
        create_time,
        str(metrics) if metrics else None,
    )


def _write_state(path: str, state: _State) -> None:
    # Write then rename: a reader (or a crash) never sees a half-written file.
    target = os.path.join(path, STATE_FILE)
    tmp = f"{target}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(state._asdict(), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)


class _Settings(NamedTuple):
    """What a start writes into the broker's config besides its port."""

    metrics_port: int  # metrics.port
    idle_shutdown_ms: int  # idle.shutdown.ms


def _write_config(path: str, port: int, settings: _Settings) -> str:
    config_path = os.path.join(path, CONFIG_FILE)
    lines = [
        "# Written by spark_sink.embedded for each start of the embedded broker.",
        f"log.dir={os.path.join(path, DATA_DIR)}",
        "listener.host=127.0.0.1",
        f"listener.port={port}",
        # Only this user's processes can read it, so only they can call the broker.
        f"{TOKEN_FILE_KEY}={token_file(path)}",
        # The endpoint binds 127.0.0.1 (metrics.host's default), as the listener does.
        f"metrics.port={settings.metrics_port}",
        # Nobody stops the embedded broker by hand: it stops once idle, the next job
        # starts it again (broker_core/server/process/idle.py).
        f"idle.shutdown.ms={settings.idle_shutdown_ms}",
    ]
    with open(config_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return config_path


def _log_tail(path: str, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with open(os.path.join(path, LOG_FILE), errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip("\n")
    except OSError as exc:
        return f"(no log: {exc})"


# -- processes -------------------------------------------------------------------------------
def _broker_process(state: _State, config_path: str) -> psutil.Process | None:
    """The live process recorded in ``state`` if it is this path's broker; None otherwise.

    After a reboot or a long time the recorded pid may belong to anything, which must not
    be signalled: the process must have the create time recorded at launch (pid reuse)
    and run ``broker_core.cli.main`` with this path's config. A ``broker.json`` written
    before create times were recorded is judged by the command line alone.
    """
    try:
        proc = psutil.Process(state.pid)
        if state.create_time is not None and not _same_time(proc.create_time(), state.create_time):
            return None  # the pid was reused
        args = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    if BROKER_MODULE not in args or config_path not in args:
        return None
    return proc if _running(proc) else None


def _answering_client(address: str, path: str) -> BrokerClient | None:
    """A client of ``address`` if the broker there answers a ping; None otherwise. The
    calls carry ``path``'s token from here on (registered first)."""
    register(address, token_file(path))
    try:
        client = BrokerClient(address, timeout_s=_PING_TIMEOUT_S)
    except Exception:  # a malformed address in broker.json: no broker there
        return None
    if _ping(client):
        return client
    client.close()
    return None


def _ping(client: BrokerClient) -> bool:
    try:
        client.ping()
    except Exception:  # any failure (network, timeout, garbage) means: not usable
        return False
    return True


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    # The broker runs with cwd=path; make sure it imports the same broker_core as this
    # process even when that is not installed (a checkout, a zip shipped to executors).
    root = os.path.dirname(os.path.dirname(os.path.abspath(broker_core.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


_Started = tuple[str, psutil.Process, str | None]  # address, process, metrics endpoint


def _private_dir(path: str) -> None:
    """``path`` created 0700, or narrowed to it when this user owns it: the broker's rows,
    token and state live under it, and other local users must not read them even where
    a parent (a 0755 home, ``/tmp``) lets them through (docs/security.md)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_mode & 0o077 and st.st_uid == os.geteuid():
        os.chmod(path, 0o700)


def _start(path: str, previous_port: int | None, settings: _Settings, timeout_s: float) -> _Started:
    """Start a broker (on ``previous_port`` if given, so old addresses stay valid; on a
    free port if that fails; with ``settings``) and return its address,
    process and metrics endpoint. Called with the lock held."""
    started = _launch(path, previous_port or 0, settings, timeout_s)
    if started is None:
        # Refused because a broker holds the data directory (it exits 2 at once)? Use it.
        started = _adopt_lock_holder(path, os.path.join(path, CONFIG_FILE), timeout_s)
    if started is None and previous_port:
        started = _launch(path, 0, settings, timeout_s)  # the old port may be taken
    if started is None:
        raise EmbeddedBrokerError(
            f"the embedded broker for {path} exited before serving; "
            f"last lines of {os.path.join(path, LOG_FILE)}:\n{_log_tail(path)}"
        )
    return started


def _launch(path: str, port: int, settings: _Settings, timeout_s: float) -> _Started | None:
    """One start attempt: ``(address, process, metrics endpoint)``, or None if the broker
    died before serving."""
    config_path = _write_config(path, port, settings)
    log_path = os.path.join(path, LOG_FILE)
    read_fd, write_fd = os.pipe()
    try:
        with open(log_path, "ab") as log:
            log.write(
                f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} embedded broker starting "
                f"(port {port}) by pid {os.getpid()}\n".encode()
            )
            log.flush()
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    BROKER_MODULE,
                    "broker",
                    "start",
                    "--config",
                    config_path,
                    "--ready-fd",
                    str(write_fd),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=path,
                env=_child_env(),
                # Every file and folder it makes is its owner's only (0600, 0700).
                umask=0o077,
                pass_fds=(write_fd,),
                close_fds=True,
                # Its own session: the broker outlives the worker or driver that started it
                # and is not killed with that process group.
                start_new_session=True,
            )
    finally:
        os.close(write_fd)  # only the broker holds it now, so its exit means EOF
    # Looked up before the reaper can reap it: until then even an exited child keeps its
    # pid, so this is the broker's create time, never another process's.
    broker = psutil.Process(proc.pid)
    state = _State(None, proc.pid, port or None, broker.create_time())
    # Our child for as long as we live: reap it when it exits so no zombie lingers.
    threading.Thread(
        target=proc.wait, name=f"idemlog-embedded-reaper-{proc.pid}", daemon=True
    ).start()
    # Recorded before it serves: if this process dies while waiting, the next caller finds
    # this pid (ours, not answering) and stops it rather than start a second broker.
    _write_state(path, state)
    try:
        received = _read_until_eof(read_fd, timeout_s)
    finally:
        os.close(read_fd)
    if received is None:
        proc.kill()
        _wait_gone(broker, _KILL_WAIT_S)
        raise EmbeddedBrokerError(
            f"the embedded broker for {path} did not serve within {timeout_s:g} s "
            f"(killed); last lines of {log_path}:\n{_log_tail(path)}"
        )
    lines = received.splitlines()
    address = lines[0].strip() if lines else ""
    if not address:
        # Died before serving: let it finish writing its last words before they are read.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_KILL_WAIT_S)
        return None
    bound_port = int(address.rpartition(":")[2])
    metrics = next(
        (
            rest.strip()
            for kind, _, rest in (x.partition(" ") for x in lines[1:])
            if kind == _READY_METRICS
        ),
        None,
    )
    _write_state(path, state._replace(address=address, port=bound_port, metrics=metrics))
    return address, broker, metrics


def _adopt_lock_holder(path: str, config_path: str, timeout_s: float) -> _Started | None:
    """The broker holding ``<path>/data``'s lock, recorded in ``broker.json``, if one does
    and answers within ``timeout_s`` (it may still be recovering); None if none holds it.

    Called with ``broker.lock`` held, when ``broker.json`` names no live broker: the data
    directory's lock still says whether one runs there. A holder that is this path's
    broker but never answers is terminated (as a hung recorded one is) and None is
    returned; a holder that is not this path's broker raises EmbeddedBrokerError naming
    it, since no broker can open the directory while it lives. Its metrics endpoint, if
    any, is not known here (recorded as none).
    """
    data_dir = os.path.join(path, DATA_DIR)
    holder = _lock_holder_once_exited(Path(data_dir))
    if holder is None:
        return None
    proc = None
    if holder > 0:
        with contextlib.suppress(psutil.Error):
            candidate = psutil.Process(holder)
            state = _State(None, holder, None, candidate.create_time())
            proc = _broker_process(state, config_path)
    if proc is None:
        raise EmbeddedBrokerError(
            f"the embedded broker's data directory {data_dir} is locked by "
            f"{f'process {holder}' if holder > 0 else 'an unknown process'}, which is not "
            f"the broker of {config_path}; stop it, then retry"
        )
    deadline = time.monotonic() + timeout_s
    while _running(proc):
        for address in _listening_addresses(proc):
            client = _answering_client(address, path)
            if client is not None:
                client.close()
                port = int(address.rpartition(":")[2])
                _write_state(path, _State(address, proc.pid, port, proc.create_time()))
                return address, proc, None
        if time.monotonic() >= deadline:
            _terminate(proc, _TERM_GRACE_S)  # holds the data but never serves: as a hung one
            return None
        time.sleep(_POLL_S * 10)  # another process's start: no event to wait on
    return None
