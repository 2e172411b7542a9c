"""SCRAM over Arrow Flight's handshake, and the session token each later call carries.

The handshake (``FlightClient.authenticate`` / ``ServerAuthHandler.authenticate``) opens
with the mechanism's name; :class:`ServerAuth` hands the rest to that mechanism and issues
the session whatever it is (SCRAM here; a client certificate, ``cert_auth.py``). SCRAM's
is five messages: the mechanism's name, then RFC 5802's client-first, server-first,
client-final and server-final (``broker_core.security.scram``), then the session
(``{"token": .., "lifetime_ms": ..}``, JSON) once the client's proof verified. Flight then
sends the token with every call and the server's :meth:`ServerAuth.is_valid` turns
it into the call's principal (``principal.principal_of``), or refuses the call with
``SASL_AUTHENTICATION_FAILED``. The client verifies the server's signature before it
takes the token: a server without the user's credential cannot pass for the broker.

Refusals name the principal and the mechanism, never the password; an unknown user and a
wrong password get the same answer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow.flight as flight

from broker_core.errors import IdemlogError, SaslAuthenticationFailedError
from broker_core.protocol.wire import error_message
from broker_core.security.principal import Principal
from broker_core.security.scram import (
    MECHANISM_NAMES,
    Mechanism,
    ScramClient,
    ScramCredential,
    ScramError,
    ScramServer,
)
from broker_core.security.sessions import SessionTable

log = logging.getLogger("idemlog.security")

# A user's credential for one mechanism, as the broker's store holds it; None if unknown.
CredentialLookup = Callable[[str, Mechanism], ScramCredential | None]
MAX_HANDSHAKE_MESSAGE = 4096  # longer than any SCRAM message with a sane username
SECRET_BYTES = 32  # the broker's secret from which unknown users' salts are derived


def _refusal(error: IdemlogError) -> flight.FlightUnauthenticatedError:
    return flight.FlightUnauthenticatedError(error_message(error))


def _text(raw: bytes, what: str) -> str:
    if len(raw) > MAX_HANDSHAKE_MESSAGE:
        raise ScramError(f"{what} longer than {MAX_HANDSHAKE_MESSAGE} bytes")
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError(f"{what} is not UTF-8") from None


class HandshakeMechanism(Protocol):
    """One way of proving who a client is inside Flight's handshake (SCRAM here, a
    certificate in ``broker_core.security.cert_auth``). :meth:`run` reads and writes the
    mechanism's messages after its name and returns the principal it proved and a last
    message for the client (None: none), or raises an ``IdemlogError`` (typed refusal);
    :class:`ServerAuth` then issues the session."""

    name: str

    def run(self, outgoing: Any, incoming: Any) -> tuple[Principal, str | None]: ...


class ServerAuth(flight.ServerAuthHandler):  # type: ignore[misc]
    """The broker's side: a handshake per client connection, a token check per call.

    The client's first message names the mechanism; ``mechanisms`` (by name) are those the
    listener offers (SCRAM's under SASL, the certificate's under mutual TLS:
    ``broker_core.server.access.authentication``). Whatever the mechanism, the proved principal
    gets a token of ``sessions``, sent as ``{"token", "lifetime_ms"}`` (JSON), which every
    later call carries. A failed handshake raises (Flight answers UNAUTHENTICATED with the
    typed error); so does a call whose token is missing, unknown, revoked or expired.
    ``on_call`` runs before each call's token is checked (the file store's look for a
    changed file, so that a removed user's sessions end before its next call is served).
    """

    def __init__(
        self,
        sessions: SessionTable,
        mechanisms: Collection[HandshakeMechanism],
        *,
        on_call: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self._on_call = on_call
        self._sessions = sessions
        self._mechanisms = {m.name: m for m in mechanisms}

    @property
    def mechanism_names(self) -> list[str]:
        return sorted(self._mechanisms)

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        try:
            try:
                name = _text(incoming.read(), "the mechanism")
            except ScramError as exc:
                raise SaslAuthenticationFailedError(f"malformed handshake: {exc}") from None
            mechanism = self._mechanisms.get(name)
            if mechanism is None:
                raise SaslAuthenticationFailedError(self._not_enabled(name))
            principal, final = mechanism.run(outgoing, incoming)
            token = self._sessions.issue(principal, name)
            if final is not None:
                outgoing.write(final)
            lifetime_ms = int(self._sessions.lifetime_s * 1000)
            outgoing.write(json.dumps({"token": token.hex(), "lifetime_ms": lifetime_ms}))
        except IdemlogError as exc:
            raise _refusal(exc) from None

    def _not_enabled(self, name: str) -> str:
        scram = [m for m in self._mechanisms if m.startswith("SCRAM-")]
        if name.startswith("SCRAM-") and scram:
            return (
                f"mechanism {name!r} is not enabled on this broker (sasl.enabled.mechanisms="
                f"{', '.join(sorted(scram))})"
            )
        return (
            f"mechanism {name!r} is not offered by this listener (it offers "
            f"{', '.join(self.mechanism_names)}; docs/security.md)"
        )

    def is_valid(self, token: bytes) -> str:
        try:
            if self._on_call is not None:
                self._on_call()
            return str(self._sessions.validate(bytes.fromhex(bytes(token).decode("ascii"))))
        except (ValueError, UnicodeDecodeError):
            raise _refusal(SaslAuthenticationFailedError("malformed SASL session token")) from None
        except IdemlogError as exc:
            raise _refusal(exc) from None


class ScramExchange:
    """One SCRAM authentication (RFC 5802) on the broker's side, a message at a time, for
    any transport (Flight's handshake here, Kafka's SaslAuthenticate in
    ``server/kafka/sasl.py``): :meth:`step` takes the client-first and answers the
    server-first, then takes the client-final and answers the server-final, setting
    :attr:`principal`. A malformed message, one out of turn or a proof that does not
    verify raises SaslAuthenticationFailedError naming the user and mechanism (an unknown
    user and a wrong password alike), logged with the detail the client is not told."""

    def __init__(self, mechanism: Mechanism, credentials: CredentialLookup, secret: bytes) -> None:
        self.name = mechanism.sasl_name
        self._server = ScramServer(
            mechanism, lambda user: credentials(user, mechanism), secret=secret
        )
        self._answered_first = False
        self.principal: Principal | None = None

    def step(self, raw: bytes) -> str:
        server = self._server
        try:
            if not self._answered_first:
                self._answered_first = True
                return server.first(_text(raw, "the client-first message"))
            final = server.final(_text(raw, "the client-final message"))
        except ScramError as exc:
            name = server.username or "?"
            log.info("SCRAM handshake of User:%s (%s) refused: %s", name, self.name, exc)
            raise SaslAuthenticationFailedError(
                f"authentication of User:{name} with {self.name} failed: invalid "
                "credentials (unknown user or wrong password)"
            ) from None
        self.principal = Principal.user(server.username or "?")
        return final


class ScramMechanism:
    """SCRAM-SHA-256 or -512 (RFC 5802) as a :class:`HandshakeMechanism`: client-first,
    server-first, client-final; the server-final is the last message. ``credentials``
    looks users up (the store, ``broker_core.security.credentials``); ``secret`` derives
    unknown users' salts (stable for one broker's life), so a refusal does not tell which
    users exist."""

    def __init__(self, mechanism: Mechanism, credentials: CredentialLookup, secret: bytes) -> None:
        self.name = mechanism.sasl_name
        self._mechanism = mechanism
        self._credentials = credentials
        self._secret = secret

    def exchange(self) -> ScramExchange:
        """A new authentication by this mechanism."""
        return ScramExchange(self._mechanism, self._credentials, self._secret)

    def run(self, outgoing: Any, incoming: Any) -> tuple[Principal, str | None]:
        exchange = self.exchange()
        outgoing.write(exchange.step(incoming.read()))
        final = exchange.step(incoming.read())
        assert exchange.principal is not None  # set by the step that verified the proof
        return exchange.principal, final


def scram_mechanisms(
    credentials: CredentialLookup, mechanisms: Collection[Mechanism], secret: bytes
) -> list[ScramMechanism]:
    """The SCRAM mechanisms ``sasl.enabled.mechanisms`` allows, sharing ``secret`` (one per
    broker, :data:`SECRET_BYTES`; every listener's: an unknown user's salt must be the
    same on each, or comparing them would tell which users exist)."""
    return [
        ScramMechanism(m, credentials, secret)
        for m in sorted(mechanisms, key=lambda m: m.sasl_name)
    ]


@dataclass(frozen=True)
class SaslCredentials:
    """What a client authenticates with. ``repr`` hides the password (it may be logged)."""

    mechanism: Mechanism
    username: str
    password: str

    def __repr__(self) -> str:
        return f"SaslCredentials({self.mechanism.sasl_name}, User:{self.username}, password=***)"

    @classmethod
    def from_options(cls, mechanism: str, username: str, password: str) -> SaslCredentials:
        """From ``sasl.mechanism``/``sasl.username``/``sasl.password`` values.
        Raises InvalidConfigError naming the option (never the password's value)."""
        from broker_core.errors import InvalidConfigError

        try:
            parsed = Mechanism.parse(mechanism)
        except ValueError:
            raise InvalidConfigError(
                f"sasl.mechanism={mechanism!r} is not one of {', '.join(MECHANISM_NAMES)}"
            ) from None
        if not username:
            raise InvalidConfigError("sasl.username is empty: SASL needs a user name")
        if not password:
            raise InvalidConfigError(f"sasl.password is empty for sasl.username={username!r}")
        return cls(parsed, username, password)


class ScramClientAuth(flight.ClientAuthHandler):  # type: ignore[misc]
    """The client's side of one handshake; its token goes with every later call.
    ``lifetime_s`` is the session's lifetime the broker announced."""

    def __init__(self, credentials: SaslCredentials) -> None:
        super().__init__()
        self.mechanism_name = credentials.mechanism.sasl_name
        self._credentials = credentials
        self._token = b""
        self.lifetime_s = 0.0

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        c = self._credentials
        scram = ScramClient(c.mechanism, c.username, c.password)
        outgoing.write(c.mechanism.sasl_name)
        outgoing.write(scram.first())
        try:
            outgoing.write(scram.final(bytes(incoming.read()).decode("utf-8")))
            scram.verify(bytes(incoming.read()).decode("utf-8"))
            session = json.loads(bytes(incoming.read()))
            self._token = str(session["token"]).encode("ascii")
            self.lifetime_s = int(session["lifetime_ms"]) / 1000.0
        except (
            ScramError,
            ValueError,
            KeyError,
            TypeError,
        ) as exc:  # not FlightError: the broker's refusal goes up as it is
            raise _refusal(
                SaslAuthenticationFailedError(
                    f"User:{c.username} ({c.mechanism.sasl_name}): the broker did not prove "
                    f"it holds the user's credential ({exc})"
                )
            ) from None

    def get_token(self) -> bytes:
        return self._token
