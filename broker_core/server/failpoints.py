"""The broker's test hooks: failure injection at named points, only when started for it.

A broker started with ``test.hooks.enable=true`` reads ``IDEMLOG_TEST_FAILPOINT`` once, at
start, and arms the point it names. Without that key (the default) the variable is
ignored, whatever its value, and logged once as a warning naming it: an inherited
environment alone never switches a hook on (docs/security.md, Test hooks), and a fault
test that forgot the key fails loudly instead of passing without its fault.

Points (each read by one product call, through a :class:`BrokerFailpoints` passed in):

* ``after_prepare`` / ``after_first_marker``: the marker writer SIGKILLs the broker before
  its first marker, or after the first partition's (``server.coordination.marker_client``);
* ``withhold_replica_fetch``: the leader answers its followers' fetches with no batches
  (``server.replication.replica_manager``), so they fall behind and its tail diverges;
* ``unverified_txn_produce``: the leader appends a transactional batch of a stream that
  names no transactional id unverified, as a broker before issue 36 did
  (``server.requests.flight_server``): how the tests of the hanging-transaction tools make the
  data those tools are for (written before the coordinator verified every transaction).

State: one armed point name per process, fixed at start.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping

from broker_core.errors import InvalidConfigError

log = logging.getLogger("idemlog.failpoints")

ENV = "IDEMLOG_TEST_FAILPOINT"
ENABLE_KEY = "test.hooks.enable"
AFTER_PREPARE = "after_prepare"
AFTER_FIRST_MARKER = "after_first_marker"
WITHHOLD_REPLICA_FETCH = "withhold_replica_fetch"
UNVERIFIED_TXN_PRODUCE = "unverified_txn_produce"
POINTS = (AFTER_PREPARE, AFTER_FIRST_MARKER, WITHHOLD_REPLICA_FETCH, UNVERIFIED_TXN_PRODUCE)


class BrokerFailpoints:
    """The one point armed in this broker (``armed`` None: none)."""

    def __init__(self, armed: str | None = None) -> None:
        self.armed = armed

    def is_armed(self, point: str) -> bool:
        """True when ``point`` is the armed one (never without ``test.hooks.enable``)."""
        return self.armed is not None and self.armed == point

    def kill_at(self, point: str) -> None:
        """SIGKILL this process if ``point`` is armed; returns otherwise."""
        if self.is_armed(point):
            log.warning("test failpoint %s: killing this broker (SIGKILL)", point)
            os.kill(os.getpid(), signal.SIGKILL)


NO_FAILPOINTS = BrokerFailpoints()
"""Nothing armed: what every broker not started for the fault tests gets."""


def from_start(enabled: bool, environ: Mapping[str, str] = os.environ) -> BrokerFailpoints:
    """The failpoints of a broker starting now.

    Enabled (``test.hooks.enable=true``): the point named by ``IDEMLOG_TEST_FAILPOINT``,
    if set. Raises ``InvalidConfigError`` naming the variable for a point that does not exist (a
    typo would otherwise be a fault test without its fault). Not enabled: none, and one
    warning if the variable is set.
    """
    value = environ.get(ENV, "").strip()
    if not value:
        return NO_FAILPOINTS
    if not enabled:
        log.warning(
            "%s=%s is set but ignored: this broker was not started with %s=true "
            "(test hooks are for the fault tests only, docs/security.md)",
            ENV,
            value,
            ENABLE_KEY,
        )
        return NO_FAILPOINTS
    if value not in POINTS:
        raise InvalidConfigError(f"{ENV}={value!r} is not one of {', '.join(POINTS)}")
    log.warning("test hooks enabled (%s=true): failpoint %s armed", ENABLE_KEY, value)
    return BrokerFailpoints(value)
