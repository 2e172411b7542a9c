"""Errors raised by the producer client itself (the broker's own are in broker_core.errors)."""

from __future__ import annotations

from broker_core.errors import ErrorCode, IdemlogError


class BufferExhaustedError(IdemlogError):
    """send() waited max.block.ms for buffer.memory and none was freed."""

    error_code = ErrorCode.REQUEST_TIMED_OUT


class DeliveryTimeoutError(IdemlogError):
    """A batch was neither acknowledged nor failed for good within delivery.timeout.ms."""

    error_code = ErrorCode.REQUEST_TIMED_OUT


class ProducerClosedError(IdemlogError):
    """The producer is closed (or closing) and takes no more sends."""

    error_code = ErrorCode.INVALID_REQUEST


class TransactionAbortedError(IdemlogError):
    """The batch belonged to a transaction that was aborted before it was sent."""

    error_code = ErrorCode.INVALID_TXN_STATE


class AbortableTransactionError(IdemlogError):
    """The current transaction hit an error; abort_transaction() must be called."""

    error_code = ErrorCode.INVALID_TXN_STATE


class MaxBlockTimeoutError(IdemlogError, TimeoutError):
    """A public call retried retriable errors (metadata, InitProducerId, EndTxn, ...) for
    max.block.ms without success. The last retriable error is its ``__cause__``."""

    error_code = ErrorCode.REQUEST_TIMED_OUT
