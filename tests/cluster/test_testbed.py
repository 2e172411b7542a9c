"""The multi-host test bed itself (``tests/harness/netns.py``): hosts reach each other on
their own addresses, a cut link really cuts, and nothing is left behind, not even by a
run that was killed before its teardown."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import psutil

from tests.harness.netns import PREFIX, REGISTRY, TestBed, _ip, _links, _namespaces
from tests.harness.waiting import wait_until

# A TCP echo server on the host's address; prints READY once it listens.
ECHO_SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], 7000))
print("READY", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(c.recv(64))
    c.close()
"""

# Exit 0 if the echo server at argv[1] answers within 2 s, 1 otherwise.
ECHO_CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], 7000), timeout=2) as c:
        c.sendall(b"ping")
        sys.exit(0 if c.recv(64) == b"ping" else 1)
except OSError:
    sys.exit(1)
"""


def _echo(address: str) -> bool:
    try:
        with socket.create_connection((address, 7000), timeout=2) as c:
            c.sendall(b"ping")
            return c.recv(64) == b"ping"
    except OSError:
        return False


def test_hosts_reach_each_other_and_a_cut_link_cuts(testbed: TestBed) -> None:
    a, b, c = (testbed.add_host(n) for n in ("a", "b", "c"))
    assert len({a.address, b.address, c.address}) == 3
    server = a.popen([sys.executable, "-c", ECHO_SERVER, a.address])
    wait_until(lambda: "READY" in testbed.logs(), "the echo server on host a", timeout=30)
    assert server.poll() is None

    assert b.run([sys.executable, "-c", ECHO_CLIENT, a.address]).returncode == 0
    assert c.run([sys.executable, "-c", ECHO_CLIENT, a.address]).returncode == 0
    assert _echo(a.address), "the test process (root namespace) reaches the host"
    # Host b has only its own address: it cannot be reached on another host's.
    assert b.run(["ip", "-4", "-br", "addr"]).stdout.count(testbed.subnet) == 1

    b.cut()
    assert b.run([sys.executable, "-c", ECHO_CLIENT, a.address]).returncode == 1
    assert c.run([sys.executable, "-c", ECHO_CLIENT, a.address]).returncode == 0
    b.heal()
    wait_until(
        lambda: b.run([sys.executable, "-c", ECHO_CLIENT, a.address]).returncode == 0,
        "host b reaching host a after its link was healed",
        timeout=30,
    )


def test_close_removes_namespaces_links_processes_and_its_record(tmp_path: Path) -> None:
    bed = TestBed(tmp_path / "bed")
    host = bed.add_host("only")
    sleeper = host.popen(["sleep", "600"])
    assert (REGISTRY / bed.run).exists()
    assert host.netns in _namespaces()
    bed.close()
    assert not [n for n in _namespaces() if n.startswith(f"{PREFIX}{bed.run}")]
    assert not [link for link in _links() if link.startswith(f"{PREFIX}{bed.run}")]
    assert not (REGISTRY / bed.run).exists()
    assert sleeper.poll() is not None, "the host's process was killed"


def test_a_killed_runs_leftovers_are_removed_by_the_next_run(tmp_path: Path) -> None:
    # A run killed before its teardown: its namespace, bridge and record stay behind.
    dead = subprocess.Popen(["true"])
    dead.wait()
    run = "dead00"
    netns, bridge = f"{PREFIX}{run}h0", f"{PREFIX}{run}br"
    _ip("netns", "add", netns)
    _ip("link", "add", bridge, "type", "bridge")
    REGISTRY.mkdir(parents=True, exist_ok=True)
    (REGISTRY / run).write_text(f"{dead.pid} 0.0")
    assert not psutil.pid_exists(dead.pid) or psutil.Process(dead.pid).create_time() != 0.0

    bed = TestBed(tmp_path / "bed")
    try:
        assert netns not in _namespaces()
        assert bridge not in _links()
        assert not (REGISTRY / run).exists()
    finally:
        bed.close()
