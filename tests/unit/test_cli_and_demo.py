"""The command line and the store demo work end to end on a real store."""

from __future__ import annotations

import json
import subprocess
import sys
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


@pytest.mark.parametrize("action", [["describe"], ["dump", "--topic", "orders"]])
def test_missing_data_dir_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], action: list[str]
) -> None:
    missing = tmp_path / "nonexistent"
    assert main(["log", *action, "--data-dir", str(missing)]) == 2
    assert f"--data-dir {missing}: no such directory" in capsys.readouterr().err
    assert not missing.exists()  # inspecting never creates it


def test_installed_command_fails_on_a_missing_data_dir(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker_core.cli.main",
            "log",
            "describe",
            "--data-dir",
            str(missing),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("idemlog: ")
    assert f"--data-dir {missing}: no such directory" in done.stderr


def test_file_or_foreign_directory_is_not_a_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("hello\n")
    assert main(["log", "describe", "--data-dir", str(a_file)]) == 2
    assert f"--data-dir {a_file}: not a directory" in capsys.readouterr().err
    # A directory with files but no topic and no broker file: not an idemlog store.
    assert main(["log", "describe", "--data-dir", str(tmp_path)]) == 2
    assert f"--data-dir {tmp_path}: not an idemlog data directory" in capsys.readouterr().err


def test_empty_data_dir_says_it_has_no_topics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A broker that created no topic yet leaves an empty directory: valid, and said so.
    assert main(["log", "describe", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"no topics in {tmp_path}\n"
    assert main(["log", "describe", "--data-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_log_commands_report_a_torn_tail_and_leave_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(tmp_path)
    store.create_topic("orders", 1)
    store.partition("orders", 0).append(rows(10))
    store.close()
    segment = tmp_path / "orders" / "0" / f"{0:020d}.log"
    whole = segment.read_bytes()
    segment.write_bytes(whole + b"\x00" * 24)  # a torn append after a clean close
    files = sorted(p.name for p in (tmp_path / "orders" / "0").iterdir())
    assert main(["log", "describe", "--data-dir", str(tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)[0]["partitions"][0]["log_end_offset"] == 10
    assert f"{segment.name} ends in a torn or unreadable tail at byte {len(whole)}" in err
    assert "recovery would truncate it there" in err
    assert main(["log", "dump", "--data-dir", str(tmp_path), "--topic", "orders"]) == 0
    assert "10 rows (read_committed)" in capsys.readouterr().out
    assert segment.read_bytes() == whole + b"\x00" * 24  # reported, not repaired
    assert sorted(p.name for p in (tmp_path / "orders" / "0").iterdir()) == files
    assert not (tmp_path / ".lock").exists()
