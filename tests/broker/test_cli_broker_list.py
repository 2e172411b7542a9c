"""``idemlog broker list|stop`` with real brokers on this host: Spark's embedded broker
(started by ``spark_sink.embedded.ensure_broker``, as a Spark task starts it) and one
started with ``idemlog broker start``; a clean stop, a SIGKILL after the timeout of a
broker that ignores SIGTERM (SIGSTOPped), and a crashed broker's stale entry."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from broker_core.cli.failures import ExitCode
from broker_core.cli.registry import REGISTRY_ENV
from spark_sink import embedded
from tests.broker.helpers import idemlog
from tests.harness.broker import BrokerFactory


def listed() -> list[dict[str, Any]]:
    done = idemlog("broker", "list", "--json")
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A registry of this test's own: brokers it starts inherit the variable."""
    path = tmp_path / "run"
    monkeypatch.setenv(REGISTRY_ENV, str(path))
    return path


def test_list_and_stop_an_embedded_broker_and_one_started_by_idemlog(
    registry: Path, tmp_path: Path, broker_factory: BrokerFactory
) -> None:
    spark_path = str(tmp_path / "embedded")
    address = embedded.ensure_broker(spark_path)
    spark_pid = embedded.broker_pid(spark_path)
    assert spark_pid is not None
    try:
        other = broker_factory()
        rows = {r["pid"]: r for r in listed()}
        assert set(rows) == {spark_pid, other.pid}
        spark = rows[spark_pid]
        assert spark["address"] == address and spark["status"] == "alive"
        assert spark["started_by"] == "spark" and spark["mode"] == "embedded"
        assert spark["log_dir"] == str(Path(spark_path, "data"))
        assert rows[other.pid]["started_by"] == "idemlog"
        assert rows[other.pid]["log_dir"] == str(other.log_dir.absolute())
        text = idemlog("broker", "list").stdout  # the same fields, as a table
        for row in rows.values():
            assert all(str(row[k]) in text for k in ("pid", "address", "log_dir", "status"))

        done = idemlog("broker", "stop", "--log-dir", spark["log_dir"])
        assert done.returncode == 0, done.stderr
        (line,) = done.stdout.splitlines()
        assert f"broker pid {spark_pid} at {address}" in line and "stopped (SIGTERM)" in line
        assert not psutil.pid_exists(spark_pid) or (
            psutil.Process(spark_pid).status() == psutil.STATUS_ZOMBIE
        )
        assert "STOPPED" in Path(spark_path, embedded.LOG_FILE).read_text()  # a clean stop
        assert [r["pid"] for r in listed()] == [other.pid]  # it removed its own entry

        # A broker that ignores SIGTERM (stopped) is SIGKILLed after --timeout-s.
        os.kill(other.pid, signal.SIGSTOP)
        done = idemlog("broker", "stop", "--all", "--timeout-s", "1")
        assert done.returncode == 0, done.stderr
        (line,) = done.stdout.splitlines()
        assert f"broker pid {other.pid}" in line and "killed (SIGKILL)" in line
        assert other.wait_exit() == -signal.SIGKILL
        assert listed() == []  # its entry went with the stop
    finally:
        embedded.stop_broker(spark_path)


def test_a_crashed_brokers_entry_is_listed_stale_once_and_stop_names_an_unknown_dir(
    registry: Path, broker_factory: BrokerFactory
) -> None:
    broker = broker_factory()
    assert [r["status"] for r in listed()] == ["alive"]
    assert broker.kill(signal.SIGKILL) == -signal.SIGKILL  # no clean stop: the file stays
    assert [(r["pid"], r["status"]) for r in listed()] == [(broker.pid, "stale")]
    assert listed() == []  # pruned after being reported
    done = idemlog("broker", "stop", "--log-dir", str(broker.log_dir))
    assert done.returncode == ExitCode.USAGE
    assert done.stderr.startswith(f"idemlog: --log-dir {broker.log_dir}: no running broker")
    assert len(done.stderr.splitlines()) == 1
