"""Receiving a range on a thread of its own while the task hands rows to Spark.

A read task alternates two kinds of work: receiving batches from the broker (gRPC, the
Arrow IPC decoding) and handing them to Spark (its Arrow serializer writes them to the
JVM). Done in turn, the broker's side waits while Spark's is busy and the reverse: a
fetch's next part, and the next fetch (which starts only when the last one's trailer has
said where), are not asked for while the task yields. :func:`prefetched` runs the range's
reading on a receiver thread that hands its batches over through a queue bounded in
bytes, so both go on at once (both release the GIL in Arrow's and gRPC's C++ code).

**Memory bound**: a task holds at most ``limit`` bytes of received batches not yet
yielded (``PREFETCH_MAX_BYTES``, 16 MiB, by default), plus the one batch the receiver is
waiting to queue (a batch larger than the bound is queued alone) and gRPC's flow-control
window; the rows themselves, their order and which ones are read are the reader's
(``reader.read_range``), unchanged.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from typing import Final, TypeAlias

import pyarrow as pa

__all__ = ["PREFETCH_MAX_BYTES", "prefetched"]

PREFETCH_MAX_BYTES: Final = 16 * 1024 * 1024


class _End:
    """The receiver read its range to the end."""


END: Final = _End()
_Item: TypeAlias = pa.RecordBatch | BaseException | _End


class Handoff:
    """A queue from one receiver to one consumer, bounded in bytes: :meth:`put` waits
    while the queued bytes plus the new item's would pass ``limit`` (an item is always
    admitted into an empty queue, so one larger than the bound still passes, alone), and
    returns False once the consumer has gone (:meth:`close`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: deque[tuple[_Item, int]] = deque()
        self._bytes = 0
        self._closed = False
        self._changed = threading.Condition()

    @property
    def queued_bytes(self) -> int:
        with self._changed:
            return self._bytes

    def put(self, item: _Item, size: int = 0) -> bool:
        """Queue ``item`` (``size`` bytes) once it fits; False if the consumer is gone."""
        with self._changed:
            while not self._closed and self._items and self._bytes + size > self.limit:
                self._changed.wait()
            if self._closed:
                return False
            self._items.append((item, size))
            self._bytes += size
            self._changed.notify_all()
            return True

    def get(self) -> _Item:
        """The next item, waiting for the receiver."""
        with self._changed:
            while not self._items:
                self._changed.wait()
            item, size = self._items.popleft()
            self._bytes -= size
            self._changed.notify_all()
            return item

    def close(self) -> None:
        """The consumer is gone: the receiver's waiting or next put returns False."""
        with self._changed:
            self._closed = True
            self._items.clear()
            self._bytes = 0
            self._changed.notify_all()


def _receive(source: Iterator[pa.RecordBatch], handoff: Handoff) -> None:
    try:
        for batch in source:
            if not handoff.put(batch, batch.nbytes):
                return  # the consumer stopped early (a limit): stop reading too
        handoff.put(END)
    except BaseException as exc:
        # Raised by the consumer in the task; dropped only if the consumer has already
        # stopped (then nothing waits for the rows this error concerns).
        handoff.put(exc)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()  # read_range's finally: its stream cancelled, its client closed


def prefetched(
    source: Iterator[pa.RecordBatch], limit: int = PREFETCH_MAX_BYTES
) -> Iterator[pa.RecordBatch]:
    """``source``'s batches, in order, read ahead by a receiver thread by at most
    ``limit`` bytes. An error of ``source`` is raised here, after the batches before it,
    as it was raised there; closing this generator early stops the receiver at its next
    batch (it is a daemon thread: a receive blocked on a dead broker does not keep the
    worker alive, and ends with the call's own timeout)."""
    handoff = Handoff(limit)
    receiver = threading.Thread(
        target=_receive, args=(source, handoff), name="idemlog-fetch-receiver", daemon=True
    )
    receiver.start()
    try:
        while True:
            item = handoff.get()
            if isinstance(item, _End):
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        handoff.close()
