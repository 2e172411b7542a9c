"""A real ZooKeeper server for tests and benchmarks, run from the Debian ``zookeeper`` package.

Modelled on kazoo's own testing harness (``kazoo/testing``), reduced to what idemlog needs:
one standalone server per test session on a free loopback port, a unique chroot per test,
and the failures the code under test must survive, produced for real rather than mocked:

* :meth:`ZooKeeperHarness.expire_session` -- a second client takes over the session and
  closes it, so the server really expires it (the way kazoo's harness has always done it);
* :meth:`ZooKeeperHarness.session_expired` -- the same, but the client is held in its
  expired state until the ``with`` block ends;
* :meth:`ZooKeeperHarness.drop_connection` -- the client's socket is shut down, so it goes
  SUSPENDED and reconnects on the same session;
* :meth:`ZooKeeperHarness.stop_server` / :meth:`ZooKeeperHarness.start_server` --
  ZooKeeper unavailable, then back on the same port with the same data.

The server is ``java -cp <classpath> org.apache.zookeeper.server.ZooKeeperServerMain
zoo.cfg``. Debian ships the jars in /usr/share/java; ``zookeeper.jar``'s manifest names
its dependencies, so the classpath only needs the server jar, the jute jar and an SLF4J
binding (without one the server logs nothing). ``ZOOKEEPER_CLASSPATH`` overrides the search.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import KazooState

__all__ = [
    "INSTALL_HINT",
    "ZooKeeperHarness",
    "ZooKeeperHarnessError",
    "ZooKeeperServer",
    "find_java",
    "zookeeper_classpath",
]

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
INSTALL_HINT = (
    "run `apt-get install zookeeper` (Debian/Ubuntu: it installs the server jars into "
    "/usr/share/java), or point ZOOKEEPER_CLASSPATH at the ZooKeeper server jars"
)
# Where the jars live: the Debian package (/usr/share/java), and an Apache tarball unpacked
# at /usr/share/zookeeper (zookeeper-3.x.jar plus lib/*.jar).
JAR_DIRS = (Path("/usr/share/zookeeper"), Path("/usr/share/zookeeper/lib"), Path("/usr/share/java"))
LOOPBACK = "127.0.0.1"

# Client settings for tests: reconnect quickly once the server is back instead of kazoo's
# default backoff of up to a minute, which would make stop/start tests slow and flaky.
FAST_RECONNECT: dict[str, Any] = {
    "max_tries": -1,
    "delay": 0.05,
    "backoff": 1.5,
    "max_delay": 0.5,
    "max_jitter": 0.2,
}
DEFAULT_SESSION_TIMEOUT = 10.0


class ZooKeeperHarnessError(RuntimeError):
    """The test ZooKeeper could not be found, started, stopped or driven as asked."""


def find_java() -> str:
    """The ``java`` executable: ``$JAVA_HOME/bin/java`` if set, else ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home, "bin", "java"), os.X_OK):
        return str(Path(java_home, "bin", "java"))
    java = shutil.which("java")
    if java is None:
        raise ZooKeeperHarnessError(
            "no `java` found (JAVA_HOME unset and none on PATH); the ZooKeeper tests run a "
            f"real ZooKeeper server: {INSTALL_HINT} (it pulls in a JRE)"
        )
    return java


def _first_existing(patterns: list[str]) -> Path | None:
    for pattern in patterns:
        for match in sorted(glob.glob(pattern)):
            if Path(match).is_file():
                return Path(match)
    return None


def zookeeper_classpath() -> str:
    """The classpath of a standalone ZooKeeper server; fails loudly if the jars are missing."""
    override = os.environ.get("ZOOKEEPER_CLASSPATH")
    if override:
        return override
    jars: list[Path] = []
    for name in ("zookeeper", "zookeeper-jute"):
        jar = _first_existing(
            [str(d / f"{name}.jar") for d in JAR_DIRS]
            # Versioned names (zookeeper-3.8.0.jar), but not zookeeper-jute-* for "zookeeper".
            + [str(d / f"{name}-[0-9]*.jar") for d in JAR_DIRS]
        )
        if jar is None:
            searched = ", ".join(str(d) for d in JAR_DIRS)
            raise ZooKeeperHarnessError(
                f"ZooKeeper jar {name}.jar not found in {searched}: the ZooKeeper tests need "
                f"a real ZooKeeper server; {INSTALL_HINT}"
            )
        jars.append(jar)
    # A tarball layout keeps the dependencies in lib/; Debian's manifest Class-Path covers them.
    lib = Path("/usr/share/zookeeper/lib")
    if lib.is_dir():
        jars.extend(sorted(lib.glob("*.jar")))
    # slf4j-simple makes the server log to stderr, which is how start-up failures get explained.
    for optional in ("slf4j-api", "slf4j-simple"):
        jar = _first_existing([str(Path("/usr/share/java") / f"{optional}.jar")])
        if jar is not None:
            jars.append(jar)
    return os.pathsep.join(dict.fromkeys(str(j) for j in jars))


def free_loopback_port() -> int:
    """A port nobody listens on right now (the kernel's pick for a bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def four_letter_word(host: str, port: int, word: str, timeout: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command and return the whole reply ('' on no answer)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(word.encode("ascii"))
            chunks: list[bytes] = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
    except OSError:
        return ""
    return b"".join(chunks).decode("utf-8", "replace")


class ZooKeeperServer:
    """One standalone ZooKeeper server process with its own config, data dir and log.

    ``start()`` and ``stop()`` may be called repeatedly: the port and the data directory are
    kept, so a restart brings back the same znodes and the same live sessions.
    """

    def __init__(
        self,
        base_dir: Path,
        *,
        startup_timeout: float = 20.0,
        stop_timeout: float = 10.0,
        tick_time_ms: int = 200,
        force_sync: bool = False,
        host: str = LOOPBACK,
        port: int | None = None,
        launcher: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        """``host``/``port``: where it listens (default: loopback, a free port chosen at
        the first start). ``launcher`` wraps the command line, e.g. ``Host.command`` of the
        multi-host test bed to run the server on a host of its own."""
        self.base_dir = Path(base_dir)
        self.data_dir = self.base_dir / "data"
        self.config_path = self.base_dir / "zoo.cfg"
        self.log_path = self.base_dir / "zookeeper.log"
        self.host = host
        self.port: int | None = port
        self.launcher = launcher
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.tick_time_ms = tick_time_ms
        self.force_sync = force_sync
        self.start_count = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._atexit_registered = False

    @property
    def address(self) -> str:
        """``host:port`` of the client port (no chroot)."""
        if self.port is None:
            raise ZooKeeperHarnessError("the ZooKeeper server was never started")
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self.running and self._process is not None else None

    def command(self) -> list[str]:
        """The exact command line used to run the server (for CI scripts and error messages)."""
        return [
            find_java(),
            # A small heap, client JIT only and serial GC: the test server holds a few
            # hundred znodes, and these roughly halve JVM start-up on a 2-core machine.
            "-Xms32m",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Xshare:auto",
            "-Djava.awt.headless=true",
            "-Dzookeeper.admin.enableServer=false",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-cp",
            zookeeper_classpath(),
            MAIN_CLASS,
            str(self.config_path),
        ]

    def _write_config(self) -> None:
        assert self.port is not None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"tickTime={self.tick_time_ms}",
            f"dataDir={self.data_dir}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            # Explicit bounds, so a test asking for a short or long session gets it.
            "minSessionTimeout=1000",
            "maxSessionTimeout=60000",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat,cons,mntr,dump",
            # Sessions survive a stop/start only if the server keeps them in its data dir,
            # which it always does; forceSync only decides whether each write is fsynced.
            f"forceSync={'yes' if self.force_sync else 'no'}",
            "autopurge.purgeInterval=0",
        ]
        self.config_path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def log_tail(self, lines: int = 60) -> str:
        """The last ``lines`` lines of the server's stdout/stderr log."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return "(no server log written)"
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> None:
        """Start the server (no-op if running) and return once it serves requests."""
        if self.running:
            return
        command = self.command()  # resolves java and the jars first: fail before any work
        if self.launcher is not None:
            command = self.launcher(command)
        first_start = self.port is None
        # Binding port 0 and handing the number to Java leaves a small window in which
        # another process may take it; on the first start a fresh port is simply tried again.
        attempts = 3 if first_start else 1
        for attempt in range(1, attempts + 1):
            if first_start:
                self.port = free_loopback_port()
            self._write_config()
            try:
                self._spawn_and_wait(command)
                break
            except ZooKeeperHarnessError:
                if attempt == attempts or "Address already in use" not in self.log_tail(200):
                    raise
        self.start_count += 1
        if not self._atexit_registered:
            # Belt and braces: a test run killed before fixture teardown must not leak a JVM.
            atexit.register(self._kill_quietly)
            self._atexit_registered = True

    def _spawn_and_wait(self, command: list[str]) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        log_file = open(self.log_path, "ab")  # noqa: SIM115 -- kept open while the JVM runs
        log_file.write(
            f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting ZooKeeper on "
            f"{self.host}:{self.port}: {' '.join(command)}\n".encode()
        )
        log_file.flush()
        self._log_file = log_file
        started = time.monotonic()
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=self.base_dir,
            # Its own process group: a Ctrl-C aimed at pytest does not hit the JVM first.
            start_new_session=True,
        )
        deadline = started + self.startup_timeout
        while True:
            returncode = self._process.poll()
            if returncode is not None:
                self._close_log()
                raise ZooKeeperHarnessError(
                    f"ZooKeeper exited with status {returncode} during start-up "
                    f"(port {self.port}, log {self.log_path}); last lines of its log:\n"
                    f"{self.log_tail()}"
                )
            if self._serving():
                return
            if time.monotonic() >= deadline:
                self._terminate()
                raise ZooKeeperHarnessError(
                    f"ZooKeeper did not answer on {self.host}:{self.port} within "
                    f"{self.startup_timeout:.0f}s (log {self.log_path}); last lines of its "
                    f"log:\n{self.log_tail()}"
                )
            # Polling interval of a deadline-bounded readiness probe; there is no event to
            # wait on for "a JVM in another process has bound its port".
            time.sleep(0.05)

    def _serving(self) -> bool:
        # `ruok` answers as soon as the socket is up; `srvr` also says whether the server
        # has loaded its database and is serving requests.
        assert self.port is not None
        reply = four_letter_word(self.host, self.port, "srvr")
        return "Zookeeper version" in reply and "Mode:" in reply

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if the JVM has not exited within ``stop_timeout``."""
        self._terminate()

    def kill(self) -> int:
        """SIGKILL at once (a crash: nothing flushed beyond what ZooKeeper fsynced);
        returns the exit status. ``start()`` brings it back on its data."""
        process = self._process
        assert process is not None and process.poll() is None, "the server is not running"
        process.kill()
        code = process.wait(timeout=self.stop_timeout)
        self._process = None
        self._close_log()
        return code

    def _terminate(self) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=self.stop_timeout)
        self._process = None
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _kill_quietly(self) -> None:
        with contextlib.suppress(Exception):
            if self._process is not None and self._process.poll() is None:
                self._process.kill()
                self._process.wait(timeout=5)

    def __enter__(self) -> ZooKeeperServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _new_client(hosts: str, **options: Any) -> KazooClient:
    options.setdefault("timeout", DEFAULT_SESSION_TIMEOUT)
    options.setdefault("connection_retry", dict(FAST_RECONNECT))
    return KazooClient(hosts=hosts, **options)


def _wait(event: threading.Event, timeout: float, what: str, server: ZooKeeperServer) -> None:
    if not event.wait(timeout):
        raise ZooKeeperHarnessError(
            f"timed out after {timeout:.1f}s waiting for {what}; last lines of the server "
            f"log:\n{server.log_tail(20)}"
        )


class ZooKeeperHarness:
    """One test's view of the shared server: a unique chroot, its clients, fault injection."""

    def __init__(
        self,
        server: ZooKeeperServer,
        *,
        chroot: str | None = None,
        session_timeout: float = DEFAULT_SESSION_TIMEOUT,
        event_timeout: float = 30.0,
    ) -> None:
        self.server = server
        self.chroot = chroot or f"/idemlog-test-{uuid.uuid4().hex}"
        self.session_timeout = session_timeout
        # Upper bound for every wait on a client event; generous, since a miss fails the test.
        self.event_timeout = event_timeout
        self._clients: list[KazooClient] = []
        # kazoo auth_data of the set-up/tear-down client: a test whose brokers secured
        # their nodes (zookeeper.set.acl) adds their identity, so the chroot is deleted.
        self.admin_auth: list[tuple[str, str]] = []

    @property
    def hosts(self) -> str:
        """Connection string with the chroot, e.g. ``127.0.0.1:40123/idemlog-test-ab12``."""
        return self.server.address + self.chroot

    # -- set-up and tear-down --------------------------------------------------------------

    def setup(self) -> None:
        """Make sure the server runs and create the chroot node."""
        self.server.start()
        with self.admin_client() as admin:
            admin.ensure_path(self.chroot)

    def teardown(self) -> None:
        """Close every client of this test, restart a stopped server, delete the chroot."""
        while self._clients:
            client = self._clients.pop()
            with contextlib.suppress(Exception):
                client.stop()
            with contextlib.suppress(Exception):
                client.close()
        # A test that stopped the server and then failed must not break the next test.
        self.server.start()
        with self.admin_client() as admin, contextlib.suppress(NoNodeError):
            admin.delete(self.chroot, recursive=True)

    @contextlib.contextmanager
    def admin_client(self) -> Iterator[KazooClient]:
        """A short-lived client on the server root (no chroot), for set-up and inspection."""
        client = _new_client(self.server.address, auth_data=list(self.admin_auth) or None)
        client.start(timeout=self.event_timeout)
        try:
            yield client
        finally:
            client.stop()
            client.close()

    # -- clients ---------------------------------------------------------------------------

    def client(self, *, start: bool = True, **options: Any) -> KazooClient:
        """A kazoo client on this test's chroot, closed at teardown.

        ``options`` go to :class:`KazooClient`; by default the session timeout is
        ``session_timeout`` and the client reconnects every 0.05-0.5 s while the server is down.
        """
        options.setdefault("timeout", self.session_timeout)
        client = _new_client(self.hosts, **options)
        self._clients.append(client)
        if start:
            try:
                client.start(timeout=self.event_timeout)
            except Exception as exc:
                raise ZooKeeperHarnessError(
                    f"kazoo client could not connect to {self.hosts}: {exc!r}; last lines of "
                    f"the server log:\n{self.server.log_tail(20)}"
                ) from exc
        return client

    def wait_connected(self, client: KazooClient, timeout: float | None = None) -> None:
        """Block until ``client`` is CONNECTED (returns at once if it already is)."""
        connected = threading.Event()

        def listener(state: str) -> bool:
            if state == KazooState.CONNECTED:
                connected.set()
                return True
            return False

        client.add_listener(listener)
        try:
            if client.connected:
                return
            _wait(connected, timeout or self.event_timeout, "the client to reconnect", self.server)
        finally:
            client.remove_listener(listener)

    # -- fault injection -------------------------------------------------------------------

    def expire_session(self, client: KazooClient, *, wait_reconnect: bool = True) -> None:
        """Make the server expire ``client``'s session; return once the client saw LOST.

        The kazoo way: a second client connects with the same session id and password (the
        server moves the session to it and drops the first connection), then closes the
        session. When the first client reconnects, the server tells it the session expired.
        With ``wait_reconnect`` also wait until kazoo has opened a new session.
        """
        lost = threading.Event()
        reconnected = threading.Event()

        def listener(state: str) -> bool:
            if state == KazooState.LOST:
                lost.set()
            elif state == KazooState.CONNECTED and lost.is_set():
                reconnected.set()
                return True
            return False

        client.add_listener(listener)
        try:
            self._kill_session(client, lost)
            if wait_reconnect:
                _wait(reconnected, self.event_timeout, "a new session after expiry", self.server)
        finally:
            client.remove_listener(listener)

    @contextlib.contextmanager
    def session_expired(self, client: KazooClient) -> Iterator[None]:
        """Expire ``client``'s session and hold it expired for the duration of the block.

        Inside the block every request of ``client`` fails with ``SessionExpiredError``, as
        it does for real between expiry and kazoo's next session, a window that is otherwise
        too short to hit from a test. On exit kazoo opens a new session and this waits for it.
        The hold is a state listener that blocks kazoo's connection thread on LOST (kazoo
        only runs listeners on that thread), released on exit or after ``event_timeout``.
        """
        lost = threading.Event()
        release = threading.Event()
        reconnected = threading.Event()

        def hold(state: str) -> bool:
            if state == KazooState.LOST:
                lost.set()
                release.wait(self.event_timeout)
            elif state == KazooState.CONNECTED and lost.is_set():
                reconnected.set()
                return True
            return False

        client.add_listener(hold)
        try:
            self._kill_session(client, lost)
            yield
        finally:
            release.set()
        try:
            _wait(reconnected, self.event_timeout, "a new session after expiry", self.server)
        finally:
            client.remove_listener(hold)

    def _kill_session(self, client: KazooClient, lost: threading.Event) -> None:
        session = client.client_id
        if session is None:
            raise ZooKeeperHarnessError(
                "cannot expire the session of a client that is not connected"
            )
        deadline = time.monotonic() + self.event_timeout
        # The first client may reconnect and reclaim the session before the second one closes
        # it; kazoo's harness retries the takeover for that reason, and so does this.
        while not lost.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ZooKeeperHarnessError(
                    f"session 0x{session[0]:x} did not expire within {self.event_timeout:.0f}s"
                )
            thief = _new_client(self.server.address, client_id=session)
            try:
                thief.start(timeout=remaining)
            finally:
                thief.stop()
                thief.close()
            lost.wait(min(5.0, max(0.0, deadline - time.monotonic())))

    def drop_connection(self, client: KazooClient) -> None:
        """Close ``client``'s socket under it; return once it went SUSPENDED and reconnected.

        The session survives (kazoo reconnects with the same session id), but every request
        in flight fails with ``ConnectionLoss``.
        """
        suspended = threading.Event()
        reconnected = threading.Event()

        def listener(state: str) -> bool:
            if state == KazooState.SUSPENDED:
                suspended.set()
            elif state == KazooState.CONNECTED and suspended.is_set():
                reconnected.set()
                return True
            return False

        client.add_listener(listener)
        try:
            sock = getattr(client._connection, "_socket", None)  # kazoo has no public hook
            if sock is None:
                raise ZooKeeperHarnessError("client has no open socket to drop")
            # shutdown (not close): kazoo's connection thread is select()ing on this socket
            # and must see EOF, then it closes the socket itself.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            _wait(suspended, self.event_timeout, "SUSPENDED after the drop", self.server)
            _wait(reconnected, self.event_timeout, "the client to reconnect", self.server)
        finally:
            client.remove_listener(listener)

    def stop_server(self) -> None:
        """Stop the shared server: every client goes SUSPENDED and keeps retrying."""
        self.server.stop()

    def kill_server(self) -> int:
        """SIGKILL the shared server (see ``ZooKeeperServer.kill``); its exit status."""
        return self.server.kill()

    def start_server(self) -> None:
        """Start it again on the same port and data dir; sessions within their timeout live on."""
        self.server.start()


# Re-exported for fixtures typing: a factory that returns started clients.
ClientFactory = Callable[..., KazooClient]
