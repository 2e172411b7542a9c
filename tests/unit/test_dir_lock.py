"""The data-directory lock (broker_core/fileutil.py DirectoryLock) within one process; the
two-process cases, a killed holder among them, are in tests/broker/test_data_dir.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker_core.errors import LogDirLockedError
from broker_core.fileutil import LOCK_FILE, DirectoryLock, directory_lock_holder
from broker_core.log.dir_lock import lock_data_dir


def test_second_lock_of_a_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = lock_data_dir(tmp_path)
    assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    with pytest.raises(LogDirLockedError) as info:
        lock_data_dir(tmp_path)  # another open file description: refused, even in-process
    assert info.value.code == 10004 and not info.value.retriable
    assert f"log.dir {tmp_path} is in use" in info.value.message
    assert f"locked by process {os.getpid()}" in info.value.message
    assert directory_lock_holder(tmp_path) == os.getpid()
    first.release()
    first.release()  # idempotent
    assert directory_lock_holder(tmp_path) is None
    again = lock_data_dir(tmp_path)  # free again; the file stays, as Kafka's does
    assert again.held
    again.release()


def test_holder_check_creates_nothing(tmp_path: Path) -> None:
    assert directory_lock_holder(tmp_path) is None
    assert directory_lock_holder(tmp_path / "missing") is None
    assert list(tmp_path.iterdir()) == []


def test_a_lock_file_naming_a_pid_is_not_a_lock(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_text("1\n")  # a pid that lives, but holds no flock
    assert directory_lock_holder(tmp_path) is None
    lock = DirectoryLock(tmp_path)
    lock.acquire()
    assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"  # rewritten, not appended
    lock.release()
