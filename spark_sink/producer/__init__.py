"""The idemlog producer client: Arrow accumulator, pipelined sender with ordered retries,
epoch bumps and transactions (docs/design.md §3, §9 items 13-15). Usable without Spark.

Modules, one concept each: ``config`` (keys), ``partitioner`` (key hash → partition),
``message_accumulator`` (per-partition queues, buffer.memory), ``producer_batch`` (one
produced batch), ``sender`` (background thread: drain, send, answers, retries),
``transaction_manager`` (producer id/epoch, sequences, transaction states),
``transport`` (the broker interface and its Flight implementation), ``futures``
(send results), ``metrics``, ``producer`` (the facade).
"""

from __future__ import annotations

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
