"""The embedded broker's per-start token: only its owner's processes may call it.

The embedded broker (``spark_sink/embedded.py``) listens on loopback, where every local
user can connect. So at each start the broker writes a fresh random token into
``listener.token.file`` (mode 0600: readable by its owner only) before it listens, and
refuses every call that does not carry that token in the :data:`TOKEN_HEADER` header
(:class:`TokenServerMiddlewareFactory`, checked before any handler runs). A client learns
the file of an address from :func:`register` (``ensure_broker`` registers the broker it
finds or starts, in each process) and sends the file's current token with every call
(:class:`TokenClientMiddlewareFactory`, one ``stat`` per call, re-read when the file
changes: a restarted broker's new token is picked up without a new channel).

The token is a header, not a session (``flight_auth``): a session would die with the
broker, where the embedded broker restarts under its clients (``ensure_broker``) and they
must go on. It decides who may connect; the principal stays ``User:ANONYMOUS``.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import threading
from dataclasses import dataclass
from typing import Any

import pyarrow.flight as flight

from broker_core.errors import SaslAuthenticationFailedError
from broker_core.protocol.wire import error_message

TOKEN_HEADER = "idemlog-local-token"
# The embedded broker's files (spark_sink/embedded.py writes them; declared here, below
# it, so that the CLI finds the default embedded broker's token too: discover_embedded).
DEFAULT_EMBEDDED_DIR = os.path.expanduser("~/.idemlog/embedded")
EMBEDDED_STATE_FILE = "broker.json"  # {"address", "pid", "port", "create_time"}
EMBEDDED_TOKEN_FILE = "broker.token"
TOKEN_BYTES = 32
TOKEN_FILE_KEY = "listener.token.file"
# Registered addresses: one per embedded broker a process used (a handful), never pruned.
_registry: dict[str, str] = {}
_registry_lock = threading.Lock()


def write_token_file(path: str) -> str:
    """A fresh token, written to ``path`` with mode 0600 (created so, never widened) and
    renamed into place: a reader sees the old file or the new one whole. Returns it.
    Raises OSError if the directory cannot be written."""
    token = secrets.token_hex(TOKEN_BYTES)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an old tmp left by a crash keeps its mode otherwise
        os.write(fd, token.encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return token


def register(address: str, token_file: str) -> None:
    """Every later call of this process to ``address`` carries the token in
    ``token_file`` (read at each call's start, so a restart's new token is used)."""
    with _registry_lock:
        _registry[address] = token_file


@dataclass(frozen=True, slots=True)
class EmbeddedRecord:
    """What the state file of an embedded broker's directory records of the broker last
    started there: its address (None until it served), pid and psutil create time (None
    in a file from before it was recorded)."""

    address: str | None
    pid: int
    create_time: float | None


def embedded_record(directory: str) -> EmbeddedRecord | None:
    """The state file of ``directory`` (the Spark option ``path``), or None when it is
    missing, unreadable or not one."""
    try:
        with open(os.path.join(directory, EMBEDDED_STATE_FILE), encoding="utf-8") as f:
            doc = json.load(f)
        created = doc.get("create_time")
        return EmbeddedRecord(
            address=str(doc["address"]) if doc.get("address") else None,
            pid=int(doc["pid"]),
            create_time=float(created) if created is not None else None,
        )
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return None


def discover_embedded(bootstrap: str, directory: str = DEFAULT_EMBEDDED_DIR) -> list[str]:
    """Register the token of the embedded broker of ``directory`` for each address of
    ``bootstrap`` (``host:port,...``) that its state file names as the broker's: a client
    outside Spark (the CLI) pointed at the embedded broker sends its token, and no other
    broker is ever sent it. Returns the addresses registered; a missing or unreadable
    state file registers none."""
    record = embedded_record(directory)
    recorded = record.address if record else None
    found = [a.strip() for a in bootstrap.split(",") if recorded and a.strip() == recorded]
    for address in found:
        register(address, os.path.join(directory, EMBEDDED_TOKEN_FILE))
    return found


def token_file_for(address: str) -> str | None:
    with _registry_lock:
        return _registry.get(address)


def _refusal(text: str) -> flight.FlightUnauthenticatedError:
    return flight.FlightUnauthenticatedError(error_message(SaslAuthenticationFailedError(text)))


class _Accepted(flight.ServerMiddleware):  # type: ignore[misc]
    pass


class TokenServerMiddlewareFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Refuses (SASL_AUTHENTICATION_FAILED, before any handler) a call whose
    :data:`TOKEN_HEADER` is not ``token``; ``token_file`` is named in the refusal."""

    def __init__(self, token: str, token_file: str) -> None:
        super().__init__()
        self._token = token.encode("ascii")
        self._file = token_file

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> _Accepted:
        values = headers.get(TOKEN_HEADER) or []
        if not values:
            raise _refusal(
                f"this broker serves its owner only: a call must carry the token of "
                f"{self._file} ({TOKEN_FILE_KEY}, readable by the broker's user only)"
            )
        if not hmac.compare_digest(str(values[0]).encode("ascii", "replace"), self._token):
            raise _refusal(
                f"the token presented is not this broker's: it is rewritten at each start "
                f"({self._file}); read it again"
            )
        return _Accepted()


class _Sending(flight.ClientMiddleware):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        super().__init__()
        self._token = token

    def sending_headers(self) -> dict[str, str]:
        return {TOKEN_HEADER: self._token}


class TokenClientMiddlewareFactory(flight.ClientMiddlewareFactory):  # type: ignore[misc]
    """Sends the token of ``token_file`` with every call. A file this process cannot read
    (another user's broker) sends none, and the broker's refusal says why."""

    def __init__(self, token_file: str) -> None:
        super().__init__()
        self._file = token_file
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime_ns) read
        self._token = ""

    def _current(self) -> str:
        try:
            st = os.stat(self._file)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            with self._lock:
                if stamp != self._seen:
                    with open(self._file, encoding="ascii") as f:
                        self._token = f.read().strip()
                    self._seen = stamp
                return self._token
        except (OSError, ValueError):
            return ""

    def start_call(self, info: Any) -> _Sending | None:
        token = self._current()
        return _Sending(token) if token else None
