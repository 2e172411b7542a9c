"""SASL (SCRAM) on a real embedded broker process: users added and removed with the real
``idemlog users`` command, refusals seen by a real client (docs/security.md)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import ErrorCode, SaslAuthenticationFailedError
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.scram import Mechanism
from tests.broker.helpers import SCHEMA, TEST_BROKER_CONFIG, ids, rows
from tests.harness.broker import BrokerFactory, BrokerProcess

PASSWORD = "alice-Pa55word-7f3c"
SHA256, SHA512 = Mechanism.SCRAM_SHA_256, Mechanism.SCRAM_SHA_512


def idemlog(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real command, as an operator runs it (the password on stdin, not in argv)."""
    return subprocess.run(
        [sys.executable, "-m", "broker_core.cli.main", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def add_user(where: list[str], name: str, password: str) -> None:
    done = idemlog("users", "add", name, *where, "--password-file", "-", stdin=password + "\n")
    assert done.returncode == 0, done.stderr
    assert password not in done.stdout + done.stderr


@pytest.fixture
def sasl_broker(broker_factory: BrokerFactory, tmp_path: Path) -> BrokerProcess:
    data = tmp_path / "sasl-data"
    data.mkdir()
    add_user(["--data-dir", str(data)], "alice", PASSWORD)
    config = {**TEST_BROKER_CONFIG, "log.dir": str(data), "security.protocol": "SASL_PLAINTEXT"}
    return broker_factory(config, name="sasl")


def _refusal(address: str, sasl: SaslCredentials | None) -> SaslAuthenticationFailedError:
    with (
        BrokerClient(address, sasl=sasl, retries=0) as client,
        pytest.raises(SaslAuthenticationFailedError) as err,
    ):
        client.describe_topics()
    error = err.value
    assert error.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert error.code == 58 and not error.retriable
    return error


def test_users_file_holds_salted_credentials_only(sasl_broker: BrokerProcess) -> None:
    path = sasl_broker.log_dir / "__users.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert PASSWORD not in text and "iterations=4096" in text and "stored_key=" in text
    listed = idemlog("users", "list", "--data-dir", str(sasl_broker.log_dir))
    assert listed.stdout.split() == ["alice", "SCRAM-SHA-256,SCRAM-SHA-512"]


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
def test_authenticated_client_produces_and_reads(
    sasl_broker: BrokerProcess, mechanism: Mechanism
) -> None:
    alice = SaslCredentials(mechanism, "alice", PASSWORD)
    with BrokerClient(sasl_broker.address, sasl=alice) as client:
        client.create_topic("t", 1, schema=SCHEMA)
        with client.produce_stream("t", 0) as stream:
            stream.send(rows(5)).result(10)
        assert ids(client, "t") == [0, 1, 2, 3, 4]


def test_refusals_name_the_principal_and_mechanism_never_the_password(
    sasl_broker: BrokerProcess,
) -> None:
    address = sasl_broker.address
    none = _refusal(address, None)
    assert "no SASL session: this listener requires authentication" in none.message
    wrong = _refusal(address, SaslCredentials(SHA256, "alice", "not-" + PASSWORD))
    assert wrong.message == (
        "authentication of User:alice with SCRAM-SHA-256 failed: invalid credentials "
        "(unknown user or wrong password)"
    )
    assert PASSWORD not in wrong.message
    unknown = _refusal(address, SaslCredentials(SHA512, "mallory", PASSWORD))
    # The same answer as a wrong password: a refusal does not tell which users exist.
    assert unknown.message == wrong.message.replace("alice", "mallory").replace("256", "512")
    log = sasl_broker.log_path.read_text()
    assert PASSWORD not in log
    assert "SCRAM handshake of User:mallory (SCRAM-SHA-512) refused" in log


def test_removed_user_is_refused_at_its_next_call(sasl_broker: BrokerProcess) -> None:
    alice = SaslCredentials(SHA512, "alice", PASSWORD)
    with BrokerClient(sasl_broker.address, sasl=alice, retries=0) as client:
        assert client.describe_topics() == []  # authenticated: a session is open
        removed = idemlog("users", "remove", "alice", "--data-dir", str(sasl_broker.log_dir))
        assert removed.returncode == 0, removed.stderr
        # The same connection, no new handshake: its session ended with the user.
        with pytest.raises(SaslAuthenticationFailedError, match="revoked"):
            client.describe_topics()
    refused = _refusal(sasl_broker.address, alice)
    assert "User:alice with SCRAM-SHA-512 failed: invalid credentials" in refused.message
    log = sasl_broker.log_path.read_text()
    assert re.search(r"User:alice changed or removed: 1 sessions ended", log), log[-2000:]


def test_embedded_default_is_unchanged_plaintext_on_loopback(broker: BrokerProcess) -> None:
    # No users, no keys: any local client is served, as before; the listener is loopback.
    assert broker.host == "127.0.0.1"
    with BrokerClient(broker.address, retries=0) as client:
        client.create_topic("open", 1, schema=SCHEMA)
        assert [t.name for t in client.describe_topics()] == ["open"]
    assert not (broker.log_dir / "__users.json").exists()
    assert os.path.basename(str(broker.log_dir)).endswith("-data")


def test_cli_authenticates_with_command_config(sasl_broker: BrokerProcess, tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
        f"sasl.username=alice\nsasl.password={PASSWORD}\n"
    )
    bootstrap = ["--bootstrap", sasl_broker.address]
    created = idemlog(
        "topics", "create", *bootstrap, "--topic", "cli", "--command-config", str(config)
    )
    assert created.returncode == 0, created.stderr
    refused = idemlog("topics", "describe", *bootstrap)
    assert refused.returncode == 2
    assert "SASL_AUTHENTICATION_FAILED (58): no SASL session" in refused.stderr


def test_clients_authenticate_again_before_their_session_expires(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    data = tmp_path / "short"
    data.mkdir()
    add_user(["--data-dir", str(data)], "alice", PASSWORD)
    broker = broker_factory(
        {
            "log.dir": str(data),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.session.lifetime.ms": 1000,  # the minimum
        },
        name="short",
    )
    alice = SaslCredentials(SHA512, "alice", PASSWORD)
    with BrokerClient(broker.address, sasl=alice, retries=0) as client:
        calls, started = 0, time.monotonic()
        # Three session lifetimes of calls, none retried: each is served, as the client
        # replaces its connection at half the lifetime.
        while time.monotonic() - started < 3.0:
            client.describe_topics()
            calls += 1
    assert calls > 10


def test_standalone_producer_takes_the_security_keys(sasl_broker: BrokerProcess) -> None:
    from broker_core.producer.producer import Producer

    keys = {"security.protocol": "SASL_PLAINTEXT", "sasl.username": "alice"}
    with BrokerClient(sasl_broker.address, sasl=SaslCredentials(SHA512, "alice", PASSWORD)) as c:
        c.create_topic("p", 1, schema=SCHEMA)
        with Producer(sasl_broker.address, **keys, **{"sasl.password": PASSWORD}) as producer:
            producer.send("p", rows(4)).result(30)
        assert ids(c, "p") == [0, 1, 2, 3]
    with pytest.raises(SaslAuthenticationFailedError, match="User:alice with SCRAM-SHA-512"):
        Producer(sasl_broker.address, **keys, **{"sasl.password": "wrong"}).send("p", rows(1))
