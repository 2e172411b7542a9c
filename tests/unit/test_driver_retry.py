"""The driver's retries of its plan, commit and abort (``spark_sink.driver_retry``):
retriable errors only, for ``driver.retry.timeout.ms`` from the first failure, then one
line naming the option."""

from __future__ import annotations

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import InvalidTxnStateError, NetworkError, NotLeaderOrFollowerError
from spark_sink.driver_retry import retrying
from spark_sink.errors import DriverRetriesSpentError
from spark_sink.options import IdemlogOptions, Scope, parse_options

# Nothing listens on port 1: a connection to it is refused at once.
NOWHERE = "127.0.0.1:1"


def options(bound_ms: int) -> IdemlogOptions:
    return parse_options(
        {"topic": "t", "brokers": NOWHERE, "driver.retry.timeout.ms": str(bound_ms)}, Scope.WRITE
    )


def test_retriable_errors_are_retried_until_the_call_succeeds() -> None:
    errors = [NetworkError("refused"), NotLeaderOrFollowerError("broker 0 is shutting down")]
    calls = []

    def call(client: BrokerClient) -> str:
        calls.append(client)
        if errors:
            raise errors.pop(0)
        return "committed"

    assert retrying(options(10_000), "commit of batch 1", call, request_timeout_s=1) == "committed"
    assert len(calls) == 3 and len(set(map(id, calls))) == 3  # a fresh client each time


def test_a_fencing_or_invalid_state_answer_is_raised_at_once() -> None:
    calls = []

    def call(client: BrokerClient) -> None:
        calls.append(1)
        raise InvalidTxnStateError("transactional id 's/0' is PREPARE_ABORT")

    with pytest.raises(InvalidTxnStateError):
        retrying(options(10_000), "commit of batch 1", call, request_timeout_s=1)
    assert calls == [1]


def test_past_the_bound_one_line_names_the_option_and_the_last_error() -> None:
    calls = []

    def call(client: BrokerClient) -> None:
        calls.append(1)
        raise NotLeaderOrFollowerError("broker 0 is shutting down")

    with pytest.raises(DriverRetriesSpentError) as info:
        retrying(options(300), "commit of batch 7", call, request_timeout_s=1)
    line = str(info.value)
    assert line.startswith("REQUEST_TIMED_OUT (7): commit of batch 7: ")
    assert "driver.retry.timeout.ms=300 ms" in line
    assert line.endswith("NOT_LEADER_OR_FOLLOWER (6): broker 0 is shutting down")
    assert "\n" not in line and len(calls) >= 2
    assert isinstance(info.value.__cause__, NotLeaderOrFollowerError)


def test_unreachable_brokers_are_named_by_their_option() -> None:
    with pytest.raises(DriverRetriesSpentError) as info:
        retrying(options(100), "plan", lambda c: c.metadata(True), request_timeout_s=1)
    assert f"(option 'brokers'={NOWHERE!r})" in str(info.value)
    assert "no broker reachable" in str(info.value)
