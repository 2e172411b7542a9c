"""What the partition log's calls return: append and marker results, fetched batches.

Kept apart from ``partition_log`` (which re-exports them) so that module stays small.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import pyarrow as pa

from broker_core.errors import InvalidRecordError


class IsolationLevel(Enum):
    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"

    @classmethod
    def parse(cls, value: str | IsolationLevel) -> IsolationLevel:
        if isinstance(value, IsolationLevel):
            return value
        try:
            return cls(value)
        except ValueError:
            raise InvalidRecordError(
                f"isolation={value!r} is not one of read_committed, read_uncommitted"
            ) from None


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int
    duplicate: bool  # an earlier copy was found; the offsets are the original's


@dataclass(frozen=True, slots=True)
class MarkerResult:
    offset: int  # the marker's own offset
    last_stable_offset: int  # the partition's LSO just after the marker was appended


@dataclass(frozen=True, slots=True)
class HangingAbort:
    """An open transaction an operator aborted (``PartitionLog.abort_open_transaction``)."""

    producer_id: int
    txn_start_offset: int
    marker_epoch: int  # the producer's epoch on the partition from then on
    marker: MarkerResult


@dataclass(frozen=True, slots=True)
class FetchedBatch:
    base_offset: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    timestamp: int
    records: pa.RecordBatch

    @property
    def last_offset(self) -> int:
        return self.base_offset + int(self.records.num_rows) - 1


@dataclass(frozen=True, slots=True)
class FetchResult:
    batches: list[FetchedBatch]
    next_offset: int  # where the next read continues
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int

    @property
    def num_rows(self) -> int:
        return sum(b.records.num_rows for b in self.batches)

    def table(self) -> pa.Table | None:
        if not self.batches:
            return None
        return pa.Table.from_batches([b.records for b in self.batches])
