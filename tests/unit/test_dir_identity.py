"""A log.dir's identity (broker_core.log.dir_identity): meta.properties and .running."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_core.errors import InvalidConfigError
from broker_core.log.dir_identity import (
    META_FILE,
    RUNNING_FILE,
    mark_clean_shutdown,
    open_identity,
)


def test_a_new_directory_gets_an_id_that_a_clean_or_killed_restart_keeps(tmp_path: Path) -> None:
    first = open_identity(tmp_path, 3, boot_id="boot-a")
    assert first.renewed is not None and "new or emptied" in first.renewed
    assert (tmp_path / META_FILE).read_text().splitlines()[1:] == [
        "node.id=3",
        f"directory.id={first.directory_id}",
    ]
    assert (tmp_path / RUNNING_FILE).read_text().strip() == "boot-a"
    # Killed (the marker stays) and restarted on the same boot: the page cache kept it all.
    killed = open_identity(tmp_path, 3, boot_id="boot-a")
    assert (killed.directory_id, killed.renewed) == (first.directory_id, None)
    # A clean shutdown, then a start after a reboot: nothing was lost either.
    mark_clean_shutdown(tmp_path)
    assert not (tmp_path / RUNNING_FILE).exists()
    clean = open_identity(tmp_path, 3, boot_id="boot-b")
    assert (clean.directory_id, clean.renewed) == (first.directory_id, None)


def test_a_reboot_under_a_running_broker_or_a_wiped_directory_gives_a_new_id(
    tmp_path: Path,
) -> None:
    first = open_identity(tmp_path, 3, boot_id="boot-a")
    rebooted = open_identity(tmp_path, 3, boot_id="boot-b")  # .running of boot-a found
    assert rebooted.directory_id != first.directory_id
    assert rebooted.renewed is not None and "rebooted" in rebooted.renewed
    (tmp_path / META_FILE).unlink()
    wiped = open_identity(tmp_path, 3, boot_id="boot-b")
    assert wiped.directory_id not in (first.directory_id, rebooted.directory_id)


def test_another_brokers_directory_is_refused_by_name(tmp_path: Path) -> None:
    open_identity(tmp_path, 2, boot_id="boot-a")
    with pytest.raises(InvalidConfigError, match=r"belongs to node.id=2.*broker.id=3"):
        open_identity(tmp_path, 3, boot_id="boot-a")
    (tmp_path / META_FILE).write_text("node.id 2\n")
    with pytest.raises(InvalidConfigError, match="not key=value"):
        open_identity(tmp_path, 2, boot_id="boot-a")
