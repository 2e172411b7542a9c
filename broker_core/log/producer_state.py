"""Per-partition producer state: what the validator checks each append against.

For every producer id that wrote to the partition the log keeps its epoch, the metadata of
its last ``producer.state.batch.window`` batches (to answer a retried batch with its
original offsets), the first offset of its open transaction, and when it last wrote. The
state is rebuilt by replaying batch headers, and saved in snapshots so that a restart only
replays the tail of the log.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum

from broker_core.errors import InvalidTxnStateError
from broker_core.log.validator import ProducerFields, check_append, check_fields, check_marker
from broker_core.record.batch import (
    NO_PRODUCER_EPOCH,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    BatchHeader,
    ControlType,
)

NO_OFFSET = -1
NO_COORDINATOR_EPOCH = -1  # no marker seen yet: any coordinator epoch is accepted


class AppendOrigin(Enum):
    """Who asks for the append; only clients' appends are sequence-checked."""

    CLIENT = "client"
    COORDINATOR = "coordinator"  # transaction markers
    REPLICATION = "replication"
    RECOVERY = "recovery"


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerStateEntry:
    producer_id: int
    window: int
    epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(default_factory=deque)
    current_txn_first_offset: int = NO_OFFSET
    last_timestamp: int = NO_TIMESTAMP
    coordinator_epoch: int = NO_COORDINATOR_EPOCH  # of the last marker; fences older ones
    # The sequence range written at the current epoch, so that a retry of a batch that has
    # left the cached window is recognised as a certain duplicate (DUPLICATE_SEQUENCE).
    epoch_start_sequence: int = NO_SEQUENCE
    epoch_record_count: int = 0

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def has_open_transaction(self) -> bool:
        return self.current_txn_first_offset != NO_OFFSET

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.epoch:
            return None
        for meta in self.batches:
            if meta.first_seq == first_seq and meta.last_seq == last_seq:
                return meta
        return None

    def bump_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self.batches.clear()
            self.epoch_start_sequence = NO_SEQUENCE
            self.epoch_record_count = 0

    def add_batch(self, meta: BatchMetadata, record_count: int) -> None:
        if self.epoch_start_sequence == NO_SEQUENCE:
            self.epoch_start_sequence = meta.first_seq
        self.epoch_record_count += record_count
        self.batches.append(meta)
        while len(self.batches) > self.window:
            self.batches.popleft()


class VerificationGuard:
    """One verification of a transactional producer with its coordinator (KIP-890), made
    before the leader asks: the append that follows passes only if this very object is
    still the producer's pending guard, so a marker written while the coordinator
    answered (it drops the guard) makes the answer void. Compared by identity."""

    __slots__ = ("producer_epoch", "transactional_id")

    def __init__(self, producer_epoch: int, transactional_id: str) -> None:
        self.producer_epoch = producer_epoch
        self.transactional_id = transactional_id

    def names(self, producer_epoch: int, transactional_id: str) -> bool:
        return (self.producer_epoch, self.transactional_id) == (producer_epoch, transactional_id)


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    aborted: bool


def producer_fields(header: BatchHeader) -> ProducerFields:
    return ProducerFields(
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        first_seq=header.base_sequence,
        last_seq=header.last_sequence,
        record_count=header.record_count,
        is_transactional=header.is_transactional,
    )


class ProducerStateManager:
    """The producer state of one partition. Not thread-safe: the log holds its lock."""

    def __init__(
        self,
        *,
        window: int,
        expiration_ms: int,
        producer_id_known: Callable[[int], bool] | None = None,
    ) -> None:
        self.window = window
        self.expiration_ms = expiration_ms
        self._producer_id_known = producer_id_known or (lambda _pid: True)
        self._producers: dict[int, ProducerStateEntry] = {}
        self._ongoing: dict[int, int] = {}  # producer id -> first offset of its open txn
        # KIP-890's verification, in memory only (a new leader verifies again): guards
        # asked of a coordinator and not yet used, and the guard whose transaction is
        # open here (its later batches pay nothing). A marker drops both.
        self._verifying: dict[int, VerificationGuard] = {}
        self._verified: dict[int, VerificationGuard] = {}

    # -- reading ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._producers)

    def __iter__(self) -> Iterator[ProducerStateEntry]:
        return iter(self._producers.values())

    def get(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    def first_unstable_offset(self) -> int | None:
        """First offset of the oldest open transaction; the last stable offset's bound."""
        return min(self._ongoing.values()) if self._ongoing else None

    def ongoing_transactions(self) -> dict[int, int]:
        return dict(self._ongoing)

    # -- the coordinator's verification of transactional batches ----------------------
    def verification_needed(
        self, producer_id: int, producer_epoch: int, transactional_id: str
    ) -> VerificationGuard | None:
        """None when this producer's transaction here, at this epoch and under this
        transactional id, was verified already; else the pending guard to verify with the
        coordinator and to hand to the append: the one a concurrent verification of the
        same (epoch, transactional id) made (a producer's retry on a new stream while its
        old stream's batch verifies), or a new one."""
        if self._verified_open(producer_id, producer_epoch, transactional_id):
            return None
        pending = self._verifying.get(producer_id)
        if pending is not None and pending.names(producer_epoch, transactional_id):
            return pending  # made before this ask too: a marker since would have dropped it
        guard = VerificationGuard(producer_epoch, transactional_id)
        self._verifying[producer_id] = guard
        return guard

    def _verified_open(self, producer_id: int, producer_epoch: int, transactional_id: str) -> bool:
        """The producer's open transaction here, at this epoch and under this transactional
        id, was verified with its coordinator (and no marker has ended it since)."""
        entry = self._producers.get(producer_id)
        verified = self._verified.get(producer_id)
        return (
            entry is not None
            and entry.has_open_transaction
            and entry.epoch == producer_epoch
            and verified is not None
            and verified.names(producer_epoch, transactional_id)
        )

    def drop_verification(self, producer_id: int, guard: VerificationGuard) -> None:
        """The coordinator refused: forget the pending guard."""
        if self._verifying.get(producer_id) is guard:
            del self._verifying[producer_id]

    def check_verified(
        self, batch: ProducerFields, transactional_id: str, guard: VerificationGuard | None
    ) -> None:
        """Raise INVALID_TXN_STATE unless the batch's transaction was verified with its
        coordinator: its open transaction here was, or ``guard`` is still pending (no
        marker since it was made). Checked before the sequence, so that only a producer
        id's owner learns anything of its state."""
        pid, epoch = batch.producer_id, batch.producer_epoch
        if self._verified_open(pid, epoch, transactional_id):
            return
        if (
            guard is not None
            and self._verifying.get(pid) is guard
            and guard.names(epoch, transactional_id)
        ):
            return
        raise InvalidTxnStateError(
            f"producer_id={pid} epoch {epoch} of transactional id {transactional_id!r}: no "
            "ongoing transaction holding this partition was verified with its coordinator "
            "(it ended meanwhile, or the partition was not added to it)"
        )

    def on_verified_append(self, producer_id: int, guard: VerificationGuard | None) -> None:
        """A batch passed by ``guard`` is in the log: its transaction is the verified one."""
        if guard is not None and self._verifying.get(producer_id) is guard:
            del self._verifying[producer_id]
            self._verified[producer_id] = guard

    # -- validation (no state change) --------------------------------------------------
    def check_append(self, batch: ProducerFields, origin: AppendOrigin) -> BatchMetadata | None:
        """Raise if the batch must be rejected; return the original if it is a duplicate."""
        if origin is not AppendOrigin.CLIENT:
            return None
        if batch.producer_id < 0:
            # No state to check against, but the fields still must be coherent (e.g. -2,
            # or a sequence without a producer id, is a client bug, not a plain append).
            check_fields(batch)
            return None
        entry = self._producers.get(batch.producer_id)
        if entry is not None:
            duplicate = entry.find_duplicate(batch.producer_epoch, batch.first_seq, batch.last_seq)
            if duplicate is not None:
                return duplicate
        check_append(entry, batch, producer_id_known=self._producer_id_known)
        return None

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """Raise if the coordinator's marker must be rejected (fenced producer or coordinator)."""
        check_marker(
            self._producers.get(producer_id), producer_id, producer_epoch, coordinator_epoch
        )

    # -- state changes (after the batch is in the log) -----------------------------------
    def _entry(self, producer_id: int) -> ProducerStateEntry:
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = ProducerStateEntry(producer_id, self.window, batches=deque())
            self._producers[producer_id] = entry
        return entry

    def on_data_batch(
        self, batch: ProducerFields, first_offset: int, last_offset: int, timestamp: int
    ) -> None:
        if batch.producer_id < 0:
            return
        entry = self._entry(batch.producer_id)
        entry.bump_epoch(batch.producer_epoch)
        if batch.first_seq != NO_SEQUENCE:
            meta = BatchMetadata(
                batch.first_seq, batch.last_seq, first_offset, last_offset, timestamp
            )
            entry.add_batch(meta, batch.record_count)
        entry.last_timestamp = timestamp
        if batch.is_transactional and not entry.has_open_transaction:
            entry.current_txn_first_offset = first_offset
            self._ongoing[batch.producer_id] = first_offset

    def on_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        control_type: ControlType,
        coordinator_epoch: int,
        offset: int,
        timestamp: int,
    ) -> CompletedTxn | None:
        self._verifying.pop(producer_id, None)
        self._verified.pop(producer_id, None)
        entry = self._entry(producer_id)
        entry.bump_epoch(max(entry.epoch, producer_epoch))
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp = timestamp
        if not entry.has_open_transaction:
            return None
        completed = CompletedTxn(
            producer_id, entry.current_txn_first_offset, offset, control_type is ControlType.ABORT
        )
        entry.current_txn_first_offset = NO_OFFSET
        del self._ongoing[producer_id]
        return completed

    def remove_expired(self, now_ms: int) -> list[int]:
        """Forget producers idle past the expiration, except those with an open txn."""
        expired = [
            pid
            for pid, entry in self._producers.items()
            if not entry.has_open_transaction
            and now_ms - entry.last_timestamp >= self.expiration_ms
        ]
        for pid in expired:
            del self._producers[pid]
            self._verified.pop(pid, None)
        return expired

    # -- snapshots ---------------------------------------------------------------------
    def entries(self) -> list[ProducerStateEntry]:
        return list(self._producers.values())

    def load(self, entries: Iterable[ProducerStateEntry]) -> None:
        self._producers.clear()
        self._ongoing.clear()
        self._verifying.clear()
        self._verified.clear()
        for entry in entries:
            entry.window = self.window
            while len(entry.batches) > self.window:
                entry.batches.popleft()
            self._producers[entry.producer_id] = entry
            if entry.has_open_transaction:
                self._ongoing[entry.producer_id] = entry.current_txn_first_offset

    def clear(self) -> None:
        self.load([])
