"""The embedded producer-id block source: the ZooKeeper record kept in a local file.

See ``broker_core.producer_ids.block`` for the record and the leasing rules.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from broker_core.errors import (
    ProducerIdAllocationError,
)
from broker_core.fileutil import atomic_write
from broker_core.producer_ids.block import ProducerIdBlock, check_broker_id, next_block_after


class FileProducerIdBlockSource:
    """The embedded default without ZooKeeper: the same record in a local file.

    Each lease takes an exclusive ``flock`` on ``<path>.lock`` (a separate file, because the
    record itself is replaced by rename), reads the record, and writes the next one
    atomically: temp file, fsync, rename over the record, fsync the directory. Processes and
    threads on one machine therefore never get overlapping blocks, and a crash leaves either
    the old or the new record, never a torn one.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._lock_path = self._path.with_name(self._path.name + ".lock")

    @property
    def path(self) -> Path:
        return self._path

    def next_block(self, broker_id: int) -> ProducerIdBlock:
        check_broker_id(broker_id)
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise self._io_error("cannot open the lock file", self._lock_path, exc) from exc
        try:
            # Held for one read and one small write; released when the fd is closed, even if
            # the process dies, so a crashed holder never blocks the others.
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            except OSError as exc:
                raise self._io_error("cannot lock", self._lock_path, exc) from exc
            previous = self._read()
            block = next_block_after(previous, broker_id)
            self._write(block)
            return block
        finally:
            os.close(lock_fd)

    def latest_block(self) -> ProducerIdBlock | None:
        """The most recently leased block (read-only, no lock: the record is renamed in)."""
        return self._read()

    def _read(self) -> ProducerIdBlock | None:
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._io_error("cannot read", self._path, exc) from exc
        return ProducerIdBlock.from_record(data, f"in file {self._path}")

    def _write(self, block: ProducerIdBlock) -> None:
        try:
            atomic_write(self._path, block.to_record())
        except OSError as exc:
            raise self._io_error("cannot write", self._path, exc) from exc

    @staticmethod
    def _io_error(what: str, path: Path, exc: OSError) -> ProducerIdAllocationError:
        return ProducerIdAllocationError(f"producer id block record: {what} {path}: {exc}")
