"""Errors raised by the Spark side itself (the producer client's are in
``broker_core.producer.errors``, the broker's in ``broker_core.errors``)."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from broker_core.errors import DEBUG_ENV, ErrorCode, IdemlogError, UnknownTopicIdError

log = logging.getLogger("idemlog.spark")

# pyspark's Python workers report an error to the JVM as its formatted traceback, which
# Spark puts under its own [PYTHON_DATA_SOURCE_ERROR] or PythonException; with this
# variable set (Spark's spark.sql.execution.pyspark.udf.hideTraceback.enabled sets it for
# UDF workers) they report ``type: message`` only (pyspark.util.handle_worker_exception).
SPARK_HIDE_TRACEBACK = "SPARK_HIDE_TRACEBACK"
# Set by Spark for every Python worker it starts: how the worker connects back to it.
_SPARK_WORKER_MARKS = (
    "PYTHON_WORKER_FACTORY_SECRET",
    "PYTHON_WORKER_FACTORY_SOCK_PATH",
    "PYTHON_WORKER_FACTORY_PORT",
)
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def _as_one_line(exc: IdemlogError) -> None:
    """Have the Spark worker this process is report ``exc`` as its one line: the worker
    reports the error escaping now and exits (pyspark's workers never go on after an
    error), so nothing else is reported without its traceback. The traceback goes to the
    debug log, and stays in the report with IDEMLOG_DEBUG=1. Outside a Spark worker (a
    test calling the reader directly) nothing changes."""
    if not any(mark in os.environ for mark in _SPARK_WORKER_MARKS):
        return
    log.debug("idemlog error reported to Spark as one line", exc_info=exc)
    if os.environ.get(DEBUG_ENV) != "1":
        os.environ[SPARK_HIDE_TRACEBACK] = "1"


def one_line_errors(method: Callable[P, R]) -> Callable[P, R]:
    """``method`` (one Spark calls in a Python worker: planning, a task, a commit) with
    idemlog's own errors reported to Spark as their one line, not under their Python
    traceback: ``topic 'x' does not exist`` instead of ten lines of frames above it.
    Any other exception (a bug) keeps its traceback."""

    @functools.wraps(method)
    def reporting(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except IdemlogError as exc:
            _as_one_line(exc)
            raise

    return reporting


def one_line_errors_of(rows: Iterator[T]) -> Iterator[T]:
    """``rows`` (a read task's batches) with idemlog's errors reported as one_line_errors
    reports them."""
    try:
        yield from rows
    except IdemlogError as exc:
        _as_one_line(exc)
        raise


class EmbeddedBrokerError(IdemlogError):
    """The embedded broker (``spark_sink.embedded``) could not be started or reached.

    BROKER_NOT_AVAILABLE because that is what the sink sees: no broker to write to. The
    code is retriable, so a retried task tries to start it again (a port or a lock freed
    in the meantime); the message names the directory and quotes the broker's log.
    """

    error_code = ErrorCode.BROKER_NOT_AVAILABLE


class InjectedFailure(IdemlogError):
    """A failure injected on purpose by a write's hooks (the option ``hooks``): the fault
    tests' ``testkit.spark_failpoints``, the notebook's own."""

    error_code = ErrorCode.UNKNOWN_SERVER_ERROR


class UnsupportedWriteError(IdemlogError):
    """A write Spark can express but an append-only log cannot honour (overwrite)."""

    error_code = ErrorCode.INVALID_REQUEST


def topic_recreated(
    topic: str, pinned: str, current: str, since: str, remedy: str = ""
) -> UnknownTopicIdError:
    """The one line for a reader, sink or export that knows ``topic`` by the id
    ``pinned`` (since ``since``: its planning, its checkpoint, its last export) and finds
    ``current`` ("": the topic is gone): it names the topic and says it was recreated
    (or deleted), then ``remedy``. UNKNOWN_TOPIC_ID, not retriable: rows of another
    topic are never read or written as if they followed."""
    what = "recreated" if current else "deleted"
    now = f"is now {current}" if current else "no longer exists"
    tail = f": {remedy}" if remedy else ""
    return UnknownTopicIdError(
        f"topic {topic!r} was {what} since {since} (id {pinned} {now}){tail}"
    )


class SinkStateLostError(IdemlogError):
    """The coordinator no longer knows a batch whose prepared transactions are still open
    on the topic's partitions: its ``__transaction_state`` was lost (with every replica).

    Non-retriable on purpose: running the batch again would write it on top of those
    transactions, which no coordinator will ever end, so they would hold the partitions'
    last stable offset and every later batch, reported committed, would never be
    readable. The message names the batch, the producer ids and where each transaction
    starts, and the operators' way out (``idemlog transactions find-hanging``, then
    ``abort``, docs/operations.md "Hanging transactions"); after that the batch can run
    again.
    """

    error_code = ErrorCode.INVALID_PRODUCER_ID_MAPPING


class DriverRetriesSpentError(IdemlogError):
    """The driver's plan, commit or abort of a batch met only retriable failures (brokers
    down or restarting, leaders or the coordinator moving) for the whole of the option
    ``driver.retry.timeout.ms``. Its message is one line: what gave up, the option and
    its value, and the last error. REQUEST_TIMED_OUT, retriable: a restart of the query
    once the brokers are back goes on where it stopped (a commit whose answer was lost
    is found committed)."""

    error_code = ErrorCode.REQUEST_TIMED_OUT
