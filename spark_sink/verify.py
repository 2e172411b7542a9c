"""The proof docs/design.md §8 asks for: what was read back vs what was meant to be written.

Every expected id must be present exactly once, nothing else may be there, and the rows
of one key must be in input order (ids increasing) in log order, which needs the
reader's ``_partition``/``_offset`` metadata columns.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from spark_sink.options import OFFSET_COLUMN, PARTITION_COLUMN


@dataclass(frozen=True)
class Verdict:
    rows_expected: int
    rows_committed: int
    duplicates: int  # rows beyond the first copy of an id
    missing: int  # expected ids not found
    unexpected: int  # distinct ids found that were not expected
    order_violations: int  # keys whose ids go backwards in log order (-1: not checked)

    @property
    def ok(self) -> bool:
        return (
            self.rows_committed == self.rows_expected
            and self.duplicates == self.missing == self.unexpected == 0
            and self.order_violations <= 0
        )

    def line(self) -> str:
        extra = ""
        if self.unexpected:
            extra += f" unexpected={self.unexpected}"
        if self.order_violations > 0:
            extra += f" keys_out_of_order={self.order_violations}"
        return (
            f"exactly_once={'OK' if self.ok else 'FAIL'} rows_expected={self.rows_expected} "
            f"rows_committed={self.rows_committed} duplicates={self.duplicates} "
            f"missing={self.missing}{extra}"
        )


def verify_exactly_once(
    table: pa.Table, *, id_column: str, key_column: str | None, expected_ids: Iterable[int]
) -> Verdict:
    """Compare the rows read back (``table``) with the ids meant to be written: counts
    of duplicates, missing and unexpected ids, and, when ``key_column`` is given and the
    table has the ``_partition``/``_offset`` metadata columns, the keys whose ids go
    backwards in log order (-1: not checked). Pure: raises only for a missing column
    (KeyError from pyarrow)."""
    ids = table.column(id_column).to_numpy(zero_copy_only=False).astype(np.int64)
    expected = np.unique(np.fromiter(expected_ids, dtype=np.int64))
    found, counts = np.unique(ids, return_counts=True)
    duplicates = int((counts - 1).sum())
    missing = int(np.setdiff1d(expected, found, assume_unique=True).size)
    unexpected = int(np.setdiff1d(found, expected, assume_unique=True).size)
    order = -1
    names = set(table.column_names)
    if key_column is not None and {PARTITION_COLUMN, OFFSET_COLUMN} <= names:
        order = _keys_out_of_order(table, id_column, key_column)
    return Verdict(int(expected.size), len(ids), duplicates, missing, unexpected, order)


def _keys_out_of_order(table: pa.Table, id_column: str, key_column: str) -> int:
    frame = table.select([PARTITION_COLUMN, OFFSET_COLUMN, key_column, id_column]).to_pandas()
    frame = frame.sort_values([PARTITION_COLUMN, OFFSET_COLUMN], kind="stable")
    increasing = frame.groupby(key_column, sort=False)[id_column].apply(
        lambda s: bool(s.is_monotonic_increasing)
    )
    return int((~increasing.astype(bool)).sum())
