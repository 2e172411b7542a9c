"""The ``idemlog`` command line.

Local data directories, read-only (never a file written, even on a running broker's
directory): ``idemlog log describe`` lists topics, partitions, offsets and producers;
``idemlog log dump`` prints a partition's batches. Configuration: ``idemlog
config topic|broker`` lists the keys with defaults and docs (``--properties``: the
commented default file). A broker and its clients (``broker_core.cli.broker_cmd``):
``idemlog broker start``, ``idemlog topics create|describe|delete``; ``idemlog broker
list|stop``, the brokers on this host (``broker_core.cli.hosted_cmd``); ``idemlog consume``,
which follows a topic (``broker_core.cli.consume_cmd``); the metrics
(``broker_core.cli.metrics_cmd``): ``idemlog metrics``. SCRAM users
(``broker_core.cli.users_cmd``): ``idemlog users add|remove|list``. ZooKeeper node ACLs
(``broker_core.cli.zk_cmd``): ``idemlog zookeeper set-acl``. ACLs
(``broker_core.cli.acls_cmd``): ``idemlog acls add|remove|list``. The Spark side's jobs
(``broker_core.cli.spark_cmd``, with the ``[spark]`` extra): ``idemlog export delta``,
``idemlog metrics record``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker_core.cli.acls_cmd import add_acls_command
from broker_core.cli.broker_cmd import add_commands
from broker_core.cli.consume_cmd import add_consume_command
from broker_core.cli.failures import (
    EPILOG,
    ExitCode,
    classify,
    silence_stdout,
    stdout_reader_left,
)
from broker_core.cli.metrics_cmd import add_metrics_command
from broker_core.cli.spark_cmd import add_spark_commands
from broker_core.cli.users_cmd import add_users_command
from broker_core.cli.zk_cmd import add_zookeeper_command
from broker_core.errors import DEBUG_ENV, InvalidConfigError, UnknownTopicOrPartitionError
from broker_core.log.config import LOG_CONFIG
from broker_core.log.dir_lock import LOCK_FILE
from broker_core.log.inspect import LIVE_NOTE, PartitionView, StoreView
from broker_core.log.partition_log import IsolationLevel
from broker_core.log.store import TOPIC_FILE
from broker_core.protocol.admin_requests import schema_fields
from broker_core.server.config.broker_config import BROKER_CONFIG, render_properties

# --help's first line: plain text (the module's docstring is reStructuredText).
DESCRIPTION = (
    "idemlog: run a broker, manage its topics, transactions, users and ACLs, follow a "
    "topic, read metrics, inspect a data directory, export to Delta."
)
# A broker's own files in its data directory (``__producer_id_block``, ``__cluster.json``).
_BROKER_FILE_PREFIX = "__"
# What one read of ``log dump`` holds at most (or one batch, if larger): it prints as it goes.
_DUMP_READ_BYTES = 1 << 20


def _open_store(data_dir: str) -> StoreView:
    """A read-only view of an existing data directory (``broker_core.log.inspect``):
    nothing in it is written, created or deleted, even while a broker runs on it (then a
    note says so on stderr). Raises InvalidConfigError naming the directory if it is
    missing, not a directory, or holds files but no topic and no broker file (not an
    idemlog data directory: a mistyped path must not read as an empty store)."""
    path = Path(data_dir)
    if not path.exists():
        raise InvalidConfigError(f"--data-dir {data_dir}: no such directory")
    if not path.is_dir():
        raise InvalidConfigError(f"--data-dir {data_dir}: not a directory")
    entries = list(path.iterdir())
    ours = any(
        e.name.startswith(_BROKER_FILE_PREFIX) or e.name == LOCK_FILE or (e / TOPIC_FILE).is_file()
        for e in entries
    )
    if entries and not ours:
        raise InvalidConfigError(
            f"--data-dir {data_dir}: not an idemlog data directory (no topic with a "
            f"{TOPIC_FILE} and no broker file in it)"
        )
    store = StoreView(path)
    if store.live:
        holder = f"process {store.holder}" if store.holder and store.holder > 0 else "a process"
        print(f"idemlog: {LIVE_NOTE} ({holder} holds {path / LOCK_FILE})", file=sys.stderr)
    return store


def _report_problems(view: PartitionView) -> None:
    """What recovery would repair, said, never done (see broker_core.log.inspect)."""
    for problem in view.problems:
        print(f"idemlog: {problem}", file=sys.stderr)


def _describe(args: argparse.Namespace) -> int:
    with _open_store(args.data_dir) as store:
        names = [args.topic] if args.topic else store.topics()
        report: list[dict[str, Any]] = []
        for name in names:
            try:
                topic = store.topic(name)
            except UnknownTopicOrPartitionError as exc:
                raise InvalidConfigError(f"--topic {name}: {exc.message}") from exc
            parts = []
            for p in range(topic.partitions):
                log = store.partition(name, p)
                _report_problems(log)
                parts.append(
                    {
                        "partition": p,
                        "log_start_offset": log.log_start_offset,
                        "log_end_offset": log.log_end_offset,
                        "last_stable_offset": log.last_stable_offset,
                        "segments": len(log.segments),
                        "bytes": log.size_bytes,
                        "producers": len(log.state),
                        "open_transactions": len(log.state.ongoing_transactions()),
                    }
                )
                log.close()
            report.append(
                {
                    "topic": name,
                    "schema": schema_fields(topic.schema),
                    "config_overrides": topic.overrides,
                    "partitions": parts,
                }
            )
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    if not report:
        print(f"no topics in {args.data_dir}")
    for t in report:
        # The same fields as --json: the schema (Arrow's text form) and the overrides too.
        schema = ", ".join(t["schema"] or ["-"])
        print(f"topic {t['topic']}  schema [{schema}]  config {t['config_overrides']}")
        cols = list(t["partitions"][0]) if t["partitions"] else []
        print("  " + " ".join(f"{c:>18}" for c in cols))
        for row in t["partitions"]:
            print("  " + " ".join(f"{row[c]:>18}" for c in cols))
    return 0


def _dump(args: argparse.Namespace) -> int:
    with _open_store(args.data_dir) as store:
        try:
            log = store.partition(args.topic, args.partition)
        except UnknownTopicOrPartitionError as exc:
            # A flag naming nothing in the directory: a usage error, no broker answered.
            raise InvalidConfigError(f"--topic {args.topic}: {exc.message}") from exc
        _report_problems(log)
        offset = log.log_start_offset if args.offset is None else args.offset
        rows = 0
        while True:
            result = log.read(
                offset, isolation=IsolationLevel.parse(args.isolation), max_bytes=_DUMP_READ_BYTES
            )
            for b in result.batches:
                rows += b.records.num_rows
                print(
                    f"offset={b.base_offset}..{b.last_offset} producer_id={b.producer_id} "
                    f"epoch={b.producer_epoch} base_sequence={b.base_sequence} "
                    f"transactional={b.is_transactional} rows={b.records.num_rows}"
                )
            if result.next_offset == offset:
                break
            offset = result.next_offset
        print(f"{rows} rows ({args.isolation}), last stable offset {log.last_stable_offset}")
    return 0


def _config(args: argparse.Namespace) -> int:
    if args.properties:
        if args.scope != "broker":
            raise InvalidConfigError(
                "--properties is for `config broker`; the topic keys' file is conf/topic.properties"
            )
        print(render_properties(), end="")
        return 0
    config_def = BROKER_CONFIG if args.scope == "broker" else LOG_CONFIG
    for name, type_name, default, doc in config_def.describe():
        print(f"{name} ({type_name}, default {default})\n    {doc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="idemlog", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"after a failure's one line, print its traceback (as {DEBUG_ENV}=1 does)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    log_cmd = sub.add_parser("log", help="inspect a local data directory")
    log_sub = log_cmd.add_subparsers(dest="action", required=True)
    describe = log_sub.add_parser("describe", help="topics, partitions, offsets, producers")
    describe.add_argument("--data-dir", required=True, help="the store's data directory")
    describe.add_argument("--topic", help="only this topic")
    describe.add_argument("--json", action="store_true", help="print JSON instead of a table")
    describe.set_defaults(func=_describe)
    dump = log_sub.add_parser("dump", help="print a partition's batches")
    dump.add_argument("--data-dir", required=True, help="the store's data directory")
    dump.add_argument("--topic", required=True, help="the topic to print")
    dump.add_argument("--partition", type=int, default=0, help="its partition (default: 0)")
    dump.add_argument("--offset", type=int, help="start offset (default: log start)")
    dump.add_argument(
        "--isolation",
        choices=[level.value for level in IsolationLevel],
        default=IsolationLevel.READ_COMMITTED.value,
        help="read_committed (default): committed rows only; read_uncommitted: every row",
    )
    dump.set_defaults(func=_dump)

    config = sub.add_parser("config", help="list configuration keys")
    config.add_argument("scope", choices=["topic", "broker"], help="which keys to list")
    config.add_argument(
        "--properties", action="store_true", help="print the commented default broker file"
    )
    config.set_defaults(func=_config)
    add_commands(sub)
    add_metrics_command(sub)
    add_consume_command(sub)
    add_users_command(sub)
    add_zookeeper_command(sub)
    # -- authorization --
    add_acls_command(sub)
    # The Spark side's jobs (dist): after add_metrics_command, whose `metrics` gets `record`.
    add_spark_commands(sub)
    return parser


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
        args = build_parser().parse_args(argv)
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
