"""The certificate handshake over a real TLS Flight listener in this process: each call
carries the principal its handshake proved, and a broker without the mechanism still
serves a client that has a certificate (docs/security.md, Principals from certificates).
The broker processes' side is tests/broker/test_mtls_principal.py."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow.flight as flight
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from broker_core.client.connections import FlightConnections
from broker_core.errors import SaslAuthenticationFailedError
from broker_core.security.cert_auth import CertificateClientAuth, CertificateMechanism
from broker_core.security.flight_auth import ServerAuth
from broker_core.security.principal import ANONYMOUS, principal_of
from broker_core.security.principal_mapping import PrincipalMapper
from broker_core.security.sessions import SessionTable
from broker_core.security.tls import Side, TlsSettings, open_flight_client, server_arguments
from testkit.tls import TlsCerts, issue_client


class _Who(flight.FlightServerBase):  # type: ignore[misc]
    """Answers every action with the caller's principal."""

    def do_action(
        self, context: flight.ServerCallContext, action: flight.Action
    ) -> Iterator[flight.Result]:
        yield flight.Result(str(principal_of(context)).encode())


def _server(certs: TlsCerts, client_auth: str, rules: str = "DEFAULT") -> _Who:
    material = TlsSettings.from_values(certs.broker_keys(client_auth=client_auth)).load(Side.SERVER)
    auth = None
    if client_auth == "required":
        assert material.ca is not None
        auth = ServerAuth(
            SessionTable(lifetime_s=60, max_sessions=10),
            [CertificateMechanism(material.ca, PrincipalMapper.parse(rules))],
        )
    location, kwargs = server_arguments("127.0.0.1", 0, material, auth_handler=auth)
    return _Who(location, **kwargs)


def _who(connections: FlightConnections, port: int) -> str:
    return connections.action(f"127.0.0.1:{port}", "who", b"", 10.0, "who").decode()


def _connections(certs: TlsCerts, cert: str, key: str) -> FlightConnections:
    keys = {**certs.client_keys(), "ssl.certificate.location": cert, "ssl.key.location": key}
    return FlightConnections(TlsSettings.from_values(keys).load(Side.CLIENT))


def test_every_call_carries_the_mapped_subject_of_the_client_certificate(
    tls_certs: TlsCerts,
) -> None:
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "data"),
            x509.NameAttribute(NameOID.COMMON_NAME, "Spark-Job"),
        ]
    )
    files = issue_client(tls_certs, "unit-spark-job", subject)
    server = _server(tls_certs, "required", "RULE:^CN=(.*?),OU=data$/$1/L,DEFAULT")
    try:
        mapped = _connections(tls_certs, str(files.cert), str(files.key))
        assert _who(mapped, server.port) == "User:spark-job"
        assert _who(mapped, server.port) == "User:spark-job"  # a later call, same session
        default = _connections(tls_certs, str(tls_certs.client.cert), str(tls_certs.client.key))
        assert _who(default, server.port) == "User:CN=client"
    finally:
        server.shutdown()


def test_a_client_with_a_certificate_is_served_by_a_listener_without_the_mechanism(
    tls_certs: TlsCerts,
) -> None:
    server = _server(tls_certs, "none")
    try:
        client = _connections(tls_certs, str(tls_certs.client.cert), str(tls_certs.client.key))
        assert _who(client, server.port) == str(ANONYMOUS)
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    ("chain", "key", "why"),
    [
        ("client", "broker", "the signature does not verify"),
        ("other", "other", "not signed by the broker's ssl.ca.location"),
        ("expired", "expired", "expired on"),
    ],
)
def test_a_handshake_not_proving_a_valid_certificate_of_the_ca_is_refused(
    tls_certs: TlsCerts, chain: str, key: str, why: str
) -> None:
    """The TLS link is the valid client certificate's; the handshake shows another chain or
    signs with another key, which the broker's own check must refuse."""
    files = {"client": tls_certs.client, "broker": tls_certs.broker}
    files |= {"other": tls_certs.other, "expired": tls_certs.expired}
    server = _server(tls_certs, "required")
    material = TlsSettings.from_values(tls_certs.client_keys(with_cert=True)).load(Side.CLIENT)
    forged = CertificateClientAuth(files[chain].cert.read_bytes(), files[key].key.read_bytes())
    try:
        with pytest.raises(flight.FlightUnauthenticatedError) as refused:
            open_flight_client(f"127.0.0.1:{server.port}", material, auth=forged)
        message = str(refused.value)
        assert "SASL_AUTHENTICATION_FAILED" in message and why in message, message
        assert "certificate authentication of CN=" in message
    finally:
        server.shutdown()


def test_a_refusal_reaches_the_caller_typed(tls_certs: TlsCerts) -> None:
    server = _server(tls_certs, "required", "RULE:^CN=(.*?),OU=data$/$1/")
    try:
        client = _connections(tls_certs, str(tls_certs.client.cert), str(tls_certs.client.key))
        with pytest.raises(SaslAuthenticationFailedError) as refused:
            _who(client, server.port)
        assert not refused.value.retriable
        assert "No rules apply to CN=client, rules [RULE:^CN=(.*?),OU=data$/$1/]" in (
            refused.value.message
        )
    finally:
        server.shutdown()
