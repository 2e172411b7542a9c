"""SASL_SSL (SCRAM inside TLS) on a real broker process: the TLS settings from the tls keys,
the credentials from the sasl keys, both on one link (docs/security.md).

The certificates are the session's (the ``tls_certs`` fixture, ``testkit.tls``); the user
is added with the real ``idemlog users`` command. A client with the CA and a user's
credentials is served; one with the CA and no credentials is refused by SASL after its TLS
handshake succeeded; one with the credentials but no TLS is refused by TLS before SASL is
reached.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import SaslAuthenticationFailedError, SslHandshakeError
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.scram import Mechanism
from broker_core.security.tls import Side, TlsMaterial, TlsSettings
from testkit.tls import TlsCerts
from tests.broker.helpers import SCHEMA, TEST_BROKER_CONFIG, ids, rows
from tests.broker.test_sasl import PASSWORD, add_user, idemlog
from tests.harness.broker import BrokerFactory, BrokerProcess

ALICE = SaslCredentials(Mechanism.SCRAM_SHA_512, "alice", PASSWORD)


def _tls(keys: Mapping[str, str]) -> TlsMaterial:
    return TlsSettings.from_values(keys).load(Side.CLIENT)


@pytest.fixture
def sasl_ssl_broker(
    broker_factory: BrokerFactory, tls_certs: TlsCerts, tmp_path: Path
) -> BrokerProcess:
    data = tmp_path / "sasl-ssl-data"
    data.mkdir()
    add_user(["--data-dir", str(data)], "alice", PASSWORD)
    config = {
        **TEST_BROKER_CONFIG,
        **tls_certs.broker_keys(),
        "security.protocol": "SASL_SSL",
        "log.dir": str(data),
    }
    return broker_factory(config, name="sasl-ssl")


def test_sasl_ssl_serves_a_client_with_both_and_refuses_one_without_credentials(
    sasl_ssl_broker: BrokerProcess, tls_certs: TlsCerts
) -> None:
    address = sasl_ssl_broker.address
    client_tls = _tls({**tls_certs.client_keys(), "security.protocol": "SASL_SSL"})
    assert client_tls.settings.encrypted and client_tls.ca is not None
    with BrokerClient(address, tls=client_tls, sasl=ALICE) as client:
        client.create_topic("both", 1, schema=SCHEMA)
        with client.produce_stream("both", 0) as stream:
            stream.send(rows(5)).result(10)
        assert ids(client, "both") == [0, 1, 2, 3, 4]

    # TLS accepted (the same CA), then no SASL session: refused by SASL, not by TLS.
    with (
        BrokerClient(address, tls=client_tls, retries=0) as anonymous,
        pytest.raises(SaslAuthenticationFailedError) as no_credentials,
    ):
        anonymous.describe_topics()
    assert "no SASL session: this listener requires authentication" in (
        no_credentials.value.message
    )
    assert not no_credentials.value.retriable

    # The credentials without TLS: refused at the TLS handshake, before SASL's.
    with (
        BrokerClient(address, sasl=ALICE, retries=0) as plaintext,
        pytest.raises(SslHandshakeError, match="speaks TLS"),
    ):
        plaintext.describe_topics()
    log = sasl_ssl_broker.log_text()
    assert PASSWORD not in log
    assert "reachable from other machines" not in log  # loopback, and encrypted


def test_the_cli_and_the_producer_take_tls_and_sasl_keys_together(
    sasl_ssl_broker: BrokerProcess, tls_certs: TlsCerts, tmp_path: Path
) -> None:
    from broker_core.producer.producer import Producer

    keys = {
        **tls_certs.client_keys(),
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "alice",
        "sasl.password": PASSWORD,
    }
    config = tmp_path / "client.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
    bootstrap = ["--bootstrap", sasl_ssl_broker.address]
    created = idemlog(
        "topics", "create", *bootstrap, "--topic", "cli", "--command-config", str(config)
    )
    assert created.returncode == 0, created.stderr
    with Producer(sasl_ssl_broker.address, **keys) as producer:
        producer.send("cli", rows(3)).result(30)
    with BrokerClient(sasl_ssl_broker.address, tls=_tls(keys), sasl=ALICE) as client:
        assert ids(client, "cli") == [0, 1, 2]
    # The same file without the password: the CLI is refused by SASL, naming the user.
    config.write_text("".join(f"{k}={v}\n" for k, v in keys.items() if k != "sasl.password"))
    refused = idemlog("topics", "describe", *bootstrap, "--command-config", str(config))
    assert refused.returncode == 2
    assert "sasl.password is empty for sasl.username='alice'" in refused.stderr
