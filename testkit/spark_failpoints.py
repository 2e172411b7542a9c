"""Failure injection at named points of the Spark sink's protocol, for the fault tests and
the demo: :class:`SparkFailpoints`, the write's hooks (``spark_sink.hooks``) when a write
names it, ``.option("hooks", "testkit.spark_failpoints:SparkFailpoints")`` (:data:`HOOKS`).

Never shipped (the wheel holds ``broker_core`` and ``spark_sink`` only), so no installed
idemlog can kill its own process. A write that does not name the class never reads the
variables below (docs/security.md, Test hooks). Armed by ``IDEMLOG_SPARK_FAILPOINTS`` in
the environment of the write's Python processes (in local mode the driver's; on a
cluster ``spark.executorEnv`` too), a ``;``-separated list of
``<point>@<batch id>[/<spark partition>]=<action>``, e.g.
``mid_write@3/1=kill_worker;inside_commit@5=kill_driver``.

Points: those of :class:`spark_sink.hooks.Point` (``before_write``, ``mid_write`` (after
the task's first rows were flushed into the log), ``after_prepare``, ``before_commit``,
``inside_commit`` (the driver's commit request in flight), ``after_commit``), and
``lost_ack``: the task's producer transport, see below. A batch write (``df.write``) is
batch id 0.

Actions: ``raise`` (the task or commit fails with
:class:`spark_sink.errors.InjectedFailure`), ``kill_worker`` (SIGKILL of the Python
process at the point), ``kill_driver`` (SIGKILL of the process group
``IDEMLOG_DRIVER_PGID``: the driver's JVM and Python), ``sleep:<s>``, and for ``lost_ack``
only ``drop:<n>``: the broker's answers to the task's first ``n`` produce requests are lost
after the broker appended the batch (the producer sees a retriable NetworkError and
resends the same sequence numbers, which the broker answers as duplicates: Kafka's
lost-acknowledgement case).

Each entry fires once across all processes and restarts: the first process to reach it
creates a marker file in ``IDEMLOG_SPARK_FAILPOINTS_DIR`` (``O_EXCL``), so a retried task
or a restarted query passes the point. The marker (:func:`marker_path`) holds the entry's
text and the pid of the process that fired it.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from broker_core.errors import InvalidConfigError, NetworkError
from spark_sink.errors import InjectedFailure
from spark_sink.hooks import Point, SinkHooks, class_name

if TYPE_CHECKING:
    from broker_core.producer.producer_batch import TopicPartition
    from broker_core.producer.transport import SendHandle, Transport
    from broker_core.protocol.wire import ProduceResponse

ENV = "IDEMLOG_SPARK_FAILPOINTS"
ENV_DIR = "IDEMLOG_SPARK_FAILPOINTS_DIR"
ENV_DRIVER_PGID = "IDEMLOG_DRIVER_PGID"
LOST_ACK = "lost_ack"  # the task's producer transport (SinkHooks.transport)
POINTS: tuple[str, ...] = (
    Point.BEFORE_WRITE.value,
    LOST_ACK,
    *(p.value for p in Point if p is not Point.BEFORE_WRITE),
)
_ENTRY = re.compile(
    r"(?P<point>[a-z_]+)@(?P<batch>\d+)(?:/(?P<part>\d+))?=(?P<action>[a-z_]+(:[\d.]+)?)"
)
_ACTIONS = ("raise", "kill_worker", "kill_driver", "sleep", "drop")


@dataclass(frozen=True)
class Failpoint:
    text: str
    point: str
    batch_id: int
    partition: int | None
    action: str

    def matches(self, point: str, batch_id: int, partition: int | None) -> bool:
        return (
            self.point == point
            and self.batch_id == batch_id
            and (self.partition is None or self.partition == partition)
        )


def parse(spec: str) -> list[Failpoint]:
    result = []
    for text in filter(None, (t.strip() for t in spec.split(";"))):
        m = _ENTRY.fullmatch(text)
        if m is None or m["point"] not in POINTS or m["action"].split(":")[0] not in _ACTIONS:
            raise InvalidConfigError(
                f"{ENV}: {text!r} is not <point>@<batch>[/<partition>]=<action> with point "
                f"in {', '.join(POINTS)} and action in raise, kill_worker, kill_driver, "
                "sleep:<seconds>, drop:<n> (lost_ack only)"
            )
        if (m["point"] == "lost_ack") != (m["action"].split(":")[0] == "drop"):
            raise InvalidConfigError(f"{ENV}: {text!r}: drop:<n> is the action of lost_ack only")
        part = int(m["part"]) if m["part"] is not None else None
        result.append(Failpoint(text, m["point"], int(m["batch"]), part, m["action"]))
    return result


def claim(point: str, batch_id: int, partition: int | None = None) -> Failpoint | None:
    """The armed entry for this point, marked as fired; None when nothing is armed.
    Raises InvalidConfigError for a malformed variable."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    for entry in parse(spec):
        if entry.matches(point, batch_id, partition) and _first_claim(entry):
            return entry
    return None


def hit(point: str, batch_id: int, partition: int | None = None) -> None:
    """Act on the armed entry for this point, if any."""
    entry = claim(point, batch_id, partition)
    if entry is not None:
        act(entry)


def act(entry: Failpoint) -> None:
    name, _, arg = entry.action.partition(":")
    if name == "sleep":
        time.sleep(float(arg or "1"))  # the injected fault *is* the delay
    elif name == "raise":
        raise InjectedFailure(f"failpoint {entry.text} fired")
    elif name == "kill_worker":
        os.kill(os.getpid(), signal.SIGKILL)
    elif name == "kill_driver":
        pgid = os.environ.get(ENV_DRIVER_PGID)
        if not pgid:
            raise InvalidConfigError(f"failpoint {entry.text}: {ENV_DRIVER_PGID} is not set")
        os.killpg(int(pgid), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)  # in case this process is in another group


def losing_acks(entry: Failpoint | None, transport: Transport) -> Transport:
    """``transport``, or for an armed ``lost_ack`` entry a proxy that loses the answers to
    its first ``n`` produce requests."""
    if entry is None:
        return transport
    return _LosingAcks(transport, int(entry.action.partition(":")[2] or "1"), entry.text)


class _LostAnswer:
    def __init__(self, inner: SendHandle, what: str) -> None:
        self.inner = inner
        self.what = what

    def done(self) -> bool:
        return self.inner.done()

    def result(self, timeout: float | None = None) -> ProduceResponse:
        self.inner.result(timeout)  # the broker did append (or reject) the batch
        raise NetworkError(f"failpoint {self.what}: the broker's answer was lost")

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        self.inner.add_done_callback(callback)


class _LosingAcks:
    """A ``Transport`` proxy; everything but ``send`` goes to the real one."""

    def __init__(self, inner: Transport, count: int, what: str) -> None:
        self._inner = inner
        self._remaining = count
        self._what = what
        self._lock = threading.Lock()

    def send(self, tp: TopicPartition, batch: pa.RecordBatch, **kwargs: Any) -> SendHandle:
        handle = self._inner.send(tp, batch, **kwargs)
        with self._lock:  # send runs on the sender thread; the lock keeps the count exact
            lose = self._remaining > 0
            self._remaining -= lose
        return _LostAnswer(handle, self._what) if lose else handle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class SparkFailpoints(SinkHooks):
    """The sink's hooks that fire the entries of ``IDEMLOG_SPARK_FAILPOINTS``."""

    def at(
        self,
        point: Point,
        batch_id: int,
        partition_id: int | None = None,
        *,
        effect: Callable[[], object] | None = None,
    ) -> None:
        entry = claim(point, batch_id, partition_id)
        if entry is None:
            return
        if effect is not None:
            # mid_write: some rows really are in the log when it fires; inside_commit: the
            # commit request is in flight (the broker may or may not record it).
            effect()
        act(entry)

    def transport(
        self, batch_id: int, partition_id: int
    ) -> Callable[[Transport], Transport] | None:
        entry = claim(LOST_ACK, batch_id, partition_id)
        if entry is None:
            return None
        return lambda transport: losing_acks(entry, transport)


HOOKS = class_name(SparkFailpoints)  # the value of the sink option ``hooks`` that arms them


def marker_path(directory: str, text: str) -> str:
    """Where the marker of the entry ``text`` is created once it fired."""
    return os.path.join(directory, hashlib.sha1(text.encode()).hexdigest()[:16])


def _first_claim(entry: Failpoint) -> bool:
    directory = os.environ.get(ENV_DIR)
    if not directory:
        raise InvalidConfigError(f"{ENV} is set but {ENV_DIR} (one-shot markers) is not")
    try:
        fd = os.open(marker_path(directory, entry.text), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    # The text, then the pid that fired it: a test finds the process (and its host) to
    # kill or cut while it sleeps at the point.
    os.write(fd, f"{entry.text}\n{os.getpid()}\n".encode())
    os.fsync(fd)  # the marker must survive the kill it precedes
    os.close(fd)
    return True
