"""The ``idemlog`` command line.

Local files, no broker asked (``broker_core.cli.local_cmd``): ``idemlog log describe``
lists a data directory's topics, partitions, offsets and producers, ``idemlog log dump``
prints a partition's batches (read-only, even on a running broker's directory); ``idemlog
config topic|broker`` lists the keys with defaults and docs (``--properties``: the
commented default file). A broker and its clients (``broker_core.cli.broker_cmd``):
``idemlog broker start``, ``idemlog topics create|describe|delete``, ``idemlog
transactions``; ``idemlog broker list|stop``, the brokers on this host
(``broker_core.cli.hosted_cmd``); ``idemlog consume``, which follows a topic
(``broker_core.cli.consume_cmd``); the metrics (``broker_core.cli.metrics_cmd``):
``idemlog metrics``. SCRAM users (``broker_core.cli.users_cmd``): ``idemlog users
add|remove|list``. ZooKeeper node ACLs (``broker_core.cli.zk_cmd``): ``idemlog zookeeper
set-acl``. ACLs (``broker_core.cli.acls_cmd``): ``idemlog acls add|remove|list``. The Spark
side's jobs (``broker_core.cli.spark_cmd``, with the ``[spark]`` extra): ``idemlog export
delta``, ``idemlog metrics record``.

Each command's module is imported only when that command runs (``COMMANDS``): a call
pays for its own command's imports, not for every other's (the broker's server for a
``topics`` call, the client for a ``log`` call).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from broker_core.cli.failures import (
    EPILOG,
    ExitCode,
    classify,
    silence_stdout,
    stdout_reader_left,
)
from broker_core.errors import DEBUG_ENV

# --help's first line: plain text (the module's docstring is reStructuredText).
DESCRIPTION = (
    "idemlog: run a broker, manage its topics, transactions, users and ACLs, follow a "
    "topic, read metrics, inspect a data directory, export to Delta."
)


@dataclass(frozen=True, slots=True)
class Command:
    """One top-level command: its name and its line in ``idemlog --help``, both known
    without importing it, and the functions (``module:function``) that fill its parser,
    in order; each is handed the command's parser."""

    name: str
    help: str
    fillers: tuple[str, ...]

    def fill(self, parser: argparse.ArgumentParser) -> None:
        for filler in self.fillers:
            module, function = filler.split(":")
            getattr(importlib.import_module(module), function)(parser)


# In ``idemlog --help``'s order.
COMMANDS = (
    Command("log", "inspect a local data directory", ("broker_core.cli.local_cmd:fill_log",)),
    Command("config", "list configuration keys", ("broker_core.cli.local_cmd:fill_config",)),
    Command("broker", "run a broker", ("broker_core.cli.broker_cmd:fill_broker",)),
    Command(
        "topics",
        "create, describe, delete topics on a cluster",
        ("broker_core.cli.broker_cmd:fill_topics",),
    ),
    Command(
        "transactions",
        "list or abort open (hanging) transactions",
        ("broker_core.cli.broker_cmd:fill_transactions",),
    ),
    Command(
        "metrics",
        "the cluster's metrics as a table or JSON",
        # `idemlog metrics record` is a Spark job: its parser comes from spark_cmd.
        (
            "broker_core.cli.metrics_cmd:fill_metrics",
            "broker_core.cli.spark_cmd:fill_metrics_record",
        ),
    ),
    Command(
        "consume",
        "print a topic's records as they arrive (as Kafka's console consumer)",
        ("broker_core.cli.consume_cmd:fill_consume",),
    ),
    Command("users", "add, remove, list SCRAM users", ("broker_core.cli.users_cmd:fill_users",)),
    Command(
        "zookeeper", "the cluster's ZooKeeper tree", ("broker_core.cli.zk_cmd:fill_zookeeper",)
    ),
    Command(
        "acls",
        "add, remove, list ACLs (authorizer.enable)",
        ("broker_core.cli.acls_cmd:fill_acls",),
    ),
    Command(
        "export",
        "copy a topic out of idemlog (needs the [spark] extra)",
        ("broker_core.cli.spark_cmd:fill_export",),
    ),
)


def _command_named(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (no option of
    ``idemlog`` itself takes a value); None if there is none."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(only: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The ``idemlog`` parser: every command filled in, or only those named in ``only``
    (the others keep their name and help line, all that ``idemlog --help`` shows)."""
    parser = argparse.ArgumentParser(prog="idemlog", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"after a failure's one line, print its traceback (as {DEBUG_ENV}=1 does)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for entry in COMMANDS:
        cmd = sub.add_parser(entry.name, help=entry.help)
        if only is None or entry.name in only:
            entry.fill(cmd)
    return parser


class _VersionAction(argparse._VersionAction):
    """argparse's ``--version``, its version looked up only when it is asked for: the
    search of the installed distributions costs every other command ~0.05 s of CPU."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        self.version = f"%(prog)s {_version()}"
        super().__call__(parser, namespace, values, option_string)


def _version() -> str:
    """The installed package's version, or a note when run from a checkout that is not
    installed (the version lives in the package metadata, nowhere else)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("idemlog")
    except PackageNotFoundError:
        return "(not installed: run from a source checkout)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (``failures.ExitCode``). Every failure is
    one line on stderr (``failures.classify``), its traceback only with ``--debug`` or
    IDEMLOG_DEBUG=1; argparse exits 2 by itself on a bad flag. A reader that closed
    stdout (``idemlog ... | head``) ends any command quietly, exit 0."""
    try:
        words = sys.argv[1:] if argv is None else argv
        named = _command_named(words)
        args = build_parser(only={named} if named else set()).parse_args(words)
    except SystemExit:
        # --help, --version and usage errors print, then exit: flushed here, so that a
        # reader that left is seen now rather than by the interpreter's flush at exit.
        _flush_stdout()
        raise
    except BrokenPipeError:
        if not stdout_reader_left():
            raise
        silence_stdout()
        return int(ExitCode.OK)
    try:
        code = int(args.func(args))
        _flush_stdout()
        return code
    except (Exception, KeyboardInterrupt) as exc:
        if isinstance(exc, BrokenPipeError) and stdout_reader_left():
            # `idemlog ... | head`: the reader has what it wanted; end quietly, as other
            # Unix tools do, for every command (consume also prints its summary first).
            silence_stdout()
            return int(ExitCode.OK)
        line, code = classify(exc)
        print(f"idemlog: {line}", file=sys.stderr, flush=True)
        if args.debug or os.environ.get(DEBUG_ENV) == "1":
            traceback.print_exc()
        return int(code)


def _flush_stdout() -> None:
    """Flush stdout; raises BrokenPipeError unless the broken pipe is stdout's reader
    gone (then stdout is silenced: nothing more to print)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        if not stdout_reader_left():
            raise
        silence_stdout()


if __name__ == "__main__":
    sys.exit(main())
