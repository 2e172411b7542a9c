"""Where ACLs live: ZooKeeper on a cluster, a file in the data directory embedded.

As Kafka keeps them, one record per resource pattern: the JSON of its bindings
(``{"version": 1, "acls": [{"principal", "host", "operation", "permission"}, ..]}``).
On a cluster the record is the znode ``<root>/acls/<Type>:<PATTERN>:<name>`` (``root``
is ``/idemlog`` under the chroot; the name percent-encoded, since a transactional id may
hold ``/``); every broker watches the ACLs' node and each record's, so an added or
removed ACL reaches every broker within ZooKeeper's notification delay (milliseconds),
without a restart. Embedded, the bindings are one JSON file, ``<log.dir>/__acls.json``,
replaced atomically; the broker re-reads it when its size, inode or modification time
changed, at the next request.

Bounds: the bindings an operator wrote, cached once (about 200 bytes each) and, on
ZooKeeper, one watch per resource pattern that has any.

Writes (``idemlog acls``) are conditional: ZooKeeper's on the record's version (a
concurrent writer makes the other read again), the file's under an exclusive ``flock``
of ``__acls.json.lock``; two operators adding at once never lose one's ACL.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from broker_core.errors import InvalidConfigError
from broker_core.security import zk_acl
from broker_core.security.acl import (
    AclBinding,
    AclEntry,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
)
from broker_core.security.principal import Principal
from broker_core.security.store_file import (
    FileIdentity,
    file_identity,
    locked_update,
    write_private,
)
from broker_core.security.zk_watched import WatchedZkRecords

log = logging.getLogger("idemlog.security")

ACLS_FILE = "__acls.json"
ACLS_ZNODE = "acls"  # under the cluster's root znode
RECORD_VERSION = 1

Bindings = tuple[AclBinding, ...]


def _entry_doc(e: AclEntry) -> dict[str, str]:
    return {
        "principal": str(e.principal),
        "host": e.host,
        "operation": e.operation.value,
        "permission": e.permission.value,
    }


def _entry(doc: Any, pattern: ResourcePattern, what: str) -> AclBinding:
    try:
        return AclBinding.of(
            pattern,
            Principal.parse(doc["principal"]),
            Operation.parse(doc["operation"]),
            Permission(doc["permission"]),
            doc["host"],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidConfigError(f"{what}: malformed ACL ({exc})") from None


def binding_doc(b: AclBinding) -> dict[str, str]:
    """One binding as the file and ``idemlog acls list --json`` write it."""
    return {
        "resource_type": b.pattern.type.value,
        "pattern_type": b.pattern.pattern.value,
        "name": b.pattern.name,
        **_entry_doc(b.entry),
    }


def binding_from_doc(doc: Any, what: str) -> AclBinding:
    try:
        pattern = ResourcePattern(
            ResourceType.parse(doc["resource_type"]),
            PatternType.parse(doc["pattern_type"]),
            str(doc["name"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidConfigError(f"{what}: malformed ACL ({exc})") from None
    return _entry(doc, pattern, what)


def _order(b: AclBinding) -> tuple[str, ...]:
    return (str(b.pattern), str(b.entry.principal), b.entry.operation, b.entry.host)


class AclStore(Protocol):
    """What a broker asks of a store, and what ``idemlog acls`` changes."""

    def bindings(self) -> Bindings: ...

    def add(self, bindings: Iterable[AclBinding]) -> int: ...

    def remove(self, bindings: Iterable[AclBinding]) -> int: ...

    def close(self) -> None: ...


class FileAclStore:
    """The embedded broker's store: ``<log.dir>/__acls.json``. :meth:`bindings` costs
    one ``stat`` when the file did not change."""

    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / ACLS_FILE
        self._lock_path = log_dir / (ACLS_FILE + ".lock")
        self._mutex = threading.Lock()
        self._seen: FileIdentity | None = None
        self._bindings: Bindings = ()

    def bindings(self) -> Bindings:
        with self._mutex:
            seen = file_identity(self.path)
            if seen != self._seen:
                self._bindings = self._read() if seen is not None else ()
                self._seen = seen
            return self._bindings

    def _read(self) -> Bindings:
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            if doc["version"] != RECORD_VERSION:
                raise ValueError(f"version {doc['version']!r}")
            acls = doc["acls"]
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidConfigError(f"{self.path}: not an ACL file ({exc})") from None
        return tuple(binding_from_doc(a, str(self.path)) for a in acls)

    def _locked(self) -> AbstractContextManager[list[AclBinding]]:
        return locked_update(
            self._lock_path, self.path, lambda: list(self._read()), list, self._write
        )

    def _write(self, bindings: list[AclBinding]) -> None:
        doc = {
            "version": RECORD_VERSION,
            "acls": [binding_doc(b) for b in sorted(set(bindings), key=_order)],
        }
        write_private(self.path, json.dumps(doc, indent=1).encode())

    def add(self, bindings: Iterable[AclBinding]) -> int:
        """Add the bindings not there yet; how many were new."""
        with self._locked() as current:
            new = [b for b in dict.fromkeys(bindings) if b not in current]
            current.extend(new)
            return len(new)

    def remove(self, bindings: Iterable[AclBinding]) -> int:
        """Remove the bindings that are there; how many were."""
        gone = set(bindings)
        with self._locked() as current:
            kept = [b for b in current if b not in gone]
            removed = len(current) - len(kept)
            current[:] = kept
            return removed

    def close(self) -> None:
        pass


def node_name(pattern: ResourcePattern) -> str:
    """A pattern's znode name: ``Type:PATTERN:<percent-encoded name>``."""
    quoted = urllib.parse.quote(pattern.name, safe="")
    return f"{pattern.type.value}:{pattern.pattern.value}:{quoted}"


def pattern_of_node(name: str) -> ResourcePattern:
    kind, pattern, quoted = name.split(":", 2)
    return ResourcePattern(
        ResourceType.parse(kind), PatternType.parse(pattern), urllib.parse.unquote(quoted)
    )


class ZkAclStore(WatchedZkRecords[Bindings]):
    """A cluster's store: ``<root>/acls/<pattern>`` on ``client`` (a started kazoo client
    on the chroot, which stays the caller's).

    ``watch=True`` (a broker) keeps a cache fed by watches; ``on_change`` (if given) is
    called after each change reaches it. ``watch=False`` (``idemlog acls``) reads directly.
    """

    what = "ACL record"
    _log = log

    def __init__(
        self,
        client: Any,
        root: str,
        *,
        watch: bool,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._on_change = on_change
        self._snapshot: Bindings = ()
        super().__init__(client, f"{root}/{ACLS_ZNODE}", watch=watch)

    # -- the broker's cache (zk_watched.py's hooks) ----------------------------------------
    def _invalid(self, name: str, exc: Exception) -> Bindings:
        # Its bindings count as absent: with deny-by-default that refuses, it never allows
        # more than was written.
        log.error("ACL record %s: %s (ignored)", name, exc)
        return ()

    def _updated(self) -> None:
        self._snapshot = tuple(b for r in self._records.values() for b in r)

    def _children_changed(self, gone: list[str]) -> None:
        self._changed()

    def _record_changed(self, name: str, before: Bindings | None, after: Bindings | None) -> None:
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    # -- reads and conditional writes -----------------------------------------------------
    def _decode(self, name: str, data: bytes) -> Bindings:
        what = f"{self.path}/{name}"
        pattern = pattern_of_node(name)
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("version") != RECORD_VERSION:
            raise InvalidConfigError(f"{what}: not an ACL record of version {RECORD_VERSION}")
        return tuple(_entry(e, pattern, what) for e in doc.get("acls", []))

    def _read(self, name: str) -> tuple[Bindings, int]:
        return self._read_version(name, ())

    def bindings(self) -> Bindings:
        if self._watch:
            return self._snapshot  # replaced whole under the lock: a consistent view
        return tuple(
            b for name in sorted(self._client.get_children(self.path)) for b in self._read(name)[0]
        )

    def _update(self, pattern: ResourcePattern, change: Callable[[list[AclBinding]], int]) -> int:
        """Apply ``change`` to one record by a write conditional on the version read;
        a concurrent writer makes it read again. The record goes when it empties."""
        from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

        name = node_name(pattern)
        path = f"{self.path}/{name}"
        while True:
            current, version = self._read(name)
            updated = list(current)
            changed = change(updated)
            if not changed:
                return 0
            data = json.dumps(
                {"version": RECORD_VERSION, "acls": [_entry_doc(b.entry) for b in updated]}
            ).encode()
            try:
                if version < 0:
                    zk_acl.create_async(self._client, path, data).get()
                elif not updated:
                    self._client.delete(path, version=version)
                else:
                    self._client.set(path, data, version=version)
                return changed
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue  # changed under us: read again

    def add(self, bindings: Iterable[AclBinding]) -> int:
        added = 0
        for pattern, group in _by_pattern(bindings).items():

            def extend(current: list[AclBinding], group: list[AclBinding] = group) -> int:
                new = [b for b in group if b not in current]
                current.extend(new)
                return len(new)

            added += self._update(pattern, extend)
        return added

    def remove(self, bindings: Iterable[AclBinding]) -> int:
        removed = 0
        for pattern, group in _by_pattern(bindings).items():

            def drop(current: list[AclBinding], group: list[AclBinding] = group) -> int:
                kept = [b for b in current if b not in group]
                count = len(current) - len(kept)
                current[:] = kept
                return count

            removed += self._update(pattern, drop)
        return removed


def _by_pattern(bindings: Iterable[AclBinding]) -> dict[ResourcePattern, list[AclBinding]]:
    groups: dict[ResourcePattern, list[AclBinding]] = {}
    for b in dict.fromkeys(bindings):
        groups.setdefault(b.pattern, []).append(b)
    return groups
