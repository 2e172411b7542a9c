"""Small filesystem helpers shared by the log, the snapshots and the topic metadata, and
the data-directory lock (``DirectoryLock``: one process per data directory)."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

Piece = Any  # anything with the buffer protocol


def fsync_directory(directory: Path) -> None:
    """Make a create/rename/delete in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def pwrite_all(fd: int, pieces: Sequence[Piece], position: int) -> int:
    """Write ``pieces`` back to back at ``position`` with as few syscalls as possible."""
    views = [memoryview(p).cast("B") for p in pieces]
    written = 0
    while views:
        n = os.pwritev(fd, views[:_IOV_MAX], position + written)
        if n <= 0:
            raise OSError(f"pwritev wrote {n} bytes")
        written += n
        while views and n >= len(views[0]):
            n -= len(views.pop(0))
        if n:
            views[0] = views[0][n:]
    return written


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], call)


_SYNC_FILE_RANGE = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writing the range's dirty pages, no wait


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Ask the kernel to start writing ``nbytes`` at ``offset`` of ``fd`` to the disk and
    return without waiting (Linux's ``sync_file_range(SYNC_FILE_RANGE_WRITE)``), so that
    a later fsync of the file finds those pages written or on their way. Durability is
    unchanged: only fsync makes data durable, and it reports any error of these writes.
    Returns False where the call does not exist (not Linux); raises OSError when the
    kernel refuses the request."""
    if _SYNC_FILE_RANGE is None:
        return False
    if _SYNC_FILE_RANGE(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"sync_file_range: {os.strerror(code)}")
    return True


def atomic_write(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file whole.

    ``sync=False`` skips the fsyncs (the caller makes the file durable later, see
    ``fsync_file``); until then a power loss may leave the new name with partial data.
    """
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        fsync_directory(path.parent)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- the data-directory lock -------------------------------------------------------------------
LOCK_FILE = ".lock"
"""Kafka's name: the file in a data directory that its owning process holds an OS lock on."""
# A data directory's identity files (log/dir_identity.py), beside the lock in log.dir.
META_FILE = "meta.properties"
RUNNING_FILE = ".running"

_PID_BYTES = 32  # a pid and a newline, with room; the lock file holds nothing else


class DirectoryLockedError(OSError):
    """Another open file description holds ``<directory>/.lock``; ``holder`` is the pid
    written into the file by the process that holds it (None if it wrote none yet)."""

    def __init__(self, directory: Path, holder: int | None) -> None:
        who = f"process {holder}" if holder is not None else "another process"
        super().__init__(errno.EAGAIN, f"data directory {directory} is locked by {who}")
        self.directory = directory
        self.holder = holder


class DirectoryLock:
    """An exclusive ``flock`` on ``<directory>/.lock``, held until :meth:`release` or the
    process's end.

    ``flock`` belongs to the open file description, so the kernel drops it when its holder
    dies however it dies: a lock file left by a killed process never blocks (only a live
    holder does), and no stale-lock cleanup exists. The descriptor is not inherited
    (``os.open`` gives O_CLOEXEC), so a child process never keeps the lock. A second
    ``DirectoryLock`` of the same directory conflicts even within one process.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock without waiting and write this process's pid into the file.

        Raises DirectoryLockedError naming the holder's pid if another holds it, OSError
        if the file cannot be created or opened.
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise DirectoryLockedError(self.directory, holder) from None
        except BaseException:
            os.close(fd)
            raise
        # Written after the lock is taken: whoever reads a pid while the lock is held
        # reads the holder's (a reader may see the file empty for an instant).
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Drop the lock (closing the descriptor); the file stays, as Kafka's does. Idempotent."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def directory_lock_holder(directory: Path) -> int | None:
    """Whether a live process holds ``<directory>/.lock``: its pid (or -1 when it wrote
    none), else None. Creates nothing: a directory without the file is unlocked.

    The check takes a shared lock for an instant and drops it at once, so a broker that
    starts during that instant finds the directory locked (by its previous holder's pid,
    or none) and refuses; it never waits on it.
    """
    try:
        fd = os.open(directory / LOCK_FILE, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None  # no lock file, or no directory: nothing holds it
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            return -1 if holder is None else holder
        return None
    finally:
        os.close(fd)  # drops the shared lock, if taken


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, _PID_BYTES, 0).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None
