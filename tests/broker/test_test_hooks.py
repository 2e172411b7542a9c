"""Test hooks are not an attack surface (docs/security.md, Test hooks): a broker process
arms ``IDEMLOG_TEST_FAILPOINT`` only when it was started with ``test.hooks.enable=true``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import InvalidConfigError, NetworkError
from broker_core.server.failpoints import ENABLE_KEY, ENV, NO_FAILPOINTS, from_start
from tests.broker.helpers import TEST_BROKER_CONFIG, ids, rows
from tests.harness.broker import TEST_HOOKS, BrokerFactory

ClientFor = Callable[..., BrokerClient]
IGNORED = f"{ENV}=after_prepare is set but ignored"


def _commit_one(client: BrokerClient) -> None:
    """A transaction over one partition, committed: the path ``after_prepare`` kills on."""
    pid, epoch = client.init_producer_id("txn-hooks")
    client.add_partitions_to_txn("txn-hooks", pid, epoch, [("ledger", 0)])
    with client.produce_stream("ledger", 0, transactional_id="txn-hooks") as stream:
        stream.send(
            rows(5), producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True
        ).offsets(10)
    client.end_txn("txn-hooks", pid, epoch, commit=True)


def test_an_inherited_failpoint_without_the_opt_in_is_ignored_and_logged_once(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    broker = broker_factory(TEST_BROKER_CONFIG, env={ENV: "after_prepare"})
    client = client_for(broker, retries=0)
    client.create_topic("ledger", 1)
    _commit_one(client)  # the armed point would have SIGKILLed the broker here
    assert broker.running
    assert ids(client, "ledger", 0) == list(range(5))
    assert broker.log_text().count(IGNORED) == 1, broker.log_tail()
    assert "test failpoint" not in broker.log_text()


def test_with_the_opt_in_the_same_failpoint_fires(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    broker = broker_factory({**TEST_BROKER_CONFIG, **TEST_HOOKS}, env={ENV: "after_prepare"})
    client = client_for(broker, retries=0)
    client.create_topic("ledger", 1)
    with pytest.raises(NetworkError):
        _commit_one(client)
    assert broker.wait_exit(30) == -9  # the failpoint's SIGKILL
    assert "test failpoint after_prepare: killing this broker" in broker.log_text()
    assert IGNORED not in broker.log_text()


def test_the_gate_arms_nothing_without_the_opt_in_and_refuses_an_unknown_point(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert from_start(False, {}) is NO_FAILPOINTS
    assert from_start(True, {}) is NO_FAILPOINTS
    with caplog.at_level("WARNING", logger="idemlog.failpoints"):
        off = from_start(False, {ENV: "withhold_replica_fetch"})
    assert off is NO_FAILPOINTS and not off.is_armed("withhold_replica_fetch")
    assert [r.getMessage() for r in caplog.records] == [
        f"{ENV}=withhold_replica_fetch is set but ignored: this broker was not started with "
        f"{ENABLE_KEY}=true (test hooks are for the fault tests only, docs/security.md)"
    ]
    on = from_start(True, {ENV: "withhold_replica_fetch"})
    assert on.is_armed("withhold_replica_fetch") and not on.is_armed("after_prepare")
    with pytest.raises(InvalidConfigError, match=f"{ENV}='after_prepar' is not one of"):
        from_start(True, {ENV: "after_prepar"})
