"""Producer state: id and epoch, per-partition sequences, and the transaction state machine.

Sequences (docs/design.md §3): per producer id x epoch x partition, starting at 0, counting rows,
wrapping at 2^31-1 → 0. ``next_sequence`` is taken at drain time; ``last_acked`` moves
with acknowledgements. A partition whose sequence can no longer be trusted (a batch that
may or may not be in the log failed for good, the broker answered OUT_OF_ORDER for the
batch it should have expected next, or it forgot the producer) is *unresolved*:

* idempotent-only producer: the epoch is bumped — a new InitProducerId (the broker hands
  out a fresh producer id at epoch 0) — once nothing is in flight, and every partition's
  sequences restart at 0; batches still queued are re-sequenced, none is dropped;
* transactional producer: the transaction goes to ABORTABLE_ERROR; ``abort_transaction``
  ends it and re-initialises (InitProducerId on the same transactional id bumps the epoch).

The transaction states and their legal transitions are the table ``TRANSITIONS``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import Enum

from broker_core.errors import IdemlogError, InvalidTxnStateError

from .producer_batch import SEQUENCE_MODULUS, TopicPartition


class TxnState(Enum):
    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING_TRANSACTION = "COMMITTING_TRANSACTION"
    ABORTING_TRANSACTION = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


_S = TxnState
TRANSITIONS: dict[TxnState, frozenset[TxnState]] = {
    _S.UNINITIALIZED: frozenset({_S.INITIALIZING}),
    _S.INITIALIZING: frozenset({_S.READY}),
    _S.READY: frozenset({_S.IN_TRANSACTION, _S.INITIALIZING}),
    _S.IN_TRANSACTION: frozenset(
        {_S.COMMITTING_TRANSACTION, _S.ABORTING_TRANSACTION, _S.ABORTABLE_ERROR}
    ),
    _S.COMMITTING_TRANSACTION: frozenset({_S.READY, _S.ABORTABLE_ERROR}),
    _S.ABORTING_TRANSACTION: frozenset({_S.READY, _S.INITIALIZING}),
    _S.ABORTABLE_ERROR: frozenset({_S.ABORTING_TRANSACTION, _S.ABORTABLE_ERROR}),
    _S.FATAL_ERROR: frozenset(),
}
# Any state may fall into FATAL_ERROR (fenced, unrecoverable); the table lists the rest.


def can_transition(old: TxnState, new: TxnState) -> bool:
    return new is TxnState.FATAL_ERROR or new in TRANSITIONS[old]


@dataclass
class PartitionSequences:
    """Sequence bookkeeping of one partition under the current producer id and epoch."""

    next_sequence: int = 0
    last_acked: int = -1  # last sequence acknowledged at this epoch, -1: none yet
    next_ordinal: int = 0
    in_flight: int = 0
    retrying: bool = False  # a batch of it failed and is being resent: 1 in flight at most
    unresolved: bool = False  # needs an epoch bump (idempotent) / abort (transactional)
    unresolved_ordinal: int = -1  # the batch that made it unresolved


class TransactionManager:
    def __init__(self, transactional_id: str | None = None, *, idempotent: bool = True) -> None:
        self.transactional_id = transactional_id
        self.idempotent = idempotent
        self._lock = threading.RLock()
        self.producer_id = -1
        self.producer_epoch = -1
        self.state = TxnState.UNINITIALIZED
        self.last_error: IdemlogError | None = None
        self._partitions: dict[TopicPartition, PartitionSequences] = {}
        self.txn_partitions: set[TopicPartition] = set()  # added to the open transaction
        # The partitions the open transaction's first send() queued rows for: the sender
        # registers them at once, before their batches are ready (later partitions join
        # the registration made when a batch is ready). Emptied when it ends.
        self.announced: set[TopicPartition] = set()
        self.bump_requested = False

    # -- state machine -------------------------------------------------------------------
    @property
    def is_transactional(self) -> bool:
        return self.transactional_id is not None

    def transition(self, new: TxnState, error: IdemlogError | None = None) -> None:
        with self._lock:
            if not can_transition(self.state, new):
                raise InvalidTxnStateError(
                    f"transactional id {self.transactional_id!r}: cannot go from "
                    f"{self.state.name} to {new.name}"
                    + (f" (last error: {self.last_error})" if self.last_error else "")
                )
            self.state = new
            if error is not None:
                self.last_error = error

    def require(self, *states: TxnState, action: str) -> None:
        with self._lock:
            if self.state not in states:
                cause = f": {self.last_error}" if self.last_error is not None else ""
                raise InvalidTxnStateError(
                    f"{action} is not allowed in state {self.state.name}{cause}"
                )

    def fail_abortable(self, error: IdemlogError) -> None:
        with self._lock:
            if self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING_TRANSACTION):
                self.transition(TxnState.ABORTABLE_ERROR, error)
            elif self.state is TxnState.ABORTABLE_ERROR:
                pass
            self.last_error = self.last_error or error

    def fail_fatal(self, error: IdemlogError) -> None:
        with self._lock:
            self.state = TxnState.FATAL_ERROR
            self.last_error = error

    @property
    def has_error(self) -> bool:
        return self.state in (TxnState.ABORTABLE_ERROR, TxnState.FATAL_ERROR)

    # -- producer id ---------------------------------------------------------------------
    def set_producer_id(self, producer_id: int, epoch: int) -> None:
        """A new id/epoch, from InitProducerId or an EndTxn's answer (the next
        transaction's: KIP-890): every partition's sequences restart at 0."""
        with self._lock:
            self.producer_id, self.producer_epoch = producer_id, epoch
            self._partitions.clear()
            self.bump_requested = False

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    # -- sequences -----------------------------------------------------------------------
    def partition(self, tp: TopicPartition) -> PartitionSequences:
        with self._lock:
            state = self._partitions.get(tp)
            if state is None:
                state = self._partitions[tp] = PartitionSequences()
            return state

    def next_sequence(self, tp: TopicPartition, rows: int) -> tuple[int, int]:
        """(base sequence, ordinal) for a batch of ``rows`` drained now."""
        with self._lock:
            state = self.partition(tp)
            base, ordinal = state.next_sequence, state.next_ordinal
            state.next_sequence = (base + rows) % SEQUENCE_MODULUS
            state.next_ordinal += 1
            return base, ordinal

    def is_next_in_line(self, tp: TopicPartition, base_sequence: int) -> bool:
        """Is this the batch the broker should expect next (last acked + 1)?"""
        with self._lock:
            last = self.partition(tp).last_acked
            return base_sequence == (last + 1) % SEQUENCE_MODULUS

    def acked(self, tp: TopicPartition, last_sequence: int, ordinal: int) -> None:
        with self._lock:
            state = self.partition(tp)
            state.last_acked = last_sequence
            if state.unresolved and ordinal > state.unresolved_ordinal:
                # A later batch was accepted, so the doubtful one is in the log: resolved.
                state.unresolved = False
                state.unresolved_ordinal = -1

    def mark_unresolved(self, tp: TopicPartition, ordinal: int) -> None:
        with self._lock:
            state = self.partition(tp)
            if not state.unresolved or ordinal < state.unresolved_ordinal:
                state.unresolved_ordinal = ordinal
            state.unresolved = True

    def unresolved_partitions(self) -> list[TopicPartition]:
        with self._lock:
            return [tp for tp, s in self._partitions.items() if s.unresolved]

    def in_flight_total(self) -> int:
        with self._lock:
            return sum(s.in_flight for s in self._partitions.values())

    def in_flight(self, tp: TopicPartition) -> int:
        with self._lock:
            state = self._partitions.get(tp)
            return state.in_flight if state is not None else 0

    def add_in_flight(self, tp: TopicPartition, delta: int) -> None:
        with self._lock:
            self.partition(tp).in_flight += delta

    # -- transactions --------------------------------------------------------------------
    def partitions_to_add(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        with self._lock:
            return [tp for tp in tps if tp not in self.txn_partitions]

    def partitions_added(self, tps: list[TopicPartition]) -> None:
        with self._lock:
            self.txn_partitions.update(tps)

    def announce(self, tps: list[TopicPartition]) -> bool:
        """A send() of the open transaction queued rows for ``tps``: kept if it is the
        transaction's first (True: the sender should wake and register them now)."""
        with self._lock:
            if self.announced or self.txn_partitions or not tps:
                return False
            self.announced.update(tps)
            return True

    def announced_unregistered(self) -> bool:
        with self._lock:
            return bool(self.announced - self.txn_partitions)

    def transaction_ended(self) -> None:
        with self._lock:
            self.txn_partitions.clear()
            self.announced.clear()
            self.last_error = None
