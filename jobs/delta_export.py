"""``python -m jobs.delta_export``: the checkout's entry of ``idemlog export delta``.

    python -m jobs.delta_export --topic T (--path STORE | --brokers HOST:PORT[,...])
        --table DELTA_PATH --partition-by COL [--app-id ID]

The export itself is ``spark_sink.export.delta`` (docs/jobs.md); the options and the run are
``broker_core.cli.spark_cmd``'s, shared with the installed ``idemlog export delta``. This
module only keeps the ``python -m`` spelling and its messages (``delta_export: error: ...``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from broker_core.cli.spark_cmd import add_export_arguments, run_export
from broker_core.errors import InvalidConfigError

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Export the topic's committed rows since the last run into the Delta table.

    Returns 0 after printing the result line (``exported ...`` or ``nothing new``); 2,
    with the reason on stderr, when a precondition fails before anything is written. Bad
    arguments exit 2 through argparse; other errors (a broker unreachable, Spark failing)
    propagate."""
    parser = argparse.ArgumentParser(
        prog="python -m jobs.delta_export", description=__doc__.splitlines()[0]
    )
    add_export_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_export(args, prefix="delta_export")
    except InvalidConfigError as exc:
        print(f"delta_export: error: {exc.message}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
