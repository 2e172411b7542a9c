"""``register(spark)`` checks the interpreter a local session's Python workers run
(issue 37: a user's own session whose workers run ``python3`` failed in its first task
with ``ModuleNotFoundError: spark_sink``). The session is a stand-in holding the two
fields the check reads; the interpreters are real."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from broker_core.errors import ErrorCode
from spark_sink.worker_python import WorkerPythonError, check_worker_python


def session(master: str, python: str) -> object:
    return SimpleNamespace(sparkContext=SimpleNamespace(master=master, pythonExec=python))


def without_idemlog(tmp_path: Path) -> str:
    """An interpreter that cannot import idemlog: this one, isolated and without site."""
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    script.chmod(0o755)
    return str(script)


def test_the_sessions_own_interpreter_passes_without_starting_one() -> None:
    check_worker_python(session("local[2,4]", sys.executable))  # type: ignore[arg-type]


def test_an_interpreter_without_idemlog_is_named_with_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = without_idemlog(tmp_path)
    monkeypatch.setenv("PYSPARK_PYTHON", python)
    with pytest.raises(WorkerPythonError) as err:
        check_worker_python(session("local[2]", python))  # type: ignore[arg-type]
    message = str(err.value)
    assert f"Spark's Python workers run {python!r} (PYSPARK_PYTHON," in message
    assert "No module named 'spark_sink'" in message
    assert f"set PYSPARK_PYTHON={sys.executable} before the session starts" in message
    assert err.value.error_code is ErrorCode.INVALID_CONFIG and not err.value.retriable


def test_an_unset_pyspark_python_and_a_missing_interpreter_say_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    with pytest.raises(WorkerPythonError) as err:
        check_worker_python(session("local[*]", "no-such-python3"))  # type: ignore[arg-type]
    assert "run 'no-such-python3' (the default, PYSPARK_PYTHON unset" in str(err.value)
    assert "FileNotFoundError" in str(err.value)


def test_an_interpreter_with_idemlog_passes(tmp_path: Path) -> None:
    link = tmp_path / "python-link"
    wrapper = tmp_path / "python"
    # Another path to this interpreter, through a script: the check runs it.
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    link.symlink_to(wrapper)
    check_worker_python(session("local[2]", str(link)))  # type: ignore[arg-type]


def test_a_cluster_master_is_not_checked_from_the_driver(tmp_path: Path) -> None:
    python = without_idemlog(tmp_path)
    check_worker_python(session("spark://master:7077", python))  # type: ignore[arg-type]
