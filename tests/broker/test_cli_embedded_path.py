"""``--path DIR`` on the commands that talk to a broker (``topics``, ``consume``,
``metrics``, ``transactions``): they reach the embedded broker a Spark job started for
that directory (started here by ``spark_sink.embedded.ensure_broker``, as a Spark task
starts it), found through its state file with its pid checked, and send its owner-only
token; with no broker there, or the one recorded stopped, one line naming ``--path``."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from broker_core.cli.failures import ExitCode
from broker_core.cli.registry import REGISTRY_ENV
from broker_core.client.broker_client import BrokerClient
from spark_sink import embedded
from tests.broker.helpers import SCHEMA, idemlog, rows
from tests.harness.waiting import wait_until


def test_topics_consume_metrics_and_transactions_reach_the_embedded_broker_of_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(REGISTRY_ENV, str(tmp_path / "run"))  # the broker's entry: ours
    path = str(tmp_path / "embedded")
    address = embedded.ensure_broker(path)  # registers its token for this process
    try:
        schema = ",".join(f"{f.name}:{f.type}" for f in SCHEMA)
        create = ["topics", "create", "--path", path, "--topic", "t", "--partitions", "2"]
        done = idemlog(*create, "--schema", schema)
        assert done.returncode == 0, done.stderr
        with BrokerClient(address) as client:
            for p in (0, 1):
                with client.produce_stream("t", p) as stream:
                    stream.send(rows(3 + p, start=10 * p)).offsets(10)

        described = idemlog("topics", "describe", "--path", path, "--topic", "t", "--json")
        assert described.returncode == 0, described.stderr
        (topic,) = json.loads(described.stdout)
        assert topic["name"] == "t" and len(topic["partitions"]) == 2
        follow = ["consume", "--path", path, "--topic", "t", "--from-beginning"]
        done = idemlog(*follow, "--timeout-ms", "300", "--json")
        assert done.returncode == 0, done.stderr
        got = sorted(json.loads(line)["value"]["id"] for line in done.stdout.splitlines())
        assert got == [0, 1, 2, 10, 11, 12, 13]
        done = idemlog("metrics", "--path", path, "--json")
        assert done.returncode == 0, done.stderr
        appended = {
            p["partition"]: p["records_appended"]
            for p in json.loads(done.stdout)["partitions"]
            if p["topic"] == "t"
        }
        assert appended == {0: 3, 1: 4}
        done = idemlog("transactions", "list", "--path", path)
        assert done.returncode == 0, done.stderr

        # The same address without --path carries no token: this broker refuses it.
        refused = idemlog("topics", "describe", "--bootstrap", address)
        assert refused.returncode == ExitCode.USAGE, refused.stderr
        assert "token" in refused.stderr
        both = idemlog("metrics", "--path", path, "--bootstrap", address)
        assert both.returncode == ExitCode.USAGE and "not allowed with" in both.stderr
        # Killed (SIGKILL, as a crash): its state file still names it, its pid is gone.
        pid = embedded.broker_pid(path)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: embedded.broker_pid(path) is None, f"broker pid {pid} gone")
        killed = idemlog("consume", "--path", path, "--topic", "t")
        assert killed.returncode == ExitCode.UNREACHABLE
        assert killed.stderr.strip().splitlines()[-1] == (
            f"idemlog: --path {path}: its embedded broker (pid {pid}, {address}) is not "
            f"running; the next Spark job with the option path={path} starts it again"
        )
    finally:
        embedded.stop_broker(path)

    # Stopped cleanly (its state file removed), or never started there.
    for where in (path, str(tmp_path / "nowhere")):
        missing = idemlog("metrics", "--path", where)
        assert missing.returncode == ExitCode.UNREACHABLE
        assert missing.stderr.strip() == (
            f"idemlog: --path {where}: no embedded broker runs there (no address in "
            f"{where}/broker.json: none started there, or it was stopped); a Spark job with "
            f"the option path={where} starts one"
        )
