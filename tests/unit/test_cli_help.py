"""``idemlog --help`` documents every command and flag, the exit codes, and ``--version``
comes from the installed package's metadata."""

from __future__ import annotations

import argparse
import re
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


def _helps(parser: argparse.ArgumentParser, path: list[str]) -> dict[str, str]:
    """Every command's --help text, by its command line."""
    texts = {" ".join(path): parser.format_help()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                texts.update(_helps(sub, [*path, name]))
    return texts


# reStructuredText in a help text: ``literal``, :class:`X`, :func:`y` and the like.
RST_MARKUP = re.compile(r"``|:[a-z]+:`")


def test_help_is_plain_text_without_internal_options() -> None:
    helps = _helps(build_parser(), ["idemlog"])
    assert len(helps) > 20, sorted(helps)  # the walk reached the subcommands
    marked = {cmd: RST_MARKUP.findall(text) for cmd, text in helps.items()}
    assert {cmd: m for cmd, m in marked.items() if m} == {}
    # spark_sink.embedded's launcher passes it; an operator never needs it.
    assert "--ready-fd" not in helps["idemlog broker start"]
    args = build_parser().parse_args(
        ["broker", "start", "--config", "b.properties", "--ready-fd", "7"]
    )
    assert args.ready_fd == 7
