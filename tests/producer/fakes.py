"""Fakes of the producer tests: a scripted transport the test answers send by send
(``FakeTransport``), one that answers at once (``AutoTransport``), and a manual clock."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from broker_core.errors import IdemlogError, error_for_code
from broker_core.producer.producer_batch import TopicPartition
from broker_core.protocol.wire import ProduceResponse


def table(n: int, start: int = 0) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "key": (ids % 13).astype(np.int64)})


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeHandle:
    def __init__(self) -> None:
        self._response: ProduceResponse | None = None
        self._error: IdemlogError | None = None
        self._callbacks: list[Callable[[], None]] = []

    def done(self) -> bool:
        return self._response is not None or self._error is not None

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        if self.done():
            callback()
        else:
            self._callbacks.append(callback)

    def settle(self) -> None:
        """Wake whoever waits on the answer just scripted (the sender thread)."""
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def result(self, timeout: float | None = None) -> ProduceResponse:
        if self._error is not None:
            raise self._error
        assert self._response is not None, "not answered yet"
        return self._response


@dataclass
class Sent:
    tp: TopicPartition
    rows: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    handle: FakeHandle

    def ok(self, base_offset: int, duplicate: bool = False) -> None:
        self.handle._response = ProduceResponse(
            0, 0, base_offset, base_offset + self.rows - 1, 0, duplicate
        )
        self.handle.settle()

    def error(self, code: int) -> None:
        self.handle._response = ProduceResponse.failure(0, error_for_code(code, "scripted"))
        self.handle.settle()

    def broken(self, error: IdemlogError) -> None:
        self.handle._error = error
        self.handle.settle()


@dataclass
class FakeTransport:
    """Records every send; the test answers each one (in any order)."""

    partitions: int = 1
    sent: list[Sent] = field(default_factory=list)
    pids: list[tuple[int, int]] = field(default_factory=lambda: [(100, 0), (101, 0), (102, 0)])
    init_calls: list[str | None] = field(default_factory=list)
    resets: list[TopicPartition] = field(default_factory=list)
    added: list[list[TopicPartition]] = field(default_factory=list)
    ended: list[bool] = field(default_factory=list)
    prepared: list[int] = field(default_factory=list)

    def partitions_for(self, topic: str) -> int:
        return self.partitions

    def send(
        self,
        tp: TopicPartition,
        batch: pa.RecordBatch,
        *,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        transactional: bool,
    ) -> FakeHandle:
        handle = FakeHandle()
        self.sent.append(
            Sent(tp, batch.num_rows, producer_id, producer_epoch, base_sequence, handle)
        )
        return handle

    def reset(self, tp: TopicPartition, error: IdemlogError) -> None:
        self.resets.append(tp)

    def init_producer_id(
        self, transactional_id: str | None, transaction_timeout_ms: int | None
    ) -> tuple[int, int]:
        self.init_calls.append(transactional_id)
        return self.pids[len(self.init_calls) - 1]

    def add_partitions_to_txn(
        self, transactional_id: str, producer_id: int, epoch: int, tps: Sequence[TopicPartition]
    ) -> None:
        self.added.append(list(tps))

    def end_txn(
        self, transactional_id: str, producer_id: int, epoch: int, commit: bool
    ) -> tuple[int, int]:
        self.ended.append(commit)
        return producer_id, epoch + 1  # each transaction ends at its own epoch (KIP-890)

    def within(self, seconds: float) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()  # a scripted answer takes no time

    def prepare_sink_txn(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        batch_id: int,
        ranges: Sequence[tuple[str, int, int, int]],
    ) -> None:
        self.prepared.append(batch_id)

    def close(self) -> None:
        pass


class AutoTransport(FakeTransport):
    """Answers every batch at once: success, or the next scripted error code."""

    def __init__(self, partitions: int = 2) -> None:
        super().__init__(partitions=partitions)
        self.errors: list[int] = []
        self.offsets: dict[TopicPartition, int] = {}

    def send(
        self,
        tp: TopicPartition,
        batch: pa.RecordBatch,
        *,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        transactional: bool,
    ) -> FakeHandle:
        handle = super().send(
            tp,
            batch,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            transactional=transactional,
        )
        sent = self.sent[-1]
        if self.errors:
            sent.error(self.errors.pop(0))
        else:
            base = self.offsets.get(tp, 0)
            self.offsets[tp] = base + sent.rows
            sent.ok(base)
        return handle
