"""The commit path's timeouts and the checks that they do not contradict each other
(docs/failure-model.md, "Timeouts on the commit path"): derived from the broker's keys,
declared in ``server.config.broker_config``."""

from __future__ import annotations

from collections.abc import Mapping

from broker_core.config import ConfigValue
from broker_core.errors import InvalidConfigError

# The commit path's timeouts, each longer than the one it waits for (docs/failure-model.md,
# "Timeouts on the commit path"). The margins cover an ISR check (at most 1 s), a ZooKeeper
# write and the answer's way back.
ACK_WAIT_MARGIN_MS = 5_000
MARKER_CALL_MARGIN_MS = 5_000


def ack_timeout_ms(replica_lag_time_max_ms: int) -> int:
    """How long an acks=all answer (a marker's too) waits for the in-sync replicas: past a
    stuck follower's removal from the ISR (``replica.lag.time.max.ms`` after it last
    caught up, then an ISR check and a ZooKeeper write), with room to spare."""
    return 2 * replica_lag_time_max_ms + ACK_WAIT_MARGIN_MS


def marker_call_timeout_ms(replica_lag_time_max_ms: int) -> int:
    """A remote ``write_txn_markers`` call's timeout: longer than the acks=all wait at the
    leader it waits for, so a stuck follower makes the call slow, never time out and be
    retried (a retry appends the marker again)."""
    return ack_timeout_ms(replica_lag_time_max_ms) + MARKER_CALL_MARGIN_MS


def check_timeouts(parsed: Mapping[str, ConfigValue]) -> None:
    """Refuse timeouts that contradict each other (InvalidConfigError naming both keys and
    their values): the commit path's (docs/failure-model.md), and a follower's long poll
    that would count as lag."""
    lag = int(parsed["replica.lag.time.max.ms"])
    deadline = int(parsed["transaction.marker.retry.deadline.ms"])
    session = int(parsed["zookeeper.session.timeout.ms"])
    wait = int(parsed["replica.fetch.wait.max.ms"])
    if deadline <= marker_call_timeout_ms(lag):
        raise InvalidConfigError(
            f"transaction.marker.retry.deadline.ms={deadline} must be longer than the marker "
            f"call's timeout, 2 x replica.lag.time.max.ms + 10 s = {marker_call_timeout_ms(lag)} "
            f"ms (replica.lag.time.max.ms={lag}): markers held up by a stuck follower would "
            "be given up before it leaves the ISR"
        )
    if deadline <= session:
        raise InvalidConfigError(
            f"transaction.marker.retry.deadline.ms={deadline} must be longer than "
            f"zookeeper.session.timeout.ms={session}: a leader lost during a commit is "
            "replaced only once its session expired, and its markers must be retried past that"
        )
    if wait >= lag:
        raise InvalidConfigError(
            f"replica.fetch.wait.max.ms={wait} must be shorter than replica.lag.time.max.ms="
            f"{lag}: a follower's long poll would drop it from the ISR"
        )
