"""What a send() returns: a ``concurrent.futures.Future`` of the rows' log offsets.

One send may be split over several partitions (keyed rows) and, when large, over several
produced batches of one partition. Its future therefore always resolves to a **list** of
:class:`RecordMetadata`, one per contiguous run of the send's rows in the log, sorted by
(partition, base_offset). ``sum(m.num_rows for m in result) == rows sent``.

A run answered ``DUPLICATE_SEQUENCE_NUMBER`` (written before, offsets no longer cached by
the broker) is a success with ``base_offset = last_offset = -1`` and ``duplicate=True``.
If any part of a send fails for good, the future fails with that part's error (the
broker's typed error); other parts may still have been written.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import NamedTuple

UNKNOWN_OFFSET = -1


class RecordMetadata(NamedTuple):
    partition: int
    base_offset: int
    last_offset: int
    num_rows: int
    duplicate: bool = False


SendResult = list[RecordMetadata]


class SendCollector:
    """Gathers the parts of one send and completes its future once every part is in."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.future: Future[SendResult] = Future()
        self._lock = threading.Lock()
        self._parts: list[RecordMetadata] = []
        self._expected = 0
        self._sealed = False
        self._failed = False

    def add_part(self) -> None:
        """One more part will be reported (called while the send is being split)."""
        with self._lock:
            self._expected += 1

    def seal(self) -> None:
        """Every part is registered; complete now if they are all reported already."""
        with self._lock:
            self._sealed = True
        self._maybe_complete()

    def part_done(self, meta: RecordMetadata) -> None:
        with self._lock:
            self._parts.append(meta)
        self._maybe_complete()

    def part_failed(self, error: BaseException) -> None:
        with self._lock:
            if self._failed or self.future.done():
                return
            self._failed = True
        self.future.set_exception(error)

    def _maybe_complete(self) -> None:
        with self._lock:
            if self._failed or not self._sealed or len(self._parts) < self._expected:
                return
            if self.future.done():
                return
            parts = sorted(self._parts, key=lambda m: (m.partition, m.base_offset))
        self.future.set_result(parts)
