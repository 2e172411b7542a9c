"""A segment opened for reading only: what ``idemlog log describe|dump`` reads a data
directory through (``broker_core.log.inspect``), possibly while a broker appends to it.

``ReadOnlySegment`` is a ``LogSegment`` that never writes: its file is opened
``O_RDONLY`` (a write through it fails in the kernel), its offset index is rebuilt in
memory by the scan and never read from or written to disk, and its transaction index is
read once and changed in memory only. Nothing is created: a segment without index files
leaves none behind.

Batches are read with ``pread``, one at a time, instead of through a memory map: a live
broker may truncate a file under the reader (a follower's divergence, a restart's
recovery), and touching a mapped page past the new end kills the process with SIGBUS;
a short ``pread`` is reported as a torn batch instead. Memory held: one batch at a time
(at most ``max.message.bytes``) plus the in-memory indexes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from broker_core.errors import CorruptRecordError, StorageError
from broker_core.log.indexes import AbortedTxn, OffsetIndex, TxnIndex
from broker_core.log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TXN_INDEX_SUFFIX,
    LogSegment,
    StoredBatch,
    segment_name,
)
from broker_core.record.batch import (
    HEADER_SIZE,
    NO_TIMESTAMP,
    BatchHeader,
    decode_header,
    verify_crc,
)


class MemoryOffsetIndex(OffsetIndex):
    """An offset index kept in memory only (built by the scan); its file is never opened."""

    def __init__(self, path: Path, base_offset: int) -> None:  # no super(): it opens the file
        self.path = path
        self.base_offset = base_offset
        self._offsets: list[int] = []
        self._positions: list[int] = []
        self._timestamps: list[int] = []

    def load(self, segment_size: int) -> bool:
        return False  # never trusted: the scan rebuilds it

    def append(self, offset: int, position: int, max_timestamp: int) -> None:
        if self._offsets and offset <= self._offsets[-1]:
            return
        self._offsets.append(offset)
        self._positions.append(position)
        self._timestamps.append(max_timestamp)

    def truncate_from_position(self, position: int) -> None:
        keep = sum(1 for p in self._positions if p < position)
        del self._offsets[keep:], self._positions[keep:], self._timestamps[keep:]

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class MemoryTxnIndex(TxnIndex):
    """The aborted-transaction index as the file holds it (a torn last entry dropped),
    then changed in memory only: the replay re-creates entries as recovery would."""

    def __init__(self, path: Path) -> None:
        try:
            super().__init__(path)  # reads the file; a torn one is "rewritten" (a no-op)
        except FileNotFoundError:  # deleted with its segment since the check for it
            self.path, self.entries, self._fd = path, [], None

    def _rewrite(self) -> None:
        pass  # the file keeps what it holds

    def append(self, txn: AbortedTxn) -> None:
        self.entries.append(txn)

    def flush(self) -> None:
        pass


class ReadOnlySegment(LogSegment):
    """A segment file read as it is, never written (see the module docstring).

    ``size`` is bound when it is opened: batches a live broker appends later are not
    seen. Raises FileNotFoundError if the segment is gone (retention deleted it).
    """

    def __init__(self, directory: Path, base_offset: int) -> None:  # no super(): O_RDWR|O_CREAT
        self.directory = directory
        self.base_offset = base_offset
        self.log_path = directory / segment_name(base_offset, LOG_SUFFIX)
        self._fd = os.open(self.log_path, os.O_RDONLY)
        self.size = os.fstat(self._fd).st_size
        self.file_size = self.size  # as opened; ``size`` shrinks to the valid prefix
        index_path = directory / segment_name(base_offset, INDEX_SUFFIX)
        self.index = MemoryOffsetIndex(index_path, base_offset)
        self.txn_index = MemoryTxnIndex(directory / segment_name(base_offset, TXN_INDEX_SUFFIX))
        self.next_offset = base_offset
        self.first_timestamp = NO_TIMESTAMP
        self.max_timestamp = NO_TIMESTAMP
        self._bytes_since_index = 0
        self._map = None
        self._mapped_size = 0
        self.scan_error = None

    def view(self) -> memoryview:
        raise StorageError(f"{self.log_path}: a read-only segment is read batch by batch")

    def _pread(self, size: int, position: int) -> bytes:
        return os.pread(self._fd, size, position)

    def _header_at(self, position: int) -> BatchHeader:
        return decode_header(self._pread(HEADER_SIZE, position), 0)

    def batches(self, start_position: int = 0) -> Iterator[StoredBatch]:
        """Batches from ``start_position`` up to ``size`` (bound now, read lazily)."""
        return self._read_batches(start_position, self.size)

    def _read_batches(self, position: int, limit: int) -> Iterator[StoredBatch]:
        while position < limit:
            stored = self._batch_at(position, limit)
            yield stored
            position += stored.header.size

    def _batch_at(self, position: int, limit: int) -> StoredBatch:
        try:
            header = self._header_at(position)
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"{self.log_path}: {exc.message}") from exc
        if position + header.size > limit:
            raise CorruptRecordError(
                f"{self.log_path}: batch at byte {position} needs {header.size} bytes, "
                f"{limit - position} present"
            )
        data = self._pread(header.size, position)
        if len(data) != header.size:  # the file shrank under us
            raise CorruptRecordError(
                f"{self.log_path}: batch at byte {position} needs {header.size} bytes, "
                f"{len(data)} could be read"
            )
        return StoredBatch(position, header, memoryview(data))

    def scan(
        self, start_position: int, expected_offset: int, *, gaps: bool = False
    ) -> Iterator[StoredBatch]:
        """CRC-checked batches while they are whole and contiguous (``LogSegment.scan``;
        ``gaps``: a compacted log's), bound to the current ``size``; ``scan_error`` says
        why it stopped early."""
        self.scan_error = None
        return self._scan_pread(start_position, self.size, expected_offset, gaps)

    def _scan_pread(
        self, position: int, limit: int, expected: int, gaps: bool
    ) -> Iterator[StoredBatch]:
        while position < limit:
            try:
                stored = self._batch_at(position, limit)
                offset = stored.header.base_offset
                if offset < expected or (offset != expected and not gaps):
                    raise CorruptRecordError(
                        f"batch at byte {position} has offset {offset}, expected {expected}"
                        + (" or more" if gaps else "")
                    )
                verify_crc(stored.header, stored.data)
            except CorruptRecordError as exc:
                self.scan_error = exc.message
                return
            yield stored
            position += stored.header.size
            expected = stored.header.next_offset
