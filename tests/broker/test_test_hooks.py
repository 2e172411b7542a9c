"""Test hooks are not an attack surface (docs/security.md, Test hooks): a broker process
asks the hooks its own ``test.hooks.class`` names, built at start, and no others; an
inherited ``IDEMLOG_TEST_FAILPOINT`` alone arms nothing; a class that cannot be loaded
refuses the start, naming the key."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import InvalidConfigError, NetworkError
from broker_core.server.hooks import HOOKS_CLASS_KEY, NO_HOOKS, load_hooks
from testkit.broker_failpoints import (
    AFTER_FIRST_MARKER,
    AFTER_PREPARE,
    ENV,
    HOOKS_CLASS,
    POINTS,
    UNVERIFIED_TXN_PRODUCE,
    WITHHOLD_REPLICA_FETCH,
    BrokerFailpoints,
)
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
    assert "test hooks on" not in broker.log_text()


def test_with_the_opt_in_the_same_failpoint_fires(
    broker_factory: BrokerFactory, client_for: ClientFor
) -> None:
    broker = broker_factory({**TEST_BROKER_CONFIG, **TEST_HOOKS}, env={ENV: "after_prepare"})
    client = client_for(broker, retries=0)
    client.create_topic("ledger", 1)
    with pytest.raises(NetworkError):
        _commit_one(client)
    assert broker.wait_exit(30) == -9  # the failpoint's SIGKILL
    log = broker.log_text()
    assert f"test hooks on ({HOOKS_CLASS_KEY}={HOOKS_CLASS}): never in production" in log
    assert "test failpoint after_prepare: killing this broker" in log
    assert IGNORED not in log


def test_a_hooks_class_that_cannot_be_loaded_refuses_the_start_naming_the_key(
    broker_factory: BrokerFactory,
) -> None:
    bad = "testkit.no_such_hooks:BrokerFailpoints"
    broker = broker_factory({**TEST_BROKER_CONFIG, HOOKS_CLASS_KEY: bad}, start=False)
    broker.spawn()
    assert broker.wait_exit() == 2
    log = broker.log_text()
    # A configuration error: one line naming the key and its value, no traceback.
    errors = [line for line in log.splitlines() if line.startswith("idemlog:")]
    assert len(errors) == 1, log
    assert errors[0].startswith(f"idemlog: {HOOKS_CLASS_KEY}={bad!r}: cannot import "), log
    assert "Traceback" not in log


def test_without_a_class_the_product_answers_and_an_inherited_variable_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert load_hooks("", {}) is NO_HOOKS
    with caplog.at_level("WARNING", logger="idemlog.test_hooks"):
        off = load_hooks("  ", {ENV: WITHHOLD_REPLICA_FETCH})
    assert off is NO_HOOKS
    assert [r.getMessage() for r in caplog.records] == [
        f"{ENV}={WITHHOLD_REPLICA_FETCH} is set but ignored: this broker was not started with "
        f"{HOOKS_CLASS_KEY} (test hooks are for the fault tests only, docs/security.md)"
    ]
    # The product's answers: nothing withheld, nothing appended unverified, no split.
    NO_HOOKS.before_markers()
    NO_HOOKS.after_first_marker()
    assert not NO_HOOKS.first_marker_alone()
    assert not NO_HOOKS.withhold_replica_fetch()
    assert not NO_HOOKS.append_unverified()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("testkit.broker_failpoints", "is not module:Class"),
        (":BrokerFailpoints", "is not module:Class"),
        ("testkit.no_such_hooks:Hooks", "cannot import testkit.no_such_hooks"),
        ("testkit.broker_failpoints:Nope", "Nope in testkit.broker_failpoints is not a subclass"),
        ("testkit.broker_failpoints:POINTS", "POINTS in testkit.broker_failpoints is not a"),
        ("collections:OrderedDict", "OrderedDict in collections is not a subclass"),
    ],
)
def test_a_class_that_is_not_broker_hooks_is_refused_naming_the_key(
    value: str, message: str
) -> None:
    with pytest.raises(InvalidConfigError) as info:
        load_hooks(value, {})
    assert info.value.message.startswith(f"{HOOKS_CLASS_KEY}={value!r}"), info.value.message
    assert message in info.value.message
    assert info.value.code == 40


def test_the_testkit_failpoints_arm_the_named_point_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV, WITHHOLD_REPLICA_FETCH)
    hooks = load_hooks(HOOKS_CLASS, {})
    assert isinstance(hooks, BrokerFailpoints) and hooks.armed == WITHHOLD_REPLICA_FETCH
    assert hooks.withhold_replica_fetch()
    assert not hooks.append_unverified() and not hooks.first_marker_alone()
    hooks.before_markers()  # after_prepare is not armed: returns
    answers = {
        point: (
            BrokerFailpoints({ENV: point}).first_marker_alone(),
            BrokerFailpoints({ENV: point}).withhold_replica_fetch(),
            BrokerFailpoints({ENV: point}).append_unverified(),
        )
        for point in POINTS
    }
    assert answers == {
        AFTER_PREPARE: (False, False, False),
        AFTER_FIRST_MARKER: (True, False, False),
        WITHHOLD_REPLICA_FETCH: (False, True, False),
        UNVERIFIED_TXN_PRODUCE: (False, False, True),
    }
    assert BrokerFailpoints({}).armed is None
    with pytest.raises(InvalidConfigError, match=f"{ENV}='after_prepar' is not one of"):
        BrokerFailpoints({ENV: "after_prepar"})
