"""The Producer facade over a transport that answers at once (no broker, real threads)."""

from __future__ import annotations

import pandas as pd
import pytest

from broker_core.errors import ErrorCode, InvalidTxnStateError, MessageTooLargeError
from broker_core.producer import Producer, TxnState
from broker_core.producer.producer_batch import TopicPartition
from tests.harness.waiting import wait_until
from tests.producer.fakes import AutoTransport, table


def test_send_pandas_and_arrow_resolves_offsets() -> None:
    transport = AutoTransport()
    with Producer(transport=transport, linger_ms=0) as producer:
        f1 = producer.send("t", pd.DataFrame({"id": range(10), "key": [1, 2] * 5}), key="key")
        f2 = producer.send("t", table(4).to_batches()[0])  # round-robin, no key
        producer.flush()
        parts = f1.result(5)
        assert sorted(m.partition for m in parts) == [0, 1]
        assert sum(m.num_rows for m in parts) == 10
        (whole,) = f2.result(5)
        assert whole.num_rows == 4
        assert producer.metrics_snapshot()["records_sent"] == 14


def test_failed_transaction_is_aborted_and_the_epoch_bumped() -> None:
    transport = AutoTransport(partitions=1)
    transport.pids = [(5, 0), (5, 1)]
    producer = Producer(transport=transport, linger_ms=0, transactional_id="tx")
    producer.init_transactions()
    with pytest.raises(InvalidTxnStateError, match="not allowed in state READY"):
        producer.send("t", table(3))
    producer.begin_transaction()
    transport.errors = [ErrorCode.MESSAGE_TOO_LARGE.code]
    failed = producer.send("t", table(3))
    with pytest.raises(MessageTooLargeError) as refused:  # the batch's own error
        producer.commit_transaction()
    with pytest.raises(MessageTooLargeError) as batch_error:
        failed.result(5)
    assert refused.value is batch_error.value
    assert producer.txn.state is TxnState.ABORTABLE_ERROR
    producer.abort_transaction()
    assert producer.producer_id_and_epoch == (5, 1)
    assert transport.init_calls == ["tx", "tx"]
    producer.begin_transaction()
    ok = producer.send("t", table(3))
    producer.commit_transaction()
    assert ok.result(5)[0].num_rows == 3
    last = transport.sent[-1]
    assert (last.producer_epoch, last.base_sequence) == (1, 0), "sequences restart at 0"
    assert transport.added == [[TopicPartition("t", 0)], [TopicPartition("t", 0)]]
    assert transport.ended == [True]
    producer.close()


def test_one_add_partitions_registers_every_partition_with_a_queued_batch() -> None:
    """The transaction's first send registers its partitions at once, before any batch
    is ready; the first batch that is ready (full) then registers with it every other
    partition whose batches still linger: their batches are this transaction's too, and
    none of them waits for an AddPartitionsToTxn round trip of its own when it becomes
    ready."""
    transport = AutoTransport(partitions=3)
    producer = Producer(
        transport=transport, linger_ms=60_000, batch_size=1024, transactional_id="tx"
    )
    producer.init_transactions()
    producer.begin_transaction()
    small = [producer.send("t", table(2))]  # round-robin: one partition, lingering
    first = wait_until(lambda: list(transport.added), "the first send's AddPartitionsToTxn")
    assert len(first[0]) == 1  # registered while its batch lingers (nothing is ready)
    small.append(producer.send("t", table(2)))  # the second partition, lingering
    full = producer.send("t", table(1000))  # the third, over batch.size: ready at once
    wait_until(lambda: len(transport.added) == 2, "the ready batch's AddPartitionsToTxn")
    assert len(transport.added[1]) == 2  # the ready partition and the lingering one
    assert {tp.partition for added in transport.added for tp in added} == {0, 1, 2}
    producer.commit_transaction()  # flushes the lingering two
    assert len(transport.added) == 2, transport.added
    assert [f.result(5)[0].num_rows for f in small] == [2, 2]
    assert sum(m.num_rows for m in full.result(5)) == 1000
    producer.close()
