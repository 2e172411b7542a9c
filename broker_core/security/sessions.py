"""The broker's table of SASL sessions: the token a handshake gave and whose it is.

A token is 32 random bytes, valid for ``sasl.session.lifetime.ms`` after its handshake
and only on the broker that issued it (the table is in memory: a restarted broker
forgets every session, and its clients authenticate again). The table holds at most
``sasl.session.max.count`` sessions; expired ones are dropped when a handshake needs room,
and a handshake that still finds the table full is refused. Removing a user (or changing
its credential) revokes its sessions, so its next call is refused. A token opens with the
table's run id (random per broker start), so a token of a broker's earlier run is told
apart from a revoked one (:data:`EARLIER_RUN`): its client authenticates again on a new
channel instead of failing.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from broker_core.errors import SaslAuthenticationFailedError
from broker_core.security.principal import Principal

TOKEN_BYTES = 32
RUN_ID_BYTES = 8  # a token opens with its table's run id: a restarted broker's is new
# In the refusal of a token of an earlier run: the client's channel outlived a broker
# restart, which FlightConnections treats as a broken connection (a new handshake).
EARLIER_RUN = "the session was issued by an earlier run of this broker"


@dataclass(frozen=True)
class Session:
    principal: Principal
    mechanism: str
    expires_at: float  # on the table's clock


class SessionTable:
    """Thread-safe ``token -> Session`` with a lifetime and a bound on its size."""

    def __init__(
        self,
        *,
        lifetime_s: float,
        max_sessions: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lifetime_s <= 0 or max_sessions < 1:
            raise ValueError(f"lifetime_s={lifetime_s} and max_sessions={max_sessions}")
        self.lifetime_s = lifetime_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[bytes, Session] = {}
        self._run_id = secrets.token_bytes(RUN_ID_BYTES)

    def issue(self, principal: Principal, mechanism: str) -> bytes:
        """A new token for ``principal``. Raises SaslAuthenticationFailedError if the
        table holds ``max_sessions`` unexpired sessions."""
        now = self._clock()
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                self._sessions = {t: s for t, s in self._sessions.items() if s.expires_at > now}
            if len(self._sessions) >= self.max_sessions:
                raise SaslAuthenticationFailedError(
                    f"{principal} ({mechanism}): the broker holds its maximum of "
                    f"{self.max_sessions} sessions (sasl.session.max.count)"
                )
            token = self._run_id + secrets.token_bytes(TOKEN_BYTES - RUN_ID_BYTES)
            self._sessions[token] = Session(principal, mechanism, now + self.lifetime_s)
            return token

    def validate(self, token: bytes) -> Principal:
        """The principal of a live session. Raises SaslAuthenticationFailedError for no
        token, an unknown or revoked one, one of the broker's earlier run
        (:data:`EARLIER_RUN`), or one past its lifetime (then dropped)."""
        if not token:
            raise SaslAuthenticationFailedError(
                "no SASL session: this listener requires authentication (set "
                "sasl.mechanism, sasl.username and sasl.password)"
            )
        now = self._clock()
        with self._lock:
            session = self._sessions.get(token)
            if session is not None and session.expires_at <= now:
                del self._sessions[token]
                raise SaslAuthenticationFailedError(
                    f"{session.principal} ({session.mechanism}): the session expired "
                    f"(sasl.session.lifetime.ms={int(self.lifetime_s * 1000)}): authenticate again"
                )
        if session is None and token[:RUN_ID_BYTES] != self._run_id:
            raise SaslAuthenticationFailedError(
                f"{EARLIER_RUN} (it restarted since): authenticate again on a new connection"
            )
        if session is None:
            raise SaslAuthenticationFailedError(
                "unknown or revoked SASL session (the user was removed or its password "
                "changed): authenticate again"
            )
        return session.principal

    def revoke(self, principal: Principal) -> int:
        """Drop every session of ``principal``; how many there were."""
        with self._lock:
            gone = [t for t, s in self._sessions.items() if s.principal == principal]
            for token in gone:
                del self._sessions[token]
            return len(gone)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)
