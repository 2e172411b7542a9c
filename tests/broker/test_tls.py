"""TLS on a real broker process: a client through TLS, mutual TLS, and each refusal with a
real client and its message (docs/security.md).

The certificates are the session's (the ``tls_certs`` fixture, ``testkit.tls``). Every
refused link must be a non-retriable ``SslHandshakeError`` naming the broker's address and
the cause, raised at once, not after the client's retries: the same files would give the
same answer.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import pyarrow.flight as flight
import pytest

from broker_core.cli.main import main as cli_main
from broker_core.client.broker_client import BrokerClient
from broker_core.errors import SslHandshakeError
from broker_core.security.tls import (
    SecurityProtocol,
    Side,
    TlsMaterial,
    TlsSettings,
    server_arguments,
)
from testkit.tls import TlsCerts
from tests.broker.helpers import TEST_BROKER_CONFIG, ids, rows
from tests.harness.broker import BrokerFactory, BrokerProcess

REFUSAL_S = 5.0  # a refusal is immediate; a retried NetworkError would take the backoffs


def _material(keys: Mapping[str, str]) -> TlsMaterial:
    return TlsSettings.from_values(keys).load(Side.CLIENT)


def _client(broker: BrokerProcess, keys: Mapping[str, str]) -> BrokerClient:
    return BrokerClient(broker.address, tls=_material(keys), retries=3, timeout_s=10.0)


def _refused(broker_address: str, keys: Mapping[str, str]) -> SslHandshakeError:
    """The error a real client meets asking ``broker_address`` for metadata."""
    started = time.monotonic()
    with (
        BrokerClient(broker_address, tls=_material(keys), retries=3, timeout_s=10.0) as client,
        pytest.raises(SslHandshakeError) as refused,
    ):
        client.refresh_metadata()
    assert time.monotonic() - started < REFUSAL_S, "refused at once, not retried"
    assert not refused.value.retriable and refused.value.code == 10101
    assert broker_address in refused.value.message
    return refused.value


def _with_cert(certs: TlsCerts, cert: str, key: str, **extra: str) -> dict[str, object]:
    return {
        **TEST_BROKER_CONFIG,
        "security.protocol": "SSL",
        "ssl.ca.location": str(certs.ca),
        "ssl.certificate.location": cert,
        "ssl.key.location": key,
        **extra,
    }


@pytest.fixture
def tls_broker(broker_factory: BrokerFactory, tls_certs: TlsCerts) -> BrokerProcess:
    return broker_factory({**TEST_BROKER_CONFIG, **tls_certs.broker_keys()}, name="tls")


@pytest.fixture
def mtls_broker(broker_factory: BrokerFactory, tls_certs: TlsCerts) -> BrokerProcess:
    keys = tls_certs.broker_keys(client_auth="required")
    return broker_factory({**TEST_BROKER_CONFIG, **keys}, name="mtls")


def test_a_tls_client_produces_and_reads_through_a_tls_listener(
    tls_broker: BrokerProcess, tls_certs: TlsCerts
) -> None:
    with _client(tls_broker, tls_certs.client_keys()) as client:
        client.create_topic("secret", 1)
        with client.produce_stream("secret", 0) as stream:
            stream.send(rows(5)).offsets(10)
        assert ids(client, "secret") == list(range(5))


def test_plaintext_client_on_a_tls_listener_is_refused(tls_broker: BrokerProcess) -> None:
    error = _refused(tls_broker.address, {})
    assert "speaks TLS" in error.message and "security.protocol=PLAINTEXT" in error.message


def test_a_broker_certificate_of_another_ca_is_refused(
    broker_factory: BrokerFactory, tls_certs: TlsCerts
) -> None:
    other = broker_factory(
        _with_cert(tls_certs, str(tls_certs.other.cert), str(tls_certs.other.key)), name="other"
    )
    error = _refused(other.address, tls_certs.client_keys())
    assert "not signed by ssl.ca.location" in error.message
    assert str(tls_certs.ca) in error.message


def test_a_certificate_that_does_not_name_the_host_is_refused_unless_the_check_is_off(
    broker_factory: BrokerFactory, tls_certs: TlsCerts
) -> None:
    wrong = broker_factory(
        _with_cert(tls_certs, str(tls_certs.wrong_host.cert), str(tls_certs.wrong_host.key)),
        name="wrong-host",
    )
    error = _refused(wrong.address, tls_certs.client_keys())
    assert "does not name the host" in error.message and "127.0.0.1" in error.message
    # Kafka's ssl.endpoint.identification.algorithm="": the CA is still checked, the
    # host name no longer.
    keys = {**tls_certs.client_keys(), "ssl.endpoint.identification.algorithm": ""}
    with _client(wrong, keys) as client:
        assert client.refresh_metadata().brokers
    other_ca = {**keys, "ssl.ca.location": str(tls_certs.other_ca)}
    assert "not signed by" in _refused(wrong.address, other_ca).message


def test_an_expired_broker_certificate_is_refused_by_the_client(tls_certs: TlsCerts) -> None:
    # The broker refuses to start with an expired certificate of its own (tested below),
    # so the expired listener here is a bare Flight server with the same construction.
    settings = TlsSettings(protocol=SecurityProtocol.SSL)
    expired = TlsMaterial(
        settings, None, tls_certs.expired.cert.read_bytes(), tls_certs.expired.key.read_bytes()
    )
    location, arguments = server_arguments("127.0.0.1", 0, expired)
    server = flight.FlightServerBase(location, **arguments)
    try:
        error = _refused(f"127.0.0.1:{server.port}", tls_certs.client_keys())
        assert "has expired" in error.message
    finally:
        server.shutdown()


def test_mutual_tls_serves_a_client_certificate_of_the_ca_only(
    mtls_broker: BrokerProcess, tls_certs: TlsCerts
) -> None:
    with _client(mtls_broker, tls_certs.client_keys(with_cert=True)) as client:
        client.create_topic("mutual", 1)
        with client.produce_stream("mutual", 0) as stream:
            stream.send(rows(3)).offsets(10)
        assert ids(client, "mutual") == [0, 1, 2]
    missing = _refused(mtls_broker.address, tls_certs.client_keys())
    assert "requires a client certificate" in missing.message
    foreign = {
        **tls_certs.client_keys(),
        "ssl.certificate.location": str(tls_certs.other.cert),
        "ssl.key.location": str(tls_certs.other.key),
    }
    refused = _refused(mtls_broker.address, foreign)
    assert "refused the client certificate" in refused.message
    assert str(tls_certs.other.cert) in refused.message


def test_an_encrypted_broker_key_opens_with_its_password(
    broker_factory: BrokerFactory, tls_certs: TlsCerts
) -> None:
    from testkit.tls import KEY_PASSWORD

    config = _with_cert(
        tls_certs,
        str(tls_certs.broker.cert),
        str(tls_certs.encrypted_key),
        **{"ssl.key.password": KEY_PASSWORD},
    )
    broker = broker_factory(config, name="encrypted")
    with _client(broker, tls_certs.client_keys()) as client:
        assert client.refresh_metadata().brokers
    assert KEY_PASSWORD not in broker.log_text()


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "ssl.certificate.location='{dir}/absent.crt': cannot read it"),
        ("mismatch", "ssl.key.location='{client_key}' does not match the certificate"),
        ("expired", "ssl.certificate.location='{expired}' expired on"),
        ("no-password", "ssl.key.location='{encrypted}' is encrypted: set ssl.key.password"),
        ("wrong-password", "ssl.key.location='{encrypted}' cannot be opened"),
    ],
)
def test_a_broker_with_bad_files_refuses_to_start_naming_the_key_and_path(
    broker_factory: BrokerFactory, tls_certs: TlsCerts, case: str, expected: str
) -> None:
    cert, key = str(tls_certs.broker.cert), str(tls_certs.broker.key)
    extra: dict[str, str] = {}
    if case == "missing":
        cert = str(tls_certs.ca.parent / "absent.crt")
    elif case == "mismatch":
        key = str(tls_certs.client.key)
    elif case == "expired":
        cert, key = str(tls_certs.expired.cert), str(tls_certs.expired.key)
    else:
        key = str(tls_certs.encrypted_key)
        if case == "wrong-password":
            extra["ssl.key.password"] = "not-the-password"
    broker = broker_factory(_with_cert(tls_certs, cert, key, **extra), name=case, start=False)
    broker.spawn()
    assert broker.wait_exit() != 0
    message = expected.format(
        dir=tls_certs.ca.parent,
        client_key=tls_certs.client.key,
        expired=tls_certs.expired.cert,
        encrypted=tls_certs.encrypted_key,
    )
    assert message in broker.log_text()
    assert "LISTENING" not in broker.log_text()
    assert "not-the-password" not in broker.log_text()


def test_a_plaintext_broker_on_every_interface_warns_and_a_loopback_one_does_not(
    broker_factory: BrokerFactory,
) -> None:
    exposed = broker_factory(
        {
            **TEST_BROKER_CONFIG,
            "listener.host": "0.0.0.0",
            "listener.advertised.host": "127.0.0.1",
        },
        name="exposed",
    )
    exposed.wait_for_log("is reachable from other machines")
    loopback = broker_factory(TEST_BROKER_CONFIG, name="loopback")
    with BrokerClient(loopback.address) as client:
        assert client.refresh_metadata().brokers  # started, and said nothing of the kind
    assert "reachable from other machines" not in loopback.log_text()


def test_the_cli_reaches_a_tls_broker_with_command_config(
    tls_broker: BrokerProcess,
    tls_certs: TlsCerts,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "client.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in tls_certs.client_keys().items()))
    base = ["topics", "create", "--bootstrap", tls_broker.address, "--topic", "cli-tls"]
    assert cli_main([*base, "--partitions", "1", "--command-config", str(config)]) == 0
    assert "created topic cli-tls" in capsys.readouterr().out
    assert cli_main([*base, "--partitions", "1"]) == 2  # no --command-config: plaintext
    assert "SSL_HANDSHAKE_FAILED" in capsys.readouterr().err
    config.write_text("security.protocol=SSL\nssl.typo=1\n")
    assert cli_main([*base, "--command-config", str(config)]) == 2
    assert "ssl.typo" in capsys.readouterr().err
