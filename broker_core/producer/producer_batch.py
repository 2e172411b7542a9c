"""One produced batch: the Arrow rows of one partition sent (and retried) as a unit.

A batch is built from one or more appended chunks (parts of sends). When the sender
drains it, it is frozen: its chunks are merged into one ``RecordBatch``, and it gets its
producer id, epoch and base sequence, which it keeps for every retry (only an epoch bump
re-assigns them). Sequences count rows, like Kafka's count records.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import pyarrow as pa

from broker_core.errors import IdemlogError

from .futures import RecordMetadata, SendCollector

SEQUENCE_MODULUS = 2**31  # sequences wrap at 2^31 - 1 -> 0, like Kafka's
NO_SEQUENCE = -1


@dataclass(frozen=True, order=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass
class _Part:
    collector: SendCollector
    row_start: int  # inside the batch
    rows: int


class Written(enum.Enum):
    """What the producer knows about whether the broker wrote the batch."""

    NOT_SENT = "not sent at this producer id/epoch"
    MAYBE = "sent, answer lost (timeout, broken stream): may be in the log"
    NO = "answered with an error that proves it is not in the log"


@dataclass(eq=False)
class ProducerBatch:
    tp: TopicPartition
    created: float  # monotonic seconds of the first append
    chunks: list[pa.RecordBatch] = field(default_factory=list)
    parts: list[_Part] = field(default_factory=list)
    num_rows: int = 0
    size_bytes: int = 0
    # Set at drain time.
    record_batch: pa.RecordBatch | None = None
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = NO_SEQUENCE
    ordinal: int = -1  # per-partition drain order, for comparisons that ignore wrapping
    # Sending and retrying.
    attempts: int = 0  # sends so far
    retries: int = 0  # resends after retriable errors (bounded by the retries key)
    requeued: bool = False
    sent_at: float = 0.0
    retry_after: float = 0.0
    written: Written = Written.NOT_SENT
    last_error: IdemlogError | None = None
    done: bool = False

    @property
    def has_sequence(self) -> bool:
        return self.base_sequence != NO_SEQUENCE

    @property
    def last_sequence(self) -> int:
        return (self.base_sequence + self.num_rows - 1) % SEQUENCE_MODULUS

    def try_append(self, chunk: pa.RecordBatch, collector: SendCollector, limit: int) -> bool:
        """Merge ``chunk`` in if the batch is still open, same schema, and within ``limit``."""
        if self.record_batch is not None or not self.chunks:
            return False
        if self.size_bytes + chunk.nbytes > limit or not chunk.schema.equals(self.chunks[0].schema):
            return False
        self.add(chunk, collector)
        return True

    def add(self, chunk: pa.RecordBatch, collector: SendCollector) -> None:
        collector.add_part()
        self.parts.append(_Part(collector, self.num_rows, chunk.num_rows))
        self.chunks.append(chunk)
        self.num_rows += chunk.num_rows
        self.size_bytes += chunk.nbytes

    def freeze(self) -> pa.RecordBatch:
        """The one RecordBatch sent on the wire (merged once, reused by retries)."""
        if self.record_batch is None:
            if len(self.chunks) == 1:
                self.record_batch = self.chunks[0]
            else:
                self.record_batch = pa.concat_batches(self.chunks)
        return self.record_batch

    def assign(self, producer_id: int, epoch: int, base_sequence: int, ordinal: int) -> None:
        self.producer_id, self.producer_epoch = producer_id, epoch
        self.base_sequence, self.ordinal = base_sequence, ordinal
        self.written = Written.NOT_SENT

    def reset_sequence(self) -> None:
        """Forget producer state (after an epoch bump): re-assigned at the next drain."""
        self.producer_id = self.producer_epoch = -1
        self.base_sequence = NO_SEQUENCE
        self.ordinal = -1
        self.written = Written.NOT_SENT

    def complete(self, base_offset: int, duplicate: bool = False) -> None:
        """Acknowledged at ``base_offset`` (-1: a duplicate whose offsets are unknown)."""
        self.done = True
        for part in self.parts:
            if base_offset < 0:
                meta = RecordMetadata(self.tp.partition, -1, -1, part.rows, True)
            else:
                base = base_offset + part.row_start
                meta = RecordMetadata(
                    self.tp.partition, base, base + part.rows - 1, part.rows, duplicate
                )
            part.collector.part_done(meta)

    def fail(self, error: BaseException) -> None:
        self.done = True
        for part in self.parts:
            part.collector.part_failed(error)

    def __repr__(self) -> str:
        return (
            f"ProducerBatch({self.tp}, rows={self.num_rows}, pid={self.producer_id}, "
            f"epoch={self.producer_epoch}, seq={self.base_sequence}, attempts={self.attempts})"
        )
