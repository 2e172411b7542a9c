"""The TLS settings and the handshake diagnosis, without a broker (the real links are
tested in tests/broker/test_tls.py and test_tls_cluster.py)."""

from __future__ import annotations

import logging
import time

import pytest

from broker_core.errors import InvalidConfigError
from broker_core.security.tls import (
    PLAINTEXT_MATERIAL,
    ClientAuth,
    SecurityProtocol,
    TlsSettings,
    is_loopback,
    warn_if_exposed,
)
from broker_core.security.tls_probe import diagnose
from broker_core.security.zk_tls import ZkTlsSettings


def test_a_certificate_needs_its_key_and_sasl_ssl_is_tls() -> None:
    with pytest.raises(InvalidConfigError, match="set both or neither"):
        TlsSettings.from_values({"security.protocol": "SSL", "ssl.certificate.location": "/c"})
    # The SASL protocols are accepted; only SASL_SSL encrypts (the sasl.* keys are read
    # by broker_core.security.client_config / server.config.security).
    assert not TlsSettings.from_values({"security.protocol": "SASL_PLAINTEXT"}).encrypted
    sasl_ssl = TlsSettings.from_values({"security.protocol": "SASL_SSL", "ssl.ca.location": "/ca"})
    assert sasl_ssl.encrypted and sasl_ssl.scheme == "grpc+tls"
    settings = TlsSettings.from_values(
        {"security.protocol": "SSL", "ssl.key.password": "s3cret", "ssl.ca.location": "/ca"}
    )
    assert settings.protocol is SecurityProtocol.SSL and settings.scheme == "grpc+tls"
    assert "s3cret" not in repr(settings)


def test_zookeeper_errors_name_the_zookeeper_keys() -> None:
    zk = ZkTlsSettings.from_values(
        {"zookeeper.ssl.client.enable": True, "zookeeper.ssl.ca.location": "/absent/ca.crt"}
    )
    with pytest.raises(InvalidConfigError, match=r"zookeeper\.ssl\.ca\.location='/absent/ca.crt'"):
        zk.kazoo_arguments()
    assert ZkTlsSettings.from_values({}).kazoo_arguments() == {}


def test_a_listener_off_loopback_without_tls_or_authentication_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("broker1.example.net")
    with caplog.at_level(logging.WARNING, logger="idemlog.security"):
        assert not warn_if_exposed("127.0.0.1", TlsSettings())
        mtls = TlsSettings(protocol=SecurityProtocol.SSL, client_auth=ClientAuth.REQUIRED)
        assert not warn_if_exposed("0.0.0.0", mtls)
        assert warn_if_exposed("0.0.0.0", TlsSettings())
        assert not warn_if_exposed("0.0.0.0", TlsSettings(protocol=SecurityProtocol.SASL_SSL))
        assert warn_if_exposed("0.0.0.0", TlsSettings(protocol=SecurityProtocol.SASL_PLAINTEXT))
        # TLS without client certificates: encrypted, but anyone may write.
        assert warn_if_exposed("0.0.0.0", TlsSettings(protocol=SecurityProtocol.SSL))
    warnings = [r.getMessage() for r in caplog.records if "reachable" in r.getMessage()]
    assert len(warnings) == 3 and "unauthenticated; set security.protocol=SSL" in warnings[0]
    assert "authenticated, but anyone" in warnings[1] and warnings[1].endswith(
        "set security.protocol=SASL_SSL (docs/security.md)"
    )
    assert "encrypted but unauthenticated" in warnings[2]
    assert "set ssl.client.auth=required, or security.protocol=SASL_SSL" in warnings[2]


def test_an_unreachable_host_is_not_probed() -> None:
    # A host cut off gives gRPC's timeout, not a closed socket: no probe (it would wait
    # out its own timeout on every failed call), so the caller's NetworkError stands.
    failure = (
        "failed to connect to all addresses; last error: UNAVAILABLE: "
        "ipv4:10.255.255.1:9092: Connection timed out"
    )
    started = time.monotonic()
    assert diagnose("10.255.255.1:9092", PLAINTEXT_MATERIAL, failure) is None
    assert time.monotonic() - started < 0.5
