"""Real broker processes for tests: ``idemlog broker start --config <file>`` in a subprocess.

A :class:`BrokerProcess` writes its config file (``listener.port=0`` unless given, so the
kernel picks a free port), starts the broker with ``python -m broker_core.cli.main``, and
returns once the broker printed ``LISTENING host:port`` -- the reader thread of its
stdout sets an event on that line (or on EOF, if the process died first), so start-up is
awaited, never slept for. stdout and stderr go to ``<name>.log``; :meth:`log_tail` shows
them in failure messages.

* :meth:`kill` sends a signal (SIGKILL by default) and reaps the process;
* :meth:`stop` is a clean SIGTERM shutdown;
* :meth:`restart` starts it again on the same ``log.dir`` and, by default, the same port,
  so clients holding the old address reconnect to the new process;
* ``env`` adds environment variables for one start (e.g. ``IDEMLOG_TEST_FAILPOINT``,
  which arms a failpoint only if the broker's config also has :data:`TEST_HOOKS`).

For a cluster, pass ``zookeeper.connect`` (e.g. ``zk_chroot.hosts``) and ``broker.id``
in ``config``, and request ``zk_chroot`` before ``broker_factory`` in the test's
arguments, so the brokers are killed before the chroot is deleted.

:class:`BrokerFactory` (fixture ``broker_factory``) creates brokers under a test's
tmp_path and kills whatever is still running at teardown, so no process outlives its
test; an ``atexit`` hook kills any left by an interrupted run. The fixtures
(``broker_factory``, ``broker``, ``client``) are registered for the whole suite by
``pytest_plugins`` in ``tests/conftest.py``: never import them into a test module.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.server.hooks import HOOKS_CLASS_KEY
from testkit.broker_failpoints import HOOKS_CLASS
from tests.harness.waiting import WaitTimeout, wait_until

# A broker's opt-in to the test hooks (broker_core.server.hooks): the testkit's failpoints,
# which a test that arms one adds to the broker's config, explicitly (docs/contributing.md).
TEST_HOOKS: dict[str, object] = {HOOKS_CLASS_KEY: HOOKS_CLASS}
REPO = Path(__file__).resolve().parents[2]
LISTENING = "LISTENING "
DEFAULT_START_TIMEOUT = 30.0
DEFAULT_STOP_TIMEOUT = 30.0


class BrokerHarnessError(RuntimeError):
    """The broker process did not start, stop or exit as the test expected."""


class BrokerProcess:
    def __init__(
        self,
        workdir: Path,
        config: Mapping[str, object] | None = None,
        *,
        name: str = "broker",
        extra_args: list[str] | None = None,
        launcher: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.config: dict[str, object] = {
            "listener.port": 0,
            "log.dir": str(self.workdir / f"{name}-data"),
        }
        self.config.update(config or {})
        self.extra_args = list(extra_args or [])  # e.g. ["--override", "key=value"]
        # Wraps the command line, e.g. ``Host.command``: the broker runs on a test-bed host.
        self.launcher = launcher
        self.raw_config: str | None = None  # written verbatim instead of ``config`` if set
        self.config_path = self.workdir / f"{name}.properties"
        self.log_path = self.workdir / f"{name}.log"
        self.host: str | None = None
        self.port: int | None = None
        self.process: subprocess.Popen[str] | None = None
        self.starts = 0
        self._listening = threading.Event()
        self._reader: threading.Thread | None = None
        self._log: IO[str] | None = None

    # -- addresses ---------------------------------------------------------------------------
    @property
    def address(self) -> str:
        if self.host is None or self.port is None:
            raise BrokerHarnessError(f"{self.name} has not printed its LISTENING line yet")
        return f"{self.host}:{self.port}"

    @property
    def log_dir(self) -> Path:
        return Path(str(self.config["log.dir"]))

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise BrokerHarnessError(f"{self.name} was never started")
        return self.process.pid

    # -- start -------------------------------------------------------------------------------
    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "broker_core.cli.main",
            "broker",
            "start",
            "--config",
            str(self.config_path),
            *self.extra_args,
        ]

    def write_config(self) -> None:
        if self.raw_config is not None:
            self.config_path.write_text(self.raw_config)
            return
        lines = [f"{k}={v}" for k, v in self.config.items()]
        self.config_path.write_text("\n".join(lines) + "\n")

    def spawn(self, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """Start the process without waiting for it (see :meth:`start`)."""
        if self.running:
            raise BrokerHarnessError(f"{self.name} is already running (pid {self.pid})")
        self.write_config()
        self._close_log()
        self._log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 -- kept open
        self._log.write(f"\n=== start {self.starts + 1}: {' '.join(self.command())}\n")
        self._log.flush()
        self._listening.clear()
        self.host = self.port = None
        full_env = dict(os.environ)
        full_env.pop("IDEMLOG_TEST_FAILPOINT", None)  # only ever set for one start
        full_env.update(env or {})
        command = self.command()
        self.process = subprocess.Popen(
            self.launcher(command) if self.launcher is not None else command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=REPO,
            env=full_env,
            start_new_session=True,  # a signal aimed at pytest does not hit the broker
        )
        _LIVE.add(self)
        self.starts += 1
        self._reader = threading.Thread(
            target=self._read_stdout, args=(self.process,), name=f"{self.name}-stdout", daemon=True
        )
        self._reader.start()
        return self.process

    def _read_stdout(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        log = self._log
        for line in process.stdout:
            if log is not None and not log.closed:
                log.write(f"[stdout] {line}")
                log.flush()
            if line.startswith(LISTENING) and not self._listening.is_set():
                host, _, port = line[len(LISTENING) :].strip().rpartition(":")
                self.host, self.port = host, int(port)
                self._listening.set()
        self._listening.set()  # EOF: the process is gone; start() reports it

    def start(
        self, env: Mapping[str, str] | None = None, timeout: float = DEFAULT_START_TIMEOUT
    ) -> str:
        """Start the broker and return ``host:port`` once it serves."""
        self.spawn(env)
        return self.start_wait(timeout)

    def start_wait(self, timeout: float = DEFAULT_START_TIMEOUT) -> str:
        """After :meth:`spawn`: ``host:port`` once the broker serves (brokers spawned
        together start side by side)."""
        process = self.process
        assert process is not None, "spawn() first"
        if not self._listening.wait(timeout):
            self.kill()
            raise BrokerHarnessError(
                f"{self.name} printed no LISTENING line within {timeout:.0f}s; log:\n"
                f"{self.log_tail()}"
            )
        if self.port is None:
            code = process.wait(timeout)
            raise BrokerHarnessError(
                f"{self.name} exited with status {code} during start-up; log:\n{self.log_tail()}"
            )
        return self.address

    def restart(
        self,
        env: Mapping[str, str] | None = None,
        *,
        same_port: bool = True,
        timeout: float = DEFAULT_START_TIMEOUT,
    ) -> str:
        """Start again on the same log.dir (the old process must be gone)."""
        if self.running:
            raise BrokerHarnessError(f"{self.name} is still running; kill or stop it first")
        if same_port and self.port is not None:
            self.config["listener.port"] = self.port
        return self.start(env, timeout)

    # -- stop --------------------------------------------------------------------------------
    def kill(self, sig: int = signal.SIGKILL, timeout: float = DEFAULT_STOP_TIMEOUT) -> int:
        """Send ``sig`` and wait for the process to exit; its exit status (-sig if killed)."""
        process = self.process
        if process is None:
            raise BrokerHarnessError(f"{self.name} was never started")
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
            raise BrokerHarnessError(
                f"{self.name} ignored signal {sig} for {timeout:.0f}s and was SIGKILLed; "
                f"log:\n{self.log_tail()}"
            ) from None
        self._join_reader()
        _LIVE.discard(self)
        return code

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> int:
        """Clean shutdown (SIGTERM); raises unless the broker exits with status 0."""
        code = self.kill(signal.SIGTERM, timeout)
        if code != 0:
            raise BrokerHarnessError(
                f"{self.name} exited with {code} after SIGTERM; log:\n{self.log_tail()}"
            )
        return code

    def wait_exit(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> int:
        """Wait for a process expected to exit on its own (e.g. a bad config)."""
        if self.process is None:
            raise BrokerHarnessError(f"{self.name} was never started")
        code = self.process.wait(timeout)
        self._join_reader()
        _LIVE.discard(self)
        return code

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(10)
            self._reader = None
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            with contextlib.suppress(Exception):
                self._log.close()
            self._log = None

    def close(self) -> None:
        """Teardown: SIGKILL if still running; never raises."""
        with contextlib.suppress(Exception):
            if self.running:
                self.kill(signal.SIGKILL)
        self._close_log()
        _LIVE.discard(self)

    # -- logs --------------------------------------------------------------------------------
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:]) or "(empty log)"

    def wait_for_log(self, text: str, timeout: float = 10.0) -> None:
        """Poll the log (a file written by another process, with a deadline) until
        ``text`` appears in it; raises :class:`BrokerHarnessError` with the log's tail."""
        try:
            wait_until(lambda: text in self.log_text(), f"{text!r} in the log", timeout=timeout)
        except WaitTimeout as exc:
            raise BrokerHarnessError(f"{self.name}: {exc}; log:\n{self.log_tail()}") from None


_LIVE: set[BrokerProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    # A test run interrupted before fixture teardown must not leave brokers behind.
    for broker in list(_LIVE):
        broker.close()


class BrokerFactory:
    """Creates brokers under one directory and kills every one of them at teardown."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.brokers: list[BrokerProcess] = []

    def __call__(
        self,
        config: Mapping[str, object] | None = None,
        *,
        name: str | None = None,
        start: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> BrokerProcess:
        broker = BrokerProcess(self.workdir, config, name=name or f"broker{len(self.brokers)}")
        self.brokers.append(broker)
        if start:
            broker.start(env)
        return broker

    def close(self) -> None:
        for broker in self.brokers:
            broker.close()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[BrokerFactory]:
    factory = BrokerFactory(tmp_path / "brokers")
    try:
        yield factory
    finally:
        factory.close()
        for broker in factory.brokers:
            # Shown by pytest when the test failed (captured output of the teardown).
            print(f"--- {broker.name} log tail ---\n{broker.log_tail(30)}")


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> BrokerProcess:
    """One real broker process (embedded mode) for the test."""
    return broker_factory()


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[BrokerClient]:
    """A client of :func:`broker`."""
    with BrokerClient(broker.address) as c:
        yield c
