"""The idemlog producer client: Arrow accumulator, pipelined sender with ordered retries,
epoch bumps and transactions (docs/design.md §3, §9 items 13-15). Usable without Spark.

Modules, one concept each: ``config`` (the keys, and ``ProducerConfig``, their typed
form), ``partitioner`` (key hash → partition), ``message_accumulator`` (per-partition
queues, buffer.memory), ``producer_batch`` (one produced batch), ``sender`` (background
thread: drain, send, answers, retries), ``transaction_manager`` (producer id/epoch,
sequences, transaction states), ``transport`` (the broker interface and its Flight
implementation), ``futures`` (send results), ``metrics``, ``producer`` (the facade).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_core.lazy import lazy_names

if TYPE_CHECKING:
    from .config import PRODUCER_CONFIG, ProducerConfig
    from .errors import (
        AbortableTransactionError,
        BufferExhaustedError,
        DeliveryTimeoutError,
        MaxBlockTimeoutError,
        ProducerClosedError,
        TransactionAbortedError,
    )
    from .futures import RecordMetadata, SendResult
    from .partitioner import hash_keys, partitions_for_keys
    from .producer import Producer
    from .producer_batch import TopicPartition
    from .transaction_manager import TxnState
    from .transport import FlightTransport, SendHandle, Transport

# Each name loads its module on first use: importing one module of the package (the
# driver's options import ``config``) does not load the rest (the sender, the
# partitioner's NumPy code), which only the tasks need.
_HOME = {
    "PRODUCER_CONFIG": ".config",
    "ProducerConfig": ".config",
    "AbortableTransactionError": ".errors",
    "BufferExhaustedError": ".errors",
    "DeliveryTimeoutError": ".errors",
    "MaxBlockTimeoutError": ".errors",
    "ProducerClosedError": ".errors",
    "TransactionAbortedError": ".errors",
    "RecordMetadata": ".futures",
    "SendResult": ".futures",
    "hash_keys": ".partitioner",
    "partitions_for_keys": ".partitioner",
    "Producer": ".producer",
    "TopicPartition": ".producer_batch",
    "TxnState": ".transaction_manager",
    "FlightTransport": ".transport",
    "SendHandle": ".transport",
    "Transport": ".transport",
}


__getattr__ = lazy_names(__name__, _HOME)

__all__ = [
    "PRODUCER_CONFIG",
    "AbortableTransactionError",
    "BufferExhaustedError",
    "DeliveryTimeoutError",
    "FlightTransport",
    "MaxBlockTimeoutError",
    "Producer",
    "ProducerClosedError",
    "ProducerConfig",
    "RecordMetadata",
    "SendHandle",
    "SendResult",
    "TopicPartition",
    "TransactionAbortedError",
    "Transport",
    "TxnState",
    "hash_keys",
    "partitions_for_keys",
]
