"""Producer-state snapshot files: ``<20-digit offset>.snapshot`` in the partition directory.

A snapshot at offset X holds the producer state after every batch below X, so recovery
loads it and replays the log from X only. Layout (big-endian):

    magic "IDPS" (4) | version int16 | reserved int16 | crc uint32 (CRC-32C of all that
    follows) | offset int64 | entry count int32 | entries

    entry: producer_id int64, epoch int16, coordinator_epoch int32, last_timestamp int64,
           current_txn_first_offset int64, epoch_start_sequence int32,
           epoch_record_count int64, batch count int16,
           then per batch: first_seq int32, last_seq int32, first_offset int64,
                           last_offset int64, timestamp int64

Files are written to a temporary name, fsynced and renamed, so a crash leaves either the
old set or the new one; a file that fails any check is reported by ``read_snapshot``
(the caller deletes it and falls back to the next older one).
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from pathlib import Path

import crc32c

from broker_core.errors import CorruptRecordError
from broker_core.fileutil import atomic_write
from broker_core.log.producer_state import BatchMetadata, ProducerStateEntry

log = logging.getLogger("idemlog.snapshot")

SUFFIX = ".snapshot"
_MAGIC = b"IDPS"
_VERSION = 1
_PREFIX = struct.Struct(">4shhI")
_BODY_HEAD = struct.Struct(">qi")
_ENTRY = struct.Struct(">qhiqqiqh")
_BATCH = struct.Struct(">iiqqq")


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SUFFIX}"


def list_snapshots(directory: Path) -> list[tuple[int, Path]]:
    """(offset, path) of every snapshot file, oldest first."""
    found = []
    for path in directory.glob(f"*{SUFFIX}"):
        stem = path.name[: -len(SUFFIX)]
        if len(stem) == 20 and stem.isdigit():
            found.append((int(stem), path))
    return sorted(found)


def encode_snapshot(offset: int, entries: list[ProducerStateEntry]) -> bytes:
    parts = [_BODY_HEAD.pack(offset, len(entries))]
    for e in entries:
        parts.append(
            _ENTRY.pack(
                e.producer_id,
                e.epoch,
                e.coordinator_epoch,
                e.last_timestamp,
                e.current_txn_first_offset,
                e.epoch_start_sequence,
                e.epoch_record_count,
                len(e.batches),
            )
        )
        for b in e.batches:
            parts.append(
                _BATCH.pack(b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp)
            )
    body = b"".join(parts)
    return _PREFIX.pack(_MAGIC, _VERSION, 0, crc32c.crc32c(body)) + body


def decode_snapshot(
    data: bytes, *, window: int, name: str = "snapshot"
) -> tuple[int, list[ProducerStateEntry]]:
    if len(data) < _PREFIX.size + _BODY_HEAD.size:
        raise CorruptRecordError(f"{name}: truncated ({len(data)} bytes)")
    magic, version, _reserved, crc = _PREFIX.unpack_from(data, 0)
    if magic != _MAGIC or version != _VERSION:
        raise CorruptRecordError(f"{name}: not a version {_VERSION} producer snapshot")
    body = memoryview(data)[_PREFIX.size :]
    if crc32c.crc32c(body) != crc:
        raise CorruptRecordError(f"{name}: CRC mismatch")
    try:
        offset, count = _BODY_HEAD.unpack_from(body, 0)
        pos = _BODY_HEAD.size
        entries = []
        for _ in range(count):
            pid, epoch, coord, last_ts, txn_first, start_seq, rec_count, n = _ENTRY.unpack_from(
                body, pos
            )
            pos += _ENTRY.size
            batches: deque[BatchMetadata] = deque()
            for _ in range(n):
                batches.append(BatchMetadata(*_BATCH.unpack_from(body, pos)))
                pos += _BATCH.size
            entries.append(
                ProducerStateEntry(
                    producer_id=pid,
                    window=window,
                    epoch=epoch,
                    batches=batches,
                    current_txn_first_offset=txn_first,
                    last_timestamp=last_ts,
                    coordinator_epoch=coord,
                    epoch_start_sequence=start_seq,
                    epoch_record_count=rec_count,
                )
            )
    except struct.error as exc:
        raise CorruptRecordError(f"{name}: truncated entry ({exc})") from exc
    if pos != len(body):
        raise CorruptRecordError(f"{name}: {len(body) - pos} trailing bytes")
    return offset, entries


def write_snapshot(
    directory: Path, offset: int, entries: list[ProducerStateEntry], *, sync: bool = True
) -> Path:
    """Write the snapshot; with ``sync=False`` the caller fsyncs it (and the directory)."""
    path = snapshot_path(directory, offset)
    atomic_write(path, encode_snapshot(offset, entries), sync=sync)
    return path


def read_snapshot(path: Path, *, window: int) -> tuple[int, list[ProducerStateEntry]]:
    offset, entries = decode_snapshot(path.read_bytes(), window=window, name=str(path))
    stem_offset = int(path.name[: -len(SUFFIX)])
    if offset != stem_offset:
        raise CorruptRecordError(f"{path}: holds offset {offset}, its name says {stem_offset}")
    return offset, entries


def load_newest_valid(
    directory: Path, *, window: int, at_most: int | None = None
) -> tuple[int, list[ProducerStateEntry]] | None:
    """The newest readable snapshot at or below ``at_most``; bad ones are deleted."""
    for offset, path in reversed(list_snapshots(directory)):
        if at_most is not None and offset > at_most:
            log.warning("deleting snapshot %s: beyond the log end offset %d", path, at_most)
            path.unlink(missing_ok=True)
            continue
        try:
            return read_snapshot(path, window=window)
        except (CorruptRecordError, OSError) as exc:
            log.warning("deleting unreadable producer snapshot: %s", exc)
            path.unlink(missing_ok=True)
    return None


def delete_snapshots_below(directory: Path, offset: int, keep_newest: bool = True) -> None:
    snaps = list_snapshots(directory)
    for snap_offset, path in snaps[:-1] if keep_newest else snaps:
        if snap_offset < offset:
            path.unlink(missing_ok=True)
