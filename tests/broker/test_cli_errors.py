"""Every failure of the real ``idemlog`` command is one line, names what is at fault and
exits with its documented code (docs/broker.md, "Exit codes"); never a traceback.

Each test runs the command as an operator does (a subprocess) against the real fault: a
missing or unreadable file, a port another socket holds, a ZooKeeper address nobody
answers, a broker address with nothing behind it, and Ctrl-C/SIGTERM during a start.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_core.cli.failures import ExitCode
from tests.harness.broker import BrokerFactory, BrokerProcess

# Nothing listens on port 1 of the loopback (a privileged port no test binds).
DEAD_ADDRESS = "127.0.0.1:1"


def idemlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker_core.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def one_error_line(output: str) -> str:
    """The single ``idemlog:`` line of a failed command; asserts there is no traceback."""
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("idemlog:")]
    assert len(errors) == 1, output
    return errors[0]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port held by a listening socket of this test."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


@pytest.mark.parametrize("case", ["missing", "directory", "not-utf8"])
def test_unreadable_config_file_is_a_usage_error_naming_it(tmp_path: Path, case: str) -> None:
    path = {
        "missing": tmp_path / "nonexistent.properties",
        "directory": tmp_path,
        "not-utf8": tmp_path / "latin1.properties",
    }[case]
    if case == "not-utf8":
        path.write_bytes(b"broker.id=0\nlog.dir=/tmp/caf\xe9\n")
    done = idemlog("broker", "start", "--config", str(path))
    assert done.returncode == ExitCode.USAGE == 2
    line = one_error_line(done.stderr)
    assert line.startswith(f"idemlog: --config {path}: "), line
    expected = {
        "missing": "no such file",
        "directory": "is a directory",
        "not-utf8": "line 2: byte 0xe9 (offset 28) is not UTF-8",
    }[case]
    assert expected in line
    assert "(40)" not in line  # no wire code for a usage error
    assert done.stdout == ""


def test_log_dir_that_cannot_be_created_names_log_dir(broker_factory: BrokerFactory) -> None:
    blocker = broker_factory.workdir / "a-file"
    broker_factory.workdir.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory\n")
    broker = broker_factory({"log.dir": str(blocker / "data")}, start=False)
    broker.spawn()
    assert broker.wait_exit() == ExitCode.USAGE
    line = one_error_line(broker.log_text())
    assert line.startswith(f"idemlog: log.dir={blocker / 'data'}: cannot create"), line
    assert "Not a directory" in line
    assert "LISTENING" not in broker.log_text()


def test_port_in_use_names_listener_port(broker_factory: BrokerFactory, held_port: int) -> None:
    broker = broker_factory({"listener.port": held_port}, start=False)
    broker.spawn()
    assert broker.wait_exit() == ExitCode.USAGE
    log = broker.log_text()
    line = one_error_line(log)
    assert line.startswith(
        f"idemlog: listener.port={held_port}: 127.0.0.1:{held_port} is already in use; "
    ), line
    # Said before anything starts: no gRPC C++ log (E0000 ... add_port.cc) before it, and
    # nothing else at all (the harness heads each start's output with a "=== start" line).
    said = [x for x in log.splitlines() if x.strip() and not x.startswith("=== start")]
    assert said == [line], log


def test_unreachable_zookeeper_names_the_key_and_exits_3(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(
        {"zookeeper.connect": DEAD_ADDRESS, "zookeeper.session.timeout.ms": 4000}, start=False
    )
    broker.spawn()
    assert broker.wait_exit() == ExitCode.UNREACHABLE == 3
    log = broker.log_text()
    line = one_error_line(log)
    assert line.startswith(f"idemlog: zookeeper.connect={DEAD_ADDRESS}: no ZooKeeper"), line
    assert "zookeeper.session.timeout.ms=4000" in line
    assert "Connection dropped" not in log  # kazoo's reconnect warnings are quiet at start


def _start_waiting_on_zookeeper(factory: BrokerFactory) -> BrokerProcess:
    """A broker whose start waits on a ZooKeeper nobody answers, for a minute."""
    broker = factory(
        {"zookeeper.connect": DEAD_ADDRESS, "zookeeper.session.timeout.ms": 60_000}, start=False
    )
    broker.spawn()
    broker.wait_for_log("is starting", timeout=60)
    return broker


@pytest.mark.parametrize(
    ("stop", "code"),
    [(signal.SIGINT, ExitCode.INTERRUPTED), (signal.SIGTERM, ExitCode.TERMINATED)],
)
def test_stop_signal_during_a_start_ends_it_at_once(
    broker_factory: BrokerFactory, stop: signal.Signals, code: ExitCode
) -> None:
    broker = _start_waiting_on_zookeeper(broker_factory)
    sent = time.monotonic()
    status = broker.kill(stop, timeout=15)
    # Well inside the 60 s the start would otherwise wait for its session.
    assert time.monotonic() - sent < 15
    assert status == broker.wait_exit() == code
    log = broker.log_text()
    line = one_error_line(log)
    assert line == f"idemlog: broker start interrupted by {stop.name}; nothing was served"
    assert "LISTENING" not in log and "no ZooKeeper" not in log  # the wait did not end first


def test_unreachable_bootstrap_exits_3_naming_the_address() -> None:
    done = idemlog("topics", "describe", "--bootstrap", DEAD_ADDRESS)
    assert done.returncode == ExitCode.UNREACHABLE
    line = one_error_line(done.stderr)
    # The address and the cause once, no wire code, no transport message.
    assert line == (
        f"idemlog: cannot reach a broker at {DEAD_ADDRESS} (connection refused); "
        "check that it runs and the address is right"
    ), line


def test_unresolvable_bootstrap_says_the_host_name_is_not_found() -> None:
    # .invalid is reserved (RFC 2606): no resolver finds it.
    done = idemlog("topics", "describe", "--bootstrap", "nohost.invalid:9092")
    assert done.returncode == ExitCode.UNREACHABLE
    line = one_error_line(done.stderr)
    assert line == (
        "idemlog: cannot reach a broker at nohost.invalid:9092 (host name not found); "
        "check that it runs and the address is right"
    ), line


def test_every_bootstrap_address_is_named_once() -> None:
    done = idemlog("topics", "describe", "--bootstrap", f"127.0.0.2:1,{DEAD_ADDRESS}")
    assert done.returncode == ExitCode.UNREACHABLE
    line = one_error_line(done.stderr)
    assert line.startswith(f"idemlog: cannot reach a broker at 127.0.0.2:1, {DEAD_ADDRESS} ("), line
    assert line.count(DEAD_ADDRESS) == 1 and "NETWORK_EXCEPTION" not in line, line


def test_unreachable_zookeeper_for_users_exits_3() -> None:
    done = idemlog("users", "list", "--zookeeper", DEAD_ADDRESS)
    assert done.returncode == ExitCode.UNREACHABLE
    line = one_error_line(done.stderr)
    assert line.startswith(f"idemlog: --zookeeper {DEAD_ADDRESS}: no ZooKeeper"), line
    assert "Connection dropped" not in done.stderr


def test_usage_error_shows_no_wire_code() -> None:
    done = idemlog("config", "topic", "--properties")
    assert done.returncode == ExitCode.USAGE
    line = one_error_line(done.stderr)
    assert line.startswith("idemlog: --properties is for `config broker`"), line
    assert "INVALID_CONFIG" not in line and "(40)" not in line
