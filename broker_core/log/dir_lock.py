"""The data-directory lock of a broker: one process per ``log.dir`` (Kafka's ``.lock``).

A broker takes it before it reads or writes anything in the directory (recovery may
truncate segments, the producer-id block file is rewritten) and holds it for its life;
the OS lock dies with the process, so a lock file left by a killed broker never blocks a
restart. Inspection (``broker_core.log.inspect``) never takes it: it only asks whether a
live process holds it. The mechanism is ``broker_core.fileutil.DirectoryLock``.
"""

from __future__ import annotations

from pathlib import Path

from broker_core.errors import LogDirLockedError
from broker_core.fileutil import (
    LOCK_FILE,
    DirectoryLock,
    DirectoryLockedError,
    directory_lock_holder,
)

__all__ = ["LOCK_FILE", "DirectoryLock", "lock_data_dir", "lock_holder"]


def lock_data_dir(directory: Path) -> DirectoryLock:
    """Lock ``directory`` (which must exist) for this process; the caller releases it.

    Raises LogDirLockedError, one line naming the directory and the holder's pid when
    known, if a live process holds it; OSError if the lock file cannot be opened.
    """
    lock = DirectoryLock(directory)
    try:
        lock.acquire()
    except DirectoryLockedError as exc:
        who = f"process {exc.holder}" if exc.holder is not None else "another process"
        raise LogDirLockedError(
            f"log.dir {directory} is in use: {directory / LOCK_FILE} is locked by {who} "
            f"(a broker serves it; one process per data directory)"
        ) from None
    return lock


def lock_holder(directory: Path) -> int | None:
    """The pid of the live process holding ``directory``'s lock (-1: unknown pid), or
    None when none does. Creates no file."""
    return directory_lock_holder(directory)
