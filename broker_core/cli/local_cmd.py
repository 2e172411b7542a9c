"""``idemlog`` commands that read local files only, no broker asked (``broker_core.cli.main``
wires them).

idemlog log describe|dump --data-dir DIR: a data directory, read-only (never a file
written, even on a running broker's directory): its topics, partitions, offsets and
producers, or a partition's batches.
idemlog config topic|broker [--properties]: the configuration keys with their defaults
and docs (``--properties``: the commented default broker file).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from broker_core.errors import InvalidConfigError, UnknownTopicOrPartitionError
from broker_core.log.config import LOG_CONFIG
from broker_core.log.dir_lock import LOCK_FILE
from broker_core.log.inspect import LIVE_NOTE, PartitionView, StoreView
from broker_core.log.partition_log import IsolationLevel
from broker_core.log.store import TOPIC_FILE
from broker_core.protocol.admin_requests import schema_fields
from broker_core.server.config.broker_config import BROKER_CONFIG, render_properties

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


def fill_log(log_cmd: argparse.ArgumentParser) -> None:
    """Fill ``idemlog log``'s parser (``describe``, ``dump``)."""
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


def fill_config(config: argparse.ArgumentParser) -> None:
    """Fill ``idemlog config``'s parser."""
    config.add_argument("scope", choices=["topic", "broker"], help="which keys to list")
    config.add_argument(
        "--properties", action="store_true", help="print the commented default broker file"
    )
    config.set_defaults(func=_config)
