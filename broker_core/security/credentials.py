"""Where SCRAM credentials live: ZooKeeper on a cluster, a file in the data directory embedded.

Each user has one record: its credential per mechanism in Kafka's stored form
(``{"version": 1, "config": {"SCRAM-SHA-256": "salt=..,stored_key=..,server_key=..,
iterations=4096"}}``), never the password. On a cluster the record is the znode
``<root>/config/users/<name>`` (``root`` is ``/idemlog`` under the chroot); every broker
watches the users' node and each user's, so an added user, a new password or a removal
reaches every broker without a restart. Embedded, the records are one JSON file,
``<log.dir>/__users.json``, mode 0600, replaced atomically; the broker re-reads it when
its size, inode or modification time changed, at the next handshake.

Bounds: one cached record per user (a few hundred bytes) and, on ZooKeeper, one watch
per user; both as many as the users an operator added.

Writes (``idemlog users``) are conditional: ZooKeeper's on the node's version, the
file's under an exclusive ``flock`` of ``__users.json.lock``; two operators at once
never lose one's change.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from broker_core.errors import InvalidConfigError
from broker_core.security import zk_acl
from broker_core.security.scram import Mechanism, ScramCredential
from broker_core.security.store_file import (
    FileIdentity,
    file_identity,
    locked_update,
    write_private,
)
from broker_core.security.zk_watched import WatchedZkRecords

log = logging.getLogger("idemlog.security")

USERS_FILE = "__users.json"
USERS_ZNODE = "config/users"  # under the cluster's root znode
RECORD_VERSION = 1
MAX_USERNAME_LENGTH = 256

# One user's credentials, by mechanism.
UserRecord = dict[Mechanism, ScramCredential]
# Told the name of a user whose record changed or went: its sessions end.
ChangeListener = Callable[[str], None]


def check_username(name: str) -> str:
    """``name`` if it can be a user (and a znode) name; InvalidConfigError naming it."""
    if not name or len(name) > MAX_USERNAME_LENGTH or name in (".", ".."):
        raise InvalidConfigError(f"user name {name!r}: 1 to {MAX_USERNAME_LENGTH} characters")
    if "/" in name or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise InvalidConfigError(f"user name {name!r} holds '/' or a control character")
    return name


def encode_record(record: Mapping[Mechanism, ScramCredential]) -> dict[str, Any]:
    return {
        "version": RECORD_VERSION,
        "config": {m.sasl_name: c.to_text() for m, c in sorted(record.items(), key=_by_name)},
    }


def _by_name(item: tuple[Mechanism, ScramCredential]) -> str:
    return item[0].sasl_name


def decode_record(doc: Any, what: str) -> UserRecord:
    """A record from its JSON document; InvalidConfigError naming ``what`` if malformed."""
    try:
        if doc["version"] != RECORD_VERSION:
            raise ValueError(f"version {doc['version']!r}")
        return {
            Mechanism.parse(name): ScramCredential.from_text(text)
            for name, text in doc["config"].items()
        }
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise InvalidConfigError(f"{what}: malformed SCRAM record ({exc})") from None


class CredentialStore(Protocol):
    """What a broker asks of a store, and what ``idemlog users`` changes."""

    def lookup(self, user: str, mechanism: Mechanism) -> ScramCredential | None: ...

    def users(self) -> dict[str, UserRecord]: ...

    def upsert(self, user: str, record: UserRecord) -> None: ...

    def remove(self, user: str) -> bool: ...

    def close(self) -> None: ...


class FileCredentialStore:
    """The embedded broker's store: ``<log.dir>/__users.json`` (mode 0600).

    ``on_change`` is told each user whose record changed or went since the last read.
    """

    def __init__(self, log_dir: Path, *, on_change: ChangeListener | None = None) -> None:
        self.path = log_dir / USERS_FILE
        self._lock_path = log_dir / (USERS_FILE + ".lock")
        self._on_change = on_change
        self._mutex = threading.Lock()
        self._seen: FileIdentity | None = None
        self._records: dict[str, UserRecord] = {}

    def lookup(self, user: str, mechanism: Mechanism) -> ScramCredential | None:
        return self._current().get(user, {}).get(mechanism)

    def users(self) -> dict[str, UserRecord]:
        return dict(self._current())

    def refresh(self) -> None:
        """Re-read the file if it changed (one ``stat`` otherwise), telling ``on_change``."""
        self._current()

    def _current(self) -> dict[str, UserRecord]:
        with self._mutex:
            seen = file_identity(self.path)
            if seen != self._seen:
                records = self._read() if seen is not None else {}
                changed = [
                    u
                    for u in set(records) | set(self._records)
                    if records.get(u) != self._records.get(u)
                ]
                self._records, self._seen = records, seen
                for user in changed:
                    if self._on_change is not None:
                        self._on_change(user)
            return self._records

    def _read(self) -> dict[str, UserRecord]:
        doc = json.loads(self.path.read_text(encoding="utf-8"))
        if not isinstance(doc, dict):
            raise InvalidConfigError(f"{self.path}: not a JSON object")
        return {
            check_username(name): decode_record(value, f"{self.path}: user {name!r}")
            for name, value in doc.items()
        }

    def _locked(self) -> AbstractContextManager[dict[str, UserRecord]]:
        return locked_update(self._lock_path, self.path, self._read, dict, self._write)

    def _write(self, records: Mapping[str, UserRecord]) -> None:
        data = json.dumps(
            {u: encode_record(r) for u, r in sorted(records.items())}, indent=1
        ).encode()
        write_private(self.path, data)

    def upsert(self, user: str, record: UserRecord) -> None:
        """Set ``user``'s credentials for the mechanisms in ``record`` (others kept)."""
        with self._locked() as records:
            records[check_username(user)] = {**records.get(user, {}), **record}

    def remove(self, user: str) -> bool:
        """Drop ``user``; False if there was none."""
        with self._locked() as records:
            return records.pop(user, None) is not None

    def close(self) -> None:
        pass


class ZkCredentialStore(WatchedZkRecords[UserRecord]):
    """A cluster's store: ``<root>/config/users/<name>`` on ``client`` (a started kazoo
    client on the chroot, which stays the caller's).

    ``watch=True`` (a broker) keeps a cache fed by watches and tells ``on_change`` each
    user whose record changed or went; ``watch=False`` (``idemlog users``) reads directly.
    """

    what = "user"
    _log = log

    def __init__(
        self,
        client: Any,
        root: str,
        *,
        watch: bool,
        on_change: ChangeListener | None = None,
    ) -> None:
        self._on_change = on_change
        super().__init__(client, f"{root}/{USERS_ZNODE}", watch=watch)

    # -- the broker's cache (zk_watched.py's hooks) ----------------------------------------
    def _decode(self, name: str, data: bytes) -> UserRecord:
        return decode_record(json.loads(data), f"{self.path}/{name}")

    def _invalid(self, name: str, exc: Exception) -> None:
        log.error("user %s: %s (the user cannot authenticate)", name, exc)
        return None

    def _children_changed(self, gone: list[str]) -> None:
        for user in gone:
            self._changed(user)

    def _record_changed(
        self, name: str, before: UserRecord | None, after: UserRecord | None
    ) -> None:
        if before is not None and before != after:
            self._changed(name)

    def _changed(self, user: str) -> None:
        if self._on_change is not None:
            self._on_change(user)

    def lookup(self, user: str, mechanism: Mechanism) -> ScramCredential | None:
        if self._watch:
            with self._lock:
                return self._records.get(user, {}).get(mechanism)
        return self._read(user)[0].get(mechanism)

    # -- direct reads and conditional writes ----------------------------------------------
    def _read(self, user: str) -> tuple[UserRecord, int]:
        return self._read_version(user, {})

    def users(self) -> dict[str, UserRecord]:
        if self._watch:
            with self._lock:
                return dict(self._records)
        return {name: self._read(name)[0] for name in sorted(self._client.get_children(self.path))}

    def upsert(self, user: str, record: UserRecord) -> None:
        """Set ``user``'s credentials for the mechanisms in ``record`` (others kept), by a
        write conditional on the version read (a concurrent change makes it try again)."""
        from kazoo.exceptions import BadVersionError, NodeExistsError

        path = f"{self.path}/{check_username(user)}"
        while True:
            current, version = self._read(user)
            data = json.dumps(encode_record({**current, **record})).encode()
            try:
                if version < 0:
                    zk_acl.create_async(self._client, path, data).get()
                else:
                    self._client.set(path, data, version=version)
                return
            except (BadVersionError, NodeExistsError):
                continue  # changed under us: read again

    def remove(self, user: str) -> bool:
        from kazoo.exceptions import NoNodeError

        try:
            self._client.delete(f"{self.path}/{check_username(user)}")
        except NoNodeError:
            return False
        return True
