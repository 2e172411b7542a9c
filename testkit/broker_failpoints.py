"""The broker's failpoints: the fault tests' :class:`~broker_core.server.hooks.BrokerHooks`,
never shipped (the wheel holds ``broker_core`` and ``spark_sink`` only).

A broker started with ``test.hooks.class=`` :data:`HOOKS_CLASS` builds one
:class:`BrokerFailpoints` at start, which reads ``IDEMLOG_TEST_FAILPOINT`` then and arms
the point it names (none when unset):

* ``after_prepare`` / ``after_first_marker``: SIGKILL the broker before its first marker,
  or after the first partition's (the marker writer asks ``before_markers``,
  ``first_marker_alone`` and ``after_first_marker``);
* ``withhold_replica_fetch``: the leader answers its followers' fetches with no batches,
  so they fall behind and its tail diverges;
* ``unverified_txn_produce``: the leader appends a transactional batch of a stream that
  names no transactional id unverified, as a broker before issue 36 did: how the tests of
  the hanging-transaction tools make the data those tools are for.

State: one armed point per process, fixed at start.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping

from broker_core.errors import InvalidConfigError
from broker_core.server.hooks import FAILPOINT_ENV, HOOKS_CLASS_KEY, BrokerHooks

log = logging.getLogger("idemlog.failpoints")

ENV = FAILPOINT_ENV
AFTER_PREPARE = "after_prepare"
AFTER_FIRST_MARKER = "after_first_marker"
WITHHOLD_REPLICA_FETCH = "withhold_replica_fetch"
UNVERIFIED_TXN_PRODUCE = "unverified_txn_produce"
POINTS = (AFTER_PREPARE, AFTER_FIRST_MARKER, WITHHOLD_REPLICA_FETCH, UNVERIFIED_TXN_PRODUCE)

HOOKS_CLASS = "testkit.broker_failpoints:BrokerFailpoints"
"""The value of ``test.hooks.class`` that gives a broker these hooks."""


class BrokerFailpoints(BrokerHooks):
    """The point ``IDEMLOG_TEST_FAILPOINT`` names in ``environ`` (the process's own by
    default), armed; ``armed`` None: none. Raises ``InvalidConfigError`` naming the
    variable for a point that does not exist (a typo would otherwise be a fault test
    without its fault)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        value = (os.environ if environ is None else environ).get(ENV, "").strip()
        if value and value not in POINTS:
            raise InvalidConfigError(f"{ENV}={value!r} is not one of {', '.join(POINTS)}")
        self.armed = value or None
        if self.armed is not None:
            log.warning("test hooks on (%s): failpoint %s armed", HOOKS_CLASS_KEY, value)

    def before_markers(self) -> None:
        self._kill_at(AFTER_PREPARE)

    def first_marker_alone(self) -> bool:
        return self.armed == AFTER_FIRST_MARKER

    def after_first_marker(self) -> None:
        self._kill_at(AFTER_FIRST_MARKER)

    def withhold_replica_fetch(self) -> bool:
        return self.armed == WITHHOLD_REPLICA_FETCH

    def append_unverified(self) -> bool:
        return self.armed == UNVERIFIED_TXN_PRODUCE

    def _kill_at(self, point: str) -> None:
        """SIGKILL this process if ``point`` is armed; returns otherwise."""
        if self.armed == point:
            log.warning("test failpoint %s: killing this broker (SIGKILL)", point)
            os.kill(os.getpid(), signal.SIGKILL)
