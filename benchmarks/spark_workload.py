"""What the Spark benchmarks write and at what size: the source DataFrame (id bigint, key
int, value string, from ``spark.range``) and the size options they share."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession


def source(spark: SparkSession, rows: int) -> DataFrame:
    return spark.range(rows).selectExpr(
        "id", "cast(id % 1000 as int) key", "concat('value-', id) value"
    )


def parse_sizes(
    doc: str | None,
    argv: Sequence[str] | None,
    dir_help: str = "scratch directory",
    more: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """The size options the Spark benchmarks share, checked; ``more`` adds a benchmark's
    own options."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    if more is not None:
        more(parser)
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each sink (best counts)")
    parser.add_argument("--stream-batches", type=int, default=20)
    parser.add_argument("--stream-rows", type=int, default=100_000)
    parser.add_argument("--dir", type=Path, default=None, help=dir_help)
    args = parser.parse_args(argv)
    if args.rows <= 0 or args.repeats <= 0 or args.stream_batches <= 0 or args.stream_rows <= 0:
        parser.error("--rows, --repeats, --stream-batches and --stream-rows must be positive")
    return args
