"""SCRAM-SHA-256 and SCRAM-SHA-512 as RFC 5802 and RFC 7677 define them.

The four messages (client-first, server-first, client-final, server-final), the nonces and
the keys: the client proves it knows the password without sending it, the server proves
it holds the user's credential by a signature the client verifies. The server keeps only
what :class:`ScramCredential` holds (salt, iterations, StoredKey, ServerKey: Kafka's
stored form), never the password. Passwords are taken as UTF-8 without SASLprep, as
Kafka's ``ScramFormatter`` does (docs/security.md).

Both sides are one-shot state machines (:class:`ScramClient`, :class:`ScramServer`); a
message out of turn or malformed raises :class:`ScramError`, which callers turn into
``SASL_AUTHENTICATION_FAILED`` without its detail reaching a peer that has not yet proved
anything.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

MIN_ITERATIONS = 4096  # RFC 7677's minimum and Kafka's default
MAX_ITERATIONS = 1_000_000  # bounds the work one handshake can make a broker do
NONCE_BYTES = 24  # each side's share of the nonce, before base64
SALT_BYTES = 32
GS2_HEADER = "n,,"  # no channel binding, no authzid


class ScramError(Exception):
    """A SCRAM message malformed, out of turn, or a proof that does not verify."""


class Mechanism(Enum):
    """A SASL mechanism name and the hash it uses."""

    SCRAM_SHA_256 = ("SCRAM-SHA-256", "sha256")
    SCRAM_SHA_512 = ("SCRAM-SHA-512", "sha512")

    def __init__(self, sasl_name: str, hash_name: str) -> None:
        self.sasl_name = sasl_name
        self.hash_name = hash_name

    @classmethod
    def parse(cls, name: str) -> Mechanism:
        """The mechanism called ``name`` (``SCRAM-SHA-256``); ValueError naming the choices."""
        for mechanism in cls:
            if mechanism.sasl_name == name.strip().upper():
                return mechanism
        choices = ", ".join(m.sasl_name for m in cls)
        raise ValueError(f"unknown SASL mechanism {name!r} (one of {choices})")

    def hash(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self.hash_name).digest()

    def salted_password(self, password: str, salt: bytes, iterations: int) -> bytes:
        """RFC 5802's Hi(): PBKDF2 with this mechanism's HMAC."""
        return hashlib.pbkdf2_hmac(self.hash_name, password.encode("utf-8"), salt, iterations)


MECHANISM_NAMES = tuple(m.sasl_name for m in Mechanism)


@dataclass(frozen=True)
class ScramCredential:
    """What a server stores for one user and mechanism: never the password."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    @classmethod
    def derive(
        cls,
        mechanism: Mechanism,
        password: str,
        *,
        iterations: int = MIN_ITERATIONS,
        salt: bytes | None = None,
    ) -> ScramCredential:
        """The credential of ``password``: a fresh random salt unless one is given.
        ValueError if ``iterations`` is outside [4096, 1000000] or the password is empty."""
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise ValueError(
                f"iterations={iterations} must be in [{MIN_ITERATIONS}, {MAX_ITERATIONS}]"
            )
        if not password:
            raise ValueError("the password is empty")
        salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
        salted = mechanism.salted_password(password, salt, iterations)
        return cls(
            salt=salt,
            stored_key=mechanism.hash(mechanism.hmac(salted, b"Client Key")),
            server_key=mechanism.hmac(salted, b"Server Key"),
            iterations=iterations,
        )

    def to_text(self) -> str:
        """Kafka's stored form: ``salt=..,stored_key=..,server_key=..,iterations=..``."""
        return (
            f"salt={_b64(self.salt)},stored_key={_b64(self.stored_key)},"
            f"server_key={_b64(self.server_key)},iterations={self.iterations}"
        )

    @classmethod
    def from_text(cls, text: str) -> ScramCredential:
        """Parse :meth:`to_text`; ValueError naming what is missing or malformed."""
        fields = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
        try:
            iterations = int(fields["iterations"])
            credential = cls(
                salt=base64.b64decode(fields["salt"], validate=True),
                stored_key=base64.b64decode(fields["stored_key"], validate=True),
                server_key=base64.b64decode(fields["server_key"], validate=True),
                iterations=iterations,
            )
        except (KeyError, ValueError) as exc:
            raise ValueError(f"malformed SCRAM credential ({type(exc).__name__}: {exc})") from None
        if iterations < MIN_ITERATIONS:
            raise ValueError(f"SCRAM credential with iterations={iterations} < {MIN_ITERATIONS}")
        return credential


# The server's look-up of a user's credential for its mechanism: None for an unknown user.
LookupFn = Callable[[str], ScramCredential | None]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise ScramError(f"{what} is not base64") from None


def escape_username(name: str) -> str:
    """RFC 5802's saslname: ``=`` as ``=3D``, ``,`` as ``=2C``."""
    return name.replace("=", "=3D").replace(",", "=2C")


def unescape_username(text: str) -> str:
    if "=" in text.replace("=3D", "").replace("=2C", ""):
        raise ScramError("username has an '=' not followed by 3D or 2C")
    return text.replace("=2C", ",").replace("=3D", "=")


def _attributes(message: str, expected: str, what: str) -> dict[str, str]:
    """``a=x,b=y`` with exactly the attribute letters of ``expected``, in that order
    (extensions are refused: none is defined)."""
    parts = message.split(",")
    if len(parts) != len(expected) or any(
        len(p) < 2 or p[0] != k or p[1] != "=" for p, k in zip(parts, expected, strict=False)
    ):
        raise ScramError(f"malformed {what}")
    return {p[0]: p[2:] for p in parts}


class _Step(Enum):
    START = "start"
    SENT_FIRST = "sent first"
    SENT_FINAL = "sent final"
    DONE = "done"


# What each step may be followed by: the exchange never goes back or skips a message.
_NEXT_STEP = {
    _Step.START: _Step.SENT_FIRST,
    _Step.SENT_FIRST: _Step.SENT_FINAL,
    _Step.SENT_FINAL: _Step.DONE,
}


class _Exchange:
    def __init__(self) -> None:
        self._step = _Step.START

    def _advance(self, expected: _Step) -> None:
        if self._step is not expected:
            raise ScramError(f"SCRAM message out of turn (at {self._step.value})")
        self._step = _NEXT_STEP[expected]


class ScramClient(_Exchange):
    """The client's side: :meth:`first`, :meth:`final` (given the server-first), then
    :meth:`verify` (given the server-final), which raises ScramError unless the server
    proved it holds the user's credential."""

    def __init__(
        self, mechanism: Mechanism, username: str, password: str, *, nonce: str | None = None
    ) -> None:
        super().__init__()
        self.mechanism = mechanism
        self.username = username
        self._password = password
        self._nonce = nonce if nonce is not None else secrets.token_urlsafe(NONCE_BYTES)
        self._first_bare = f"n={escape_username(username)},r={self._nonce}"
        self._server_signature = b""

    def first(self) -> str:
        self._advance(_Step.START)
        return GS2_HEADER + self._first_bare

    def final(self, server_first: str) -> str:
        self._advance(_Step.SENT_FIRST)
        attrs = _attributes(server_first, "rsi", "server-first message")
        nonce, salt = attrs["r"], _unb64(attrs["s"], "the salt")
        try:
            iterations = int(attrs["i"])
        except ValueError:
            raise ScramError("the iteration count is not a number") from None
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise ScramError("the server's nonce does not extend the client's")
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise ScramError(f"the server asks for {iterations} iterations")
        m = self.mechanism
        salted = m.salted_password(self._password, salt, iterations)
        client_key = m.hmac(salted, b"Client Key")
        without_proof = f"c={_b64(GS2_HEADER.encode())},r={nonce}"
        auth = f"{self._first_bare},{server_first},{without_proof}".encode()
        signature = m.hmac(m.hash(client_key), auth)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = m.hmac(m.hmac(salted, b"Server Key"), auth)
        return f"{without_proof},p={_b64(proof)}"

    def verify(self, server_final: str) -> None:
        self._advance(_Step.SENT_FINAL)
        if server_final.startswith("e="):
            raise ScramError(f"the server refused: {server_final[2:]}")
        attrs = _attributes(server_final, "v", "server-final message")
        if not hmac.compare_digest(_unb64(attrs["v"], "the signature"), self._server_signature):
            raise ScramError("the server's signature does not verify (not the real server?)")


class ScramServer(_Exchange):
    """The server's side: :meth:`first` (given the client-first; ``lookup(username)`` is
    the user's credential or None), :meth:`final` (given the client-final) returns the
    server-final and sets :attr:`username`, or raises ScramError.

    An unknown user is answered as a known one, with a salt derived from ``secret`` and
    the name, and fails at the proof like a wrong password: the answer does not tell
    which names exist (RFC 5802, section 9).
    """

    def __init__(
        self,
        mechanism: Mechanism,
        lookup: LookupFn,
        *,
        secret: bytes,
        nonce: str | None = None,
    ) -> None:
        super().__init__()
        self.mechanism = mechanism
        self._lookup = lookup
        self._secret = secret
        self._nonce_part = nonce if nonce is not None else secrets.token_urlsafe(NONCE_BYTES)
        self.username: str | None = None  # the claimed name, once the client-first came
        self.authenticated = False
        self._credential: ScramCredential | None = None
        self._auth_prefix = ""
        self._nonce = ""

    def first(self, client_first: str) -> str:
        self._advance(_Step.START)
        if not client_first.startswith(GS2_HEADER):
            raise ScramError("client-first message: only 'n,,' (no channel binding) is supported")
        bare = client_first[len(GS2_HEADER) :]
        attrs = _attributes(bare, "nr", "client-first message")
        self.username = unescape_username(attrs["n"])
        if not self.username or not attrs["r"]:
            raise ScramError("client-first message: empty username or nonce")
        credential = self._lookup(self.username)
        if credential is None:
            fake = self.mechanism.hmac(self._secret, self.username.encode("utf-8"))
            credential = ScramCredential(
                salt=fake[:SALT_BYTES],
                stored_key=b"",  # matches no proof: every hash is longer
                server_key=b"",
                iterations=MIN_ITERATIONS,
            )
        self._credential = credential
        self._nonce = attrs["r"] + self._nonce_part
        server_first = f"r={self._nonce},s={_b64(credential.salt)},i={credential.iterations}"
        self._auth_prefix = f"{bare},{server_first}"
        return server_first

    def final(self, client_final: str) -> str:
        self._advance(_Step.SENT_FIRST)
        attrs = _attributes(client_final, "crp", "client-final message")
        if attrs["c"] != _b64(GS2_HEADER.encode()):
            raise ScramError("client-final message: channel binding differs from 'n,,'")
        if attrs["r"] != self._nonce:
            raise ScramError("client-final message: the nonce is not the exchange's")
        assert self._credential is not None  # set by first(), which _advance ensured ran
        m, credential = self.mechanism, self._credential
        without_proof = client_final[: client_final.rindex(",p=")]
        auth = f"{self._auth_prefix},{without_proof}".encode()
        signature = m.hmac(credential.stored_key, auth)
        proof = _unb64(attrs["p"], "the proof")
        if len(proof) != len(signature):
            raise ScramError("the proof does not verify")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(m.hash(client_key), credential.stored_key):
            raise ScramError("the proof does not verify")
        self.authenticated = True
        self._advance(_Step.SENT_FINAL)
        return f"v={_b64(m.hmac(credential.server_key, auth))}"
