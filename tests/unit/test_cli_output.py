"""``idemlog``'s output to a reader that leaves early (``idemlog ... | head``): the command
ends quietly, exit 0, as other Unix tools do, for every subcommand (``main``'s one place);
a failure's line stays on stderr.

Each test runs the real command as a subprocess whose stdout is a pipe with no reader at
all (its read end closed before the start): the first write, or the flush at exit,
meets EPIPE, deterministically.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def idemlog_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "broker_core.cli.main", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "command",
    [["config", "broker"], ["config", "broker", "--properties"], ["--help"], ["broker", "list"]],
    ids=" ".join,
)
def test_a_reader_that_left_ends_the_command_quietly(command: list[str]) -> None:
    done = idemlog_into_closed_pipe(*command)
    assert done.stderr == ""  # was "idemlog: Broken pipe", exit 1
    assert done.returncode == 0


def test_a_failure_still_says_its_line_when_nobody_reads_stdout() -> None:
    done = idemlog_into_closed_pipe("log", "describe", "--data-dir", "/nonexistent/idemlog")
    assert done.returncode == 2
    assert done.stderr.strip() == "idemlog: --data-dir /nonexistent/idemlog: no such directory"
