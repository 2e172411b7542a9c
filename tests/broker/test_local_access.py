"""Who can reach a broker on this machine, on real broker processes (docs/security.md, The
embedded default): the embedded broker's per-start token (only its owner's processes are
served) and the warning of a listener reachable from other machines without TLS or
authentication.

The broker is started as the Spark sink starts it (``spark_sink.embedded.ensure_broker``,
no Spark needed); "another local user" is a real one (``nobody``), shown unable to read the
token file, and a client without the token is refused.
"""

from __future__ import annotations

import os
import pwd
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.flight as flight
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import SaslAuthenticationFailedError
from broker_core.security.local_token import TOKEN_HEADER, register
from spark_sink.embedded import broker_pid, ensure_broker, stop_broker, token_file
from testkit.tls import TlsCerts
from tests.broker.helpers import TEST_BROKER_CONFIG
from tests.harness.broker import BrokerFactory
from tests.harness.waiting import wait_until

REFUSAL_S = 5.0  # a refusal is immediate; a retried error would take the backoffs
OTHER_USER = "nobody"


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "embedded")
    try:
        yield path
    finally:
        stop_broker(path)


def _raw_call(address: str, token: str | None) -> None:
    """A metadata-free call (ListActions) with ``token`` in the header, or none."""
    client = flight.connect(f"grpc://{address}")
    try:
        headers = [] if token is None else [(TOKEN_HEADER.encode(), token.encode())]
        list(client.list_actions(flight.FlightCallOptions(headers=headers, timeout=10.0)))
    finally:
        client.close()


def test_the_owner_is_served_and_a_client_without_the_token_is_refused(embedded: str) -> None:
    address = ensure_broker(embedded)
    mode = stat.S_IMODE(os.stat(token_file(embedded)).st_mode)
    assert mode == 0o600, oct(mode)
    with BrokerClient(address) as client:  # this process: registered by ensure_broker
        assert client.refresh_metadata().brokers
    started = time.monotonic()
    with pytest.raises(flight.FlightUnauthenticatedError) as refused:
        _raw_call(address, None)
    assert time.monotonic() - started < REFUSAL_S
    assert "58 SASL_AUTHENTICATION_FAILED: this broker serves its owner only" in str(refused.value)
    assert token_file(embedded) in str(refused.value)


def test_another_local_user_cannot_read_the_token_and_without_it_is_refused(
    embedded: str, tmp_path: Path
) -> None:
    address = ensure_broker(embedded)
    nobody = pwd.getpwnam(OTHER_USER)
    assert os.getuid() != nobody.pw_uid
    # The other user, for real: it cannot read the file (the scenario of the refusal).
    run = subprocess.run(
        ["/bin/cat", token_file(embedded)],
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode != 0 and "Permission denied" in run.stderr, run
    # A client in its position: the file it registers for the address gives it nothing
    # (register() is what every client of an embedded broker runs; see the module doc).
    register(address, str(tmp_path / "unreadable.token"))
    try:
        with (
            BrokerClient(address, retries=3, timeout_s=10.0) as client,
            pytest.raises(SaslAuthenticationFailedError) as refused,
        ):
            client.refresh_metadata()
        assert not refused.value.retriable
        assert "this broker serves its owner only" in refused.value.message
        assert token_file(embedded) in refused.value.message
    finally:
        register(address, token_file(embedded))
    with BrokerClient(address) as client:  # the owner still is served
        assert client.refresh_metadata().brokers


def test_a_restart_rewrites_the_token_and_the_old_one_is_refused(embedded: str) -> None:
    address = ensure_broker(embedded)
    old = Path(token_file(embedded)).read_text()
    _raw_call(address, old)  # served
    with BrokerClient(address, timeout_s=10.0) as client:
        assert client.refresh_metadata().brokers
        # A crash: the next ensure_broker starts a broker on the same port.
        pid = broker_pid(embedded)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: broker_pid(embedded) is None, timeout=10.0, what="the broker gone")
        assert ensure_broker(embedded) == address
        new = Path(token_file(embedded)).read_text()
        assert new != old and len(new) == 64
        assert stat.S_IMODE(os.stat(token_file(embedded)).st_mode) == 0o600
        with pytest.raises(flight.FlightUnauthenticatedError, match="not this broker's"):
            _raw_call(address, old)
        _raw_call(address, new)
        # A client of before the restart reads the new token at its next call.
        assert client.refresh_metadata().brokers


def test_a_typed_refusal_reaches_a_client_that_has_no_token(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    token = tmp_path / "broker.token"
    broker = broker_factory({**TEST_BROKER_CONFIG, "listener.token.file": str(token)}, name="token")
    broker.wait_for_log("calls must carry the token of")
    with (
        BrokerClient(broker.address, retries=3, timeout_s=10.0) as client,
        pytest.raises(SaslAuthenticationFailedError, match="serves its owner only") as refused,
    ):
        client.refresh_metadata()
    assert not refused.value.retriable


def test_a_token_file_on_a_listener_reachable_from_other_machines_refuses_the_start(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    token = tmp_path / "broker.token"
    broker = broker_factory(
        {
            **TEST_BROKER_CONFIG,
            "listener.token.file": str(token),
            "listener.host": "0.0.0.0",
            "listener.advertised.host": "127.0.0.1",
        },
        name="exposed",
        start=False,
    )
    broker.spawn()
    assert broker.wait_exit() == 2
    assert "listener.token.file" in broker.log_text()
    assert "needs a loopback listener.host (127.0.0.1), not listener.host=0.0.0.0" in (
        broker.log_text()
    )
    assert not token.exists()


@pytest.mark.parametrize(
    ("security", "fix"),
    [
        ({}, "set security.protocol=SSL"),
        ({"security.protocol": "SSL"}, "set ssl.client.auth=required, or"),
        ({"security.protocol": "SSL", "ssl.client.auth": "required"}, None),
    ],
)
def test_a_listener_reachable_from_other_machines_without_tls_or_authentication_warns_once(
    broker_factory: BrokerFactory,
    tls_certs: TlsCerts,
    security: dict[str, str],
    fix: str | None,
) -> None:
    keys = {**tls_certs.broker_keys(), **security} if security else {}
    broker = broker_factory(
        {
            **TEST_BROKER_CONFIG,
            **keys,
            "listener.host": "0.0.0.0",
            "listener.advertised.host": "127.0.0.1",
        },
        name="exposed",
    )
    broker.wait_for_log("is running")
    warnings = [
        line for line in broker.log_text().splitlines() if "reachable from other machines" in line
    ]
    if fix is None:  # mutual TLS: encrypted and authenticated
        assert warnings == []
        return
    assert len(warnings) == 1, warnings
    assert " WARNING " in warnings[0] and "listener.host=0.0.0.0" in warnings[0]
    assert fix in warnings[0] and "(docs/security.md)" in warnings[0]


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``idemlog`` in a process of its own whose home is ``home`` (so its default embedded
    directory is ``home/.idemlog/embedded``)."""
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": os.getcwd()}
    return subprocess.run(
        [sys.executable, "-m", "broker_core.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_finds_the_default_embedded_brokers_token(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = str(home / ".idemlog" / "embedded")
    address = ensure_broker(path)
    try:
        served = _cli(home, "topics", "describe", "--bootstrap", address, "--json")
        assert served.returncode == 0, served.stderr
        # Another home: no state file naming the address, so no token is sent.
        refused = _cli(tmp_path / "elsewhere", "topics", "describe", "--bootstrap", address)
        assert refused.returncode != 0
        assert "SASL_AUTHENTICATION_FAILED" in refused.stderr, refused.stderr
        assert "this broker serves its owner only" in refused.stderr
    finally:
        stop_broker(path)
