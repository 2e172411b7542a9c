"""``python -m jobs.metrics_recorder``: the checkout's entry of ``idemlog metrics record``.

    python -m jobs.metrics_recorder --table DELTA_PATH [--path STORE | --brokers HOST:PORT]
        [--interval 5] [--compact-every 720] [--once | --duration SECONDS]

The recorder itself is ``spark_sink.metrics_recorder`` (docs/jobs.md); the options and the
run are ``broker_core.cli.spark_cmd``'s, shared with the installed ``idemlog metrics record``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from broker_core.cli.spark_cmd import add_record_arguments, run_record
from broker_core.errors import IdemlogError, InvalidConfigError

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Append the cluster's metrics to a Delta table every ``--interval`` seconds (once
    with ``--once``); then print what was recorded.

    Returns 0; 2 with the error on stderr if an idemlog error ends it (the first poll
    failing). Bad arguments (a non-positive ``--interval``) exit 2 through argparse."""
    parser = argparse.ArgumentParser(
        prog="python -m jobs.metrics_recorder", description=__doc__.splitlines()[0]
    )
    add_record_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_record(args, prefix="metrics_recorder")
    except InvalidConfigError as exc:
        parser.error(exc.message)
    except IdemlogError as exc:
        print(f"metrics_recorder: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
