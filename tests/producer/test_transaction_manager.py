"""The transaction state table and sequence bookkeeping."""

from __future__ import annotations

import pytest

from broker_core.errors import InvalidTxnStateError
from broker_core.producer.producer_batch import TopicPartition
from broker_core.producer.transaction_manager import (
    TRANSITIONS,
    TransactionManager,
    TxnState,
    can_transition,
)

S = TxnState
LEGAL = {
    (S.UNINITIALIZED, S.INITIALIZING),
    (S.INITIALIZING, S.READY),
    (S.READY, S.IN_TRANSACTION),
    (S.READY, S.INITIALIZING),
    (S.IN_TRANSACTION, S.COMMITTING_TRANSACTION),
    (S.IN_TRANSACTION, S.ABORTING_TRANSACTION),
    (S.IN_TRANSACTION, S.ABORTABLE_ERROR),
    (S.COMMITTING_TRANSACTION, S.READY),
    (S.COMMITTING_TRANSACTION, S.ABORTABLE_ERROR),
    (S.ABORTING_TRANSACTION, S.READY),
    (S.ABORTING_TRANSACTION, S.INITIALIZING),
    (S.ABORTABLE_ERROR, S.ABORTING_TRANSACTION),
    (S.ABORTABLE_ERROR, S.ABORTABLE_ERROR),
}


@pytest.mark.parametrize("old", list(S))
@pytest.mark.parametrize("new", list(S))
def test_transition_table(old: TxnState, new: TxnState) -> None:
    expected = (old, new) in LEGAL or new is S.FATAL_ERROR
    assert can_transition(old, new) is expected
    txn = TransactionManager("t")
    txn.state = old
    if expected:
        txn.transition(new)
        assert txn.state is new
    else:
        with pytest.raises(InvalidTxnStateError, match=f"{old.name} to {new.name}"):
            txn.transition(new)


def test_every_state_is_in_the_table() -> None:
    assert set(TRANSITIONS) == set(S)
    assert TRANSITIONS[S.FATAL_ERROR] == frozenset()


def test_sequences_per_partition_wrap_and_reset() -> None:
    txn = TransactionManager(None)
    txn.set_producer_id(7, 0)
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    assert txn.next_sequence(a, 10) == (0, 0)
    assert txn.next_sequence(a, 5) == (10, 1)
    assert txn.next_sequence(b, 3) == (0, 0)
    txn.partition(a).next_sequence = 2**31 - 2
    assert txn.next_sequence(a, 4) == (2**31 - 2, 2)
    assert txn.partition(a).next_sequence == 2
    txn.acked(a, 2**31 - 1, 2)
    assert txn.is_next_in_line(a, 0)
    txn.mark_unresolved(b, 0)
    assert txn.unresolved_partitions() == [b]
    txn.set_producer_id(8, 0)  # a bump: every partition restarts at 0
    assert txn.next_sequence(a, 1) == (0, 0) and txn.unresolved_partitions() == []


def test_a_later_ack_resolves_a_doubtful_batch() -> None:
    txn = TransactionManager(None)
    tp = TopicPartition("t", 0)
    txn.mark_unresolved(tp, 3)
    txn.acked(tp, 49, 4)
    assert txn.unresolved_partitions() == []


def test_require_names_state_and_cause() -> None:
    txn = TransactionManager("t")
    with pytest.raises(InvalidTxnStateError, match=r"send\(\) is not allowed in state UNINIT"):
        txn.require(S.IN_TRANSACTION, action="send()")
