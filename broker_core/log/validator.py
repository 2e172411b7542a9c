"""The idempotence validator: may this producer's batch be appended to this partition?

Rules (docs/design.md §4), checked against the cached state of the producer on the partition.
A duplicate of a cached batch is answered before these checks, with its original offsets.

- epoch lower than the stored one: INVALID_PRODUCER_EPOCH (a fenced zombie);
- epoch higher: the first sequence must be 0, else OUT_OF_ORDER_SEQUENCE;
- same epoch: the first sequence must follow the last one (2^31 - 1 wraps to 0), else
  * DUPLICATE_SEQUENCE if the batch lies wholly inside the range already written at this
    epoch (a retry whose metadata has left the window: certainly written once already),
  * OUT_OF_ORDER_SEQUENCE otherwise (a gap or a partial overlap);
- a producer id this partition has never seen is accepted at any sequence (as Kafka >= 2.5
  does, since retention may have removed its state), unless the cluster never issued it:
  UNKNOWN_PRODUCER_ID;
- a non-transactional batch while the producer has an open transaction: INVALID_TXN_STATE,
  checked first and naming nothing of the producer's state: the sender may not own the
  producer id (docs/security.md, "Transactional produce").

Markers (:func:`check_marker`): an older producer epoch is INVALID_PRODUCER_EPOCH, an older
coordinator epoch than the last marker's is TRANSACTION_COORDINATOR_FENCED.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from broker_core.errors import (
    DuplicateSequenceError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
    UnknownProducerIdError,
)
from broker_core.record.batch import (
    MAX_PRODUCER_EPOCH,
    MAX_SEQUENCE,
    NO_PRODUCER_EPOCH,
    NO_SEQUENCE,
    SEQUENCE_SPACE,
    sequence_distance,
)

# Stored as an int32 in batch headers and snapshots.
MAX_COORDINATOR_EPOCH = 2**31 - 1


class ProducerHistory(Protocol):
    """What the validator reads of a producer's cached state (``ProducerHistory``
    provides it): declared here so the validator does not import the state it guards."""

    @property
    def epoch(self) -> int: ...
    @property
    def epoch_start_sequence(self) -> int: ...
    @property
    def epoch_record_count(self) -> int: ...
    @property
    def last_seq(self) -> int: ...
    @property
    def has_open_transaction(self) -> bool: ...
    @property
    def current_txn_first_offset(self) -> int: ...
    @property
    def coordinator_epoch(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ProducerFields:
    """The producer fields of an incoming batch: all the validator looks at."""

    producer_id: int
    producer_epoch: int
    first_seq: int
    last_seq: int
    record_count: int
    is_transactional: bool


def check_fields(batch: ProducerFields) -> None:
    """Header fields that are wrong whatever the state (a client bug, not a retry)."""
    pid = batch.producer_id
    if pid < -1:
        raise InvalidRecordError(f"producer_id={pid} is negative")
    if pid == -1:
        if batch.is_transactional:
            raise InvalidRecordError("a transactional batch needs a producer_id")
        if batch.first_seq != NO_SEQUENCE or batch.producer_epoch != NO_PRODUCER_EPOCH:
            raise InvalidRecordError(
                f"base_sequence={batch.first_seq}/producer_epoch={batch.producer_epoch} set on "
                "a batch without producer_id"
            )
        return
    if not 0 <= batch.producer_epoch <= MAX_PRODUCER_EPOCH:
        raise InvalidRecordError(
            f"producer_epoch={batch.producer_epoch} outside [0, {MAX_PRODUCER_EPOCH}]"
        )
    if not 0 <= batch.first_seq <= MAX_SEQUENCE:
        raise InvalidRecordError(
            f"base_sequence={batch.first_seq} outside [0, {MAX_SEQUENCE}] for producer_id={pid}"
        )


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == MAX_SEQUENCE)


def _written_at_epoch(entry: ProducerHistory, batch: ProducerFields) -> bool:
    """Does the batch lie wholly inside the sequences already written at this epoch?"""
    start = entry.epoch_start_sequence
    if start == NO_SEQUENCE or entry.epoch_record_count == 0:
        return False
    written = min(entry.epoch_record_count, SEQUENCE_SPACE)
    first = sequence_distance(start, batch.first_seq)
    last = sequence_distance(start, batch.last_seq)
    if written == SEQUENCE_SPACE:
        # The epoch has used every sequence; judge by distance behind the next expected.
        next_seq = (entry.last_seq + 1) % SEQUENCE_SPACE
        behind = sequence_distance(batch.last_seq, next_seq)
        return first <= last and 0 < behind <= SEQUENCE_SPACE // 2
    return first <= last < written


def check_append(
    entry: ProducerHistory | None,
    batch: ProducerFields,
    *,
    producer_id_known: Callable[[int], bool],
) -> None:
    """Raise the error that rejects ``batch``; return if it may be appended."""
    check_fields(batch)
    pid = batch.producer_id
    if pid == -1:
        return
    if entry is None:
        if not producer_id_known(pid):
            raise UnknownProducerIdError(f"producer_id={pid} was never issued by this cluster")
        return
    if entry.has_open_transaction and not batch.is_transactional:
        raise InvalidTxnStateError(
            f"producer_id={pid} sent a non-transactional batch while it has a transaction "
            "open on this partition"
        )
    if batch.producer_epoch < entry.epoch:
        raise InvalidProducerEpochError(
            f"producer_id={pid} epoch {batch.producer_epoch} is older than the current epoch "
            f"{entry.epoch}: a newer instance of this producer exists (fenced)"
        )
    if batch.producer_epoch > entry.epoch:
        if batch.first_seq != 0 and entry.epoch != NO_PRODUCER_EPOCH:
            raise OutOfOrderSequenceError(
                f"producer_id={pid} new epoch {batch.producer_epoch} must start at sequence 0, "
                f"got {batch.first_seq}"
            )
    else:
        last = entry.last_seq
        if not in_sequence(last, batch.first_seq):
            if _written_at_epoch(entry, batch):
                raise DuplicateSequenceError(
                    f"producer_id={pid} epoch {batch.producer_epoch} sequences "
                    f"{batch.first_seq}..{batch.last_seq} were already written (older than the "
                    f"cached window; original offsets unknown)"
                )
            expected = 0 if last == NO_SEQUENCE else (last + 1) % SEQUENCE_SPACE
            raise OutOfOrderSequenceError(
                f"producer_id={pid} epoch {batch.producer_epoch}: expected sequence {expected}, "
                f"got {batch.first_seq}..{batch.last_seq}"
            )


def check_marker(
    entry: ProducerHistory | None,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
) -> None:
    """May the coordinator write this COMMIT/ABORT marker? (Kafka's rules, in its order.)

    A marker at an older producer epoch is a zombie coordinator request; one from an
    older coordinator epoch than the last marker's comes from a coordinator that has been
    replaced: its ``__transaction_state`` partition is led at a newer leader epoch (the
    controller epoch, embedded) (TRANSACTION_COORDINATOR_FENCED). Markers replayed from the
    log in recovery are not checked: their origin is the log, not a coordinator.
    """
    if producer_id < 0:
        raise InvalidRecordError(f"a transaction marker needs a producer_id, got {producer_id}")
    if not 0 <= producer_epoch <= MAX_PRODUCER_EPOCH:
        raise InvalidRecordError(
            f"producer_epoch={producer_epoch} outside [0, {MAX_PRODUCER_EPOCH}]"
        )
    if not 0 <= coordinator_epoch <= MAX_COORDINATOR_EPOCH:
        raise InvalidRecordError(
            f"coordinator_epoch={coordinator_epoch} outside [0, {MAX_COORDINATOR_EPOCH}]"
        )
    if entry is None:
        return
    if producer_epoch < entry.epoch:
        raise InvalidProducerEpochError(
            f"marker for producer_id={producer_id} at epoch {producer_epoch} is older than the "
            f"current epoch {entry.epoch}"
        )
    if coordinator_epoch < entry.coordinator_epoch:
        raise TransactionCoordinatorFencedError(
            f"marker for producer_id={producer_id} from coordinator_epoch={coordinator_epoch} "
            f"is older than coordinator epoch {entry.coordinator_epoch} of the last marker: "
            "a newer transaction coordinator has taken over"
        )
