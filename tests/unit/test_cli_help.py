"""``idemlog --help`` documents every command and flag, the exit codes, and ``--version``
comes from the installed package's metadata."""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import version

from broker_core.cli.main import build_parser


def _undocumented(parser: argparse.ArgumentParser, path: list[str]) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if not helps.get(name):
                    missing.append(" ".join([*path, name]))
                missing += _undocumented(sub, [*path, name])
        elif not action.help:
            missing.append(" ".join([*path, *(action.option_strings or [action.dest])]))
    return missing


def test_every_command_and_flag_has_help() -> None:
    parser = build_parser()
    assert _undocumented(parser, ["idemlog"]) == []
    assert len(parser._actions) > 3  # the walk saw the tree: --help, --version, --debug, ...


def test_help_lists_the_exit_codes() -> None:
    text = " ".join(build_parser().format_help().split())
    for code in ("0 ok", "1 the command failed", "2 usage", "3 unreachable", "130", "143"):
        assert code in text, text


def test_version_is_the_installed_package_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "broker_core.cli.main", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"idemlog {version('idemlog')}"
