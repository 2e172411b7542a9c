"""The accumulator: per-partition queues of pending Arrow batches, bounded in memory.

``append`` merges small chunks into the partition's open batch up to ``batch.size`` bytes
and splits larger ones into batches of about that size. Every appended byte is counted
against ``buffer.memory`` until its batch is acknowledged or fails for good; an append
that does not fit waits on a condition (``max.block.ms`` at most) and then fails with
:class:`BufferExhaustedError` naming both keys.

The sender asks which partitions have a batch ready (full, lingered ``linger.ms``, a
retry whose backoff has passed, or a flush/close in progress), drains the head batch of
each, and puts failed batches back with :meth:`reenqueue`, which keeps each queue in
sequence order (retries go in front of batches that never had a sequence).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

import pyarrow as pa

from .config import ProducerConfig
from .errors import BufferExhaustedError
from .futures import SendCollector
from .producer_batch import ProducerBatch, TopicPartition

Clock = Callable[[], float]


class MessageAccumulator:
    @classmethod
    def from_config(
        cls, config: ProducerConfig, clock: Clock = time.monotonic
    ) -> MessageAccumulator:
        """The accumulator ``config``'s ``batch.size``, ``linger.ms``, ``buffer.memory`` and
        ``max.block.ms`` describe."""
        return cls(
            batch_size=config.batch_size,
            linger_ms=config.linger_ms,
            buffer_memory=config.buffer_memory,
            max_block_ms=config.max_block_ms,
            clock=clock,
        )

    def __init__(
        self,
        *,
        batch_size: int,
        linger_ms: int,
        buffer_memory: int,
        max_block_ms: int,
        clock: Clock = time.monotonic,
    ) -> None:
        self.batch_size = batch_size
        self.linger_s = linger_ms / 1000
        self.buffer_memory = buffer_memory
        self.max_block_s = max_block_ms / 1000
        self.clock = clock
        self.cond = threading.Condition()
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._used = 0  # bytes of batches not yet done
        self._incomplete = 0  # batches not yet done
        self._flushing = 0
        self._closing = False
        self._wakeup = False  # something changed since the sender last looked

    # -- producer side -------------------------------------------------------------------
    def append(self, tp: TopicPartition, batch: pa.RecordBatch, collector: SendCollector) -> None:
        """Queue ``batch``'s rows for ``tp``; blocks while buffer.memory is exhausted."""
        for chunk in self._split(batch):
            size = chunk.nbytes
            with self.cond:
                self._reserve(size)
                queue = self._queues.setdefault(tp, deque())
                news = False
                if not (queue and queue[-1].try_append(chunk, collector, self.batch_size)):
                    new = ProducerBatch(tp, self.clock())
                    new.add(chunk, collector)
                    queue.append(new)
                    self._incomplete += 1
                    news = True  # a new batch: a linger deadline, or its queue's head due
                elif len(queue) == 1 and queue[0].size_bytes >= self.batch_size:
                    news = True  # the lingering head batch is full: due now
                self._used += size
                if news:
                    # Only what changes ready()'s answer or its deadline wakes the sender:
                    # a chunk merged into a batch that is not due yet changes neither, and
                    # a notify per append was a quarter of the producer's GIL time
                    # (benchmarks/README.md, "Where the batch write's time goes").
                    self._wakeup = True
                    self.cond.notify_all()

    def _split(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        if batch.nbytes <= self.batch_size or batch.num_rows <= 1:
            yield batch
            return
        per_row = batch.nbytes / batch.num_rows
        rows = max(1, math.floor(self.batch_size / per_row))
        for start in range(0, batch.num_rows, rows):
            yield batch.slice(start, rows)

    def _reserve(self, size: int) -> None:
        if size > self.buffer_memory:
            raise BufferExhaustedError(
                f"a chunk of {size} bytes is larger than buffer.memory={self.buffer_memory}"
            )
        deadline = self.clock() + self.max_block_s
        while self._used + size > self.buffer_memory:
            if self._closing:
                return  # close() fails what is queued; do not block the caller for it
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise BufferExhaustedError(
                    f"waited max.block.ms={round(self.max_block_s * 1000)} for "
                    f"{size} bytes of buffer.memory={self.buffer_memory} "
                    f"({self._used} bytes held by unacknowledged batches)"
                )
            self.cond.wait(remaining)

    # -- sender side ---------------------------------------------------------------------
    def ready(
        self, now: float, sendable: Callable[[TopicPartition, ProducerBatch], bool]
    ) -> tuple[list[TopicPartition], float]:
        """Partitions whose head batch may be drained now, and the seconds until the next
        one might be (for the sender's wait)."""
        ready: list[TopicPartition] = []
        wait = math.inf
        with self.cond:
            urgent = self._flushing > 0 or self._closing
            for tp, queue in self._queues.items():
                if not queue:
                    continue
                head = queue[0]
                if head.requeued:
                    due = head.retry_after
                elif urgent or len(queue) > 1 or head.size_bytes >= self.batch_size:
                    due = now
                else:
                    due = head.created + self.linger_s
                if due > now:
                    wait = min(wait, due - now)
                elif sendable(tp, head):
                    ready.append(tp)
        return ready, wait

    def drain(self, tp: TopicPartition) -> ProducerBatch | None:
        with self.cond:
            queue = self._queues.get(tp)
            if not queue:
                return None
            batch = queue.popleft()
            batch.freeze()
            return batch

    def reenqueue(self, batch: ProducerBatch) -> None:
        """Put a batch back, in sequence (drain) order before any newer batch."""
        with self.cond:
            queue = self._queues.setdefault(batch.tp, deque())
            index = 0
            for index, queued in enumerate(queue):  # noqa: B007 -- the position is the result
                if queued.ordinal < 0 or queued.ordinal > batch.ordinal:
                    break
            else:
                index = len(queue)
            queue.insert(index, batch)
            self._wakeup = True
            self.cond.notify_all()

    def deallocate(self, batch: ProducerBatch) -> None:
        """The batch is done (acknowledged or failed for good): free its memory."""
        with self.cond:
            self._used -= batch.size_bytes
            self._incomplete -= 1
            self._wakeup = True
            self.cond.notify_all()

    def queued(self, tp: TopicPartition | None = None) -> list[ProducerBatch]:
        with self.cond:
            if tp is not None:
                return list(self._queues.get(tp, ()))
            return [b for q in self._queues.values() for b in q]

    def partitions(self) -> list[TopicPartition]:
        with self.cond:
            return [tp for tp, q in self._queues.items() if q]

    def remove_all(self, predicate: Callable[[ProducerBatch], bool]) -> list[ProducerBatch]:
        """Take every queued batch matching ``predicate`` out of the queues."""
        taken: list[ProducerBatch] = []
        with self.cond:
            for tp, queue in self._queues.items():
                keep = deque(b for b in queue if not predicate(b))
                taken.extend(b for b in queue if predicate(b))
                self._queues[tp] = keep
        return taken

    # -- flush and close -----------------------------------------------------------------
    def begin_flush(self) -> None:
        with self.cond:
            self._flushing += 1
            self._wakeup = True
            self.cond.notify_all()

    def end_flush(self) -> None:
        with self.cond:
            self._flushing -= 1

    def await_complete(self, timeout: float | None) -> bool:
        """Wait until every appended batch is done; False on timeout."""
        with self.cond:
            return self.cond.wait_for(lambda: self._incomplete == 0, timeout)

    def close(self) -> None:
        with self.cond:
            self._closing = True
            self._wakeup = True
            self.cond.notify_all()

    @property
    def closing(self) -> bool:
        return self._closing

    def incomplete(self) -> int:
        with self.cond:
            return self._incomplete

    def used_bytes(self) -> int:
        with self.cond:
            return self._used

    def wake(self) -> None:
        """Wake the sender's :meth:`wait` (or make its next one return at once): a batch in
        flight was answered. Safe from any thread; quick (the network threads call it)."""
        with self.cond:
            self._wakeup = True
            self.cond.notify_all()

    def wait(self, timeout: float) -> None:
        """The sender's wait: until a new batch, a full head batch, a requeue, a flush, a
        close or an answer (:meth:`wake`) notifies, or ``timeout`` (the caller bounds it by
        the nearest linger deadline, which a merged append never moves)."""
        with self.cond:
            if not self._wakeup:
                self.cond.wait(timeout)
            self._wakeup = False
