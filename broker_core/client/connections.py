"""One cache of Arrow Flight clients, keyed by ``host:port``, shared by every caller.

A Flight client is a gRPC channel: opening one per request would pay a connection setup
each time, so callers keep one per broker. Every Flight client of idemlog is opened here
(through ``broker_core.security.tls.open_flight_client``, under the cache's TLS
material): the broker client, the replica fetchers, the coordinator's marker writer, the
Spark sink's producer and readers and the CLI.

Given SASL credentials, each new channel first runs the SCRAM handshake
(``broker_core.security.flight_auth``, through the same ``open_flight_client``) and
carries its session token on every call; under ``SSL`` with a client certificate it runs
the certificate handshake instead (``broker_core.security.cert_auth``: the principal of a
broker with ``ssl.client.auth=required``; a broker that does not authenticate
certificates answers that it has no mechanism, and the channel goes on without a token).
A channel is replaced by a freshly authenticated one once half its session's lifetime
has passed, so calls never meet an expired token (docs/security.md).

One-answer calls (DoAction) go on a channel of their own per broker, apart from the
streams': a call that timed out has its channel closed before the caller can retry, so
the retry goes on a fresh connection, and the request left on the stalled one (or its
late answer) is never taken for the retry's. The streams' channel cannot be closed
that way: other threads' produce and fetch streams run on it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow.flight as flight

from broker_core.client.routes import CoordinatorCache
from broker_core.errors import (
    IdemlogError,
    InvalidRequestError,
    NetworkError,
    SaslAuthenticationFailedError,
)
from broker_core.protocol.wire import parse_error_message
from broker_core.security.flight_auth import SaslCredentials, ScramClientAuth
from broker_core.security.sessions import EARLIER_RUN
from broker_core.security.tls import PLAINTEXT_MATERIAL, TlsMaterial, open_flight_client
from broker_core.security.tls_probe import diagnose, peer_hostname

if TYPE_CHECKING:
    from broker_core.security.cert_auth import CertificateClientAuth

HANDSHAKE_TIMEOUT_S = 10.0
# A channel is re-authenticated after this share of its session's lifetime: a call
# started then still has the other half before its token expires.
REFRESH_SHARE = 0.5
_NEVER = float("inf")  # a channel without a session never needs a new handshake
# Each broker's two channels: the streams' and the one-answer actions'.
_STREAMS, _ACTIONS = "streams", "actions"
_Key = tuple[str, str]  # (address, one of the two)


# Bootstrap lists whose coordinators one connection cache keeps (FlightConnections.
# coordinators): a process talks to a few clusters (an embedded broker restarted on a new
# port is a new list).
MAX_COORDINATOR_CACHES = 16


class FlightConnections:
    """Thread-safe ``address -> FlightClient`` cache.

    :meth:`get` returns the cached client or opens one (opening does not contact the
    broker: a dead address fails at the first call, not here). :meth:`reset` forgets one,
    so the next :meth:`get` opens a fresh channel instead of waiting out the broken one's
    reconnect backoff. :meth:`close` closes them all (an actions' channel once its last
    call returns); the cache stays usable. ``tls``: the protocol and checked PEM files of every link
    (``TlsSettings.load(Side.CLIENT)``); plaintext by default.

    ``sasl``: the credentials every channel authenticates with; then :meth:`get` runs
    the handshake and raises ``SaslAuthenticationFailedError`` if the broker refuses it,
    ``SslHandshakeError`` if TLS refuses the link, ``NetworkError`` if the broker cannot
    be reached.
    """

    def __init__(
        self, tls: TlsMaterial = PLAINTEXT_MATERIAL, *, sasl: SaslCredentials | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._sasl = sasl
        # (address, kind) -> its channel: the streams' (get) and the actions' (call_action).
        self._clients: dict[_Key, flight.FlightClient] = {}
        self._refresh_at: dict[_Key, float] = {}  # -> when the channel re-authenticates
        # (address, kind) -> the lock of opening its channel: one per channel ever used.
        self._opening: dict[_Key, threading.Lock] = {}
        # id(channel) -> the action calls on it now; a retired one (timed out, or its
        # address reset) is closed once its last call returns.
        self._calls: dict[int, int] = {}
        self._retired: dict[int, flight.FlightClient] = {}
        # bootstrap list -> the coordinators its clients learned, the most recent last.
        self._coordinators: OrderedDict[tuple[str, ...], CoordinatorCache] = OrderedDict()
        self.tls = tls

    @property
    def sasl(self) -> SaslCredentials | None:
        """The credentials every channel authenticates with; None without SASL."""
        return self._sasl

    def coordinators(self, bootstrap: Sequence[str]) -> CoordinatorCache:
        """The transaction coordinators that the clients of ``bootstrap`` on these
        connections learned: what FIND_COORDINATOR answered one client, the next uses
        without asking again.

        Routing only: a stale entry (a coordinator moved, a broker restarted elsewhere)
        gets NOT_COORDINATOR or a network error from the request, and the client asks
        again, as with a cache of its own; the coordinator decides only for state
        partitions it leads. Bounded: at most :data:`MAX_COORDINATOR_CACHES` bootstrap
        lists (the least recently used dropped), each bounded by its cluster's
        ``__transaction_state`` partition count.

        Args:
            bootstrap: The clients' bootstrap addresses, in their order (another order is
                another list).

        Returns:
            The list's cache, created empty the first time.
        """
        key = tuple(bootstrap)
        with self._lock:
            cache = self._coordinators.get(key)
            if cache is None:
                cache = self._coordinators[key] = CoordinatorCache()
                while len(self._coordinators) > MAX_COORDINATOR_CACHES:
                    self._coordinators.popitem(last=False)
            self._coordinators.move_to_end(key)
            return cache

    def get(self, address: str) -> flight.FlightClient:
        """The channel of ``address`` for streams (DoPut, DoGet), opened if none is
        cached or the cached one is due to re-authenticate.

        Opening does not contact the broker, except to authenticate (SASL, a client
        certificate) or to learn the name a certificate must carry (TLS without host
        name checks).

        Args:
            address: The broker's ``host:port``.

        Returns:
            The Flight client, shared with every other caller of the cache.

        Raises:
            SaslAuthenticationFailedError: The broker refused the credentials.
            SslHandshakeError: TLS refused the link.
            NetworkError: (retriable) The broker could not be reached to authenticate.
        """
        return self._channel((address, _STREAMS))

    def _channel(self, key: _Key) -> flight.FlightClient:
        with self._lock:
            client = self._fresh(key)
            if client is not None:
                return client
            opening = self._opening.setdefault(key, threading.Lock())
        # One opening per channel at a time, so concurrent callers share one; the
        # handshakes (a host-name probe, SASL's) contact the broker, outside the cache's lock.
        with opening:
            with self._lock:
                client = self._fresh(key)  # another caller may have opened it
            if client is not None:
                return client
            opened, refresh_at = self._open(key[0])
            with self._lock:
                self._clients[key] = opened
                self._refresh_at[key] = refresh_at
            return opened

    def call_action(
        self, address: str, action: flight.Action, options: flight.FlightCallOptions
    ) -> list[flight.Result]:
        """One DoAction on the actions' channel of ``address``, its results.

        A call that timed out closes its channel before it raises (at once if no other
        call is on it, else when the last one returns): the next call, the caller's retry,
        opens a fresh connection.

        Args:
            address: The broker's ``host:port``.
            action: The Flight action.
            options: The call's options (its timeout).

        Returns:
            Every result of the action.

        Raises:
            flight.FlightError: Flight's errors raised as they are, for :meth:`failure`
                to type.
            IdemlogError: Opening the channel failed, as :meth:`get`.
        """
        key = (address, _ACTIONS)
        client = self._channel(key)
        while not self._counted(key, client):
            client = self._channel(key)
        try:
            return list(client.do_action(action, options))
        except flight.FlightTimedOutError:
            with self._lock:
                self._retire(key, client)
            raise
        finally:
            with self._lock:
                left = self._calls[id(client)] - 1
                if left:
                    self._calls[id(client)] = left
                else:
                    del self._calls[id(client)]
                closing = self._retired.pop(id(client), None) if not left else None
            if closing is not None:
                _close_quietly(closing)

    def _counted(self, key: _Key, client: flight.FlightClient) -> bool:
        """Count a call on ``client`` if it is still ``key``'s channel: one retired
        meanwhile may be closed at any moment, and a call on it would crash."""
        with self._lock:
            if self._clients.get(key) is not client:
                return False
            self._calls[id(client)] = self._calls.get(id(client), 0) + 1
            return True

    def _retire(self, key: _Key, client: flight.FlightClient) -> None:
        """Forget ``key``'s channel if it is still ``client``, to be closed by its last
        call (lock held)."""
        if self._clients.get(key) is client:
            del self._clients[key]
            self._refresh_at.pop(key, None)
        self._retired[id(client)] = client

    def failure(self, address: str, exc: BaseException, what: str) -> IdemlogError:
        """The typed error of a call to ``address`` that raised ``exc``; never raises.

        Args:
            address: The broker's ``host:port``.
            exc: What the call raised.
            what: The call, for the message (``"action metadata"``).

        Returns:
            The broker's own error as it is; but a session token of the broker's earlier
            run (it restarted under this channel) is a retriable ``NetworkError`` after
            which the channel is reset, so the retry authenticates again; a refused TLS
            handshake a non-retriable ``SslHandshakeError`` naming the cause; anything
            else a ``NetworkError`` naming ``what``, after which the channel is reset (the
            next call opens a fresh one).
        """
        if isinstance(exc, IdemlogError):
            return exc
        text = str(exc)
        typed = parse_error_message(text)
        if isinstance(typed, SaslAuthenticationFailedError) and EARLIER_RUN in typed.message:
            self.reset(address)
            return NetworkError(
                f"{what} to {address}: the broker restarted since this connection "
                "authenticated; a new connection authenticates again"
            )
        if typed is not None:
            return typed
        self.reset(address)
        refused = diagnose(address, self.tls, text)
        if refused is not None:
            return refused
        return NetworkError(f"{what} to {address} failed: {type(exc).__name__}: {exc}")

    def _fresh(self, key: _Key) -> flight.FlightClient | None:
        """The cached channel of ``key`` unless it is due to re-authenticate (lock held)."""
        client = self._clients.get(key)
        if client is not None and time.monotonic() < self._refresh_at[key]:
            return client
        return None

    def _open(self, address: str) -> tuple[flight.FlightClient, float]:
        override = None
        if self.tls.settings.encrypted and not self.tls.settings.check_hostname:
            override = peer_hostname(address, self.tls)  # contacts the broker (this mode only)
        # Under SSL a client with a certificate proves it holds the key (the broker's
        # principal for it, with ssl.client.auth=required; cert_auth.py).
        auth: ScramClientAuth | CertificateClientAuth | None = (
            ScramClientAuth(self._sasl) if self._sasl is not None else self._certificate_auth()
        )
        if auth is None:
            return open_flight_client(address, self.tls, override_hostname=override), _NEVER
        try:
            client = open_flight_client(
                address,
                self.tls,
                override_hostname=override,
                auth=auth,
                auth_timeout_s=HANDSHAKE_TIMEOUT_S,
                auth_optional=not isinstance(auth, ScramClientAuth),  # a certificate's
            )
        except flight.FlightError as exc:
            raise self.failure(address, exc, f"{auth.mechanism_name} handshake") from None
        if auth.lifetime_s <= 0:
            return client, _NEVER  # the broker does not authenticate certificates
        return client, time.monotonic() + auth.lifetime_s * REFRESH_SHARE

    def _certificate_auth(self) -> CertificateClientAuth | None:
        """``cert_auth.certificate_auth`` of this client's material; that module (with
        cryptography, ~0.07 s of CPU to import) is loaded for an encrypted channel only:
        a plaintext client has no certificate to prove."""
        if not self.tls.settings.encrypted:
            return None
        from broker_core.security.cert_auth import certificate_auth

        return certificate_auth(self.tls)

    def reset(self, address: str) -> None:
        """Forget the channels of ``address``: the next call opens fresh ones. Never
        raises.

        The streams' channel is not closed here: another thread may be in a call on it (a
        produce stream, a fetch), and closing a Flight client under a call crashes the
        process. It closes when its last user lets go of it. The actions' channel is
        closed once no call is on it (:meth:`call_action` counts them).

        Args:
            address: The broker's ``host:port``.
        """
        idle: flight.FlightClient | None = None
        with self._lock:
            self._clients.pop((address, _STREAMS), None)
            self._refresh_at.pop((address, _STREAMS), None)
            actions = self._clients.get((address, _ACTIONS))
            if actions is not None:
                self._retire((address, _ACTIONS), actions)
                if id(actions) not in self._calls:
                    idle = self._retired.pop(id(actions))
        if idle is not None:
            _close_quietly(idle)

    def close(self) -> None:
        """Close every channel; the cache stays usable. Never raises.

        An actions' channel with a call still on it (a replica fetcher stopped while its
        fetch waits for the leader) is retired instead, and closed when that call returns:
        closing a Flight client under a call crashes the process. No stream may be open on
        a streams' channel then.
        """
        with self._lock:
            busy = {key: c for key, c in self._clients.items() if id(c) in self._calls}
            idle = [c for c in self._clients.values() if id(c) not in self._calls]
            idle += [c for k, c in self._retired.items() if k not in self._calls]
            self._retired = {k: c for k, c in self._retired.items() if k in self._calls}
            self._clients, self._refresh_at = {}, {}
            for client in busy.values():
                self._retired[id(client)] = client
        for client in idle:
            _close_quietly(client)

    def action(self, address: str, action: str, body: bytes, timeout_s: float, what: str) -> bytes:
        """One DoAction call to ``address`` with a single result, its body returned; no
        retry (the brokers' own calls: replica fetches, markers, verifications).

        Args:
            address: The broker's ``host:port``.
            action: The action's name.
            body: The request body, sent as it is.
            timeout_s: The call's bound, in seconds.
            what: The call, for error messages.

        Returns:
            The body of the action's single result.

        Raises:
            IdemlogError: The broker's typed error, as it is.
            NetworkError: (retriable) The call reached no typed answer (the channel is
                reset, so the next call opens a fresh one); or as :meth:`failure` says.
            SslHandshakeError: TLS refused the link.
            InvalidRequestError: The broker answered other than one result (where
                ``BrokerClient.action_raw`` says ``UnknownServerError``).
        """
        options = flight.FlightCallOptions(timeout=timeout_s)
        try:
            results = self.call_action(address, flight.Action(action, body), options)
        except flight.FlightError as exc:
            raise self.failure(address, exc, what) from exc
        if len(results) != 1:
            raise InvalidRequestError(f"{what}: {len(results)} results from {address}, not 1")
        return bytes(results[0].body.to_pybytes())

    def addresses(self) -> list[str]:
        """The addresses with an open channel, sorted, each once (for tests and
        diagnostics)."""
        with self._lock:
            return sorted({address for address, _ in self._clients})


def _close_quietly(client: flight.FlightClient) -> None:
    # Closing a connection that already broke: there is nothing left to release.
    with contextlib.suppress(Exception):
        client.close()
