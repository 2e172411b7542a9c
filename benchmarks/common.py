"""Helpers every benchmark shares: percentiles, verdicts, tables, CPU time of processes.

CPU time comes from psutil (a dependency), not from reading ``/proc`` by hand: user +
system seconds of a process, and of a process tree with its reaped children (their time
moves into the parent's ``children_user``/``children_system`` when they are waited for),
so the difference of two snapshots stays right while workers come and go.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import psutil

if TYPE_CHECKING:
    from broker_core.client.broker_client import BrokerClient

MB = 1e6


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100, linear interpolation between the closest ranks);
    NaN for no values."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")


def p50(values: Sequence[float]) -> float:
    """The median; 0 for no values (a part that did not run shows as 0 in a table)."""
    return statistics.median(values) if values else 0.0


def verdict(ok: bool) -> str:
    """The word a table prints against a goal."""
    return "meets" if ok else "misses"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print rows under headers, each column as wide as its widest cell: the first (the
    row's name) left-aligned, the figures right-aligned (format numbers before)."""
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        first, *rest = row
        line = [first.ljust(widths[0])]
        line += [cell.rjust(width) for cell, width in zip(rest, widths[1:], strict=True)]
        print("  ".join(line).rstrip(), flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far; 0 when it is gone."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return float(times.user + times.system)


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process, its living descendants, and the children they reaped;
    0 when it is gone."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in tree:
        try:
            t = process.cpu_times()
        except psutil.NoSuchProcess:
            continue  # exited meanwhile: its time is in its parent's children_* once reaped
        total += t.user + t.system + t.children_user + t.children_system
    return total


def metadata_calls_per_s(client: BrokerClient, address: str, seconds: float) -> float:
    """METADATA calls a second on ``client``'s connection to ``address`` for ``seconds``,
    its first call (the connection's handshake, TLS or SASL) outside the timing."""
    from broker_core.protocol.wire import Action

    client.action(address, Action.METADATA, {})
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        client.action(address, Action.METADATA, {})
        calls += 1
    return calls / elapsed
