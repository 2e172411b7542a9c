"""TLS on Flight links: the keys (declared once), their checked settings, the PEM material,
and the one place a Flight client or a Flight server location is built.

Every Flight link of idemlog goes through :func:`open_flight_client` (the client side:
``broker_core.client.connections.FlightConnections`` calls it for the broker client, the
replica fetchers, the marker writer, the coordinator's calls, the Spark sink's producer
and readers, the CLI) and :func:`server_arguments` (the broker's Flight server). The keys
are Kafka's (``security.protocol``, ``ssl.*``, docs/security.md); a broker's links to
other brokers use its own keys, its certificate being its client certificate when they
require one (Kafka's ``security.inter.broker.protocol`` is not a separate key here).

The files are read and checked once, by :meth:`TlsSettings.load`: a missing or unreadable
file names its key and path, a key that does not open with ``ssl.key.password`` or does
not match its certificate, and an expired certificate, are refused before anything
listens or connects (an ``InvalidConfigError``).

No TLS version or suite is set here, on purpose: a link negotiates TLS 1.3 with
TLS_AES_256_GCM_SHA384 (the gRPC in pyarrow is built on OpenSSL, whose default TLS 1.3
order the Flight client offers and the broker follows). Flight exposes neither a version
nor a suite, gRPC's ``GRPC_SSL_CIPHER_SUITES`` reaches TLS 1.2 suites only (a TLS 1.3 name
in it fails every TLS channel), and AES-128-GCM measured no cheaper per byte than
AES-256-GCM, ChaCha20-Poly1305 dearer (docs/security.md, "What TLS costs").
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from broker_core.config import ConfigKey
from broker_core.errors import InvalidConfigError
from broker_core.security.local_token import TokenClientMiddlewareFactory, token_file_for

log = logging.getLogger("idemlog.security")


class SecurityProtocol(StrEnum):
    """Kafka's ``security.protocol`` values: TLS or not, SASL (SCRAM, ``flight_auth.py``)
    or not (docs/security.md)."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"


class ClientAuth(StrEnum):
    """Kafka's ``ssl.client.auth`` (``requested`` is not offered: gRPC's server either
    requires and verifies a client certificate or asks for none)."""

    NONE = "none"
    REQUIRED = "required"


SECURITY_PROTOCOL = "security.protocol"
SSL_CA_LOCATION = "ssl.ca.location"
SSL_CERTIFICATE_LOCATION = "ssl.certificate.location"
SSL_KEY_LOCATION = "ssl.key.location"
SSL_KEY_PASSWORD = "ssl.key.password"  # matches Spark's spark.redaction.regex ("password")
SSL_CLIENT_AUTH = "ssl.client.auth"
SSL_ENDPOINT_IDENTIFICATION = "ssl.endpoint.identification.algorithm"
# Flight's answer to a handshake on a server without an auth handler.
_NO_AUTH_HANDLER = "does not have an authentication mechanism enabled"
HOSTNAME_CHECK = "https"  # Kafka's value for "check the host name"; "" turns it off

TLS_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        SECURITY_PROTOCOL,
        str,
        SecurityProtocol.PLAINTEXT.value,
        "Protocol of every Flight link: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT (a SCRAM "
        "handshake on each connection, then a session token on each call; sasl.*) or "
        "SASL_SSL (both). A broker's listener serves only clients of its protocol and uses "
        "the same value for its links to other brokers (docs/security.md).",
        choices=tuple(p.value for p in SecurityProtocol),
    ),
    ConfigKey(
        SSL_CA_LOCATION,
        str,
        "",
        "PEM file of the CA certificate(s) that sign the peers' certificates: the brokers' "
        "for a client, the clients' for a broker with ssl.client.auth=required. Empty: the "
        "system's roots (a client only).",
    ),
    ConfigKey(
        SSL_CERTIFICATE_LOCATION,
        str,
        "",
        "PEM file of this side's certificate (chain): a broker's server certificate, which "
        "is also its client certificate to other brokers; a client's certificate for "
        "mutual TLS.",
    ),
    ConfigKey(
        SSL_KEY_LOCATION,
        str,
        "",
        "PEM file of the private key of ssl.certificate.location (PKCS#8 or traditional, "
        "encrypted if ssl.key.password is set).",
    ),
    ConfigKey(
        SSL_KEY_PASSWORD,
        str,
        "",
        "Password of an encrypted ssl.key.location; the key is decrypted in memory only. A "
        "secret: its name is one Spark's spark.redaction.regex redacts.",
    ),
    ConfigKey(
        SSL_CLIENT_AUTH,
        str,
        ClientAuth.NONE.value,
        "A broker's demand for client certificates: none, or required (mutual TLS: a "
        "client, and another broker, must present a certificate signed by ssl.ca.location).",
        choices=tuple(c.value for c in ClientAuth),
    ),
    ConfigKey(
        SSL_ENDPOINT_IDENTIFICATION,
        str,
        HOSTNAME_CHECK,
        "https: a client checks that the broker's certificate names the host it connects "
        "to (as Kafka); empty: it checks only that the certificate is signed by "
        "ssl.ca.location.",
        choices=(HOSTNAME_CHECK, ""),
    ),
)
TLS_KEY_NAMES = frozenset(key.name for key in TLS_KEYS)


class Side(StrEnum):
    """Which end of a link the files are for (the checks differ)."""

    SERVER = "server"
    CLIENT = "client"


@dataclass(frozen=True)
class TlsSettings:
    """The checked values of :data:`TLS_KEYS` (no file read yet; picklable, so Spark
    ships the driver's copy to its tasks). ``key_password`` is kept out of ``repr``."""

    protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    ca_location: str = ""
    certificate_location: str = ""
    key_location: str = ""
    key_password: str = field(default="", repr=False)
    client_auth: ClientAuth = ClientAuth.NONE
    check_hostname: bool = True

    @property
    def encrypted(self) -> bool:
        return self.protocol in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def scheme(self) -> str:
        """The Flight URI scheme of this protocol."""
        return "grpc+tls" if self.encrypted else "grpc"

    @classmethod
    def from_values(cls, values: Mapping[str, object]) -> TlsSettings:
        """Settings from the typed values of :data:`TLS_KEYS` (missing keys: defaults).

        The SASL part of a SASL protocol is read by ``client_config``/``security_config``
        (the ``sasl.*`` keys). Raises InvalidConfigError for a certificate without its key
        or a key without its certificate."""

        def text(name: str) -> str:
            return str(values.get(name, "") or "").strip()

        protocol = SecurityProtocol(text(SECURITY_PROTOCOL) or SecurityProtocol.PLAINTEXT)
        settings = cls(
            protocol=protocol,
            ca_location=text(SSL_CA_LOCATION),
            certificate_location=text(SSL_CERTIFICATE_LOCATION),
            key_location=text(SSL_KEY_LOCATION),
            key_password=str(values.get(SSL_KEY_PASSWORD, "") or ""),
            client_auth=ClientAuth(text(SSL_CLIENT_AUTH) or ClientAuth.NONE),
            check_hostname=str(values.get(SSL_ENDPOINT_IDENTIFICATION, HOSTNAME_CHECK)).strip()
            == HOSTNAME_CHECK,
        )
        if settings.encrypted and bool(settings.certificate_location) != bool(
            settings.key_location
        ):
            raise InvalidConfigError(
                f"{SSL_CERTIFICATE_LOCATION}={settings.certificate_location!r} and "
                f"{SSL_KEY_LOCATION}={settings.key_location!r}: set both or neither"
            )
        return settings

    def load(self, side: Side) -> TlsMaterial:
        """Read and check the PEM files for ``side``; PLAINTEXT reads nothing.

        A server needs a certificate and its key, and a CA when it requires client
        certificates. Raises InvalidConfigError naming the key and the path of a missing
        or unreadable file, a key that does not decrypt or does not match its
        certificate, an expired or not yet valid certificate."""
        if not self.encrypted:
            return TlsMaterial(self, None, None, None)
        if side is Side.SERVER and not self.certificate_location:
            raise InvalidConfigError(
                f"{SECURITY_PROTOCOL}={self.protocol.value}: a broker needs "
                f"{SSL_CERTIFICATE_LOCATION} and {SSL_KEY_LOCATION}"
            )
        if (
            side is Side.SERVER
            and self.client_auth is ClientAuth.REQUIRED
            and not (self.ca_location)
        ):
            raise InvalidConfigError(
                f"{SSL_CLIENT_AUTH}=required: set {SSL_CA_LOCATION} to the CA that signs "
                "the clients' certificates"
            )
        ca = _read(SSL_CA_LOCATION, self.ca_location) if self.ca_location else None
        if ca is not None:
            _check_ca(ca, self.ca_location)
        cert = key = None
        if self.certificate_location:
            cert = _read(SSL_CERTIFICATE_LOCATION, self.certificate_location)
            key = _read(SSL_KEY_LOCATION, self.key_location)
            _check_pair(self)
            _check_validity(cert, self.certificate_location)
            key = _plain_key(key, self)
        return TlsMaterial(self, ca, cert, key)


PLAINTEXT = TlsSettings()  # the embedded default: no TLS, nothing to read


@dataclass(frozen=True)
class TlsMaterial:
    """The PEM bytes of :class:`TlsSettings`, checked (the key unencrypted, in memory)."""

    settings: TlsSettings
    ca: bytes | None
    cert: bytes | None
    key: bytes | None = field(repr=False)


PLAINTEXT_MATERIAL = TlsMaterial(PLAINTEXT, None, None, None)


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def open_flight_client(
    address: str,
    material: TlsMaterial,
    *,
    override_hostname: str | None = None,
    auth: flight.ClientAuthHandler | None = None,
    auth_timeout_s: float = 10.0,
    auth_optional: bool = False,
) -> flight.FlightClient:
    """The Flight client of ``address`` (``host:port``) under ``material``'s protocol.

    An address registered by ``local_token.register`` (an embedded broker) gets its
    token on every call. Without ``auth``, opening does not contact the broker: a refused
    TLS handshake fails the first call (see ``broker_core.security.tls_probe.diagnose``).
    With ``auth`` (SASL: ``broker_core.security.flight_auth.ScramClientAuth``; a client
    certificate: ``cert_auth.CertificateClientAuth``), its handshake runs on the new channel
    within ``auth_timeout_s`` before the client is returned, and every later call
    carries its token; a refused or failed handshake raises its ``FlightError`` (the
    channel closed), which the caller types (``FlightConnections.failure``).
    ``auth_optional`` (the certificate handshake, ``cert_auth.py``): a broker without an
    auth handler (``ssl.client.auth=none``) answers that it has no mechanism, and the
    client is returned as it is (its calls carry no token, and need none).
    ``override_hostname``: the name the broker's certificate is checked against instead of
    the host (given when ssl.endpoint.identification.algorithm is empty)."""
    settings = material.settings
    kwargs: dict[str, Any] = {}
    if settings.encrypted:
        if material.ca is not None:
            kwargs["tls_root_certs"] = material.ca
        if material.cert is not None:
            kwargs["cert_chain"] = material.cert
            kwargs["private_key"] = material.key
        if override_hostname:
            kwargs["override_hostname"] = override_hostname
    token_file = token_file_for(address)
    if token_file is not None:  # an embedded broker: its owner's token on every call
        kwargs["middleware"] = [TokenClientMiddlewareFactory(token_file)]
    client = flight.connect(f"{settings.scheme}://{address}", **kwargs)
    if auth is not None:
        try:
            client.authenticate(auth, flight.FlightCallOptions(timeout=auth_timeout_s))
        except pa.ArrowNotImplementedError as exc:
            if auth_optional and _NO_AUTH_HANDLER in str(exc):
                return client
            with contextlib.suppress(Exception):
                client.close()
            raise
        except BaseException:
            with contextlib.suppress(Exception):  # a channel that never served a call
                client.close()
            raise
    return client


def server_arguments(
    host: str,
    port: int,
    material: TlsMaterial,
    *,
    auth_handler: flight.ServerAuthHandler | None = None,
    middleware: Mapping[str, flight.ServerMiddlewareFactory] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The location and keyword arguments of a ``FlightServerBase`` listening on
    ``host:port`` under ``material``'s protocol (mutual TLS if it requires clients'
    certificates). ``auth_handler`` (SASL or mutual TLS: ``flight_auth.ServerAuth``): every call
    but the handshake must then carry a valid session token, or Flight refuses it before
    any handler runs. ``middleware`` (the embedded broker's token, ``local_token.py``)
    runs before every call and may refuse it."""
    settings = material.settings
    location = f"{settings.scheme}://{host}:{port}"
    kwargs: dict[str, Any] = {}
    if auth_handler is not None:
        kwargs["auth_handler"] = auth_handler
    if middleware:
        kwargs["middleware"] = dict(middleware)
    if not settings.encrypted:
        return location, kwargs
    kwargs["tls_certificates"] = [flight.CertKeyPair(material.cert, material.key)]
    if settings.client_auth is ClientAuth.REQUIRED:
        kwargs["verify_client"] = True
        kwargs["root_certificates"] = material.ca
    return location, kwargs


def server_ssl_context(material: TlsMaterial) -> ssl.SSLContext:
    """A Python ``ssl`` server context of the broker's ``ssl.*`` files, for the Kafka
    listener (a plain TCP server; Flight's TLS is gRPC's): TLS 1.2 at least, the
    certificate and key (decrypted with ``ssl.key.password``), and with
    ``ssl.client.auth=required`` the clients' certificates verified against
    ``ssl.ca.location``. ``material``: already loaded, so its files were checked."""
    settings = material.settings
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(
        settings.certificate_location,
        settings.key_location,
        password=settings.key_password or None,
    )
    if settings.client_auth is ClientAuth.REQUIRED:
        assert material.ca is not None  # load() requires the CA then
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=material.ca.decode("ascii", "replace"))
    return context


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address) reaches this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any interface


def warn_if_exposed(host: str, settings: TlsSettings) -> bool:
    """Log one warning (and return True) when a listener bound to ``host`` can be reached
    from other machines without TLS, or without authentication: anyone on the network
    could then read every topic (plaintext), or write them (no SASL nor client
    certificates). Authenticated and encrypted (``SASL_SSL``, or ``SSL`` with
    ``ssl.client.auth=required``) and loopback listeners are not warned about
    (docs/security.md)."""
    if is_loopback(host):
        return False
    protocol = settings.protocol
    if protocol is SecurityProtocol.SASL_SSL or (
        protocol is SecurityProtocol.SSL and settings.client_auth is ClientAuth.REQUIRED
    ):
        return False
    if protocol is SecurityProtocol.SSL:
        problem = (
            "every link is encrypted but unauthenticated (anyone who reaches it can produce, "
            "read and delete topics)"
        )
        fix = (
            f"{SSL_CLIENT_AUTH}=required, or {SECURITY_PROTOCOL}={SecurityProtocol.SASL_SSL.value}"
        )
    elif protocol is SecurityProtocol.SASL_PLAINTEXT:
        problem = (
            "every link is plaintext (authenticated, but anyone on the network can read the data)"
        )
        fix = f"{SECURITY_PROTOCOL}={SecurityProtocol.SASL_SSL.value}"
    else:
        problem = "every link is plaintext and unauthenticated"
        fix = f"{SECURITY_PROTOCOL}={SecurityProtocol.SSL.value}"
    log.warning(
        "listener.host=%s is reachable from other machines and %s=%s: %s; set %s "
        "(docs/security.md)",
        host,
        SECURITY_PROTOCOL,
        protocol.value,
        problem,
        fix,
    )
    return True


def _read(key: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InvalidConfigError(f"{key}={path!r}: cannot read it: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise InvalidConfigError(f"{key}={path!r}: not a PEM file (no -----BEGIN line)")
    return data


def _check_ca(data: bytes, path: str) -> None:
    context = ssl.create_default_context()
    try:
        context.load_verify_locations(cadata=data.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as exc:
        raise InvalidConfigError(
            f"{SSL_CA_LOCATION}={path!r}: no CA certificate in it ({exc})"
        ) from None


def _check_pair(settings: TlsSettings) -> None:
    """The key opens (with the password, if any) and matches the certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)

    def password() -> bytes:
        if not settings.key_password:
            # ssl would otherwise prompt on the terminal for an encrypted key.
            raise InvalidConfigError(
                f"{SSL_KEY_LOCATION}={settings.key_location!r} is encrypted: set {SSL_KEY_PASSWORD}"
            )
        return settings.key_password.encode()

    try:
        context.load_cert_chain(
            settings.certificate_location, settings.key_location, password=password
        )
    except InvalidConfigError:
        raise
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            problem = f"does not match the certificate {SSL_CERTIFICATE_LOCATION}=" + repr(
                settings.certificate_location
            )
        elif settings.key_password:
            problem = f"cannot be opened (a wrong {SSL_KEY_PASSWORD}, or not a key: {exc.reason})"
        else:
            problem = f"cannot be loaded with its certificate ({exc.reason})"
        key = f"{SSL_KEY_LOCATION}={settings.key_location!r}"
        raise InvalidConfigError(f"{key} {problem}") from None


def _check_validity(cert: bytes, path: str) -> None:
    from cryptography import x509

    try:
        certificate = x509.load_pem_x509_certificate(cert)
    except ValueError as exc:
        raise InvalidConfigError(f"{SSL_CERTIFICATE_LOCATION}={path!r}: {exc}") from None
    now = datetime.datetime.now(datetime.UTC)
    if certificate.not_valid_after_utc < now:
        raise InvalidConfigError(
            f"{SSL_CERTIFICATE_LOCATION}={path!r} expired on "
            f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
        )
    if certificate.not_valid_before_utc > now:
        raise InvalidConfigError(
            f"{SSL_CERTIFICATE_LOCATION}={path!r} is not valid before "
            f"{certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )


def _plain_key(key: bytes, settings: TlsSettings) -> bytes:
    """The key unencrypted (gRPC takes no password): decrypted in memory, never written."""
    if not settings.key_password:
        return key
    from cryptography.hazmat.primitives import serialization

    loaded = serialization.load_pem_private_key(key, settings.key_password.encode())
    return loaded.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
