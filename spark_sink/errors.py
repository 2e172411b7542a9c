"""Errors raised by the Spark side itself (the producer client's are in
``spark_sink.producer.errors``, the broker's in ``broker_core.errors``)."""

from __future__ import annotations

from broker_core.errors import ErrorCode, IdemlogError


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
