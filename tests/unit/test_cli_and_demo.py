"""The command line and the store demo work end to end on a real store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_core.cli.main import main
from jobs import store_demo
from tests.store.helpers import open_store, rows


def test_describe_and_dump_report_offsets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(tmp_path)
    store.create_topic("orders", 2)
    log = store.partition("orders", 1)
    log.append(rows(10), producer_id=3, producer_epoch=0, base_sequence=0)
    store.close()
    assert main(["log", "describe", "--data-dir", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    part = report[0]["partitions"][1]
    assert (part["log_end_offset"], part["producers"]) == (10, 1)
    assert (
        main(["log", "dump", "--data-dir", str(tmp_path), "--topic", "orders", "--partition", "1"])
        == 0
    )
    assert "10 rows (read_committed)" in capsys.readouterr().out


def test_cli_error_names_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    open_store(tmp_path).close()
    assert main(["log", "dump", "--data-dir", str(tmp_path), "--topic", "nope"]) == 2
    assert "topic 'nope' does not exist" in capsys.readouterr().err


def test_store_demo_reports_exactly_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert store_demo.main(["--data-dir", str(tmp_path / "demo"), "--batches", "60"]) == 0
    out = capsys.readouterr().out
    assert "exactly_once=OK" in out and "duplicates=0 missing=0" in out
    assert "duplicate beyond the cached window" in out
