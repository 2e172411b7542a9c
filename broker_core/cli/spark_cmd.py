"""``idemlog export delta`` and ``idemlog metrics record``: the Spark side's jobs.

Their code is in ``spark_sink`` (``spark_sink.export.delta``, ``spark_sink.metrics_recorder``),
which needs the ``[spark]`` extra (pyspark, deltalake). It is imported only when one of these
subcommands runs, never when the parser is built: ``idemlog`` on a broker host (``pip install
idemlog``) lists them in ``--help`` and answers a run with one line naming the extra (exit 2).
This is the one place ``broker_core`` reaches up into ``spark_sink`` (an exception declared in
pyproject.toml's import-linter contracts; docs/architecture.md).

The options are declared here once and shared with the ``python -m jobs.delta_export`` and
``python -m jobs.metrics_recorder`` entries of a checkout.
"""

from __future__ import annotations

import argparse
import logging
import sys

from broker_core import SPARK_EXTRA
from broker_core.cli.progress import Progress
from broker_core.errors import InvalidConfigError

# The [spark] extra's modules: a missing one means the extra is not installed.
SPARK_EXTRA_MODULES = frozenset({"pyspark", "delta", "deltalake"})
_WHERE_HELP = "data directory of the embedded broker (default: the embedded default)"


def _needs_spark(command: str, exc: ModuleNotFoundError) -> InvalidConfigError:
    """The one-line refusal for a run without the [spark] extra; other missing modules
    are not ours to explain and are re-raised by the caller."""
    return InvalidConfigError(f"{command} needs {SPARK_EXTRA} (no module named {_root(exc)!r})")


def _root(exc: ModuleNotFoundError) -> str:
    return (exc.name or "").split(".")[0]


def _is_spark_extra(exc: ModuleNotFoundError) -> bool:
    return _root(exc) in SPARK_EXTRA_MODULES


def _where_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--path", default=None, help=_WHERE_HELP)
    where.add_argument("--brokers", default="", help="host:port[,host:port] of a cluster")


# -- export delta ---------------------------------------------------------------------------
def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``idemlog export delta`` (and ``python -m jobs.delta_export``)."""
    parser.add_argument("--topic", required=True, help="the topic to export")
    _where_arguments(parser)
    parser.add_argument("--table", required=True, help="path of the Delta table")
    parser.add_argument("--partition-by", required=True, help="column to partition the table by")
    parser.add_argument("--app-id", default=None, help="Delta txnAppId (default: per topic)")


def run_export(args: argparse.Namespace, *, prefix: str = "export delta") -> int:
    """Export the topic's committed rows since the last run into the Delta table, in one
    Delta commit that a repeated run never writes twice; print the result line
    (``exported rows=...`` or ``nothing new``) on stdout, the steps and progress on stderr.

    Returns 0. Raises InvalidConfigError (exit 2) without the [spark] extra, or for a
    precondition that fails before anything is written (no such topic or column, a table
    partitioned otherwise, a truncated history); other errors (a broker unreachable, Spark
    failing) propagate as they are."""
    try:
        from spark_sink.export import delta
    except ModuleNotFoundError as exc:
        if _is_spark_extra(exc):
            raise _needs_spark(prefix, exc) from None
        raise

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    bar: list[Progress] = []  # the Spark job's tasks, once it reports any

    def progress(step: delta.ExportProgress) -> None:
        # A bar on a terminal, a line every few seconds otherwise (cli/progress.py).
        if step.stage == "planned":
            log(
                f"{prefix}: run {step.run}: {step.offsets} offsets to read over "
                f"{step.partitions} partition(s)"
            )
        elif step.stage == "writing":
            if not bar:
                bar.append(Progress(f"{prefix}: run {step.run}: writing", unit="tasks"))
            bar[0].set_total(step.tasks_total)
            bar[0].advance(step.tasks_done - bar[0].done)
        else:
            if bar:
                bar[0].close()
            log(f"{prefix}: run {step.run}: {step.rows} rows committed")

    source = delta.Source(
        topic=args.topic, path=args.path or delta.DEFAULT_PATH, brokers=args.brokers
    )
    try:
        result = delta.run_export(
            source, args.table, args.partition_by, args.app_id, log=log, progress=progress
        )
    except delta.ExportError as exc:
        raise InvalidConfigError(str(exc)) from exc
    print(result.line(), flush=True)
    return 0


# -- metrics record -------------------------------------------------------------------------
def add_record_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``idemlog metrics record`` (and ``python -m jobs.metrics_recorder``)."""
    parser.add_argument("--table", required=True, help="path of the Delta table")
    _where_arguments(parser)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between polls")
    parser.add_argument(
        "--compact-every", type=int, default=720, help="compact the table every N polls"
    )
    until = parser.add_mutually_exclusive_group()
    until.add_argument("--once", action="store_true", help="record one poll and exit")
    until.add_argument("--duration", type=float, default=None, help="stop after this many s")


def run_record(args: argparse.Namespace, *, prefix: str = "metrics record") -> int:
    """Append the cluster's metrics to a Delta table every ``--interval`` seconds (once
    with ``--once``) until ``--duration`` has passed or Ctrl-C; then print
    ``recorded polls=... failed=... rows=... table=...``.

    Returns 0. Raises InvalidConfigError (exit 2) without the [spark] extra or for a bad
    ``--interval``/``--compact-every``; an IdemlogError if the first poll fails (a later
    failed poll is counted and logged, not fatal)."""
    if args.interval <= 0:
        raise InvalidConfigError(f"--interval must be > 0, got {args.interval}")
    if args.compact_every < 1:
        raise InvalidConfigError(f"--compact-every must be >= 1, got {args.compact_every}")
    try:
        from spark_sink import metrics_recorder
    except ModuleNotFoundError as exc:
        if _is_spark_extra(exc):
            raise _needs_spark(prefix, exc) from None
        raise
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    recorder = metrics_recorder.run_recorder(
        args.table,
        brokers=args.brokers,
        path=args.path or metrics_recorder.DEFAULT_PATH,
        interval_s=args.interval,
        compact_every=args.compact_every,
        once=args.once,
        duration_s=args.duration,
    )
    print(
        f"recorded polls={recorder.polls} failed={recorder.failed_polls} "
        f"rows={recorder.rows_written} table={args.table}",
        flush=True,
    )
    return 0


def fill_export(export: argparse.ArgumentParser) -> None:
    """Fill ``idemlog export``'s parser (``delta``)."""
    export_sub = export.add_subparsers(dest="action", required=True)
    delta = export_sub.add_parser(
        "delta",
        help="export the committed rows since the last run into a Delta table, once",
    )
    add_export_arguments(delta)
    delta.set_defaults(func=run_export)


def fill_metrics_record(metrics: argparse.ArgumentParser) -> None:
    """Add ``record`` under ``idemlog metrics`` (after ``metrics_cmd.fill_metrics``)."""
    metrics_sub = metrics.add_subparsers(dest="action", required=False)
    record = metrics_sub.add_parser(
        "record", help="append the metrics to a Delta table periodically (needs the [spark] extra)"
    )
    add_record_arguments(record)
    record.set_defaults(func=run_record)
