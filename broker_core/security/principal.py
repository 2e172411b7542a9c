"""Who made a call: a typed principal (Kafka's ``User:alice``) and how a handler gets it.

On a SASL listener, and on a mutual-TLS one (``ssl.client.auth=required``, the principal
then being the certificate's mapped subject, ``broker_core.security.cert_auth``), the
Flight server's auth handler (``broker_core.security.flight_auth``) validates the session
token of every call and hands Flight the principal's text as the
call's *peer identity*; :func:`principal_of` reads it back from the call's context. On a
listener without authentication the identity is empty and the principal is
:data:`ANONYMOUS` (Kafka's ``User:ANONYMOUS``). An authorizer asks ``principal_of(context)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

USER_TYPE = "User"


@dataclass(frozen=True)
class Principal:
    """A principal type and name; ``str()`` is Kafka's ``Type:name`` form."""

    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"

    @classmethod
    def user(cls, name: str) -> Principal:
        return cls(USER_TYPE, name)

    @classmethod
    def parse(cls, text: str) -> Principal:
        """``Type:name`` (the name may hold ``:``); ValueError naming the text otherwise."""
        kind, sep, name = text.partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"principal {text!r} is not Type:name (e.g. User:alice)")
        return cls(kind, name)


# The principal of a call on a listener without authentication (Kafka's name for it).
ANONYMOUS = Principal(USER_TYPE, "ANONYMOUS")


class CallContext(Protocol):
    """What :func:`principal_of` needs of ``pyarrow.flight.ServerCallContext``."""

    def peer_identity(self) -> bytes: ...


def principal_of(context: CallContext) -> Principal:
    """The authenticated principal of the call ``context`` belongs to; :data:`ANONYMOUS`
    when the listener does not authenticate (Flight then reports an empty identity).
    On a SASL listener a call never reaches a handler without a valid session, so the
    identity is always set there."""
    identity = bytes(context.peer_identity()).decode("utf-8")
    return Principal.parse(identity) if identity else ANONYMOUS
