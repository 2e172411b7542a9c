"""The driver's calls to the brokers while it plans, commits or aborts a batch (a stream
read's next offsets too), retried through a broker restart or a leader or coordinator
change for as long as the option ``driver.retry.timeout.ms`` allows (docs/spark.md, "A
broker restart").

Only errors whose own ``retriable`` flag is set are retried (``broker_core.retry``): a
broker that is down or shutting down (NETWORK_EXCEPTION, NOT_LEADER_OR_FOLLOWER), a
coordinator that moved or is loading, a request that timed out. A fencing or
invalid-state answer (PRODUCER_FENCED, INVALID_TXN_STATE, ...) is raised at once: asking
again would get the same answer. Every call retried here must be idempotent, so that an
attempt whose answer was lost may be made again: the topic's lookup and creation (a
topic created by the lost attempt is found, ``TOPIC_ALREADY_EXISTS`` is taken as found),
``commit_sink_batch`` (a batch committed by the lost attempt answers "committed before",
and the transactions it names are already committed, so nothing is aborted),
``abort_sink_run`` (fencing twice fences nothing more) and a read's offsets (they only
look).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from broker_core.client.broker_client import BrokerClient, NoBrokerReachableError
from broker_core.retry import RetryPolicy
from spark_sink.connections import sink_client
from spark_sink.errors import DriverRetriesSpentError
from spark_sink.options import DRIVER_RETRY_OPTION, IdemlogOptions

log = logging.getLogger("idemlog.sink")

T = TypeVar("T")
# Each request of a plan (a topic's description or creation, a read's offsets):
# BrokerClient's default.
PLAN_REQUEST_TIMEOUT_S = 30.0
# In each log line of a retried call: the tests count them (tests/spark/test_broker_restart.py).
RETRY_MARK = f"retrying within {DRIVER_RETRY_OPTION}"


def retrying(
    options: IdemlogOptions,
    what: str,
    call: Callable[[BrokerClient], T],
    *,
    request_timeout_s: float,
) -> T:
    """``call`` on a fresh client until it succeeds, fails for good, or has failed
    retriably for ``options.driver_retry_timeout_ms`` since its first failure; then
    :class:`DriverRetriesSpentError`, one line naming the option, chained to the last
    error. ``request_timeout_s`` bounds each attempt's requests (a commit's is longer
    than the coordinator's worst case, so a commit still being completed is waited
    for, not retried). ``what`` names the call in the log and the error."""

    def attempt() -> T:
        # A new client each time (on the process's shared connections): the broker may be
        # a new process, on a new address for the embedded one (options.bootstrap()
        # restarts it when it is gone).
        with sink_client(
            options.bootstrap(), options.tls, sasl=options.sasl, timeout_s=request_timeout_s
        ) as client:
            return call(client)

    started = time.monotonic()

    def log_retry(exc: BaseException, attempts: int) -> None:
        log.warning(
            "%s: attempt %d failed %.1f s after the first began (%s); %s",
            what,
            attempts,
            time.monotonic() - started,
            exc,
            RETRY_MARK,
        )

    def give_up(exc: BaseException, attempts: int) -> BaseException:
        where = (
            f" (option 'brokers'={options.brokers!r})"
            if isinstance(exc, NoBrokerReachableError) and options.brokers
            else ""
        )
        return DriverRetriesSpentError(
            f"{what}: the brokers{where} failed {attempts} attempts retriably for "
            f"{DRIVER_RETRY_OPTION}={options.driver_retry_timeout_ms} ms (raise the option "
            f"to ride out a longer broker restart); last error: {exc}"
        )

    policy = RetryPolicy(
        deadline_s=options.driver_retry_timeout_ms / 1000.0,
        backoff_s=0.1,
        max_backoff_s=2.0,
        jitter=0.0,
        from_first_failure=True,
    )
    return policy.call(attempt, before_retry=log_retry, give_up=give_up)
