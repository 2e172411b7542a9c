"""A file's pages in the page cache, as the kernel counts them (Linux ``cachestat``, 6.5+):
how a test sees that data was written back to disk without an fsync of its own."""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass
from pathlib import Path

_CACHESTAT = {"x86_64": 451, "aarch64": 451}  # the syscall's number (the same on both)


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [
        ("nr_cache", ctypes.c_uint64),
        ("nr_dirty", ctypes.c_uint64),
        ("nr_writeback", ctypes.c_uint64),
        ("nr_evicted", ctypes.c_uint64),
        ("nr_recently_evicted", ctypes.c_uint64),
    ]


@dataclass(frozen=True)
class PageCounts:
    cached: int
    dirty: int  # changed in memory, not yet handed to the disk
    writeback: int  # handed to the disk, not yet written


def page_counts(path: Path) -> PageCounts:
    """The whole file's page counts. Raises OSError naming the reason when the kernel has
    no ``cachestat`` (before Linux 6.5): the tests that use it need it."""
    number = _CACHESTAT.get(platform.machine())
    if number is None:
        raise OSError(f"cachestat: no syscall number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        stat = _Stat()
        whole = _Range(0, 0)  # len 0: to the end of the file
        if libc.syscall(number, fd, ctypes.byref(whole), ctypes.byref(stat), 0) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"cachestat({path}): {os.strerror(code)}")
    finally:
        os.close(fd)
    return PageCounts(int(stat.nr_cache), int(stat.nr_dirty), int(stat.nr_writeback))
