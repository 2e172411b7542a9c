"""The processes of the embedded broker (``spark_sink.embedded``) as another process sees
them: not its child, perhaps another user's, perhaps gone with its pid reused. Whether
one still runs, waiting for it to go, stopping it (SIGTERM, then SIGKILL), which process
holds a data directory's lock, the ports it listens on, the ready pipe's words.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from pathlib import Path

import psutil

from broker_core.fileutil import directory_lock_holder
from spark_sink.errors import EmbeddedBrokerError

KILL_WAIT_S = 10.0  # after SIGKILL, only the kernel's teardown is left to wait for
POLL_S = 0.02
_CREATE_TIME_TOLERANCE_S = 0.001


def running(proc: psutil.Process) -> bool:
    """Whether ``proc`` still runs: it exists, is the process it was when looked up (psutil
    compares its create time, so a reused pid is not it), and is no zombie (a zombie has
    exited; it only waits for its parent, perhaps an init that never reaps)."""
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # exists, but another user's: certainly not a broker we can use


def same_time(a: float, b: float) -> bool:
    # Both come from the same kernel start time (clock ticks) through psutil; allow for
    # the float's round trip through JSON.
    return abs(a - b) < _CREATE_TIME_TOLERANCE_S


def wait_gone(proc: psutil.Process, timeout_s: float) -> bool:
    # Not our child (another process may have started it), so neither os.waitpid nor
    # psutil's wait (which counts a zombie as alive) tells when it has exited: poll.
    deadline = time.monotonic() + timeout_s
    while running(proc):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def terminate(proc: psutil.Process, timeout_s: float) -> None:
    """SIGTERM (the broker flushes and snapshots), SIGKILL if it is still there after
    ``timeout_s``; returns once the process is gone. psutil signals only the process
    looked up, never one that took its pid since. Raises :class:`EmbeddedBrokerError` if
    it survives SIGKILL."""
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.terminate()
    if wait_gone(proc, timeout_s):
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.kill()
    if not wait_gone(proc, KILL_WAIT_S):
        raise EmbeddedBrokerError(f"embedded broker pid {proc.pid} survived SIGKILL")


def lock_holder_once_exited(data_dir: Path) -> int | None:
    """The data directory's lock holder (``directory_lock_holder``), waiting up to
    ``KILL_WAIT_S`` for one that has exited but not yet let go: a killed multi-threaded
    broker's main thread is a zombie (gone, for ``running``) while its other threads
    still tear down and hold its files, the lock among them."""
    deadline = time.monotonic() + KILL_WAIT_S
    while True:
        holder = directory_lock_holder(data_dir)
        if holder is None or holder <= 0:
            return holder
        try:
            exiting = not running(psutil.Process(holder))
        except psutil.Error:
            exiting = True
        if not exiting or time.monotonic() >= deadline:
            return holder
        time.sleep(POLL_S)  # the kernel's teardown signals nothing we can wait on


def listening_addresses(proc: psutil.Process) -> list[str]:
    """``127.0.0.1:port`` of every TCP port ``proc`` listens on (the broker binds one)."""
    try:
        connections = proc.net_connections(kind="tcp")
    except psutil.Error:
        return []
    return sorted(
        {
            f"127.0.0.1:{c.laddr.port}"
            for c in connections
            if c.status == psutil.CONN_LISTEN and c.laddr
        }
    )


def read_until_eof(fd: int, timeout_s: float) -> str | None:
    """Everything written to the pipe until EOF; None if EOF did not come in time."""
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return b"".join(chunks).decode(errors="replace")
        chunks.append(chunk)
