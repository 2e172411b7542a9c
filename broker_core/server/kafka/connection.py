"""One Kafka connection's authentication: who is on it (its principal, from its host) and
where its SASL exchange is, kept by the listener for the connection's life and handed to
every handler with the request (``KafkaRequest.connection``), so that any family asks
the authorizer about its caller (``authorize.KafkaAuthorizer``).

On a SASL listener a connection starts at HANDSHAKE and is AUTHENTICATED only once a
SaslAuthenticate verified its proof; until then the listener answers ApiVersions,
SaslHandshake and SaslAuthenticate only and closes it on any other request, as Kafka does.
A failed exchange goes to FAILED: its answer is sent, then the connection is closed. On
a PLAINTEXT or SSL listener it is AUTHENTICATED from the start, as ``User:ANONYMOUS`` or
(``ssl.client.auth=required``) as its certificate's principal.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from broker_core.security.principal import ANONYMOUS, Principal
from broker_core.server.access.authorization import Caller


class AuthState(Enum):
    HANDSHAKE = "waiting for SaslHandshake"
    AUTHENTICATE = "waiting for SaslAuthenticate"
    AUTHENTICATED = "authenticated"
    FAILED = "failed"  # answered, then closed


_TRANSITIONS: dict[AuthState, frozenset[AuthState]] = {
    AuthState.HANDSHAKE: frozenset({AuthState.AUTHENTICATE, AuthState.FAILED}),
    AuthState.AUTHENTICATE: frozenset({AuthState.AUTHENTICATED, AuthState.FAILED}),
    AuthState.AUTHENTICATED: frozenset(),
    AuthState.FAILED: frozenset(),
}


class SaslExchange(Protocol):
    """A SASL mechanism's exchange under way (``flight_auth.ScramExchange``)."""

    name: str
    principal: Principal | None

    def step(self, raw: bytes) -> str: ...


class KafkaConnection:
    """The state of one connection from ``host`` (the peer's IP address). ``sasl``: the
    listener requires SASL; ``principal``: who it is before any SASL (ANONYMOUS, or a
    client certificate's)."""

    def __init__(self, host: str, *, sasl: bool, principal: Principal = ANONYMOUS) -> None:
        self.host = host
        self.principal = principal
        self.state = AuthState.HANDSHAKE if sasl else AuthState.AUTHENTICATED
        self.exchange: SaslExchange | None = None  # between SaslHandshake and its end

    @property
    def caller(self) -> Caller:
        """Who the authorizer is asked about."""
        return Caller(self.principal, self.host)

    @property
    def authenticated(self) -> bool:
        return self.state is AuthState.AUTHENTICATED

    @property
    def closing(self) -> bool:
        """The last answer is sent: the listener closes the connection after it."""
        return self.state is AuthState.FAILED

    def begin(self, exchange: SaslExchange) -> None:
        """SaslHandshake chose the mechanism: its exchange runs next."""
        self._go(AuthState.AUTHENTICATE)
        self.exchange = exchange

    def authenticated_as(self, principal: Principal) -> None:
        """The exchange verified the client: it is ``principal`` from now on (SCRAM's
        principal wins over a certificate's, as in Kafka)."""
        self._go(AuthState.AUTHENTICATED)
        self.principal = principal
        self.exchange = None

    def fail(self) -> None:
        self.state = AuthState.FAILED  # from any state: the connection is closed
        self.exchange = None

    def _go(self, new: AuthState) -> None:
        if new not in _TRANSITIONS[self.state]:
            raise ValueError(f"a Kafka connection cannot go {self.state.value} -> {new.value}")
        self.state = new


def plaintext_connection() -> KafkaConnection:
    """A connection authenticated as ANONYMOUS from nowhere: what a request built outside
    a listener (a unit test's) carries."""
    return KafkaConnection("", sasl=False)
