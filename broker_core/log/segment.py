"""One log segment: ``<20-digit base offset>.log`` with its offset and transaction indexes.

Batches are appended at the end and read back through a read-only memory map, so a reader
gets Arrow buffers that point into the page cache instead of copies.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from broker_core.errors import CorruptRecordError, StorageError
from broker_core.fileutil import pwrite_all, start_writeback
from broker_core.log.indexes import OffsetIndex, TxnIndex
from broker_core.record.batch import (
    NO_TIMESTAMP,
    BatchHeader,
    EncodedBatch,
    decode_header,
    verify_crc,
)

log = logging.getLogger("idemlog.segment")

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TXN_INDEX_SUFFIX = ".txnindex"


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """A batch as it lies in a segment: its header and a zero-copy view of its bytes."""

    position: int
    header: BatchHeader
    data: memoryview


class LogSegment:
    def __init__(self, directory: Path, base_offset: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.log_path = directory / segment_name(base_offset, LOG_SUFFIX)
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = os.fstat(self._fd).st_size
        self.index = OffsetIndex(directory / segment_name(base_offset, INDEX_SUFFIX), base_offset)
        self.txn_index = TxnIndex(directory / segment_name(base_offset, TXN_INDEX_SUFFIX))
        self.next_offset = base_offset
        self.first_timestamp = NO_TIMESTAMP
        self.max_timestamp = NO_TIMESTAMP
        self._bytes_since_index = 0
        self._map: mmap.mmap | None = None
        self._mapped_size = 0
        self.scan_error: str | None = None  # why the last scan() stopped early, if it did
        # Bytes below this were handed to the kernel's writeback (start_writeback) or
        # were there when the segment was opened.
        self._writeback_from = self.size
        self._writeback_off: str | None = None  # why start_writeback stopped, if it did

    # -- writing -----------------------------------------------------------------------
    def append(self, batch: EncodedBatch, index_interval: int) -> BatchHeader:
        """Write an encoded batch at the end; returns its header. All or nothing."""
        position = self.size
        try:
            # Checksum on this thread, then one pwritev. A checksum thread overlapping the
            # copy into the page cache cost more CPU in the hand-off than it hid, and with
            # the producers on the same cores there is rarely an idle core to hide it on
            # (bench-broker's server CPU s/GB).
            pwrite_all(self._fd, batch.iovecs(), position)
        except OSError as exc:
            self._rollback(position)
            raise StorageError(f"writing {self.log_path} failed: {exc}") from exc
        header = batch.decode_header()
        self._account(position, header, index_interval)
        return header

    def append_many(self, batches: list[EncodedBatch], index_interval: int) -> list[BatchHeader]:
        """Write encoded batches (base offsets already set, consecutive) back to back with
        one pwritev; returns their headers. All or nothing."""
        position = self.size
        pieces = [piece for batch in batches for piece in batch.iovecs()]
        try:
            pwrite_all(self._fd, pieces, position)
        except OSError as exc:
            self._rollback(position)
            raise StorageError(f"writing {self.log_path} failed: {exc}") from exc
        headers = [batch.decode_header() for batch in batches]
        for header in headers:
            self._account(position, header, index_interval)
            position += header.size
        return headers

    def _account(self, position: int, header: BatchHeader, index_interval: int) -> None:
        self.size = position + header.size
        self.next_offset = header.next_offset
        if self.first_timestamp == NO_TIMESTAMP:
            self.first_timestamp = header.first_timestamp
        self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
        self._bytes_since_index += header.size
        if self._bytes_since_index >= index_interval or position == 0:
            self.index.append(header.base_offset, position, self.max_timestamp)
            self._bytes_since_index = 0

    def start_writeback(self, min_bytes: int) -> None:
        """Start the disk write of the bytes appended since the last call once there are
        at least ``min_bytes`` of them (0: never), without waiting for it: a later fsync
        of this segment (a transaction marker's, ``flush.*``'s, a roll's) then finds them
        written or on their way, instead of writing everything appended since the last
        fsync while its caller waits. A hint to the kernel, not a durability step."""
        pending = self.size - self._writeback_from
        if min_bytes <= 0 or pending < min_bytes or self._writeback_off is not None:
            return
        try:
            start_writeback(self._fd, self._writeback_from, pending)
        except OSError as exc:
            # The appended bytes are written and what makes them durable (fsync) reports
            # any failure of theirs; only the early start is given up, for this segment.
            self._writeback_off = str(exc)
            log.warning("%s: early writeback off: %s", self.log_path, exc)
            return
        self._writeback_from = self.size

    def _rollback(self, position: int) -> None:
        try:
            os.ftruncate(self._fd, position)
        except OSError as exc:
            # The write error is what the caller sees; recovery trims this tail on reopen.
            log.error("could not roll back a failed write in %s: %s", self.log_path, exc)

    def seal(self) -> None:
        """Index the last batch too, so a closed segment's max timestamp is on disk."""
        if self.size and self.index.last_offset is not None:
            last = self._last_batch_position()
            if last is not None and last > self.index.last_position:
                self.index.append(self._header_at(last).base_offset, last, self.max_timestamp)

    def flush(self) -> None:
        os.fsync(self._fd)
        self.index.flush()
        self.txn_index.flush()

    def flush_log(self) -> None:
        """fsync all but the offset index: enough for the active segment, whose offset
        index crash recovery always rebuilds (it re-scans from the newest snapshot's
        segment). The txn index is kept: entries below a snapshot are not replayed."""
        os.fsync(self._fd)
        self.txn_index.flush()  # a no-op unless this segment holds an abort

    def truncate_to(self, position: int) -> None:
        """Cut the log at ``position`` (a batch boundary), with the index entries past it."""
        self._map = None
        self._mapped_size = 0
        os.ftruncate(self._fd, position)
        self.size = position
        self._writeback_from = min(self._writeback_from, position)
        self.index.truncate_from_position(position)

    # -- reading -----------------------------------------------------------------------
    def view(self) -> memoryview:
        if self.size == 0:
            return memoryview(b"")
        if self._map is None or self._mapped_size < self.size:
            # A new map for the grown file; the old one lives on while readers hold buffers.
            self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
            self._mapped_size = len(self._map)
        return memoryview(self._map)[: self.size]

    def _header_at(self, position: int) -> BatchHeader:
        return decode_header(self.view(), position)

    def batches(self, start_position: int = 0) -> Iterator[StoredBatch]:
        """Batches from ``start_position`` up to the current end (bound now, read lazily)."""
        return self._iter_batches(self.view(), start_position, self.log_path)

    @staticmethod
    def _iter_batches(view: memoryview, position: int, path: Path) -> Iterator[StoredBatch]:
        while position < len(view):
            try:
                header = decode_header(view, position)
            except CorruptRecordError as exc:
                raise CorruptRecordError(f"{path}: {exc.message}") from exc
            end = position + header.size
            yield StoredBatch(position, header, view[position:end])
            position = end

    def position_of(self, offset: int) -> int | None:
        """Position of the batch holding ``offset``, or of the first batch after it."""
        for batch in self.batches(self.index.floor_position(offset)):
            if batch.header.last_offset >= offset:
                return batch.position
        return None

    def _last_batch_position(self) -> int | None:
        last = None
        for batch in self.batches(self.index.last_position):
            last = batch.position
        return last

    # -- recovery ----------------------------------------------------------------------
    def scan(
        self, start_position: int, expected_offset: int, *, gaps: bool = False
    ) -> Iterator[StoredBatch]:
        """CRC-checked batches from ``start_position`` while they are whole and contiguous
        (with ``gaps``, a compacted log's: each at or after the previous one's end).

        Stops at the first torn, corrupt or misplaced batch; ``scan_error`` says why.
        The range is bound now, so callers may re-account the size while iterating.
        """
        self.scan_error = None
        return self._scan(self.view(), start_position, expected_offset, gaps)

    def _scan(
        self, view: memoryview, position: int, expected_offset: int, gaps: bool
    ) -> Iterator[StoredBatch]:
        limit = len(view)
        while position < limit:
            try:
                header = decode_header(view, position)
                # In a compacted log, above the expected offset is a gap the cleaner left
                # (docs/storage.md, Compaction); elsewhere any other offset is misplaced.
                misplaced = (
                    header.base_offset < expected_offset
                    if gaps
                    else header.base_offset != expected_offset
                )
                if misplaced:
                    raise CorruptRecordError(
                        f"batch at byte {position} has offset {header.base_offset}, "
                        f"expected {expected_offset}{' or more' if gaps else ''}"
                    )
                end = position + header.size
                if end > limit:
                    raise CorruptRecordError(
                        f"batch at byte {position} needs {header.size} bytes, "
                        f"{limit - position} present"
                    )
                data = view[position:end]
                verify_crc(header, data)
            except CorruptRecordError as exc:
                self.scan_error = str(exc)
                return
            yield StoredBatch(position, header, data)
            position = end
            expected_offset = header.next_offset

    def restore_position_state(self, start_position: int) -> None:
        """Reset the in-memory end state before re-accounting batches from a scan."""
        self.size = start_position
        self.next_offset = self.base_offset
        self._bytes_since_index = 0

    def account_recovered(self, batch: StoredBatch, index_interval: int) -> None:
        self._account(batch.position, batch.header, index_interval)

    def load_summary(self, index_interval: int) -> None:
        """For a trusted segment: end offset and timestamps from its index and last batch."""
        if not self.index.load(self.size):
            self.rebuild_index(index_interval)
            return
        last = self._last_batch_position()
        if last is None:
            return
        header = self._header_at(last)
        self.next_offset = header.next_offset
        first = self._header_at(0)
        self.first_timestamp = first.first_timestamp
        self.max_timestamp = max(self.index.max_timestamp or NO_TIMESTAMP, header.max_timestamp)

    def rebuild_index(self, index_interval: int) -> None:
        self.index.truncate_from_position(0)
        self.first_timestamp = self.max_timestamp = NO_TIMESTAMP
        batches = self.batches()  # bound to the current file size before re-accounting
        self.restore_position_state(0)
        for batch in batches:
            self._account(batch.position, batch.header, index_interval)

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        self._map = None
        os.close(self._fd)
        self.index.close()
        self.txn_index.close()

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.index.path, self.txn_index.path):
            path.unlink(missing_ok=True)
