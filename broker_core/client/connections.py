"""One cache of Arrow Flight clients, keyed by ``host:port``, shared by every caller.

A Flight client is a gRPC channel: opening one per request would pay a connection setup
each time, so callers keep one per broker. The broker client and the coordinator's marker
writer both use :class:`FlightConnections`.
"""

from __future__ import annotations

import contextlib
import threading

import pyarrow.flight as flight

from broker_core.errors import IdemlogError, InvalidRequestError, NetworkError
from broker_core.protocol.wire import parse_error_message


class FlightConnections:
    """Thread-safe ``address -> FlightClient`` cache.

    :meth:`get` returns the cached client or opens one (opening does not contact the
    broker: a dead address fails at the first call, not here). :meth:`reset` forgets one,
    so the next :meth:`get` opens a fresh channel instead of waiting out the broken one's
    reconnect backoff. :meth:`close` closes them all (no call may be in flight then); the
    cache stays usable.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str, flight.FlightClient] = {}

    def get(self, address: str) -> flight.FlightClient:
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = flight.connect(f"grpc://{address}")
                self._clients[address] = client
            return client

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
            self.reset(address)
            typed: IdemlogError | None = parse_error_message(str(exc))
            if typed is not None:
                raise typed from exc
            raise NetworkError(f"{what} to {address} failed: {exc}") from exc
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
