"""The ZooKeeper half of the security stores a broker caches (``ZkCredentialStore``:
``credentials.py``, ``ZkAclStore``: ``acl_store.py``): one znode per record under
``path``, a children watch that forgets records gone and a data watch per record, kept on
kazoo's threads without blocking them (docs/security.md).

What a record is, what a bad one counts as and whom a change is told stay the store's:
the hooks below. The cache holds one entry per child znode: bounded by the records
written, as the znodes are.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from broker_core.errors import InvalidConfigError
from broker_core.security import zk_acl

R = TypeVar("R")

log = logging.getLogger(__name__)


class WatchedZkRecords(ABC, Generic[R]):
    """Records ``<path>/<name>`` on ``client`` (a started kazoo client on the chroot,
    which stays the caller's); the path is created with the tree's ACL. ``watch=True``
    keeps ``_records`` fed by watches (read under ``_lock``); ``watch=False`` leaves it
    empty for a store that reads directly.

    Subclasses give :meth:`_decode` and may override the hooks, each documented where it
    is called."""

    what = "record"  # names a record in the log lines
    _log = log  # a subclass's module logger, so its lines keep their logger's name

    def __init__(self, client: Any, path: str, *, watch: bool) -> None:
        self._client = client
        self.path = path
        self._watch = watch
        self._lock = threading.Lock()
        self._records: dict[str, R] = {}
        self._watched: set[str] = set()
        self._closed = False
        self._loaded = threading.Event()  # every record there at the start is cached
        zk_acl.ensure_path(client, self.path)  # with the tree's ACL (zookeeper.set.acl)
        if watch:
            from kazoo.recipe.watchers import ChildrenWatch

            ChildrenWatch(client, self.path, self._on_children)

    # -- hooks -----------------------------------------------------------------------------
    @abstractmethod
    def _decode(self, name: str, data: bytes) -> R:
        """The record in ``data``; raises ``InvalidConfigError`` or ``ValueError``."""

    def _invalid(self, name: str, exc: Exception) -> R | None:
        """What a record that does not decode counts as (None: absent); logged here."""
        self._log.error("%s %s: %s (ignored)", self.what, name, exc)
        return None

    def _updated(self) -> None:
        """Under ``_lock``, after ``_records`` changed: rebuild what is derived from it."""

    def _children_changed(self, gone: list[str]) -> None:
        """Outside the lock, after a children event forgot ``gone``."""

    def _record_changed(self, name: str, before: R | None, after: R | None) -> None:
        """Outside the lock, after a data event set ``name``'s record (None: gone)."""

    # -- the watches ---------------------------------------------------------------------
    def _on_children(self, names: list[str]) -> bool:
        """kazoo's thread, must not block: forget records gone; watch new ones elsewhere."""
        with self._lock:
            if self._closed:
                return False
            gone = [n for n in self._records if n not in names]
            for name in gone:
                del self._records[name]
            new = [n for n in names if n not in self._watched]
            self._watched.update(new)
            self._watched.intersection_update(names)
            self._updated()
        if not new:
            self._loaded.set()
        else:
            # A DataWatch reads its node at once: on a thread of its own.
            self._client.handler.spawn(self._watch_records, new)
        self._children_changed(gone)
        return True

    def _watch_records(self, names: list[str]) -> None:
        from kazoo.recipe.watchers import DataWatch

        for name in names:
            try:
                DataWatch(self._client, f"{self.path}/{name}", self._data_callback(name))
            except Exception as exc:
                self._log.warning("could not watch %s %s: %r", self.what, name, exc)
                with self._lock:
                    self._watched.discard(name)
        self._loaded.set()

    def _data_callback(self, name: str) -> Callable[..., bool]:
        def on_data(data: bytes | None, stat: Any, *_: Any) -> bool:
            record: R | None = None
            if data is not None:
                try:
                    record = self._decode(name, data)
                except (InvalidConfigError, ValueError) as exc:
                    record = self._invalid(name, exc)
            with self._lock:
                if self._closed:
                    return False
                before = self._records.get(name)
                if record is None:
                    self._records.pop(name, None)
                else:
                    self._records[name] = record
                if data is None:
                    self._watched.discard(name)
                self._updated()
            self._record_changed(name, before, record)
            return data is not None

        return on_data

    def _read_version(self, name: str, empty: R) -> tuple[R, int]:
        """``name``'s record read directly and its znode version (``empty`` and -1 when
        there is none), for a write conditional on that version. Raises as
        :meth:`_decode`."""
        from kazoo.exceptions import NoNodeError

        try:
            data, stat = self._client.get(f"{self.path}/{name}")
        except NoNodeError:
            return empty, -1
        return self._decode(name, data), int(stat.version)

    def wait_loaded(self, timeout_s: float) -> bool:
        """Whether the records present when the watch started are cached, waiting up to
        ``timeout_s`` (a broker waits before it serves)."""
        return self._loaded.wait(timeout_s)

    def close(self) -> None:
        """Stop the watches (each returns False at its next event)."""
        with self._lock:
            self._closed = True
