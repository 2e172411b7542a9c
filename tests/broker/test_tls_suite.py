"""The TLS version and suite a Flight link negotiates (docs/security.md, "What TLS costs").

idemlog sets no version or suite (``broker_core/security/tls.py``): the Flight client's
OpenSSL offers its default TLS 1.3 order and a broker follows the client's order. These
tests pin both halves with real parts, so an upgrade of pyarrow's gRPC or OpenSSL that
changes what links negotiate (and what benchmarks/README.md measured) fails here.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading

import pyarrow.flight as flight
import pytest

from broker_core.security.tls import Side, TlsSettings, open_flight_client
from testkit.tls import TlsCerts
from tests.broker.helpers import TEST_BROKER_CONFIG
from tests.harness.broker import BrokerFactory

HANDSHAKE_S = 10.0


def test_the_flight_client_offers_tls13_with_aes256_gcm_first(tls_certs: TlsCerts) -> None:
    """A TLS server that takes the client's first suite (no preference of its own) gets
    TLS 1.3 and TLS_AES_256_GCM_SHA384 from a Flight client built by idemlog."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_certs.broker.cert, tls_certs.broker.key)
    context.set_alpn_protocols(["h2"])
    context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE  # the client's order decides
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(HANDSHAKE_S)
    seen: list[tuple[str | None, str]] = []
    done = threading.Event()

    def serve_one_handshake() -> None:
        try:
            raw, _ = listener.accept()
            with context.wrap_socket(raw, server_side=True) as link:
                cipher = link.cipher()
                assert cipher is not None
                seen.append((link.version(), cipher[0]))
        finally:
            done.set()

    thread = threading.Thread(target=serve_one_handshake, daemon=True)
    thread.start()
    material = TlsSettings.from_values(tls_certs.client_keys()).load(Side.CLIENT)
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    client = open_flight_client(address, material)
    try:
        # Not a Flight server: the call fails once the handshake is done and it closes.
        with pytest.raises(flight.FlightError):
            list(client.list_actions(flight.FlightCallOptions(timeout=HANDSHAKE_S)))
    finally:
        client.close()
        assert done.wait(HANDSHAKE_S), "the Flight client never connected"
        listener.close()
    assert seen == [("TLSv1.3", "TLS_AES_256_GCM_SHA384")]


@pytest.mark.parametrize(
    ("offered", "expected"),
    [
        ("TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384"),
        ("TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256"),
    ],
)
def test_a_tls_broker_follows_the_clients_suite_order(
    broker_factory: BrokerFactory, tls_certs: TlsCerts, offered: str, expected: str
) -> None:
    """A real TLS broker takes the client's first TLS 1.3 suite (so what the Flight client
    offers first is what links run)."""
    broker = broker_factory({**TEST_BROKER_CONFIG, **tls_certs.broker_keys()}, name="suites")
    handshake = subprocess.run(
        [
            "openssl",
            "s_client",
            "-connect",
            broker.address,
            "-alpn",
            "h2",
            "-CAfile",
            str(tls_certs.ca),
            "-ciphersuites",
            offered,
        ],
        input=b"",
        capture_output=True,
        timeout=30,
        check=False,
    )
    output = handshake.stdout.decode("latin-1")
    assert "Verify return code: 0 (ok)" in output, output  # a real, verified handshake
    assert f"New, TLSv1.3, Cipher is {expected}" in output, output
