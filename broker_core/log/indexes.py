"""The per-segment index files: a sparse offset/time index and the aborted-transaction index.

``<base>.index``: 16-byte entries, appended every ``index.interval.bytes`` of batches and
at the last batch when a segment is sealed:

    relative_offset int32 | position int32 | max_timestamp int64 (of the segment so far)

``<base>.txnindex``: 32-byte entries, one per aborted transaction whose ABORT marker is in
the segment, so that ``read_committed`` readers learn which data to skip without reading
the whole log:

    producer_id int64 | first_offset int64 | last_offset int64 | last_stable_offset int64
"""

from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from broker_core.fileutil import write_all

_OFFSET_ENTRY = struct.Struct(">iiq")
_TXN_ENTRY = struct.Struct(">qqqq")


class OffsetIndex:
    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._offsets: list[int] = []
        self._positions: list[int] = []
        self._timestamps: list[int] = []
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def load(self, segment_size: int) -> bool:
        """Read the file; False (and empty) if it is not a valid index for the segment."""
        data = _read_fd(self._fd)
        self._offsets, self._positions, self._timestamps = [], [], []
        if len(data) % _OFFSET_ENTRY.size:
            return False
        last_offset, last_position = -1, -1
        for rel, pos, ts in _OFFSET_ENTRY.iter_unpack(data):
            if rel <= last_offset or pos <= last_position or pos >= segment_size or rel < 0:
                self._offsets, self._positions, self._timestamps = [], [], []
                return False
            self._offsets.append(self.base_offset + rel)
            self._positions.append(pos)
            self._timestamps.append(ts)
            last_offset, last_position = rel, pos
        return True

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def last_offset(self) -> int | None:
        return self._offsets[-1] if self._offsets else None

    @property
    def last_position(self) -> int:
        return self._positions[-1] if self._positions else 0

    @property
    def max_timestamp(self) -> int | None:
        return self._timestamps[-1] if self._timestamps else None

    def append(self, offset: int, position: int, max_timestamp: int) -> None:
        if self._offsets and offset <= self._offsets[-1]:
            return
        os.lseek(self._fd, len(self._offsets) * _OFFSET_ENTRY.size, os.SEEK_SET)
        write_all(self._fd, _OFFSET_ENTRY.pack(offset - self.base_offset, position, max_timestamp))
        self._offsets.append(offset)
        self._positions.append(position)
        self._timestamps.append(max_timestamp)

    def floor_position(self, offset: int) -> int:
        """Position of the last indexed batch starting at or before ``offset`` (else 0)."""
        i = bisect.bisect_right(self._offsets, offset) - 1
        return self._positions[i] if i >= 0 else 0

    def truncate_from_position(self, position: int) -> None:
        """Drop entries for batches at or after ``position``."""
        keep = bisect.bisect_left(self._positions, position)
        del self._offsets[keep:], self._positions[keep:], self._timestamps[keep:]
        os.ftruncate(self._fd, keep * _OFFSET_ENTRY.size)

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TxnIndex:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[AbortedTxn] = []
        self._fd: int | None = None
        if path.exists():
            data = path.read_bytes()
            usable = len(data) - len(data) % _TXN_ENTRY.size  # a torn last entry is dropped
            self.entries = [AbortedTxn(*t) for t in _TXN_ENTRY.iter_unpack(data[:usable])]
            if usable != len(data):
                self._rewrite()

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        return self._fd

    def append(self, txn: AbortedTxn) -> None:
        write_all(self._open(), _TXN_ENTRY.pack(*_fields(txn)))
        self.entries.append(txn)

    def truncate_from(self, offset: int) -> None:
        """Forget aborts whose marker is at or after ``offset`` (they are replayed again)."""
        kept = [t for t in self.entries if t.last_offset < offset]
        if len(kept) != len(self.entries):
            self.entries = kept
            self._rewrite()

    def _rewrite(self) -> None:
        fd = self._open()
        os.ftruncate(fd, 0)
        write_all(fd, b"".join(_TXN_ENTRY.pack(*_fields(t)) for t in self.entries))

    def overlapping(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with data in [start, end)."""
        return [t for t in self.entries if t.last_offset >= start and t.first_offset < end]

    def flush(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _fields(txn: AbortedTxn) -> tuple[int, int, int, int]:
    return (txn.producer_id, txn.first_offset, txn.last_offset, txn.last_stable_offset)


def _read_fd(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0) if size else b""
