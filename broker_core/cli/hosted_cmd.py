"""``idemlog broker list|stop``: the brokers running on this host (``cli.registry``),
those Spark's embedded supervisor started and those started with ``idemlog broker
start``; stopped as the supervisor stops them (SIGTERM, SIGKILL after a timeout)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from broker_core.cli import registry
from broker_core.cli.registry import Liveness, StopOutcome
from broker_core.errors import InvalidConfigError

# As spark_sink.embedded's stop_broker: a clean shutdown gets this long before SIGKILL.
DEFAULT_STOP_TIMEOUT_S = 30.0
JSON_HELP = "print JSON instead of text"


def broker_list(args: argparse.Namespace) -> int:
    """Every broker registered on this host, alive or stale (a stale one is listed once,
    then forgotten); ``--json`` prints the same ``RegisteredBroker`` objects."""
    brokers = registry.list_brokers()
    if args.json:
        print(json.dumps([b.to_json() for b in brokers], indent=2))
        return 0
    if not brokers:
        print(f"no broker registered in {registry.registry_dir()}")
        return 0
    print(
        f"{'pid':>8} {'status':<6} {'address':<22} {'mode':<9} {'started by':<10} "
        f"{'started at':<25} {'metrics':<22} log dir"
    )
    for b in brokers:
        print(
            f"{b.pid:>8} {b.status.value:<6} {b.address:<22} {b.mode:<9} {b.started_by:<10} "
            f"{b.started_at:<25} {b.metrics or '-':<22} {b.log_dir}"
        )
    return 0


def broker_stop(args: argparse.Namespace) -> int:
    """Stop the broker serving ``--log-dir`` (or ``--all`` of them): one line each.
    Raises InvalidConfigError naming ``--log-dir`` when no live broker serves it."""
    if args.timeout_s <= 0:
        raise InvalidConfigError(f"--timeout-s {args.timeout_s}: must be more than 0")
    live = [b for b in registry.list_brokers() if b.status is Liveness.ALIVE]
    if not args.all:
        wanted = str(Path(args.log_dir).absolute())
        live = [b for b in live if b.log_dir == wanted]
        if not live:
            raise InvalidConfigError(
                f"--log-dir {args.log_dir}: no running broker on this host serves it "
                "(see idemlog broker list)"
            )
    if not live:
        print("no running broker on this host")
    for b in live:
        started = time.monotonic()
        outcome = registry.stop(b, args.timeout_s)
        took = time.monotonic() - started
        what = {
            StopOutcome.STOPPED: f"stopped (SIGTERM) in {took:.1f} s",
            StopOutcome.KILLED: (
                f"killed (SIGKILL): still running {args.timeout_s:g} s after SIGTERM"
            ),
            StopOutcome.GONE: "was no longer running",
        }[outcome]
        print(f"broker pid {b.pid} at {b.address} (log.dir {b.log_dir}): {what}", flush=True)
    return 0


def add_hosted_commands(broker_sub: Any) -> None:
    """Register ``list`` and ``stop`` under ``idemlog broker``."""
    listing = broker_sub.add_parser(
        "list", help="brokers running on this host (started by Spark or by idemlog)"
    )
    listing.add_argument("--json", action="store_true", help=JSON_HELP)
    listing.set_defaults(func=broker_list)
    stopping = broker_sub.add_parser(
        "stop", help="stop a broker on this host: SIGTERM, SIGKILL after --timeout-s"
    )
    which = stopping.add_mutually_exclusive_group(required=True)
    which.add_argument("--log-dir", metavar="D", help="the broker serving this log.dir")
    which.add_argument("--all", action="store_true", help="every running broker listed")
    stopping.add_argument(
        "--timeout-s",
        type=float,
        default=DEFAULT_STOP_TIMEOUT_S,
        help="how long a clean shutdown may take before SIGKILL "
        f"(default {DEFAULT_STOP_TIMEOUT_S:g})",
    )
    stopping.set_defaults(func=broker_stop)
