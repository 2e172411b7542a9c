"""Why a Flight link failed its TLS handshake, told as a typed, non-retriable error.

gRPC reports a refused handshake as an ``UNAVAILABLE`` call, the same status as a broker
that is down, and for two cases (a plaintext client on a TLS listener, a client
certificate the broker refused) with nothing more than "Socket closed". :func:`diagnose`
reads gRPC's message where it names the cause, and otherwise opens one TLS connection of
its own with Python's ``ssl`` and the same files to find it. It runs only after a call
failed, so a healthy link pays nothing; an unreachable broker stays a retriable
``NetworkError`` (the caller's).
"""

from __future__ import annotations

import re
import socket
import ssl

from broker_core.errors import SslHandshakeError
from broker_core.security.tls import (
    SECURITY_PROTOCOL,
    SSL_CA_LOCATION,
    SSL_CERTIFICATE_LOCATION,
    SSL_ENDPOINT_IDENTIFICATION,
    TlsMaterial,
    split_address,
)

PROBE_TIMEOUT_S = 2.0
# gRPC's words for a handshake that failed on the client's side, with the cause after them.
_GRPC_TLS_FAILURE = re.compile(
    r"(Ssl handshake failed.*|Peer name \S+ is not in peer certificate|"
    r"certificate verify failed.*)"
)
# The words of a connection the other side closed at once: what a TLS listener does to
# plaintext and what a broker that requires client certificates does without a good one.
# Not gRPC's general "failed to connect", which a host cut off (a timeout) also gives: the
# probe would then wait out its own timeout on every failed call.
_CLOSED = ("Socket closed", "Connection reset")
# HTTP/2's client preface and an empty SETTINGS frame: what a gRPC client sends first.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def diagnose(address: str, material: TlsMaterial, failure: str) -> SslHandshakeError | None:
    """The TLS cause of a failed call to ``address`` (gRPC's ``failure`` text), or None
    when it is not a TLS failure (the broker is down, slow or cut off). Never raises."""
    settings = material.settings
    if settings.encrypted:
        found = _GRPC_TLS_FAILURE.search(failure)
        if found is not None:
            return SslHandshakeError(f"TLS to {address}: {_explain(found.group(1), material)}")
    if not any(words in failure for words in _CLOSED):
        return None
    try:
        cause = _probe(address, material)
    except Exception:  # a diagnosis must not replace the caller's own error
        return None
    return None if cause is None else SslHandshakeError(f"TLS to {address}: {cause}")


def peer_hostname(address: str, material: TlsMaterial) -> str | None:
    """The first name (DNS or IP) in the certificate of the broker at ``address``,
    verified against ``ssl.ca.location`` but not against the host: the name a client
    with ssl.endpoint.identification.algorithm empty checks instead. None if the broker
    cannot be reached (the call then fails as usual)."""
    context = _context(material, check_hostname=False)
    host, port = split_address(address)
    try:
        with (
            socket.create_connection((host, port), PROBE_TIMEOUT_S) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            cert = tls.getpeercert()
    except (OSError, ssl.SSLError):
        return None
    for entry in (cert or {}).get("subjectAltName", ()):
        kind, name = entry[0], entry[1]
        if kind in ("DNS", "IP Address"):
            return str(name)
    return None


def _context(material: TlsMaterial, *, check_hostname: bool) -> ssl.SSLContext:
    settings = material.settings
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    if material.ca is not None:
        context.load_verify_locations(cadata=material.ca.decode("ascii", "replace"))
    else:
        context.load_default_certs()
    if settings.certificate_location:
        context.load_cert_chain(
            settings.certificate_location,
            settings.key_location,
            password=settings.key_password.encode() if settings.key_password else None,
        )
    context.set_alpn_protocols(["h2"])
    return context


def _probe(address: str, material: TlsMaterial) -> str | None:
    host, port = split_address(address)
    settings = material.settings
    try:
        raw = socket.create_connection((host, port), PROBE_TIMEOUT_S)
    except OSError:
        return None  # not reachable: not ours to explain
    with raw:
        if not settings.encrypted:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            context.set_alpn_protocols(["h2"])
            try:
                context.wrap_socket(raw, server_hostname=host).close()
            except (ssl.SSLError, OSError):
                return None  # a plaintext listener: the failure is something else
            return (
                f"the broker's listener speaks TLS and this client uses "
                f"{SECURITY_PROTOCOL}=PLAINTEXT: set {SECURITY_PROTOCOL}=SSL and "
                f"{SSL_CA_LOCATION}"
            )
        context = _context(material, check_hostname=settings.check_hostname)
        try:
            tls = context.wrap_socket(raw, server_hostname=host)
        except ssl.SSLCertVerificationError as exc:
            return _explain(f"certificate verify failed: {exc.verify_message}", material)
        except ssl.SSLError as exc:
            return f"handshake refused: {exc.reason or exc}"
        except OSError:
            return None
        with tls:
            # Under TLS 1.3 the broker checks the client's certificate after the client
            # finished its handshake: a refusal is a closed connection instead of the
            # answer to HTTP/2's opening (a healthy broker answers with its settings).
            tls.settimeout(PROBE_TIMEOUT_S)
            try:
                tls.sendall(_HTTP2_PREFACE)
                answer = tls.recv(1)
            except ssl.SSLError as exc:
                return _refused_client(str(exc.reason or exc), material)
            except OSError:
                return None
            if not answer:
                return _refused_client("it closed the connection after the handshake", material)
    return None


def _refused_client(reason: str, material: TlsMaterial) -> str:
    if not material.settings.certificate_location:
        return (
            f"the broker requires a client certificate (ssl.client.auth=required) and this "
            f"client has none: set {SSL_CERTIFICATE_LOCATION} and ssl.key.location ({reason})"
        )
    return (
        f"the broker refused the client certificate {SSL_CERTIFICATE_LOCATION}="
        f"{material.settings.certificate_location!r}: it is not signed by a CA the broker "
        f"trusts, or has expired ({reason})"
    )


def _explain(cause: str, material: TlsMaterial) -> str:
    ca = material.settings.ca_location or "the system's roots"
    if "expired" in cause:
        return f"the broker's certificate has expired ({cause})"
    if "Peer name" in cause or "Hostname mismatch" in cause or "IP address mismatch" in cause:
        return (
            f"the broker's certificate does not name the host connected to "
            f"({SSL_ENDPOINT_IDENTIFICATION}=https checks it): {cause}"
        )
    if "unable to get local issuer" in cause or "self-signed" in cause or "self signed" in cause:
        return f"the broker's certificate is not signed by {SSL_CA_LOCATION}={ca!r} ({cause})"
    return cause
