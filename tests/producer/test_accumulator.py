"""The accumulator: batch.size, linger.ms, buffer.memory blocking and its timeout."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

from broker_core.producer.errors import BufferExhaustedError
from broker_core.producer.futures import SendCollector
from broker_core.producer.message_accumulator import MessageAccumulator
from broker_core.producer.producer_batch import TopicPartition
from tests.producer.fakes import ManualClock

TP = TopicPartition("t", 0)


def rows(n: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(np.arange(n, dtype=np.int64))], names=["id"])  # 8 B/row


def acc(clock: ManualClock, **kw: int) -> MessageAccumulator:
    values = {"batch_size": 800, "linger_ms": 10, "buffer_memory": 10_000, "max_block_ms": 50}
    values.update(kw)
    return MessageAccumulator(clock=clock, **values)


def always(_tp: TopicPartition, _b: object) -> bool:
    return True


def test_small_appends_merge_up_to_batch_size(clock: ManualClock) -> None:
    a = acc(clock)
    c = SendCollector("t")
    for _ in range(25):
        a.append(TP, rows(10), c)  # 80 bytes each: 10 per batch of 800
    sizes = [(b.num_rows, b.size_bytes) for b in a.queued(TP)]
    assert sizes == [(100, 800), (100, 800), (50, 400)]


def test_large_append_is_split(clock: ManualClock) -> None:
    a = acc(clock)
    a.append(TP, rows(250), SendCollector("t"))
    assert [b.num_rows for b in a.queued(TP)] == [100, 100, 50]


def test_linger(clock: ManualClock) -> None:
    a = acc(clock)
    a.append(TP, rows(10), SendCollector("t"))
    ready, wait = a.ready(clock(), always)
    assert ready == [] and wait == pytest.approx(0.010)
    clock.advance(0.010)
    assert a.ready(clock(), always)[0] == [TP]
    a.append(TP, rows(100), SendCollector("t"))  # a full batch is ready at once
    b = acc(clock)
    b.append(TP, rows(100), SendCollector("t"))
    assert b.ready(clock(), always)[0] == [TP]
    c = acc(clock)
    c.append(TP, rows(1), SendCollector("t"))
    c.begin_flush()  # a flush does not wait for linger
    assert c.ready(clock(), always)[0] == [TP]


def test_buffer_memory_blocks_until_freed() -> None:
    a = MessageAccumulator(batch_size=800, linger_ms=0, buffer_memory=1600, max_block_ms=5000)
    a.append(TP, rows(200), SendCollector("t"))  # 1600 bytes: full
    done = threading.Event()

    def blocked() -> None:
        a.append(TP, rows(100), SendCollector("t"))
        done.set()

    thread = threading.Thread(target=blocked)
    thread.start()
    assert not done.wait(0.1), "append must block while buffer.memory is exhausted"
    batch = a.drain(TP)
    assert batch is not None
    a.deallocate(batch)  # acknowledged: memory comes back
    assert done.wait(5)
    thread.join()
    assert a.used_bytes() == 1600


def test_buffer_memory_timeout_is_a_clear_error() -> None:
    a = MessageAccumulator(batch_size=800, linger_ms=0, buffer_memory=1600, max_block_ms=50)
    a.append(TP, rows(200), SendCollector("t"))
    with pytest.raises(BufferExhaustedError, match=r"max.block.ms=50 .*buffer.memory=1600"):
        a.append(TP, rows(1), SendCollector("t"))


def test_reenqueue_keeps_sequence_order(clock: ManualClock) -> None:
    a = acc(clock, batch_size=80)
    for _ in range(3):
        a.append(TP, rows(10), SendCollector("t"))
    drained = [a.drain(TP) for _ in range(3)]
    for i, b in enumerate(drained):
        assert b is not None
        b.assign(1, 0, 10 * i, i)
    a.append(TP, rows(10), SendCollector("t"))  # never drained
    for b in (drained[2], drained[0], drained[1]):
        assert b is not None
        a.reenqueue(b)
    assert [b.base_sequence for b in a.queued(TP)] == [0, 10, 20, -1]
