"""Deterministic sender tests (docs/design.md §9 items 13-15) against a scripted fake transport.

The sender is stepped by hand (``run_once``) with a manual clock: no thread, no sleeps.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pytest

from broker_core.errors import ErrorCode, NetworkError
from broker_core.producer.config import ProducerConfig
from broker_core.producer.errors import DeliveryTimeoutError
from broker_core.producer.futures import SendCollector, SendResult
from broker_core.producer.message_accumulator import MessageAccumulator
from broker_core.producer.metrics import ProducerMetrics
from broker_core.producer.producer_batch import TopicPartition
from broker_core.producer.sender import Sender
from broker_core.producer.transaction_manager import TransactionManager, TxnState
from tests.producer.fakes import FakeTransport, ManualClock, table

TP = TopicPartition("t", 0)
OOS = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER.code
DUP = ErrorCode.DUPLICATE_SEQUENCE_NUMBER.code


@dataclass
class Rig:
    sender: Sender
    accumulator: MessageAccumulator
    txn: TransactionManager
    transport: FakeTransport
    metrics: ProducerMetrics
    clock: ManualClock

    def append(self, n: int, start: int = 0) -> Future[SendResult]:
        collector = SendCollector("t")
        for batch in table(n, start).to_batches():
            self.accumulator.append(TP, batch, collector)
        collector.seal()
        return collector.future

    def step(self) -> None:
        self.sender.run_once()

    def seqs(self, sent: list[Any]) -> list[tuple[int, int, int]]:
        return [(s.producer_id, s.producer_epoch, s.base_sequence) for s in sent]


def rig(clock: ManualClock, **overrides: Any) -> Rig:
    values: dict[str, Any] = {"linger.ms": 0, "retry.backoff.ms": 0, "batch.size": 200}
    values.update(overrides)
    config = ProducerConfig.from_mapping(values)
    transport = FakeTransport()
    accumulator = MessageAccumulator.from_config(config, clock)
    txn = TransactionManager(None)
    txn.set_producer_id(*transport.init_producer_id(None, None))
    metrics = ProducerMetrics()
    sender = Sender(accumulator, txn, transport, config, metrics, clock=clock)
    return Rig(sender, accumulator, txn, transport, metrics, clock)


def test_three_in_flight_first_fails_others_out_of_order(clock: ManualClock) -> None:
    """§9.13: resent one at a time in sequence order; a 4th batch gets no sequence until
    then."""
    r = rig(clock)
    futures = [r.append(10, 10 * i) for i in range(3)]  # 10 rows = 160 bytes: one batch each
    r.step()
    first = list(r.transport.sent)
    assert r.seqs(first) == [(100, 0, 0), (100, 0, 10), (100, 0, 20)]
    first[0].broken(NetworkError("connection reset"))
    first[1].error(OOS)
    first[2].error(OOS)
    r.step()  # answers handled, and the first retry goes out alone
    fourth = r.append(10, 30)
    r.step()
    resent = r.transport.sent[3:]
    assert r.seqs(resent) == [(100, 0, 0)], "only the first batch is resent"
    for expected in (10, 20):
        r.step()
        assert len(r.transport.sent) == 3 + len(resent), "one in flight while retrying"
        queued = r.accumulator.queued(TP)
        assert not queued[-1].has_sequence, "the 4th batch has no sequence yet"
        resent[-1].ok(base_offset=expected - 10)
        r.step()
        resent = r.transport.sent[3:]
        assert resent[-1].base_sequence == expected
    resent[-1].ok(base_offset=20)
    r.step()
    last = r.transport.sent[-1]
    assert (last.base_sequence, last.rows) == (30, 10), "the 4th batch follows at seq 30"
    last.ok(base_offset=30)
    r.step()
    offsets = [f.result(0)[0][1:3] for f in [*futures, fourth]]
    assert offsets == [(0, 9), (10, 19), (20, 29), (30, 39)]
    assert r.transport.init_calls == [None], "no epoch bump"
    snap = r.metrics.snapshot()
    assert (snap["retries"], snap["out_of_order_resends"]) == (1, 2)


def test_out_of_order_answers_both_failing_are_resent_in_order(clock: ManualClock) -> None:
    """§9.14: the second batch's answer comes first; both fail; resent in sequence order."""
    r = rig(clock)
    futures = [r.append(10, 10 * i) for i in range(2)]
    r.step()
    a, b = r.transport.sent
    b.error(OOS)  # the later batch is answered first
    r.step()
    assert len(r.transport.sent) == 2, "nothing resent while the first is in flight"
    a.broken(NetworkError("timeout"))
    r.step()
    r.step()
    assert [s.base_sequence for s in r.transport.sent[2:]] == [0]
    r.transport.sent[2].ok(0)
    r.step()
    r.step()
    assert [s.base_sequence for s in r.transport.sent[2:]] == [0, 10]
    r.transport.sent[3].ok(10)
    r.step()
    assert [f.result(0)[0][1] for f in futures] == [0, 10]


def test_all_in_flight_failed_for_good_bumps_epoch_and_restarts_at_zero(
    clock: ManualClock,
) -> None:
    """§9.15: every in-flight batch fails for good -> new producer id/epoch, seq 0."""
    r = rig(clock, retries=0)
    futures = [r.append(10, 10 * i) for i in range(3)]
    r.step()
    for sent in r.transport.sent:
        sent.broken(NetworkError("broker gone"))
    r.step()
    for future in futures:  # failed with the broker's (transport's) error, not dropped
        with pytest.raises(NetworkError):
            future.result(0)
    assert r.transport.init_calls == [None, None], "the epoch was bumped once"
    nxt = r.append(10, 30)
    r.step()
    last = r.transport.sent[-1]
    assert (last.producer_id, last.producer_epoch, last.base_sequence) == (101, 0, 0)
    last.ok(30)
    r.step()
    assert nxt.result(0)[0][1:3] == (30, 39)
    snap = r.metrics.snapshot()
    assert snap["epoch_bumps"] == 1 and snap["record_errors"] == 30


def test_queued_batches_after_an_unresolved_one_are_resequenced(clock: ManualClock) -> None:
    """A batch failing for good leaves a gap: later ones (OOS) are not dropped but resent
    under the new epoch from sequence 0."""
    r = rig(clock, retries=0)
    futures = [r.append(10, 10 * i) for i in range(2)]
    r.step()
    a, b = r.transport.sent
    a.broken(NetworkError("lost"))
    b.error(OOS)
    r.step()
    r.step()
    assert r.transport.init_calls == [None, None]
    resent = r.transport.sent[2:]
    assert r.seqs(resent) == [(101, 0, 0)]
    resent[0].ok(0)
    r.step()
    with pytest.raises(NetworkError):
        futures[0].result(0)
    assert futures[1].result(0)[0][1:3] == (0, 9)


def test_duplicate_sequence_is_a_success(clock: ManualClock) -> None:
    r = rig(clock)
    dup, known = r.append(10), r.append(10, 10)
    r.step()
    a, b = r.transport.sent
    a.error(DUP)  # written before, offsets no longer cached
    b.ok(50, duplicate=True)  # duplicate inside the cached window: original offsets
    r.step()
    (meta,) = dup.result(0)
    assert (meta.base_offset, meta.last_offset, meta.num_rows, meta.duplicate) == (-1, -1, 10, True)
    assert known.result(0)[0][1:] == (50, 59, 10, True)
    snap = r.metrics.snapshot()
    assert (snap["duplicates"], snap["record_errors"], snap["records_sent"]) == (2, 0, 20)


def test_non_retriable_error_fails_the_future_with_the_brokers_error(clock: ManualClock) -> None:
    r = rig(clock)
    future = r.append(10)
    r.step()
    r.transport.sent[0].error(ErrorCode.MESSAGE_TOO_LARGE.code)
    r.step()
    with pytest.raises(Exception, match="MESSAGE_TOO_LARGE"):
        future.result(0)
    assert r.metrics.snapshot()["record_error_rate"] == 1.0


def test_at_most_max_in_flight_per_partition(clock: ManualClock) -> None:
    r = rig(clock, **{"max.in.flight.requests.per.connection": 2})
    for i in range(4):
        r.append(10, 10 * i)
    r.step()
    assert len(r.transport.sent) == 2
    r.transport.sent[0].ok(0)
    r.step()
    assert [s.base_sequence for s in r.transport.sent] == [0, 10, 20]


def test_delivery_timeout_fails_queued_batches(clock: ManualClock) -> None:
    r = rig(clock, **{"delivery.timeout.ms": 1000, "request.timeout.ms": 500})
    future = r.append(10)
    r.step()
    clock.advance(0.6)  # unanswered past request.timeout.ms: the stream is dropped
    r.step()
    assert r.transport.resets == [TP]
    r.transport.sent[0].broken(NetworkError("dropped"))
    r.step()  # requeued
    clock.advance(0.5)
    r.step()  # resent, then no answer: expires once unanswered and queued again
    r.transport.sent[-1].broken(NetworkError("dropped"))
    r.step()
    with pytest.raises(NetworkError):
        future.result(0)


def test_idempotent_only_expiry_without_a_sequence_changes_nothing_else(
    clock: ManualClock,
) -> None:
    """Issue 11: the transactional rule (any failed batch fails the transaction) leaves the
    idempotent-only producer as it was: a batch that expired before it got a sequence
    fails alone -- no epoch bump, no error state, the next batch continues the sequence."""
    r = rig(
        clock,
        **{
            "max.in.flight.requests.per.connection": 1,
            "delivery.timeout.ms": 1000,
            "request.timeout.ms": 500,
        },
    )
    first, queued = r.append(10), r.append(10, 10)
    r.step()
    assert r.seqs(r.transport.sent) == [(100, 0, 0)], "the 2nd batch waits (1 in flight)"
    clock.advance(1.0)
    r.step()
    error = queued.exception(0)
    assert isinstance(error, DeliveryTimeoutError), error
    r.transport.sent[0].ok(0)
    r.step()
    assert first.result(0)[0][1:3] == (0, 9)
    nxt = r.append(10, 20)
    r.step()
    assert r.seqs(r.transport.sent) == [(100, 0, 0), (100, 0, 10)], "same epoch, next seq"
    assert r.transport.init_calls == [None], "no epoch bump"
    assert r.txn.state is TxnState.UNINITIALIZED and r.txn.last_error is None
    r.transport.sent[-1].ok(10)
    r.step()
    assert nxt.result(0)[0][1:3] == (10, 19)
