"""The TLS settings and the handshake diagnosis, without a broker (the real links are
tested in tests/broker/test_tls.py and test_tls_cluster.py)."""

from __future__ import annotations

import logging
import time

import pytest

from broker_core.errors import InvalidConfigError
from broker_core.security.tls import (
    PLAINTEXT_MATERIAL,
    SecurityProtocol,
    TlsSettings,
    is_loopback,
    warn_if_exposed,
)
from broker_core.security.tls_probe import diagnose
from broker_core.security.zk_tls import ZkTlsSettings


def test_a_certificate_needs_its_key_and_sasl_is_not_built_yet() -> None:
    with pytest.raises(InvalidConfigError, match="set both or neither"):
        TlsSettings.from_values({"security.protocol": "SSL", "ssl.certificate.location": "/c"})
    with pytest.raises(InvalidConfigError, match="SASL authentication is not built yet"):
        TlsSettings.from_values({"security.protocol": "SASL_PLAINTEXT"})
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


def test_only_a_plaintext_listener_off_loopback_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("broker1.example.net")
    with caplog.at_level(logging.WARNING, logger="idemlog.security"):
        assert not warn_if_exposed("127.0.0.1", TlsSettings())
        assert not warn_if_exposed("0.0.0.0", TlsSettings(protocol=SecurityProtocol.SSL))
        assert warn_if_exposed("0.0.0.0", TlsSettings())
    assert [r.getMessage() for r in caplog.records if "reachable" in r.getMessage()]


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
