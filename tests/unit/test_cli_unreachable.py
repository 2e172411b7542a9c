"""The unreachable-broker line of ``idemlog`` (``cli/failures.py``): the addresses and the
cause once, whatever the transport said; the real command against a dead address is in
``tests/broker/test_cli_errors.py``."""

from __future__ import annotations

import pickle

import pytest

from broker_core.cli.failures import ExitCode, classify, connection_cause
from broker_core.client.broker_client import NoBrokerReachableError
from broker_core.errors import NetworkError


@pytest.mark.parametrize(
    ("transport", "cause"),
    [
        ("ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused",
         "connection refused"),
        ("Deadline Exceeded", "timed out"),
        ("errors resolving x:9: address lookup failed for x:9: Domain name not found",
         "host name not found"),
        ("connect: No route to host", "no route to host"),
        ("Received http2 header with status: 404", "no answer"),
    ],
)  # fmt: skip
def test_the_cause_is_a_few_words(transport: str, cause: str) -> None:
    assert connection_cause(f"action metadata to x:9 failed: {transport}") == cause


def test_the_line_names_each_address_and_the_cause_once() -> None:
    exc = NoBrokerReachableError(
        ("h1:9092", "h2:9092"),
        "NETWORK_EXCEPTION (13): action metadata to h2:9092 failed: ... Connection refused",
    )
    line, code = classify(exc)
    assert code is ExitCode.UNREACHABLE
    assert line == (
        "cannot reach a broker at h1:9092, h2:9092 (connection refused); "
        "check that it runs and the address is right"
    )
    # Still a retriable NetworkError for library callers, and it survives pickling.
    assert isinstance(exc, NetworkError) and exc.retriable
    again = pickle.loads(pickle.dumps(exc))
    assert (again.addresses, again.cause, str(again)) == (exc.addresses, exc.cause, str(exc))
