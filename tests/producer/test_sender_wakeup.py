"""The sender sleeps while batches are in flight and is woken by their answers
(docs/producer.md, "The sender thread"): no 2 ms poll.

Each test makes the sender's longest wait (``idle_s``) far longer than the test's deadline,
so an answer that did not wake the sender could only be seen after that wait, and the
test would fail on its deadline.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import NetworkError
from broker_core.producer import Producer
from broker_core.producer import sender as sender_module
from broker_core.producer.config import ProducerConfig
from broker_core.producer.futures import SendCollector
from broker_core.producer.message_accumulator import MessageAccumulator
from broker_core.producer.metrics import ProducerMetrics
from broker_core.producer.producer_batch import TopicPartition
from broker_core.producer.sender import Sender
from broker_core.producer.transaction_manager import TransactionManager
from tests.harness.broker import BrokerProcess
from tests.harness.waiting import wait_until
from tests.producer.fakes import FakeTransport, table

TP = TopicPartition("t", 0)
NEVER_S = 600.0  # the sender's longest wait in these tests: far past every deadline
DEADLINE_S = 10.0


class _Counted(Sender):
    """A sender counting its steps (``run_once`` calls by its thread)."""

    steps = 0

    def run_once(self) -> float:
        self.steps += 1
        return super().run_once()


def _threaded_sender(transport: FakeTransport) -> tuple[_Counted, MessageAccumulator]:
    config = ProducerConfig.from_mapping({"linger.ms": 0, "retry.backoff.ms": 0})
    accumulator = MessageAccumulator.from_config(config)
    txn = TransactionManager(None)
    txn.set_producer_id(*transport.init_producer_id(None, None))
    sender = _Counted(accumulator, txn, transport, config, ProducerMetrics(), idle_s=NEVER_S)
    return sender, accumulator


@pytest.mark.parametrize("answer", ["ok", "broken"])
def test_a_batch_in_flight_costs_no_steps_until_its_answer_wakes_the_sender(answer: str) -> None:
    transport = FakeTransport()
    sender, accumulator = _threaded_sender(transport)
    sender.start()
    try:
        collector = SendCollector("t")
        for batch in table(10).to_batches():
            accumulator.append(TP, batch, collector)
        collector.seal()
        (sent,) = wait_until(lambda: list(transport.sent), "the batch sent")
        steps_at_send = sender.steps
        # The in-flight window being measured: a poll would step ~150 times in it.
        threading.Event().wait(0.3)
        idle_steps = sender.steps - steps_at_send
        if answer == "ok":
            sent.ok(0)
            (result,) = collector.future.result(DEADLINE_S)
            assert result.base_offset == 0
        else:
            sent.broken(NetworkError("connection reset"))  # retried: sent again
            wait_until(lambda: len(transport.sent) == 2, "the batch resent after the wake")
            transport.sent[1].ok(0)
            collector.future.result(DEADLINE_S)
        assert idle_steps <= 1, f"{idle_steps} steps with one batch in flight and no answer"
    finally:
        sender.stop()


def test_answers_of_a_real_broker_wake_the_sender(
    broker: BrokerProcess, client: BrokerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real Flight stream (``ProduceHandle``'s reader thread): one batch at a
    time, each acknowledged only because its answer woke the sender."""
    monkeypatch.setattr(sender_module, "IDLE_S", NEVER_S)
    client.create_topic("wake", 1)
    ids = np.arange(50, dtype=np.int64)
    with Producer(broker.address, **{"linger.ms": 0}) as producer:
        assert producer.sender.idle_s == NEVER_S
        for i in range(5):  # the next send only after the previous answer
            chunk = pa.table({"id": ids[i * 10 : (i + 1) * 10]})
            (result,) = producer.send("wake", chunk).result(DEADLINE_S)
            assert result.base_offset == i * 10


def test_a_merged_append_does_not_wake_the_sender_a_new_batch_does() -> None:
    """Only what changes the sender's answer wakes it: a chunk merged into the open batch
    (not due before its linger deadline) costs no step; the chunk that does not fit opens
    a new batch, which makes the head due, and its wake sends the head at once, long before
    the linger deadline (ten minutes) or the sender's longest wait."""
    transport = FakeTransport()
    config = ProducerConfig.from_mapping(
        {
            "linger.ms": 600_000,
            "delivery.timeout.ms": 700_000,
            "batch.size": 10 * table(1).nbytes + 1,
            "retry.backoff.ms": 0,
        }
    )
    accumulator = MessageAccumulator.from_config(config)
    txn = TransactionManager(None)
    txn.set_producer_id(*transport.init_producer_id(None, None))
    sender = _Counted(accumulator, txn, transport, config, ProducerMetrics(), idle_s=NEVER_S)
    sender.start()
    try:
        collector = SendCollector("t")
        accumulator.append(TP, table(1).to_batches()[0], collector)  # opens the batch
        wait_until(lambda: sender.steps >= 2, "the sender stepped for the new batch")
        steps = sender.steps
        for i in range(1, 10):  # nine more rows, merged into the open batch
            accumulator.append(TP, table(1, start=i).to_batches()[0], collector)
        threading.Event().wait(0.3)  # a notify per append would have stepped it 9 times
        assert sender.steps == steps, f"{sender.steps - steps} steps for merged appends"
        assert not transport.sent and len(accumulator.queued(TP)) == 1
        accumulator.append(TP, table(1, start=10).to_batches()[0], collector)  # no room left
        collector.seal()
        (sent,) = wait_until(lambda: list(transport.sent), "the full head batch sent")
        assert sent.rows == 10
        assert [b.num_rows for b in accumulator.queued(TP)] == [1]  # the new one lingers
    finally:
        sender.stop()
