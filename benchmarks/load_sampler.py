"""The machine's load beside a benchmark: who used the CPU while each step ran.

On a shared machine a step that took longer than its median usually did so because
something else had the cores. :class:`LoadSampler` reads, every ``interval_s`` on a
thread of its own, the machine's busy CPU seconds (``/proc/stat`` through psutil), the
CPU seconds of this process's tree (Spark's JVM and its Python processes) and of one more
process (the embedded broker, which is not always in the tree: it outlives the Python
process that started it). :meth:`LoadSampler.window` then says, for any span of wall
time, how many cores the rest of the machine (other users' tests, benchmarks) and the
broker used on average during it, by linear interpolation between the samples.

Bounded: one sample per ``interval_s`` (default 0.2 s) of ~40 bytes, about 18 kB for a
10-minute benchmark; reading a tree costs about a millisecond of CPU a sample.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
import time
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Sample:
    at: float  # epoch seconds
    machine: float  # busy CPU seconds of every core since boot
    ours: float  # CPU seconds of this process's tree, the other process excluded
    other_process: float  # CPU seconds of the process given to the sampler


@dataclass(frozen=True)
class Load:
    """Average cores busy during a window: ``others`` is the machine's busy time outside
    this benchmark's processes (tree and broker), ``broker`` the broker's."""

    others: float
    broker: float


def _busy_seconds() -> float:
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def _tree_seconds(root: int, excluded: int | None) -> tuple[float, float]:
    """(CPU seconds of ``root``'s tree without ``excluded``, of ``excluded``)."""
    tree, other = 0.0, 0.0
    try:
        procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    if excluded is not None and all(p.pid != excluded for p in procs):
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(excluded))
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds = t.user + t.system + t.children_user + t.children_system
        if p.pid == excluded:
            other += seconds
        else:
            tree += seconds
    return tree, other


class LoadSampler:
    """Samples the load on a daemon thread from :meth:`start` to :meth:`stop`."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self._interval_s = interval_s
        self._samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)
        self.other_pid: int | None = None  # set once the broker runs

    def start(self) -> LoadSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        root = os.getpid()
        while True:
            ours, other = _tree_seconds(root, self.other_pid)
            self._samples.append(Sample(time.time(), _busy_seconds(), ours, other))
            if self._stop.wait(self._interval_s):
                return

    def _at(self, when: float) -> tuple[float, float, float] | None:
        """(machine, ours, other) seconds interpolated at ``when``; None outside."""
        samples = self._samples
        i = bisect.bisect_left([s.at for s in samples], when)
        if i == 0 or i >= len(samples):
            return None
        a, b = samples[i - 1], samples[i]
        f = (when - a.at) / (b.at - a.at) if b.at > a.at else 0.0
        return (
            a.machine + f * (b.machine - a.machine),
            a.ours + f * (b.ours - a.ours),
            a.other_process + f * (b.other_process - a.other_process),
        )

    def window(self, start: float, end: float) -> Load | None:
        """The average load between ``start`` and ``end`` (epoch seconds); None when the
        samples do not cover it."""
        lo, hi = self._at(start), self._at(end)
        if lo is None or hi is None or end <= start:
            return None
        span = end - start
        machine, ours, broker = (hi[k] - lo[k] for k in range(3))
        return Load(max(machine - ours - broker, 0.0) / span, broker / span)
