"""Principals from mutual-TLS certificates: a handshake mechanism bound to the certificate's
private key (docs/security.md, "Principals from certificates").

pyarrow's Flight server does not show Python the certificate its TLS layer verified (a
``ServerCallContext`` has ``peer()``, an address, and ``peer_identity()``, the auth
handler's answer; middleware sees headers only). So the identity is proved once more, in
Flight's handshake, by the same key: the mechanism :data:`CERTIFICATE` is

1. client: the mechanism's name, then its certificate chain (PEM, leaf first);
2. broker: a fresh random nonce (:data:`NONCE_BYTES`);
3. client: a signature of :data:`CONTEXT` + nonce with the key of ``ssl.key.location``;
4. broker: checks the chain up to ``ssl.ca.location`` (signatures and validity dates), the
   signature with the leaf's public key, maps the leaf's subject (RFC 2253, as Kafka prints
   it) with ``ssl.principal.mapping.rules`` and issues a session token as SCRAM does
   (``flight_auth.ServerAuth``).

The nonce is new per handshake, so a recorded signature is worth nothing on another
connection. Refusals are ``SASL_AUTHENTICATION_FAILED`` naming the subject and why.
"""

from __future__ import annotations

import datetime
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

import pyarrow.flight as flight
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa
from cryptography.x509.oid import NameOID

from broker_core.errors import SaslAuthenticationFailedError
from broker_core.security.principal import Principal
from broker_core.security.principal_mapping import (
    PRINCIPAL_MAPPING_RULES,
    NoMatchingRuleError,
    PrincipalMapper,
)
from broker_core.security.tls import SecurityProtocol, TlsMaterial

log = logging.getLogger("idemlog.security")

CERTIFICATE = "CERTIFICATE"  # the mechanism's name in the handshake
CONTEXT = b"idemlog certificate handshake v1\x00"  # signed before the nonce: no other use
NONCE_BYTES = 32
MAX_CHAIN_BYTES = 64 * 1024  # a leaf and a few intermediates; anything larger is refused
MAX_CHAIN_LENGTH = 8
MAX_SIGNATURE_BYTES = 1024  # RSA-8192 is 1024 bytes; ECDSA and EdDSA are far smaller

# RFC 2253's keywords, as Java's X500Principal.getName() prints them (Kafka's DN text);
# any other attribute is printed as its OID and the hex of its DER value.
_RFC2253_KEYWORDS = {
    NameOID.COMMON_NAME: "CN",
    NameOID.COUNTRY_NAME: "C",
    NameOID.LOCALITY_NAME: "L",
    NameOID.STATE_OR_PROVINCE_NAME: "ST",
    NameOID.ORGANIZATION_NAME: "O",
    NameOID.ORGANIZATIONAL_UNIT_NAME: "OU",
    NameOID.STREET_ADDRESS: "STREET",
    NameOID.DOMAIN_COMPONENT: "DC",
    NameOID.USER_ID: "UID",
}


def _der_hex(attribute: x509.NameAttribute[Any]) -> str:
    """``#`` and the hex of the attribute value's DER encoding (RFC 2253, 2.4)."""
    raw = attribute.value if isinstance(attribute.value, bytes) else None
    # The ASN.1 string type's universal tag (cryptography keeps it, unexposed, in _type).
    tag = attribute._type.value
    if raw is None:
        text = str(attribute.value)
        raw = text.encode("utf-16-be") if tag == 30 else text.encode("utf-8")
    length = len(raw)
    if length < 0x80:
        header = bytes([tag, length])
    else:
        size = length.to_bytes((length.bit_length() + 7) // 8, "big")
        header = bytes([tag, 0x80 | len(size)]) + size
    return "#" + (header + raw).hex()


def distinguished_name(name: x509.Name) -> str:
    """``name`` in RFC 2253 form as Kafka sees it (``X500Principal.getName()``): most
    specific attribute first, ``CN=spark-job,OU=data``."""
    parts = []
    for rdn in reversed(name.rdns):
        items = []
        for attribute in rdn:
            keyword = _RFC2253_KEYWORDS.get(attribute.oid)
            if keyword is None:
                items.append(f"{attribute.oid.dotted_string}={_der_hex(attribute)}")
            else:
                items.append(
                    x509.Name([x509.RelativeDistinguishedName([attribute])]).rfc4514_string()
                )
        parts.append("+".join(items))
    return ",".join(parts)


def sign(private_key_pem: bytes, nonce: bytes) -> bytes:
    """The signature of :data:`CONTEXT` + ``nonce`` with the (unencrypted) PEM key."""
    key = serialization.load_pem_private_key(private_key_pem, None)
    data = CONTEXT + nonce
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(data, ec.ECDSA(hashes.SHA256()))
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(data, padding.PKCS1v15(), hashes.SHA256())
    if isinstance(key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
        return key.sign(data)
    raise SaslAuthenticationFailedError(
        f"ssl.key.location: a {type(key).__name__} cannot sign the certificate handshake "
        "(use an EC, RSA or Ed25519 key)"
    )


def _verify(certificate: x509.Certificate, signature: bytes, nonce: bytes) -> None:
    """Raises InvalidSignature (or TypeError for an unusable key type)."""
    key = certificate.public_key()
    data = CONTEXT + nonce
    if isinstance(key, ec.EllipticCurvePublicKey):
        key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    elif isinstance(key, rsa.RSAPublicKey):
        key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
    elif isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        key.verify(signature, data)
    else:
        raise TypeError(f"a {type(key).__name__} cannot sign the certificate handshake")


def certificate_principal(der: bytes, mapper: PrincipalMapper) -> Principal:
    """``User:<mapped subject>`` of a client certificate a TLS layer already verified
    (the Kafka listener's, whose Python ``ssl`` shows it the peer's certificate):
    SaslAuthenticationFailedError when no rule of ``ssl.principal.mapping.rules`` maps
    its subject."""
    subject = distinguished_name(x509.load_der_x509_certificate(der).subject)
    try:
        return Principal.user(mapper.name(subject))
    except NoMatchingRuleError as exc:
        raise CertificateMechanism._refused(subject, f"{exc} ({PRINCIPAL_MAPPING_RULES})") from None


class CertificateMechanism:
    """The broker's side of :data:`CERTIFICATE` (a ``flight_auth.HandshakeMechanism``).

    ``ca_pem``: the certificates of ``ssl.ca.location``; ``mapper``: the parsed
    ``ssl.principal.mapping.rules``. :meth:`run` returns ``User:<mapped subject>`` or
    raises SaslAuthenticationFailedError naming the subject and the reason: a chain not
    signed by the CA, a certificate expired or not yet valid, a signature that does not
    verify with the certificate's key, a subject no rule maps."""

    name = CERTIFICATE

    def __init__(
        self,
        ca_pem: bytes,
        mapper: PrincipalMapper,
        *,
        now: Callable[[], datetime.datetime] | None = None,
    ) -> None:
        self._cas = x509.load_pem_x509_certificates(ca_pem)
        self._mapper = mapper
        self._now = now or (lambda: datetime.datetime.now(datetime.UTC))

    def run(self, outgoing: Any, incoming: Any) -> tuple[Principal, str | None]:
        raw = bytes(incoming.read())
        if len(raw) > MAX_CHAIN_BYTES:
            raise self._refused("?", f"a certificate chain longer than {MAX_CHAIN_BYTES} bytes")
        try:
            chain = x509.load_pem_x509_certificates(raw)
        except ValueError as exc:
            raise self._refused("?", f"no PEM certificate in the handshake ({exc})") from None
        if not chain or len(chain) > MAX_CHAIN_LENGTH:
            raise self._refused("?", f"{len(chain)} certificates (1 to {MAX_CHAIN_LENGTH})")
        leaf = chain[0]
        subject = distinguished_name(leaf.subject)
        self._check_chain(subject, chain)
        nonce = secrets.token_bytes(NONCE_BYTES)
        outgoing.write(nonce)
        signature = bytes(incoming.read())
        if len(signature) > MAX_SIGNATURE_BYTES:
            raise self._refused(subject, "a signature longer than any key makes")
        try:
            _verify(leaf, signature, nonce)
        except (InvalidSignature, TypeError, ValueError) as exc:
            why = str(exc) or "the signature does not verify with the certificate's key"
            raise self._refused(subject, why) from None
        try:
            name = self._mapper.name(subject)
        except NoMatchingRuleError as exc:
            raise self._refused(subject, f"{exc} ({PRINCIPAL_MAPPING_RULES})") from None
        principal = Principal.user(name)
        log.info("certificate %s authenticated as %s", subject, principal)
        return principal, None

    def _check_chain(self, subject: str, chain: list[x509.Certificate]) -> None:
        now = self._now()
        for certificate in chain:
            if certificate.not_valid_after_utc < now:
                raise self._refused(
                    subject,
                    f"the certificate {distinguished_name(certificate.subject)} expired on "
                    f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC",
                )
            if certificate.not_valid_before_utc > now:
                raise self._refused(
                    subject,
                    f"the certificate {distinguished_name(certificate.subject)} is not valid "
                    f"before {certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC",
                )
        current, intermediates = chain[0], chain[1:]
        for _ in range(MAX_CHAIN_LENGTH):
            if any(_issued_by(current, ca) for ca in self._cas):
                return
            issuer = next((c for c in intermediates if _issued_by(current, c)), None)
            if issuer is None or not _is_ca(issuer):
                break
            current = issuer
        raise self._refused(subject, "not signed by the broker's ssl.ca.location")

    @staticmethod
    def _refused(subject: str, why: str) -> SaslAuthenticationFailedError:
        log.info("certificate handshake of %s refused: %s", subject, why)
        return SaslAuthenticationFailedError(
            f"certificate authentication of {subject} failed: {why}"
        )


def _issued_by(certificate: x509.Certificate, issuer: x509.Certificate) -> bool:
    if certificate.issuer != issuer.subject:
        return False
    try:
        certificate.verify_directly_issued_by(issuer)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def _is_ca(certificate: x509.Certificate) -> bool:
    try:
        return bool(certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


class CertificateClientAuth(flight.ClientAuthHandler):  # type: ignore[misc]
    """The client's side of :data:`CERTIFICATE`: its chain, then its signature of the
    broker's nonce. ``cert_pem``/``key_pem``: the checked files of
    ``ssl.certificate.location``/``ssl.key.location`` (the key decrypted in memory,
    ``TlsSettings.load``). ``lifetime_s`` is the session's lifetime the broker announced
    (0 if the broker does not authenticate certificates)."""

    mechanism_name = CERTIFICATE

    def __init__(self, cert_pem: bytes, key_pem: bytes) -> None:
        super().__init__()
        self._cert = cert_pem
        self._key = key_pem
        self._token = b""
        self.lifetime_s = 0.0

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        outgoing.write(CERTIFICATE)
        outgoing.write(self._cert)
        nonce = bytes(incoming.read())
        outgoing.write(sign(self._key, nonce))
        try:
            session = json.loads(bytes(incoming.read()))
            self._token = str(session["token"]).encode("ascii")
            self.lifetime_s = int(session["lifetime_ms"]) / 1000.0
        except (ValueError, KeyError, TypeError) as exc:
            raise SaslAuthenticationFailedError(
                f"certificate handshake: the broker's answer is not a session ({exc})"
            ) from None

    def get_token(self) -> bytes:
        return self._token


def certificate_auth(material: TlsMaterial) -> CertificateClientAuth | None:
    """The certificate handshake of a client of ``material``: under ``SSL`` with a
    certificate; None otherwise (plaintext, no certificate, or SASL, whose principal wins)."""
    if material.settings.protocol is not SecurityProtocol.SSL or material.cert is None:
        return None
    assert material.key is not None  # TlsSettings.load reads the key with its certificate
    return CertificateClientAuth(material.cert, material.key)
