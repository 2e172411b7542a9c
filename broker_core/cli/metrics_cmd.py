"""``idemlog metrics``: the cluster's bounded metrics document (aggregates and the top N
producers by duplicates answered), or every producer's counters fetched page by page
(docs/operations.md)::

    idemlog metrics (--bootstrap host:port | --path DIR)
                    [--top N | --producers [--page-size N]] [--json]

``idemlog metrics record`` (recording into a Delta table) is ``spark_cmd``'s, added under
this command.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from broker_core.cli.broker_cmd import JSON_HELP, _broker_arguments, _client
from broker_core.errors import InvalidConfigError
from broker_core.protocol.metrics import (
    DEFAULT_PAGE_SIZE,
    DEFAULT_TOP,
    DETAIL_PRODUCERS,
    MAX_PAGE_SIZE,
    MAX_TOP,
    render_table,
)


def metrics(args: argparse.Namespace) -> int:
    """The bounded document (aggregates and the top producers), or with ``--producers``
    every producer's counters, fetched page by page from each broker."""
    if not args.bootstrap and not args.path:  # optional in the parser for `metrics record`
        raise InvalidConfigError("metrics: --bootstrap or --path is required")
    with _client(args) as client:
        if args.producers:
            rows = client.producer_metrics(args.page_size)
            doc: dict[str, Any] = {"detail": DETAIL_PRODUCERS, "producers": rows}
        else:
            doc = client.metrics(args.top)
    print(json.dumps(doc, indent=2) if args.json else render_table(doc))
    return 0


def _int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in low..high, else the flag's usage error (exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in {low}..{high}")
        return value

    return parse


def fill_metrics(met: argparse.ArgumentParser) -> None:
    """Fill ``idemlog metrics``'s parser (``record``: ``spark_cmd.fill_metrics_record``)."""
    # One is required, but checked by metrics(): `idemlog metrics record` (spark_cmd) has
    # its own --path and --brokers.
    _broker_arguments(met, required=False)
    met.add_argument("--json", action="store_true", help=JSON_HELP)
    met.add_argument(
        "--top",
        type=_int_in(0, MAX_TOP),
        default=DEFAULT_TOP,
        help=f"producers listed by duplicates answered, 0..{MAX_TOP} (default {DEFAULT_TOP})",
    )
    met.add_argument(
        "--producers",
        action="store_true",
        help="every producer's counters instead (paged from each broker; large)",
    )
    met.add_argument(
        "--page-size",
        type=_int_in(1, MAX_PAGE_SIZE),
        default=DEFAULT_PAGE_SIZE,
        help=f"with --producers: rows per request, 1..{MAX_PAGE_SIZE} "
        f"(default {DEFAULT_PAGE_SIZE})",
    )
    met.set_defaults(func=metrics)
