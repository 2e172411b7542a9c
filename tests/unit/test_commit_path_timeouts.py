"""The commit path's timeouts (docs/failure-model.md, "Timeouts on the commit path"): the
defaults wait each for the one beneath it, and a broker configuration that contradicts
that is refused at start with both keys and their values named."""

from __future__ import annotations

import pytest

from broker_core.errors import InvalidConfigError
from broker_core.server.config.broker_config import BrokerConfig
from broker_core.server.config.timeouts import ack_timeout_ms, marker_call_timeout_ms
from broker_core.server.replication.replica_fetcher import FetcherConfig
from broker_core.server.replication.replica_manager import ReplicationConfig
from spark_sink import commit


def test_the_defaults_each_outlast_the_timeout_beneath() -> None:
    config = BrokerConfig.from_mapping({})
    lag = config.replica_lag_time_max_ms
    assert config.replica_fetch_wait_max_ms < lag  # a long poll is not lag
    # A stuck follower leaves the ISR after lag (+ a 1 s check and a ZooKeeper write) ...
    assert ack_timeout_ms(lag) >= lag + 5_000  # ... before an acks=all wait ends,
    assert marker_call_timeout_ms(lag) > ack_timeout_ms(lag)  # which a marker call outlasts,
    deadline = config.transaction_marker_retry_deadline_ms
    assert deadline > marker_call_timeout_ms(lag)  # and the marker retries outlast that,
    assert deadline > config.zookeeper_session_timeout_ms  # and a lost leader's replacement;
    worst_commit_s = (deadline + marker_call_timeout_ms(lag)) / 1000.0
    assert worst_commit_s < commit._REQUEST_TIMEOUT_S  # the driver outlasts the coordinator
    # The values the broker's parts use are these.
    assert config.marker_call_timeout_s == marker_call_timeout_ms(lag) / 1000.0 == 70.0
    replication = ReplicationConfig(lag, FetcherConfig(1024, 500, 0.2))
    assert replication.ack_timeout_s == config.ack_timeout_s == 65.0


@pytest.mark.parametrize(
    ("values", "named"),
    [
        (  # markers held up by a stuck follower would be given up before it is dropped
            {"replica.lag.time.max.ms": 50_000},
            ["transaction.marker.retry.deadline.ms=90000", "replica.lag.time.max.ms=50000"],
        ),
        (
            {"replica.lag.time.max.ms": 10_000, "transaction.marker.retry.deadline.ms": 30_000},
            ["transaction.marker.retry.deadline.ms=30000", "replica.lag.time.max.ms=10000"],
        ),
        (  # a leader lost mid-commit is replaced only after its session expired
            {"zookeeper.session.timeout.ms": 90_000},
            ["transaction.marker.retry.deadline.ms=90000", "zookeeper.session.timeout.ms=90000"],
        ),
        (  # a follower's long poll would count as lag
            {"replica.fetch.wait.max.ms": 30_000},
            ["replica.fetch.wait.max.ms=30000", "replica.lag.time.max.ms=30000"],
        ),
    ],
)
def test_contradicting_timeouts_are_refused_naming_both_keys(
    values: dict[str, object], named: list[str]
) -> None:
    with pytest.raises(InvalidConfigError) as raised:
        BrokerConfig.from_mapping(values)
    for text in named:
        assert text in raised.value.message


def test_raising_both_keys_together_is_accepted() -> None:
    config = BrokerConfig.from_mapping(
        {
            "replica.lag.time.max.ms": 50_000,
            "zookeeper.session.timeout.ms": 60_000,
            "transaction.marker.retry.deadline.ms": 120_000,
        }
    )
    assert config.marker_call_timeout_s == 110.0
    assert config.transaction_marker_retry_deadline_ms == 120_000
