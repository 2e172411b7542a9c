"""Hosts of their own on one machine: a Linux network namespace per host, on a bridge
private to the test run (docs/contributing.md, "The multi-host test bed").

:class:`TestBed` makes hosts: each is a network namespace with ``lo`` up and one veth
link to the run's bridge, with an address of the run's own /24 subnet (``10.213.<k>.0/24``,
``k`` free at the time, chosen under a file lock so concurrent runs never share one). The
bridge has ``.1`` in the root namespace, so the test process reaches every host and every
host reaches the others. Processes start in a host with :meth:`Host.popen` (``ip netns
exec``); :meth:`Host.cut` and :meth:`Host.heal` take the host's link down and up (there is
no netem and no iptables here: a link is either there or not; a user-space TCP proxy,
``tests.harness.tcp_proxy``, does the rest).

Clean-up is guaranteed three ways: :meth:`TestBed.close` (the fixture's teardown, also
on failure) kills every process in the run's namespaces and deletes them, their links
and the bridge; each run records its pid in ``REGISTRY`` so the next run removes what a
run killed before its teardown left (:func:`remove_stale`); and names carry the run's id,
so two runs never collide.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

REGISTRY = Path("/tmp/idemlog-testbed")
SUBNET_PREFIX = "10.213"
PREFIX = "idl"  # every namespace, link and bridge of the test bed starts with it


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _namespaces() -> list[str]:
    out = _ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links() -> list[str]:
    out = _ip("-o", "link", "show").stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def _kill_namespace(netns: str) -> None:
    """SIGKILL every process in ``netns``, then delete it (its veth end goes with it)."""
    pids = _ip("netns", "pids", netns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess, ValueError, psutil.TimeoutExpired):
            psutil.Process(int(pid)).wait(10)
    _ip("netns", "delete", netns, check=False)


def _remove_run(run: str) -> None:
    for netns in _namespaces():
        if netns.startswith(f"{PREFIX}{run}"):
            _kill_namespace(netns)
    for link in _links():
        if link.startswith(f"{PREFIX}{run}"):
            _ip("link", "delete", link, check=False)
    with contextlib.suppress(FileNotFoundError):
        (REGISTRY / run).unlink()


def remove_stale() -> list[str]:
    """Remove the namespaces, links and bridges of runs whose process is gone (a run
    killed before its teardown); the runs removed."""
    removed = []
    if not REGISTRY.is_dir():
        return removed
    for entry in REGISTRY.iterdir():
        if entry.name.startswith("."):
            continue
        try:
            pid, created = entry.read_text().split()
            alive = psutil.Process(int(pid)).create_time() == float(created)
        except (ValueError, OSError, psutil.NoSuchProcess):
            alive = False
        if not alive:
            _remove_run(entry.name)
            removed.append(entry.name)
    return removed


@contextlib.contextmanager
def _registry_lock() -> Iterator[None]:
    REGISTRY.mkdir(parents=True, exist_ok=True)
    with open(REGISTRY / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@dataclass
class Host:
    """One host of the test bed."""

    name: str
    netns: str
    address: str
    link: str  # the veth end on the bridge, in the root namespace: cut and heal act on it
    bed: TestBed = field(repr=False)

    def command(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def popen(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, log: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` on this host; stdout and stderr go to ``log`` (default: a file
        per process in the bed's log folder, collected by :meth:`TestBed.logs`)."""
        path = log or self.bed.log_dir / f"{self.name}-{len(self.bed.processes)}.log"
        with open(path, "ab") as out:
            process = subprocess.Popen(
                self.command(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a signal aimed at the test never reaches it
            )
        self.bed.processes.append((self, process, path))
        return process

    def run(self, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(argv), capture_output=True, text=True, timeout=timeout, check=False
        )

    def cut(self) -> None:
        """Take the host's link down: nothing reaches it or leaves it until :meth:`heal`."""
        _ip("link", "set", self.link, "down")

    def heal(self) -> None:
        _ip("link", "set", self.link, "up")


class TestBed:
    """The hosts of one test run, on its own bridge and subnet; :meth:`close` removes all."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.run = secrets.token_hex(3)  # 6 hex: interface names stay within 15 bytes
        self.bridge = f"{PREFIX}{self.run}br"
        self.hosts: list[Host] = []
        self.processes: list[tuple[Host, subprocess.Popen[bytes], Path]] = []
        with _registry_lock():
            remove_stale()
            me = psutil.Process()
            (REGISTRY / self.run).write_text(f"{me.pid} {me.create_time()}")
            self.subnet = self._free_subnet()
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")

    def _free_subnet(self) -> str:
        used = _ip("-o", "-4", "addr", "show").stdout
        for k in range(10, 250):
            subnet = f"{SUBNET_PREFIX}.{k}"
            if f" {subnet}." not in used:
                return subnet
        raise RuntimeError(f"no free {SUBNET_PREFIX}.k.0/24 subnet for the test bed")

    def add_host(self, name: str) -> Host:
        index = len(self.hosts)
        netns = f"{PREFIX}{self.run}h{index}"
        inside, outside = f"{PREFIX}{self.run}i{index}", f"{PREFIX}{self.run}o{index}"
        address = f"{self.subnet}.{index + 2}"
        _ip("netns", "add", netns)
        _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
        _ip("link", "set", inside, "netns", netns)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        for args in (
            ("link", "set", "lo", "up"),
            ("addr", "add", f"{address}/24", "dev", inside),
            ("link", "set", inside, "up"),
        ):
            _ip("-n", netns, *args)
        host = Host(name, netns, address, outside, self)
        self.hosts.append(host)
        return host

    def logs(self) -> str:
        """Every process's output, for a failing test's report."""
        parts = []
        for host, process, path in self.processes:
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"--- {host.name} pid {process.pid} ({path.name}) ---\n{text[-4000:]}")
        return "\n".join(parts)

    def close(self) -> None:
        for _host, process, _path in self.processes:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        for _host, process, _path in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        with _registry_lock():
            _remove_run(self.run)


@pytest.fixture
def testbed(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[TestBed]:
    """A test bed for one test, removed at teardown; every process's output is attached
    to the test's report (pytest shows it when the test fails)."""
    bed = TestBed(tmp_path / "testbed")
    try:
        yield bed
    finally:
        if bed.processes:
            request.node.add_report_section("teardown", "test bed logs", bed.logs())
        bed.close()
