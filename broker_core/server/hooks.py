"""The broker's test hooks: the decisions a fault test may take over, asked through one
object handed to the parts that ask them. The product's own answers are :data:`NO_HOOKS`.

A broker gets other hooks only from its own configuration: ``test.hooks.class`` names a
:class:`BrokerHooks` subclass (``module:Class``), imported and built once, at start. The
implementations that inject faults (``testkit.broker_failpoints``: SIGKILL the broker,
withhold a fetch answer) live outside the shipped packages, so an installed wheel cannot
load them, and nothing here can kill or stall its own process.

An inherited ``IDEMLOG_TEST_FAILPOINT`` (the variable the testkit's hooks read) with no
``test.hooks.class`` arms nothing: it is logged once as a warning naming it, so a fault
test that forgot the key fails loudly instead of passing without its fault
(docs/security.md, Test hooks).

The decisions (each asked by one product call):

* ``before_markers`` / ``first_marker_alone`` + ``after_first_marker``: the marker
  writer (``server.coordination.marker_client``) once the end of a transaction is
  durable, before any marker, and whether it writes the first partition's marker alone,
  then the rest;
* ``withhold_replica_fetch``: the leader answers its followers' fetches with no batches
  (``server.replication.replica_manager``);
* ``append_unverified``: the leader appends a transactional batch of a stream that names
  no transactional id unverified, as a broker before issue 36 did
  (``server.requests.flight_server``).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping

from broker_core.errors import InvalidConfigError

log = logging.getLogger("idemlog.test_hooks")

HOOKS_CLASS_KEY = "test.hooks.class"
FAILPOINT_ENV = "IDEMLOG_TEST_FAILPOINT"


class BrokerHooks:
    """The product's answers: nothing injected. A fault test's hooks subclass it and
    override the decisions they take over; the broker calls them from request and
    coordinator threads, so an override must be thread-safe."""

    def before_markers(self) -> None:
        """A transaction's end is durable (PREPARE_COMMIT/ABORT), no marker written yet."""

    def first_marker_alone(self) -> bool:
        """Whether the marker writer writes the first partition's marker alone and calls
        :meth:`after_first_marker` before the others (the product: all leaders at once)."""
        return False

    def after_first_marker(self) -> None:
        """The first partition's marker is written, the others not yet (only when
        :meth:`first_marker_alone` said so)."""

    def withhold_replica_fetch(self) -> bool:
        """Whether the leader answers a follower's fetch with no batches."""
        return False

    def append_unverified(self) -> bool:
        """Whether the leader appends a transactional batch of a stream that names no
        transactional id, unverified (the product refuses it: INVALID_REQUEST)."""
        return False


NO_HOOKS = BrokerHooks()
"""The product's answers: what every broker without ``test.hooks.class`` gets."""


def load_hooks(class_name: str, environ: Mapping[str, str] = os.environ) -> BrokerHooks:
    """The hooks of a broker starting now: an instance of ``class_name`` (``module:Class``,
    the value of ``test.hooks.class``), or :data:`NO_HOOKS` for an empty one, with a
    warning if ``IDEMLOG_TEST_FAILPOINT`` is set. Raises ``InvalidConfigError`` naming the
    key and value when the class cannot be imported or is not a :class:`BrokerHooks`, and
    what its constructor raises (a hook refusing its own settings)."""
    name = class_name.strip()
    if not name:
        value = environ.get(FAILPOINT_ENV, "").strip()
        if value:
            log.warning(
                "%s=%s is set but ignored: this broker was not started with %s "
                "(test hooks are for the fault tests only, docs/security.md)",
                FAILPOINT_ENV,
                value,
                HOOKS_CLASS_KEY,
            )
        return NO_HOOKS
    module_name, _, attribute = name.partition(":")
    if not module_name or not attribute:
        raise InvalidConfigError(
            f"{HOOKS_CLASS_KEY}={class_name!r} is not module:Class "
            "(e.g. testkit.broker_failpoints:BrokerFailpoints)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        # The testkit is not in the wheel: an installed broker cannot load its hooks.
        raise InvalidConfigError(
            f"{HOOKS_CLASS_KEY}={class_name!r}: cannot import {module_name} ({exc}); test "
            "hooks exist only in a checkout, for the fault tests"
        ) from exc
    hooks_class = getattr(module, attribute, None)
    if not (isinstance(hooks_class, type) and issubclass(hooks_class, BrokerHooks)):
        raise InvalidConfigError(
            f"{HOOKS_CLASS_KEY}={class_name!r}: {attribute} in {module_name} is not a "
            "subclass of broker_core.server.hooks.BrokerHooks"
        )
    try:
        hooks = hooks_class()
    except TypeError as exc:
        raise InvalidConfigError(
            f"{HOOKS_CLASS_KEY}={class_name!r}: {attribute} cannot be built without "
            f"arguments ({exc})"
        ) from exc
    log.warning("test hooks on (%s=%s): never in production", HOOKS_CLASS_KEY, name)
    return hooks
