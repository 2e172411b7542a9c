"""Principals from mutual-TLS certificates on real broker processes: the certificate
handshake, ``ssl.principal.mapping.rules`` and the refusals (docs/security.md,
Principals from certificates).

Each broker runs ``security.protocol=SSL`` with ``ssl.client.auth=required``; its log
names the principal each certificate handshake proved, which is the principal every call
of that connection carries (``principal_of``; in-process proof per call:
tests/unit/test_cert_auth.py).
"""

from __future__ import annotations

import time

import pyarrow.flight as flight
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import SaslAuthenticationFailedError, SslHandshakeError
from broker_core.security.cert_auth import CertificateClientAuth
from broker_core.security.tls import Side, TlsMaterial, TlsSettings, open_flight_client
from testkit.tls import CertFiles, TlsCerts, issue_client
from tests.broker.helpers import TEST_BROKER_CONFIG, ids, rows
from tests.harness.broker import BrokerFactory, BrokerProcess

RULES = "RULE:^CN=(.*?),OU=data$/$1/L,DEFAULT"
REFUSAL_S = 5.0  # a refusal is immediate; a retried error would take the backoffs


def _broker(factory: BrokerFactory, certs: TlsCerts, rules: str) -> BrokerProcess:
    keys = {**certs.broker_keys(client_auth="required"), "ssl.principal.mapping.rules": rules}
    return factory({**TEST_BROKER_CONFIG, **keys}, name="mtls-principal")


def _material(certs: TlsCerts, files: CertFiles) -> TlsMaterial:
    keys = {
        **certs.client_keys(),
        "ssl.certificate.location": str(files.cert),
        "ssl.key.location": str(files.key),
    }
    return TlsSettings.from_values(keys).load(Side.CLIENT)


def _spark_job(certs: TlsCerts) -> CertFiles:
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "data"),
            x509.NameAttribute(NameOID.COMMON_NAME, "Spark-Job"),
        ]
    )
    return issue_client(certs, "spark-job", subject)


def test_a_client_certificate_is_its_mapped_principal_and_is_served(
    broker_factory: BrokerFactory, tls_certs: TlsCerts
) -> None:
    broker = _broker(broker_factory, tls_certs, RULES)
    with BrokerClient(broker.address, tls=_material(tls_certs, _spark_job(tls_certs))) as client:
        client.create_topic("mapped", 1)
        with client.produce_stream("mapped", 0) as stream:
            stream.send(rows(5)).offsets(10)
        assert ids(client, "mapped") == list(range(5))
    broker.wait_for_log("certificate CN=Spark-Job,OU=data authenticated as User:spark-job")
    # No rule but DEFAULT applies: the full name, RFC 2253, as Kafka prints it.
    with BrokerClient(broker.address, tls=_material(tls_certs, tls_certs.client)) as client:
        assert ids(client, "mapped") == list(range(5))
    broker.wait_for_log("certificate CN=client authenticated as User:CN=client")


def test_a_certificate_no_rule_maps_is_refused_with_kafkas_message(
    broker_factory: BrokerFactory, tls_certs: TlsCerts
) -> None:
    broker = _broker(broker_factory, tls_certs, "RULE:^CN=(.*?),OU=data$/$1/")
    started = time.monotonic()
    with (
        BrokerClient(broker.address, tls=_material(tls_certs, tls_certs.client)) as client,
        pytest.raises(SaslAuthenticationFailedError) as refused,
    ):
        client.refresh_metadata()
    assert time.monotonic() - started < REFUSAL_S, "refused at once, not retried"
    assert refused.value.code == 58 and not refused.value.retriable
    assert refused.value.message.endswith(
        "certificate authentication of CN=client failed: No rules apply to CN=client, rules "
        "[RULE:^CN=(.*?),OU=data$/$1/] (ssl.principal.mapping.rules)"
    ), refused.value.message
    broker.wait_for_log("certificate handshake of CN=client refused: No rules apply")
    # Another certificate the rule maps is served by the same broker.
    with BrokerClient(broker.address, tls=_material(tls_certs, _spark_job(tls_certs))) as client:
        assert client.refresh_metadata().brokers


def test_rules_that_do_not_map_the_brokers_own_certificate_are_a_config_error(
    broker_factory: BrokerFactory, tls_certs: TlsCerts
) -> None:
    # With the authorizer on, the broker maps its own certificate at start (its principal
    # must be a super user): rules that cannot are told as the configuration error they are.
    keys = {
        **tls_certs.broker_keys(client_auth="required"),
        "ssl.principal.mapping.rules": "RULE:^CN=(.*?),OU=data$/$1/",
        "authorizer.enable": "true",
    }
    broker = broker_factory({**TEST_BROKER_CONFIG, **keys}, name="mtls-own", start=False)
    broker.spawn()
    assert broker.wait_exit(30) == 2  # the CLI's status for a configuration error
    log = broker.log_text()
    assert "ssl.principal.mapping.rules: no rule maps this broker's own certificate" in log, log
    assert "this is a bug" not in log and "LISTENING" not in log


@pytest.mark.parametrize(
    ("chain", "key", "why"),
    [
        ("client", "broker", "the signature does not verify with the certificate's key"),
        ("other", "other", "not signed by the broker's ssl.ca.location"),
        ("expired", "expired", "expired on"),
    ],
)
def test_a_handshake_that_does_not_prove_a_valid_certificate_of_the_ca_is_refused(
    broker_factory: BrokerFactory, tls_certs: TlsCerts, chain: str, key: str, why: str
) -> None:
    """The TLS link is made with the valid client certificate (the TLS layer would refuse
    the others first); the handshake then shows another chain, or signs with another key,
    and the broker's own check refuses it."""
    broker = _broker(broker_factory, tls_certs, RULES)
    files = {
        "client": tls_certs.client,
        "broker": tls_certs.broker,
        "other": tls_certs.other,
        "expired": tls_certs.expired,
    }
    forged = CertificateClientAuth(files[chain].cert.read_bytes(), files[key].key.read_bytes())
    with pytest.raises(flight.FlightUnauthenticatedError) as refused:
        open_flight_client(broker.address, _material(tls_certs, tls_certs.client), auth=forged)
    message = str(refused.value)
    assert "58 SASL_AUTHENTICATION_FAILED" in message and why in message, message
    subject = "CN=client" if chain == "client" else "CN=broker"
    assert f"certificate authentication of {subject} failed: " in message
    broker.wait_for_log(f"certificate handshake of {subject} refused: ")
    assert why in broker.log_text()


def test_certificates_the_tls_layer_refuses_never_reach_the_handshake(
    broker_factory: BrokerFactory, tls_certs: TlsCerts
) -> None:
    """A client certificate of another CA or expired, used for the link itself: TLS refuses
    it (SSL_HANDSHAKE_FAILED, the TLS layer's error), before any handshake."""
    broker = _broker(broker_factory, tls_certs, RULES)
    for files in (tls_certs.other, tls_certs.expired):
        keys = {
            **tls_certs.client_keys(),
            "ssl.certificate.location": str(files.cert),
            "ssl.key.location": str(files.key),
        }
        # The client's own check refuses an expired file before it connects.
        if files is tls_certs.expired:
            with pytest.raises(Exception, match="expired on"):
                TlsSettings.from_values(keys).load(Side.CLIENT)
            continue
        with (
            BrokerClient(
                broker.address, tls=TlsSettings.from_values(keys).load(Side.CLIENT)
            ) as client,
            pytest.raises(SslHandshakeError) as refused,
        ):
            client.refresh_metadata()
        assert "refused the client certificate" in refused.value.message
    assert "authenticated as" not in broker.log_text()


def test_a_client_goes_on_across_a_broker_restart_with_a_new_handshake(
    broker_factory: BrokerFactory, tls_certs: TlsCerts
) -> None:
    """Sessions live in the broker's memory: after a restart the client's channel carries
    a token of the earlier run, which the client takes for a broken connection (a new
    channel, a new handshake), not for a refusal."""
    broker = _broker(broker_factory, tls_certs, RULES)
    with BrokerClient(
        broker.address, tls=_material(tls_certs, _spark_job(tls_certs)), timeout_s=20.0
    ) as client:
        client.create_topic("restarted", 1)
        with client.produce_stream("restarted", 0) as stream:
            stream.send(rows(3)).offsets(10)
        broker.kill()
        broker.restart()
        assert ids(client, "restarted") == list(range(3))  # served after the restart
        with client.produce_stream("restarted", 0) as stream:
            stream.send(rows(2, start=3)).offsets(10)
        assert ids(client, "restarted") == list(range(5))
    # The scenario happened: two runs, and the second authenticated the client anew.
    runs = broker.log_text().split("=== start ")
    assert len(runs) == 3, runs  # "", run 1, run 2
    assert "authenticated as User:spark-job" in runs[1]
    assert "authenticated as User:spark-job" in runs[2]
