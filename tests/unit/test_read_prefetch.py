"""``spark_sink.read_prefetch``: a range received on a thread of its own, handed over in
order through a queue bounded in bytes; errors raised in the task, early close stops
the receiver. (Through real Spark and a real broker: every read in tests/spark.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest

from broker_core.errors import NetworkError
from spark_sink.read_prefetch import END, Handoff, prefetched
from tests.harness.waiting import wait_until


def batch(i: int, rows: int = 100) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": pa.array([i] * rows, pa.int64())})


class Source:
    """Batches 0..n-1 (then ``error``, if given); remembers what it produced and whether
    it was closed."""

    def __init__(self, n: int, error: Exception | None = None) -> None:
        self.produced = 0
        self.closed = threading.Event()
        self._gen = self._run(n, error)

    def _run(self, n: int, error: Exception | None) -> Iterator[pa.RecordBatch]:
        try:
            for i in range(n):
                self.produced += 1
                yield batch(i)
            if error is not None:
                raise error
        finally:
            self.closed.set()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self

    def __next__(self) -> pa.RecordBatch:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()


def test_every_batch_in_order_and_the_source_closed() -> None:
    source = Source(50)
    out = [b.column(0)[0].as_py() for b in prefetched(source, limit=batch(0).nbytes * 3)]
    assert out == list(range(50))
    assert source.closed.is_set()


def test_an_error_is_raised_after_the_batches_before_it() -> None:
    source = Source(3, NetworkError("link broke"))
    got = []
    with pytest.raises(NetworkError, match="link broke"):
        for b in prefetched(source):
            got.append(b.column(0)[0].as_py())
    assert got == [0, 1, 2]


def test_the_receiver_reads_ahead_at_most_the_bound() -> None:
    size = batch(0).nbytes
    source = Source(100)
    reader = prefetched(source, limit=size * 4)
    assert next(reader).column(0)[0].as_py() == 0
    # The receiver fills the queue up to the bound (4 batches) plus the one it holds
    # waiting for room, and no further while nothing is taken.
    wait_until(lambda: source.produced >= 6, "the receiver read ahead")
    assert not source.closed.is_set()
    assert source.produced == 6, "read ahead past the bound"
    assert [b.column(0)[0].as_py() for b in reader] == list(range(1, 100))


def test_closing_early_stops_the_receiver_and_closes_the_source() -> None:
    source = Source(1000)
    reader = prefetched(source, limit=batch(0).nbytes * 2)
    next(reader)
    reader.close()
    wait_until(source.closed.is_set, "the receiver closed its source")
    assert source.produced < 1000


def test_a_put_waits_for_room_and_a_batch_larger_than_the_bound_passes_alone() -> None:
    handoff = Handoff(limit=10)
    assert handoff.put("a", 6) and handoff.put("b", 4)  # type: ignore[arg-type]
    done = threading.Event()

    def put_third() -> None:
        handoff.put("c", 1)  # type: ignore[arg-type]
        done.set()

    putter = threading.Thread(target=put_third, daemon=True)
    putter.start()
    # Blocked on the bound: it waits until a get makes room (10 + 1 > 10).
    assert not done.wait(0.2)
    assert handoff.get() == "a"
    assert done.wait(5) and handoff.queued_bytes == 5
    assert handoff.get() == "b" and handoff.get() == "c"
    assert handoff.put("huge", 1000)  # type: ignore[arg-type]
    assert handoff.queued_bytes == 1000
    handoff.close()
    assert not handoff.put(END)  # the consumer is gone
