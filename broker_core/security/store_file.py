"""The file half of the security stores (``__users.json``, ``__acls.json``): one JSON
file in the embedded broker's ``log.dir``, read again only when its identity changes,
changed under an ``flock`` by a read-modify-write and replaced whole (docs/security.md).

Both ``FileCredentialStore`` (``credentials.py``) and ``FileAclStore`` (``acl_store.py``)
use these; what the file holds and how it is decoded stays theirs.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from broker_core.fileutil import fsync_directory, write_all

T = TypeVar("T")

FileIdentity = tuple[int, int, int]
"""(inode, size, mtime_ns): a replaced or rewritten file has another."""


def file_identity(path: Path) -> FileIdentity | None:
    """``path``'s identity, or None when there is no file: one ``stat``, the whole cost
    of a store's read when the file did not change."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@contextmanager
def locked_update(
    lock_path: Path,
    path: Path,
    read: Callable[[], T],
    empty: Callable[[], T],
    write: Callable[[T], None],
) -> Iterator[T]:
    """Yield the file's content (``read()``, or ``empty()`` when there is no file) under an
    exclusive ``flock`` on ``lock_path`` (mode 0600), for the block to change in place;
    ``write(content)`` runs, still under the lock, only when the block ends without an
    exception, so a failed change writes nothing. The lock is released either way."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        content = read() if path.exists() else empty()
        yield content
        write(content)
    finally:
        os.close(fd)  # releases the flock


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically and durably, mode 0600 from the start: a
    reader sees the old file or the new, whole, and the file is never readable by
    others, not even briefly. Raises ``OSError`` as the writes do (the old file stays)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an old .tmp left behind keeps its mode otherwise
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)
