"""Issue 11, item 1: a batch of a transactional producer that fails for good fails its
transaction -- also when it never got a sequence -- so commit / prepare refuse with the
batch's error instead of committing the transaction without its rows.

Most tests run the Producer facade's real sender thread over a scripted transport and a
manual clock: the test decides when delivery.timeout.ms has passed, and waits on events (a
call reached the transport, a future failed), never on sleeps. The last one runs against a
REAL broker behind the fault proxy (tests/producer/action_faults.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import CoordinatorNotAvailableError, NetworkError
from broker_core.producer import DeliveryTimeoutError, Producer, TxnState
from broker_core.producer.producer_batch import TopicPartition
from broker_core.protocol.wire import Action
from tests.producer.action_faults import ActionFault, ActionFaultProxy
from tests.producer.fakes import FakeHandle, FakeTransport, ManualClock, table

TP = TopicPartition("t", 0)
TIMEOUTS: dict[str, Any] = {
    "linger.ms": 0,
    "retry.backoff.ms": 0,
    "request.timeout.ms": 500,
    "delivery.timeout.ms": 1000,
    "max.block.ms": 5000,
    "batch.size": 200,  # 10 rows of table() = 160 bytes: one batch per send
}
WAIT_S = 10.0  # upper bound for the sender thread to react; never reached when all is well


class ScriptedTransport(FakeTransport):
    """``FakeTransport`` whose calls can be waited for, with a scripted AddPartitionsToTxn."""

    def __init__(self) -> None:
        super().__init__(partitions=1)
        self.changed = threading.Condition()
        self.add_errors: list[Exception] = []  # raised by AddPartitionsToTxn, in turn
        self.add_calls = 0

    def wait_for(self, what: str, condition: Callable[[], bool]) -> None:
        with self.changed:
            assert self.changed.wait_for(condition, WAIT_S), f"the sender never {what}"

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
        with self.changed:
            handle = super().send(
                tp,
                batch,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                base_sequence=base_sequence,
                transactional=transactional,
            )
            self.changed.notify_all()
        return handle

    def add_partitions_to_txn(
        self, transactional_id: str, producer_id: int, epoch: int, tps: Sequence[TopicPartition]
    ) -> None:
        with self.changed:
            self.add_calls += 1
            self.changed.notify_all()
            if self.add_errors:
                raise self.add_errors.pop(0)
            super().add_partitions_to_txn(transactional_id, producer_id, epoch, tps)


def transactional(transport: ScriptedTransport, clock: ManualClock) -> Producer:
    producer = Producer(transport=transport, clock=clock, transactional_id="tx", **TIMEOUTS)
    producer.init_transactions()
    producer.begin_transaction()
    return producer


def refuse(producer: Producer, action: str) -> None:
    if action == "commit":
        producer.commit_transaction()
    else:
        producer.prepare_sink_transaction(7)


@pytest.mark.parametrize("action", ["commit", "prepare"])
def test_batch_expired_before_it_got_a_sequence_fails_the_transaction(
    clock: ManualClock, action: str
) -> None:
    """AddPartitionsToTxn keeps failing retriably (coordinator loading): the batch is never
    drained, never gets a sequence, and expires. The transaction must not commit."""
    transport = ScriptedTransport()
    transport.add_errors = [CoordinatorNotAvailableError("loading")] * 1000
    producer = transactional(transport, clock)
    try:
        future = producer.send("t", table(10))
        transport.wait_for("tried AddPartitionsToTxn", lambda: transport.add_calls >= 1)
        clock.advance(1.0)  # delivery.timeout.ms passes while the partition is not added
        error = future.exception(WAIT_S)
        assert isinstance(error, DeliveryTimeoutError), error
        assert "COORDINATOR_NOT_AVAILABLE" in str(error), "names what held the batch back"
        assert producer.txn.state is TxnState.ABORTABLE_ERROR
        with pytest.raises(DeliveryTimeoutError) as refused:
            refuse(producer, action)
        assert refused.value is error, "refused with the batch's own error"
        # The scenario really happened: the batch never reached the wire, no sequence was
        # taken, and the coordinator was asked to end / prepare nothing.
        assert transport.sent == [] and transport.added == []
        assert producer.txn.partition(TP).next_sequence == 0
        assert transport.ended == [] and transport.prepared == []
        producer.abort_transaction()  # the way out; nothing was added, nothing to end
        assert producer.txn.state is TxnState.READY
    finally:
        producer.close(timeout=0)


@pytest.mark.parametrize("action", ["commit", "prepare"])
def test_batch_expired_queued_behind_a_retrying_partition_fails_the_transaction(
    clock: ManualClock, action: str
) -> None:
    """The 1st batch's stream breaks; while its retry is in flight (one at a time while a
    partition retries) the 2nd batch waits without a sequence and expires. The 1st then
    succeeds: committing now would silently drop the 2nd batch's rows."""
    transport = ScriptedTransport()
    producer = transactional(transport, clock)
    try:
        first = producer.send("t", table(10))
        transport.wait_for("sent the 1st batch", lambda: len(transport.sent) == 1)
        transport.sent[0].broken(NetworkError("connection reset"))
        transport.wait_for("resent the 1st batch", lambda: len(transport.sent) == 2)
        second = producer.send("t", table(10, 10))
        clock.advance(1.0)  # the 2nd batch, still queued, passes delivery.timeout.ms
        error = second.exception(WAIT_S)
        assert isinstance(error, DeliveryTimeoutError), error
        retry = transport.sent[1]
        assert (retry.base_sequence, retry.rows) == (0, 10), "only the 1st batch was sent"
        retry.ok(0)
        assert first.result(WAIT_S)[0].num_rows == 10, "the retried batch itself succeeded"
        assert producer.txn.state is TxnState.ABORTABLE_ERROR
        with pytest.raises(DeliveryTimeoutError) as refused:
            refuse(producer, action)
        assert refused.value is error
        assert len(transport.sent) == 2, "the expired batch never reached the wire"
        assert transport.ended == [] and transport.prepared == []
        producer.abort_transaction()
        assert transport.ended == [] and len(transport.init_calls) == 2, "epoch bumped"
    finally:
        producer.close(timeout=0)


def test_commit_after_the_failure_refuses_with_the_batch_error_not_a_state_error(
    clock: ManualClock,
) -> None:
    """The transaction already failed when commit is called (not during its flush)."""
    transport = ScriptedTransport()
    producer = transactional(transport, clock)
    try:
        future = producer.send("t", table(10))
        transport.wait_for("sent the batch", lambda: len(transport.sent) == 1)
        transport.sent[0].error(10)  # MESSAGE_TOO_LARGE: definite, not retriable
        error = future.exception(WAIT_S)
        assert error is not None and producer.txn.state is TxnState.ABORTABLE_ERROR
        for call in (producer.commit_transaction, lambda: producer.prepare_sink_transaction(1)):
            with pytest.raises(type(error)) as refused:
                call()
            assert refused.value is error
        assert transport.ended == [] and transport.prepared == []
    finally:
        producer.close(timeout=0)


# -- a real broker behind the fault proxy ------------------------------------------------------
def test_real_broker_batch_expired_waiting_for_the_coordinator_fails_the_transaction(
    proxy: ActionFaultProxy, client: BrokerClient
) -> None:
    """On a real broker: the transaction's first rows are in the log of one partition; the
    coordinator then answers AddPartitionsToTxn for the other partition with
    COORDINATOR_NOT_AVAILABLE (loading) past delivery.timeout.ms, so that batch never gets
    a sequence and expires. Commit refuses with its error; after the abort, read_committed
    shows none of the transaction's rows, and the next transaction commits."""
    client.create_topic("txn-expiry", 2)
    config = {
        "linger.ms": 2,
        "retry.backoff.ms": 20,
        "request.timeout.ms": 1000,
        "delivery.timeout.ms": 1500,
        "transactional.id": "tx-expiry",
    }
    loading = ActionFault(
        Action.ADD_PARTITIONS_TO_TXN, times=None, error=CoordinatorNotAvailableError("loading")
    )
    with Producer(proxy.address, **config) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        written = producer.send("txn-expiry", table(10))  # no key: whole send, round-robin
        producer.flush()
        [meta] = written.result(0)
        proxy.add_action_faults(loading)
        expired = producer.send("txn-expiry", table(10, 10))  # the other partition
        error = expired.exception(WAIT_S)
        assert isinstance(error, DeliveryTimeoutError), error
        assert proxy.stats[loading.stat] >= 1, proxy.stats
        with pytest.raises(DeliveryTimeoutError) as refused:
            producer.commit_transaction()
        assert refused.value is error
        before_abort = client.read_table("txn-expiry", meta.partition, isolation="read_uncommitted")
        assert before_abort is not None and before_abort.num_rows == 10, "rows were written"
        loading.times = loading.fired  # the coordinator is back
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("txn-expiry", table(5, 100))
        producer.send("txn-expiry", table(5, 105))
        producer.commit_transaction()
    visible = sorted(
        i
        for p in (0, 1)
        if (t := client.read_table("txn-expiry", p, isolation="read_committed")) is not None
        for i in t.column("id").to_pylist()
    )
    assert visible == list(range(100, 110)), "none of the failed transaction's rows"
