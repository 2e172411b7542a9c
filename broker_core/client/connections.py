"""One cache of Arrow Flight clients, keyed by ``host:port``, shared by every caller.

A Flight client is a gRPC channel: opening one per request would pay a connection setup
each time, so callers keep one per broker. Every Flight client of idemlog is opened here
(through ``broker_core.security.tls.open_flight_client``, under the cache's TLS
material): the broker client, the replica fetchers, the coordinator's marker writer, the
Spark sink's producer and readers and the CLI.
"""

from __future__ import annotations

import contextlib
import threading

import pyarrow.flight as flight

from broker_core.errors import IdemlogError, InvalidRequestError, NetworkError
from broker_core.protocol.wire import parse_error_message
from broker_core.security.tls import PLAINTEXT_MATERIAL, TlsMaterial, open_flight_client
from broker_core.security.tls_probe import diagnose, peer_hostname


class FlightConnections:
    """Thread-safe ``address -> FlightClient`` cache.

    :meth:`get` returns the cached client or opens one (opening does not contact the
    broker: a dead address fails at the first call, not here). :meth:`reset` forgets one,
    so the next :meth:`get` opens a fresh channel instead of waiting out the broken one's
    reconnect backoff. :meth:`close` closes them all (no call may be in flight then); the
    cache stays usable. ``tls``: the protocol and checked PEM files of every link
    (``TlsSettings.load(Side.CLIENT)``); plaintext by default.
    """

    def __init__(self, tls: TlsMaterial = PLAINTEXT_MATERIAL) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str, flight.FlightClient] = {}
        self.tls = tls

    def get(self, address: str) -> flight.FlightClient:
        with self._lock:
            client = self._clients.get(address)
            if client is not None:
                return client
        override = None
        if self.tls.settings.encrypted and not self.tls.settings.check_hostname:
            # Outside the lock: it contacts the broker (only in this mode).
            override = peer_hostname(address, self.tls)
        opened = open_flight_client(address, self.tls, override_hostname=override)
        with self._lock:
            client = self._clients.setdefault(address, opened)
        if client is not opened:
            _close_quietly(opened)  # another thread opened one first
        return client

    def failure(self, address: str, exc: BaseException, what: str) -> IdemlogError:
        """The typed error of a call to ``address`` that raised ``exc``: the broker's own
        error as it is; a refused TLS handshake as a non-retriable ``SslHandshakeError``
        naming the cause; anything else a ``NetworkError`` naming ``what``, after which
        the channel is reset (the next call opens a fresh one)."""
        if isinstance(exc, IdemlogError):
            return exc
        text = str(exc)
        typed = parse_error_message(text)
        if typed is not None:
            return typed
        self.reset(address)
        refused = diagnose(address, self.tls, text)
        if refused is not None:
            return refused
        return NetworkError(f"{what} to {address} failed: {type(exc).__name__}: {exc}")

    def reset(self, address: str) -> None:
        """Forget the client of ``address``: the next :meth:`get` opens a fresh channel.

        The old one is not closed here: another thread may be in a call on it (a produce
        stream, a metadata refresh), and closing a Flight client under a call crashes the
        process. It closes when its last user lets go of it.
        """
        with self._lock:
            self._clients.pop(address, None)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            _close_quietly(client)

    def action(self, address: str, action: str, body: bytes, timeout_s: float, what: str) -> bytes:
        """One DoAction call to ``address`` with a single result, its body returned.

        The broker's typed error is raised as it is; a call that reached no typed answer
        is a NetworkError naming ``what`` (the channel is reset, so the next call opens a
        fresh one); an answer of other than one result is an InvalidRequestError.
        """
        client = self.get(address)
        options = flight.FlightCallOptions(timeout=timeout_s)
        try:
            results = list(client.do_action(flight.Action(action, body), options))
        except flight.FlightError as exc:
            raise self.failure(address, exc, what) from exc
        if len(results) != 1:
            raise InvalidRequestError(f"{what}: {len(results)} results from {address}, not 1")
        return bytes(results[0].body.to_pybytes())

    def addresses(self) -> list[str]:
        """The addresses with an open client, sorted (for tests and diagnostics)."""
        with self._lock:
            return sorted(self._clients)


def _close_quietly(client: flight.FlightClient) -> None:
    # Closing a connection that already broke: there is nothing left to release.
    with contextlib.suppress(Exception):
        client.close()
