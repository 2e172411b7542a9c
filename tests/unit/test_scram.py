"""SCRAM (RFC 5802 / 7677), the session table, the security keys, and the Flight handshake
against an in-process Flight server (a real gRPC server and client, not a fake)."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator

import pyarrow.flight as flight
import pytest

from broker_core.client.connections import FlightConnections
from broker_core.client.produce_stream import typed_flight_error
from broker_core.errors import InvalidConfigError, NetworkError, SaslAuthenticationFailedError
from broker_core.protocol.wire import error_message
from broker_core.security.client_config import sasl_credentials
from broker_core.security.flight_auth import SaslCredentials, ServerAuth, scram_mechanisms
from broker_core.security.principal import ANONYMOUS, Principal, principal_of
from broker_core.security.scram import (
    Mechanism,
    ScramClient,
    ScramCredential,
    ScramError,
    ScramServer,
    escape_username,
    unescape_username,
)
from broker_core.security.sessions import EARLIER_RUN, SessionTable
from broker_core.server.config.broker_config import BrokerConfig

SHA256, SHA512 = Mechanism.SCRAM_SHA_256, Mechanism.SCRAM_SHA_512

# RFC 7677, section 3: user "user", password "pencil".
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (
    "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_client_side_matches_rfc_7677_test_vector() -> None:
    client = ScramClient(SHA256, "user", "pencil", nonce=RFC_CLIENT_NONCE)
    assert client.first() == RFC_CLIENT_FIRST
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.verify(RFC_SERVER_FINAL)  # the server's signature checks out


def test_server_side_matches_rfc_7677_test_vector_from_the_stored_credential() -> None:
    credential = ScramCredential.derive(SHA256, "pencil", salt=RFC_SALT)
    server = ScramServer(SHA256, {"user": credential}.get, secret=b"s", nonce=RFC_SERVER_NONCE)
    assert server.first(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert server.final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.authenticated and server.username == "user"
    # What is stored survives its text form, and holds no password.
    text = credential.to_text()
    assert ScramCredential.from_text(text) == credential and "pencil" not in text


def _nobody(_user: str) -> ScramCredential | None:
    return None


def _exchange(server: ScramServer, client: ScramClient) -> None:
    client.verify(server.final(client.final(server.first(client.first()))))


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
def test_round_trip_and_refusals(mechanism: Mechanism) -> None:
    credential = ScramCredential.derive(mechanism, "s3cret", iterations=4096)
    users = {"a=b,c": credential}.get
    _exchange(ScramServer(mechanism, users, secret=b"k"), ScramClient(mechanism, "a=b,c", "s3cret"))
    with pytest.raises(ScramError, match="proof does not verify"):
        _exchange(ScramServer(mechanism, users, secret=b"k"), ScramClient(mechanism, "a=b,c", "x"))
    # An unknown user is answered like a known one, and fails at the same step.
    unknown = ScramServer(mechanism, users, secret=b"k")
    client = ScramClient(mechanism, "nobody", "s3cret")
    server_first = unknown.first(client.first())
    assert ",i=4096" in server_first
    with pytest.raises(ScramError, match="proof does not verify"):
        unknown.final(client.final(server_first))


def test_client_refuses_a_server_without_the_users_credential() -> None:
    # A server holding another credential of the same salt (not the user's password)
    # cannot forge the server signature: the client stops before it takes a token.
    real = ScramCredential.derive(SHA256, "right", salt=b"salt" * 8)
    server = ScramServer(SHA256, {"u": real}.get, secret=b"k")
    client = ScramClient(SHA256, "u", "right")
    server.final(client.final(server.first(client.first())))
    with pytest.raises(ScramError, match="signature does not verify"):
        client.verify("v=" + base64.b64encode(b"x" * 32).decode())


def test_messages_out_of_turn_and_malformed_are_refused() -> None:
    server = ScramServer(SHA256, _nobody, secret=b"k")
    with pytest.raises(ScramError, match="out of turn"):
        server.final(RFC_CLIENT_FINAL)
    with pytest.raises(ScramError, match="channel binding"):
        ScramServer(SHA256, _nobody, secret=b"k").first("y,,n=user,r=abc")
    client = ScramClient(SHA256, "u", "p", nonce="abc")
    client.first()
    with pytest.raises(ScramError, match="nonce does not extend"):
        client.final("r=xyz,s=c2FsdA==,i=4096")
    assert unescape_username(escape_username("a=,b")) == "a=,b"
    with pytest.raises(ValueError, match="iterations"):
        ScramCredential.derive(SHA256, "p", iterations=1000)


def test_session_table_expiry_bound_and_revocation() -> None:
    now = [0.0]
    table = SessionTable(lifetime_s=10, max_sessions=2, clock=lambda: now[0])
    alice, bob = Principal.user("alice"), Principal.user("bob")
    a = table.issue(alice, "SCRAM-SHA-256")
    b = table.issue(bob, "SCRAM-SHA-256")
    assert table.validate(a) == alice
    with pytest.raises(SaslAuthenticationFailedError, match="maximum of 2 sessions"):
        table.issue(alice, "SCRAM-SHA-256")
    assert table.revoke(bob) == 1 and len(table) == 1
    with pytest.raises(SaslAuthenticationFailedError, match="revoked"):
        table.validate(b)
    now[0] = 10.0
    with pytest.raises(SaslAuthenticationFailedError, match=r"User:alice .* expired"):
        table.validate(a)
    assert len(table) == 0  # the expired session is gone: the bound holds live ones only
    with pytest.raises(SaslAuthenticationFailedError, match="no SASL session"):
        table.validate(b"")


def test_security_keys_are_checked_and_the_default_is_plaintext_on_loopback() -> None:
    default = BrokerConfig.from_mapping({})
    assert not default.security.sasl and default.security.inter_broker is None
    assert default.listener_host == "127.0.0.1"
    cluster = {"zookeeper.connect": "127.0.0.1:2181", "security.protocol": "SASL_PLAINTEXT"}
    with pytest.raises(InvalidConfigError, match=re.escape("sasl.inter.broker.username")):
        BrokerConfig.from_mapping(cluster)
    inter = {"sasl.inter.broker.username": "broker", "sasl.inter.broker.password": "pw"}
    with pytest.raises(InvalidConfigError, match=re.escape("not in sasl.enabled.mechanisms")):
        BrokerConfig.from_mapping({**cluster, **inter, "sasl.enabled.mechanisms": "SCRAM-SHA-256"})
    config = BrokerConfig.from_mapping({**cluster, **inter})
    assert config.security.inter_broker is not None
    assert "pw" not in repr(config.security.inter_broker)
    with pytest.raises(InvalidConfigError, match="SCRAM-SHA-1"):
        BrokerConfig.from_mapping({"sasl.enabled.mechanisms": "SCRAM-SHA-1"})


def test_client_options() -> None:
    assert sasl_credentials({"topic": "t"}) is None
    with pytest.raises(InvalidConfigError, match=re.escape("security.protocol=PLAINTEXT")):
        sasl_credentials({"sasl.username": "alice"})
    with pytest.raises(InvalidConfigError, match=re.escape("sasl.password is empty")) as err:
        sasl_credentials({"security.protocol": "SASL_PLAINTEXT", "sasl.username": "alice"})
    assert "alice" in str(err.value)
    creds = sasl_credentials(
        {"security.protocol": "SASL_PLAINTEXT", "sasl.username": "a", "sasl.password": "hunter2"}
    )
    assert creds is not None and creds.mechanism is SHA512 and "hunter2" not in repr(creds)


class _Echo(flight.FlightServerBase):  # type: ignore[misc]
    """Answers every action with the caller's principal."""

    def do_action(
        self, context: flight.ServerCallContext, action: flight.Action
    ) -> Iterator[flight.Result]:
        yield flight.Result(str(principal_of(context)).encode())


def _principal(connections: FlightConnections, address: str) -> str:
    return connections.action(address, "who", b"", 10.0, "who").decode()


def test_handshake_over_flight_gives_each_call_its_principal() -> None:
    users = {"alice": ScramCredential.derive(SHA512, "pw")}
    sessions = SessionTable(lifetime_s=60, max_sessions=10)
    auth = ServerAuth(sessions, scram_mechanisms(lambda u, m: users.get(u), [SHA512], b"s" * 32))
    server = _Echo("grpc://127.0.0.1:0", auth_handler=auth)
    plain = _Echo("grpc://127.0.0.1:0")
    address = f"127.0.0.1:{server.port}"
    try:
        alice = FlightConnections(sasl=SaslCredentials(SHA512, "alice", "pw"))
        assert _principal(alice, address) == "User:alice"
        assert len(sessions) == 1
        assert _principal(FlightConnections(), f"127.0.0.1:{plain.port}") == str(ANONYMOUS)
        with pytest.raises(SaslAuthenticationFailedError, match="no SASL session"):
            _principal(FlightConnections(), address)
        wrong = FlightConnections(sasl=SaslCredentials(SHA512, "alice", "nope"))
        with pytest.raises(SaslAuthenticationFailedError, match="User:alice with SCRAM-SHA-512"):
            _principal(wrong, address)
        other = FlightConnections(sasl=SaslCredentials(SHA256, "alice", "pw"))
        with pytest.raises(SaslAuthenticationFailedError, match="'SCRAM-SHA-256' is not enabled"):
            _principal(other, address)
        sessions.revoke(Principal.user("alice"))
        with pytest.raises(SaslAuthenticationFailedError, match="revoked"):
            _principal(alice, address)
        alice.close()
    finally:
        server.shutdown()
        plain.shutdown()


def test_a_token_of_an_earlier_run_is_told_apart_from_a_revoked_one() -> None:
    """A restarted broker has a new table: its refusal of the old run's token says so, and
    the client takes it for a broken connection (a new handshake), not a refusal."""
    before = SessionTable(lifetime_s=60, max_sessions=10)
    after = SessionTable(lifetime_s=60, max_sessions=10)
    alice = Principal.user("alice")
    old = before.issue(alice, "SCRAM-SHA-512")
    with pytest.raises(SaslAuthenticationFailedError) as earlier:
        after.validate(old)
    assert EARLIER_RUN in earlier.value.message
    revoked = after.issue(alice, "SCRAM-SHA-512")
    after.revoke(alice)
    with pytest.raises(SaslAuthenticationFailedError, match="unknown or revoked") as gone:
        after.validate(revoked)
    assert EARLIER_RUN not in gone.value.message
    # The client's reading of each refusal as it comes back from a call.
    connections = FlightConnections()
    as_sent = flight.FlightUnauthenticatedError(error_message(earlier.value))
    assert isinstance(connections.failure("127.0.0.1:1", as_sent, "call"), NetworkError)
    assert isinstance(typed_flight_error(as_sent, "produce"), NetworkError)
    refused = flight.FlightUnauthenticatedError(error_message(gone.value))
    assert isinstance(connections.failure("127.0.0.1:1", refused, "call"), type(gone.value))
    assert isinstance(typed_flight_error(refused, "produce"), SaslAuthenticationFailedError)
