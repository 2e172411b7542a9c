"""A data directory's identity: which broker it belongs to and which copy of data it holds.

Kafka's ``meta.properties`` idea. ``log.dir/meta.properties`` holds ``node.id`` (the
broker id it belongs to) and ``directory.id`` (a UUID). The directory id names *this
copy* of the broker's data: a new or wiped directory gets a new one, and so does a
directory whose data may be incomplete because the machine went down without a clean
shutdown. The broker registers with it, and every ISR entry records the one its member
had when admitted (``PartitionState.isr_dirs``): a replica that comes back with another
id has lost what it acknowledged and is never elected from the ISR.

How an unclean machine stop is told: ``log.dir/.running`` holds the OS boot id
(``/proc/sys/kernel/random/boot_id``) while a broker runs, written at start and removed
by a clean shutdown. Found at start with another boot id, the machine rebooted under a
running broker: what was in the page cache and not yet on disk is gone (the log is not
fsynced per batch), so the directory gets a new id. Found with the same boot id, only the
process died (SIGKILL): the page cache kept every write, the id stays.

A directory of another node.id is refused at start: serving broker 2's logs as broker 3
would mix two replicas' histories.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path

from broker_core.errors import InvalidConfigError, StorageError
from broker_core.fileutil import META_FILE, RUNNING_FILE, atomic_write

__all__ = [
    "META_FILE",
    "RUNNING_FILE",
    "DirIdentity",
    "current_boot_id",
    "mark_clean_shutdown",
    "open_identity",
]

log = logging.getLogger("idemlog.log")

META_VERSION = 1
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class DirIdentity:
    """The directory's ``node_id`` and ``directory_id``; ``renewed`` says why the id was
    (re)assigned at this start, or is None when it carried over."""

    node_id: int
    directory_id: str
    renewed: str | None


def current_boot_id() -> str | None:
    """The OS boot id (Linux), or None where there is none (then a reboot is not told)."""
    try:
        return _BOOT_ID.read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def open_identity(directory: Path, node_id: int, boot_id: str | None = None) -> DirIdentity:
    """Read (or give) ``directory``'s identity for broker ``node_id`` and mark it running.

    Call with the directory locked, before anything in it is read. Raises
    InvalidConfigError for a directory of another node.id or an unreadable
    meta.properties (named), StorageError when the files cannot be written.
    """
    boot = boot_id if boot_id is not None else current_boot_id()
    meta_path, running = directory / META_FILE, directory / RUNNING_FILE
    meta = _read_meta(meta_path)
    renewed: str | None = None
    if meta is None:
        renewed = "a new or emptied directory (no meta.properties)"
    else:
        owner = meta.get("node.id")
        if owner != str(node_id):
            raise InvalidConfigError(
                f"log.dir {directory} belongs to node.id={owner} ({meta_path}), not to this "
                f"broker.id={node_id}: another broker's data; give each broker its own log.dir"
            )
        if not meta.get("directory.id"):
            raise InvalidConfigError(f"{meta_path}: no directory.id")
        previous = _read_text(running)
        if previous is not None and boot is not None and previous != boot:
            renewed = (
                f"the machine rebooted (boot id {previous} -> {boot}) without a clean "
                "shutdown of this broker: writes not yet on disk are lost"
            )
    directory_id = meta["directory.id"] if meta is not None and renewed is None else None
    try:
        if directory_id is None:
            directory_id = str(uuid.uuid4())
            _write_atomic(
                meta_path,
                f"version={META_VERSION}\nnode.id={node_id}\ndirectory.id={directory_id}\n",
            )
            log.warning("log.dir %s: new directory.id %s: %s", directory, directory_id, renewed)
        _write_atomic(running, f"{boot or 'unknown'}\n")
    except OSError as exc:
        raise StorageError(f"log.dir {directory}: cannot write its identity: {exc}") from exc
    return DirIdentity(node_id, directory_id, renewed)


def mark_clean_shutdown(directory: Path) -> None:
    """The last step of a clean shutdown: everything is on disk, the id stays valid."""
    try:
        (directory / RUNNING_FILE).unlink(missing_ok=True)
    except OSError as exc:
        log.warning("log.dir %s: %s not removed (%s)", directory, RUNNING_FILE, exc)


def _read_meta(path: Path) -> dict[str, str] | None:
    text = _read_text(path)
    if text is None:
        return None
    entries: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise InvalidConfigError(f"{path}: line {number} {line!r} is not key=value")
        entries[key.strip()] = value.strip()
    return entries


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(f"cannot read {path}: {exc}") from exc


def _write_atomic(path: Path, text: str) -> None:
    atomic_write(path, text.encode())
