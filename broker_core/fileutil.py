"""Small filesystem helpers shared by the log, the snapshots and the topic metadata."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
