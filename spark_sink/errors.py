"""Errors raised by the Spark side itself (the producer client's are in
``spark_sink.producer.errors``, the broker's in ``broker_core.errors``)."""

from __future__ import annotations

from broker_core.errors import ErrorCode, IdemlogError, UnknownTopicIdError


class EmbeddedBrokerError(IdemlogError):
    """The embedded broker (``spark_sink.embedded``) could not be started or reached.

    BROKER_NOT_AVAILABLE because that is what the sink sees: no broker to write to. The
    code is retriable, so a retried task tries to start it again (a port or a lock freed
    in the meantime); the message names the directory and quotes the broker's log.
    """

    error_code = ErrorCode.BROKER_NOT_AVAILABLE


class InjectedFailure(IdemlogError):
    """A failure injected on purpose (``spark_sink.failpoints``): tests and the demo."""

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
