"""The log of one partition: validated appends, transaction markers, reads, roll and
retention, and what its calls answer (append, marker and fetch results).

Directory layout (one directory per partition):

    00000000000000000000.log / .index / .txnindex   segments, named by base offset
    00000000000000001234.snapshot                   producer state before offset 1234
    .clean_shutdown                                 present only after a clean close

    leader-epoch-checkpoint                         leader epoch -> start offset (leader_epoch.py)
    high-watermark-checkpoint                       a replica's high watermark (replica.py)
    cleaner-checkpoint                              how far compaction got (cleaner.py)

Appends, markers, reads and the replication calls take the partition lock; appends of
different partitions run in parallel.
The read path over segments (``collect_batches``) is also the read-only view's
(``inspect.py``), so ``idemlog log dump`` reads a directory as a broker would serve it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import pyarrow as pa

from broker_core.errors import (
    CorruptRecordError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    StorageError,
)
from broker_core.fileutil import fsync_directory, fsync_file
from broker_core.log.cleaner import CleanResult, PartitionCleaner
from broker_core.log.config import LogConfig
from broker_core.log.leader_epoch import EpochEndOffset
from broker_core.log.producer_state import (
    AppendOrigin,
    ProducerStateEntry,
    ProducerStateManager,
    VerificationGuard,
)
from broker_core.log.recovery import (
    CLEAN_SHUTDOWN_FILE,
    apply_batch,
    apply_marker,
    batches_from,
    rebuild_state,
    recover_partition,
)
from broker_core.log.replica import (
    HighWatermarkCheckpoint,
    as_encoded,
    log_start_state,
    open_epoch_cache,
    parse_fetched,
    read_raw,
    reset_log,
    truncate_segments,
)
from broker_core.log.segment import LOG_SUFFIX, LogSegment, StoredBatch
from broker_core.log.snapshot import delete_snapshots_below, write_snapshot
from broker_core.log.validator import ProducerFields
from broker_core.protocol.admin_requests import NO_OFFSET, ProducerDescription
from broker_core.protocol.wire import DEFAULT_FETCH_MAX_BYTES
from broker_core.record.batch import (
    HEADER_SIZE,
    INITIAL_LEADER_EPOCH,
    MAX_PRODUCER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchHeader,
    ControlRecord,
    ControlType,
    EncodedBatch,
    as_record_batch,
    decode_control,
    decode_rows,
    encode_controls,
    encode_data,
    increment_sequence,
    ipc_pieces,
    verify_crc,
)

log = logging.getLogger("idemlog.log")

SchemaCheck = Callable[[pa.Schema], None]


class IsolationLevel(Enum):
    """What a read returns: every batch up to the high watermark, or only committed data
    up to the last stable offset, aborted batches skipped."""

    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"

    @classmethod
    def parse(cls, value: str | IsolationLevel) -> IsolationLevel:
        if isinstance(value, IsolationLevel):
            return value
        try:
            return cls(value)
        except ValueError:
            raise InvalidRecordError(
                f"isolation={value!r} is not one of read_committed, read_uncommitted"
            ) from None


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int
    duplicate: bool  # an earlier copy was found; the offsets are the original's


@dataclass(frozen=True, slots=True)
class MarkerResult:
    offset: int  # the marker's own offset
    last_stable_offset: int  # the partition's LSO just after the marker was appended


@dataclass(frozen=True, slots=True)
class HangingAbort:
    """An open transaction an operator aborted (``PartitionLog.abort_open_transaction``)."""

    producer_id: int
    txn_start_offset: int
    marker_epoch: int  # the producer's epoch on the partition from then on
    marker: MarkerResult


@dataclass(frozen=True, slots=True)
class FetchedBatch:
    base_offset: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    timestamp: int
    records: pa.RecordBatch

    @property
    def last_offset(self) -> int:
        return self.base_offset + int(self.records.num_rows) - 1


@dataclass(frozen=True, slots=True)
class FetchResult:
    batches: list[FetchedBatch]
    next_offset: int  # where the next read continues
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int

    @property
    def num_rows(self) -> int:
        return sum(b.records.num_rows for b in self.batches)

    def table(self) -> pa.Table | None:
        if not self.batches:
            return None
        return pa.Table.from_batches([b.records for b in self.batches])


@dataclass(frozen=True, slots=True)
class WholeBatch:
    """A stored batch as it is: its header, and its rows or (a marker) its control record."""

    header: BatchHeader
    rows: pa.RecordBatch | None
    control: ControlRecord | None


@dataclass(frozen=True, slots=True)
class WholeRead:
    """Kafka's Fetch of one partition (:meth:`PartitionLog.read_whole`): whole batches,
    markers included, and the aborted transactions with data among them as
    (producer id, first offset), which a read_committed Kafka client skips."""

    batches: list[WholeBatch]
    aborted: list[tuple[int, int]]
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


class PartitionLog:
    """One partition's log in ``directory``, opened by recovery (``broker_core.log.recovery``).

    The constructor recovers the directory (after a crash: the torn tail cut, the producer
    state rebuilt) and builds itself from the segments recovery returns; a directory
    without segments starts empty at offset 0. Raises CorruptRecordError for a file that is not a
    segment or index name, OSError when the directory cannot be created or read.
    """

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        *,
        name: str = "",
        schema_check: SchemaCheck | None = None,
        clock: Callable[[], int] | None = None,
        producer_id_known: Callable[[int], bool] | None = None,
    ) -> None:
        self.directory = directory
        self.config = config
        self.name = name or directory.name
        self._schema_check = schema_check
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._lock = threading.RLock()
        self.state = ProducerStateManager(
            window=config.producer_state_batch_window,
            expiration_ms=config.producer_id_expiration_ms,
            producer_id_known=producer_id_known,
        )
        self._unflushed = 0
        self._last_flush_ms = self._clock()
        self._flushers: list[threading.Thread] = []
        self.marker_appends = 0  # appends of markers (one write + fsync each): a metric
        self._fsync_failed: str | None = None  # the first failed fsync, kept (see write_marker)
        self._closed = False
        directory.mkdir(parents=True, exist_ok=True)
        # Expired producers go at once (restarts must not defer expiry); segments are kept.
        now = self._clock()
        recovered = recover_partition(directory, config, self.state, name=self.name, now_ms=now)
        self.segments: list[LogSegment] = list(recovered.segments) or [LogSegment(directory, 0)]
        self.epochs = open_epoch_cache(directory, self.segments)
        # The epoch stamped on appends; replication sets it with become_leader.
        self.leader_epoch = max(INITIAL_LEADER_EPOCH, self.epochs.latest_epoch)
        self._high_watermark: int | None = None  # None: the log end (no replication)
        self._hw_checkpoint = HighWatermarkCheckpoint(directory)
        self.checkpointed_high_watermark = self._hw_checkpoint.load()
        self._follower_schema_known = False
        self.cleaner = PartitionCleaner(
            directory, self.name, config, self.state, self.take_snapshot
        )

    # -- offsets -----------------------------------------------------------------------
    @property
    def active(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_start_offset(self) -> int:
        return self.segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        return self.active.next_offset

    @property
    def high_watermark(self) -> int:
        """The log end, unless a replica set it (update_high_watermark); never above it."""
        end = self.log_end_offset
        return end if self._high_watermark is None else min(self._high_watermark, end)

    @property
    def last_stable_offset(self) -> int:
        # Under the lock: an append moves the high watermark (_write) before it records
        # its transaction as open (on_data_batch), so a reader between the two steps
        # would count the open transaction's rows as stable, whatever order it read in.
        with self._lock:
            first_unstable = self.state.first_unstable_offset()
            hw = self.high_watermark
            return hw if first_unstable is None else min(first_unstable, hw)

    @property
    def size_bytes(self) -> int:
        return sum(int(s.size) for s in self.segments)

    # -- appends -----------------------------------------------------------------------
    def append(
        self,
        records: pa.RecordBatch | pa.Table,
        *,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
        transactional: bool = False,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        transactional_id: str | None = None,
        verification: VerificationGuard | None = None,
    ) -> AppendResult:
        """Append rows as one batch, or answer the original offsets of a retried batch.

        With ``transactional_id`` (a leader's append of a client's transactional batch),
        the batch's transaction must have been verified with its coordinator
        (:meth:`verification_needed`, ``verification`` its guard): checked here, under
        the lock, before anything else of the producer (INVALID_TXN_STATE otherwise).

        Raises the validator's errors (see ``broker_core.log.validator``); nothing is
        written when it does.
        """
        batch = as_record_batch(records)
        if batch.num_rows == 0:
            raise InvalidRecordError(f"{self.name}: a batch must hold at least one row")
        if self._schema_check is not None:
            self._schema_check(batch.schema)
        pieces = ipc_pieces(batch)  # zero-copy views of the rows, and their total size
        payload_size = pieces[1]
        if HEADER_SIZE + payload_size > self.config.max_message_bytes:
            raise MessageTooLargeError(
                f"{self.name}: batch of {batch.num_rows} rows is {HEADER_SIZE + payload_size} "
                f"bytes, over max.message.bytes={self.config.max_message_bytes}"
            )
        last_seq = (
            NO_SEQUENCE
            if base_sequence == NO_SEQUENCE
            else increment_sequence(base_sequence, batch.num_rows - 1)
        )
        fields = ProducerFields(
            producer_id, producer_epoch, base_sequence, last_seq, batch.num_rows, transactional
        )
        verify = transactional and transactional_id is not None and origin is AppendOrigin.CLIENT
        with self._lock:
            self._check_open()
            if verify:
                assert transactional_id is not None
                if producer_id < 0:
                    self.state.check_append(fields, origin)  # the field error, named
                self.state.check_verified(fields, transactional_id, verification)
            original = self.state.check_append(fields, origin)
            if original is not None:
                return AppendResult(
                    original.first_offset, original.last_offset, original.timestamp, True
                )
            now = self._clock()
            encoded = encode_data(
                batch,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                base_sequence=base_sequence,
                transactional=transactional,
                first_timestamp=now,
                max_timestamp=now,
                pieces=pieces,
                leader_epoch=self.leader_epoch,
            )
            self.epochs.assign(self.leader_epoch, self.log_end_offset)
            header = self._write(encoded, now)
            self.state.on_data_batch(fields, header.base_offset, header.last_offset, now)
            if verify:
                self.state.on_verified_append(producer_id, verification)
            self._maybe_flush(now)
            return AppendResult(header.base_offset, header.last_offset, now, False)

    def verification_needed(
        self, producer_id: int, producer_epoch: int, transactional_id: str
    ) -> VerificationGuard | None:
        """The guard to verify a transactional batch with its coordinator before
        :meth:`append`, None when its transaction here was verified already
        (``ProducerStateManager.verification_needed``)."""
        with self._lock:
            return self.state.verification_needed(producer_id, producer_epoch, transactional_id)

    def drop_verification(self, producer_id: int, guard: VerificationGuard) -> None:
        with self._lock:
            self.state.drop_verification(producer_id, guard)

    def write_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        control_type: ControlType,
        coordinator_epoch: int = 0,
    ) -> MarkerResult:
        """:meth:`write_markers` for one producer."""
        return self.write_markers([(producer_id, producer_epoch)], control_type, coordinator_epoch)

    def write_markers(
        self,
        producers: Sequence[tuple[int, int]],
        control_type: ControlType,
        coordinator_epoch: int = 0,
    ) -> MarkerResult:
        """Append a COMMIT/ABORT marker ending each (producer id, epoch)'s open transaction,
        all in one write and one fsync, durably (docs/design.md §10); returns the first
        marker's offset and the LSO after the last. Refused whole (nothing written) if one
        is at an older producer epoch, or from an older coordinator epoch than its
        producer's last marker (TRANSACTION_COORDINATOR_FENCED). A failed fsync raises
        StorageError (retriable), and so does every later marker until a reopen."""
        if not producers:
            raise InvalidRecordError(f"{self.name}: a marker append needs a producer")
        with self._lock:
            self._check_open()
            for producer_id, producer_epoch in producers:
                self.state.check_marker(producer_id, producer_epoch, coordinator_epoch)
            now, end, epoch = self._clock(), self.log_end_offset, self.leader_epoch
            # At the log end, which a roll keeps.
            encoded = encode_controls(control_type, producers, coordinator_epoch, end, now, epoch)
            if should_roll(self.active, self.config, sum(e.size for e in encoded), now):
                self.roll()
            self.epochs.assign(self.leader_epoch, self.log_end_offset)
            headers = self.active.append_many(encoded, self.config.index_interval_bytes)
            self._unflushed += len(headers)
            self.marker_appends += 1
            for header in headers:
                apply_marker(self.state, header, control_type, coordinator_epoch, self.active)
            lso = self.last_stable_offset
            # fsync now, whatever flush.* say: the transactions are recorded COMPLETE next
            # (docs/design.md §10). Also wait for a roll's background flush of older
            # segments, or recovery could cut the log at a torn batch there.
            self._join_flushers()
            self.flush()
            if self._fsync_failed is not None:
                # The kernel may have dropped dirty pages: only a restart's recovery knows.
                raise StorageError(
                    f"{self.name}: markers at offset {headers[0].base_offset} are not known "
                    f"durable: an fsync of this log failed earlier ({self._fsync_failed}); "
                    "the partition needs a broker restart"
                )
            return MarkerResult(headers[0].base_offset, lso)

    def describe_producers(self) -> list[ProducerDescription]:
        """Every producer the partition keeps state for, by producer id (a copy)."""
        with self._lock:
            return [
                ProducerDescription(
                    e.producer_id,
                    e.epoch,
                    e.last_seq,
                    e.last_timestamp,
                    e.coordinator_epoch,
                    e.current_txn_first_offset,
                )
                for e in sorted(self.state, key=lambda e: e.producer_id)
            ]

    def abort_open_transaction(
        self,
        producer_id: int | None,
        producer_epoch: int | None = None,
        start_offset: int | None = None,
    ) -> HangingAbort:
        """An operator's abort of a transaction no coordinator ends (a hanging one): the
        open transaction of ``producer_id`` (at ``producer_epoch`` if given), or the one
        that starts at ``start_offset``, gets an ABORT marker, durably.

        The marker is written one producer epoch above the producer's, checked and
        written under the log's lock: the producer is fenced on this partition (its next
        write or its coordinator's marker at the old epoch is refused, loudly), so a
        producer that was alive after all is stopped rather than silently losing half of
        its transaction. At the last epoch (2**15 - 1) there is none above: the marker
        goes at that epoch. Its coordinator epoch is the producer's last marker's, so a
        marker from any coordinator that took over since still passes.

        Raises InvalidTxnStateError when the producer (or offset) has no open
        transaction here, InvalidProducerEpochError when ``producer_epoch`` is not the
        producer's epoch (it moved on since it was described)."""
        with self._lock:
            self._check_open()
            entry = self._open_transaction(producer_id, start_offset)
            if producer_epoch is not None and producer_epoch != entry.epoch:
                raise InvalidProducerEpochError(
                    f"{self.name}: producer id {entry.producer_id} is at epoch {entry.epoch}, "
                    f"not {producer_epoch}: it wrote since it was described; describe it again"
                )
            first = entry.current_txn_first_offset
            bumped = min(entry.epoch + 1, MAX_PRODUCER_EPOCH)
            marker = self.write_markers(
                [(entry.producer_id, bumped)], ControlType.ABORT, max(entry.coordinator_epoch, 0)
            )
            log.warning(
                "%s: aborted the open transaction of producer id %d (epoch %d, from offset %d) "
                "at an operator's request; the producer is at epoch %d here from now on",
                self.name,
                entry.producer_id,
                entry.epoch,
                first,
                bumped,
            )
            return HangingAbort(entry.producer_id, first, bumped, marker)

    def _open_transaction(
        self, producer_id: int | None, start_offset: int | None
    ) -> ProducerStateEntry:
        """The state of the producer whose transaction :meth:`abort_open_transaction`
        names; the log's lock is held."""
        ongoing = self.state.ongoing_transactions()
        if producer_id is None:
            found = [pid for pid, first in ongoing.items() if first == start_offset]
            if not found:
                opened = ", ".join(str(o) for o in sorted(ongoing.values())) or "none"
                raise InvalidTxnStateError(
                    f"{self.name}: no open transaction starts at offset {start_offset} "
                    f"(open transactions start at: {opened})"
                )
            producer_id = found[0]
        entry = self.state.get(producer_id)
        if entry is None or entry.current_txn_first_offset == NO_OFFSET:
            raise InvalidTxnStateError(
                f"{self.name}: producer id {producer_id} has no open transaction here: "
                "nothing to abort"
            )
        return entry

    def _write(self, encoded: EncodedBatch, now: int, base: int | None = None) -> BatchHeader:
        if should_roll(self.active, self.config, encoded.size, now):
            self.roll()
        encoded.set_base_offset(self.log_end_offset if base is None else base)  # base: a gap
        header = self.active.append(encoded, self.config.index_interval_bytes)
        self._unflushed += 1
        return header

    # -- durability ----------------------------------------------------------------------
    def _maybe_flush(self, now: int) -> None:
        due = self._unflushed >= self.config.flush_messages
        if due or now - self._last_flush_ms >= self.config.flush_ms:
            self.flush()
        else:  # a flush writes the pages anyway; else start their writeback
            self.active.start_writeback(self.config.flush_writeback_bytes)

    def flush_if_due(self, now_ms: int | None = None) -> bool:
        """Apply ``flush.ms`` to a log that receives no appends (a broker task calls it)."""
        with self._lock:
            if self._closed or self._unflushed == 0:
                return False
            now = self._clock() if now_ms is None else now_ms
            if now - self._last_flush_ms < self.config.flush_ms:
                return False
            self.flush()
            return True

    def flush(self) -> None:
        with self._lock:
            self._check_open()
            try:
                # Not the offset index: a second fsync per durable append (~0.1 ms) buys
                # nothing; roll and close flush it, crash recovery rebuilds the active one.
                self.active.flush_log()
            except OSError as exc:
                self._fsync_failed = self._fsync_failed or f"{self.active.log_path.name}: {exc}"
                raise StorageError(f"{self.name}: fsync failed: {exc}") from exc
            self._unflushed = 0
            self._last_flush_ms = self._clock()

    def roll(self) -> None:
        """Start a new segment at the log end offset and snapshot the producer state."""
        with self._lock:
            old = self.active
            if old.size == 0:
                return
            old.seal()
            new = LogSegment(self.directory, old.next_offset)
            self.segments.append(new)
            fsync_directory(self.directory)
            # Flushing a full segment takes a while; like Kafka, do it off the append path,
            # and the snapshot's fsyncs after it: on ext4 an fsync issued meanwhile waits for
            # that flush (one journal), which stalled appends ~0.15 s per GiB rolled.
            snapshot = write_snapshot(
                self.directory, self.log_end_offset, self.state.entries(), sync=False
            )
            flusher = threading.Thread(
                target=self._flush_rolled,
                args=(old, snapshot),
                name=f"flush-{self.name}",
                daemon=True,
            )
            flusher.start()
            self._flushers = [t for t in self._flushers if t.is_alive()] + [flusher]

    def _flush_rolled(self, old: LogSegment, snapshot: Path) -> None:
        """Segment data first, then its snapshot: a durable snapshot never precedes the data."""
        try:
            old.flush()
            try:
                fsync_file(snapshot)
            except FileNotFoundError:
                return  # already replaced or deleted
            fsync_directory(self.directory)
        except OSError as exc:
            log.error("%s: fsync of rolled segment %s failed: %s", self.name, old.log_path, exc)
            self._fsync_failed = self._fsync_failed or f"{old.log_path.name}: {exc}"

    def take_snapshot(self) -> Path:
        with self._lock:
            return write_snapshot(self.directory, self.log_end_offset, self.state.entries())

    def _join_flushers(self) -> None:
        for t in self._flushers:
            t.join()
        self._flushers = []

    # -- housekeeping ------------------------------------------------------------------
    def expire_producers(self, now_ms: int | None = None) -> list[int]:
        with self._lock:
            return self.state.remove_expired(self._clock() if now_ms is None else now_ms)

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Delete the oldest sealed segments past retention.bytes/ms; producer state stays."""
        with self._lock:
            self._check_open()
            now = self._clock() if now_ms is None else now_ms
            deletable = past_retention(self.segments, self.config, now, self.high_watermark)
            if not deletable:
                return 0
            # The state must outlive the segments that built it: snapshot it first.
            self.take_snapshot()
            self._join_flushers()
            for seg in deletable:
                log.info("%s: retention deletes segment %s", self.name, seg.log_path.name)
                seg.delete()
            self.segments = self.segments[len(deletable) :]
            fsync_directory(self.directory)
            self.epochs.truncate_from_start(self.log_start_offset)
            delete_snapshots_below(self.directory, self.log_start_offset)
            return len(deletable)

    def clean(self, now_ms: int | None = None, *, force: bool = False) -> CleanResult | None:
        """A compaction pass when due or ``force``d (``log/cleaner.py``); None if none ran."""
        if not self.config.policy.compacts:
            return None
        for flusher in list(self._flushers):  # the long fsyncs of rolls: outside the lock
            flusher.join()
        with self._lock:
            self._check_open()
            self._join_flushers()  # rolled segments are durable before they are rewritten
            now = self._clock() if now_ms is None else now_ms
            upper = min(self.last_stable_offset, self.high_watermark)
            return self.cleaner.clean(self.segments, upper, now, force=force)

    # -- reads -------------------------------------------------------------------------
    def read(
        self,
        offset: int,
        *,
        max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
        isolation: IsolationLevel | str = IsolationLevel.READ_COMMITTED,
        max_offset: int | None = None,
    ) -> FetchResult:
        """Batches from ``offset`` on, zero-copy, committed-only unless asked otherwise.

        Returns at least one batch when any is readable, then stops before ``max_bytes``.
        ``read_committed`` stops at the last stable offset and skips aborted data.
        """
        level = IsolationLevel.parse(isolation)
        if not isinstance(offset, int) or offset < 0:
            raise OffsetOutOfRangeError(f"{self.name}: offset={offset!r} must be >= 0")
        if max_bytes <= 0:
            raise InvalidRecordError(f"max_bytes={max_bytes} must be positive")
        with self._lock:
            self._check_open()
            start, end = self.log_start_offset, self.log_end_offset
            if offset < start or offset > end:
                raise OffsetOutOfRangeError(
                    f"{self.name}: offset {offset} outside the log's range [{start}, {end}]"
                )
            lso = self.last_stable_offset
            upper = lso if level is IsolationLevel.READ_COMMITTED else self.high_watermark
            if max_offset is not None:
                upper = min(upper, max_offset)
            batches: list[FetchedBatch] = []
            next_offset = offset
            if offset < upper:
                next_offset = collect_batches(
                    self.segments, offset, upper, max_bytes, level, batches
                )
            return FetchResult(batches, next_offset, self.high_watermark, lso, start)

    def read_whole(
        self, offset: int, *, max_bytes: int, committed: bool, stop_at: int | None = None
    ) -> WholeRead:
        """Whole stored batches from the one holding ``offset`` (Kafka's Fetch: the client
        skips the records before the offset it asked), markers included, up to the last
        stable offset (``committed``) or the high watermark, and below ``stop_at`` if given
        (a reader's stable cut, which keeps sink batches whole); at least one when any is
        readable, then none past ``max_bytes`` (0: the offsets only). A batch that ends past
        that end waits for the next read (never cut: its header's sequence and count are
        the producer's). The answer's ``last_stable_offset`` is the partition's own.
        Raises OffsetOutOfRangeError outside [log start, log end], CorruptRecordError for
        a batch that fails its CRC or does not decode."""
        with self._lock:
            self._check_open()
            start, end = self.log_start_offset, self.log_end_offset
            if offset < start or offset > end:
                raise OffsetOutOfRangeError(
                    f"{self.name}: offset {offset} outside the log's range [{start}, {end}]"
                )
            lso, high = self.last_stable_offset, self.high_watermark
            upper = lso if committed else high
            if stop_at is not None:
                upper = min(upper, stop_at)
            batches: list[WholeBatch] = []
            size, read_end = 0, offset
            if offset < upper and max_bytes > 0:
                for seg, stored in batches_from(self.segments, offset):
                    h = stored.header
                    if h.last_offset >= upper or (batches and size + h.size > max_bytes):
                        break
                    try:
                        verify_crc(h, stored.data)
                        if h.is_control:
                            whole = WholeBatch(h, None, decode_control(h, stored.data))
                        else:
                            whole = WholeBatch(h, decode_rows(h, stored.data), None)
                    except CorruptRecordError as exc:
                        raise CorruptRecordError(
                            f"{seg.log_path} at byte {stored.position}: {exc.message}"
                        ) from exc
                    batches.append(whole)
                    size += h.size
                    read_end = h.next_offset
            aborted = sorted(
                (t.producer_id, t.first_offset)
                for seg in self.segments
                if seg.next_offset > offset
                for t in seg.txn_index.overlapping(offset, read_end)
            )
            return WholeRead(batches, aborted if committed else [], high, lso, start)

    def batches_from(self, offset: int) -> Iterator[tuple[LogSegment, StoredBatch]]:
        """Every stored batch holding ``offset`` or after it, with its segment (for tests:
        it takes no lock, so only on a log nothing writes to)."""
        return batches_from(self.segments, offset)

    def read_control(self, offset: int) -> tuple[BatchHeader, ControlType] | None:
        """The marker at ``offset``, if there is one (for tests and tools). Raises
        CorruptRecordError for an unreadable control record."""
        with self._lock:
            for seg in self.segments:
                if seg.base_offset <= offset < seg.next_offset:
                    position = seg.position_of(offset)
                    if position is None:
                        return None
                    stored = next(seg.batches(position))
                    if stored.header.is_control and stored.header.base_offset == offset:
                        record = decode_control(stored.header, stored.data)
                        return stored.header, record.control_type
            return None

    # -- replication (called by broker_core/server/replication/) ---------------------
    def become_leader(self, epoch: int) -> None:
        """Lead at ``epoch`` from the log end on (later batches carry it; the epoch cache
        records it, durably). InvalidRequestError for an older epoch or one out of range."""
        with self._lock:
            self._check_open()
            self.epochs.assign(epoch, self.log_end_offset)
            self.leader_epoch = epoch

    def end_offset_for(self, epoch: int) -> EpochEndOffset:
        """OffsetsForLeaderEpoch: where ``epoch`` ended in this log (LeaderEpochCache)."""
        with self._lock:
            return self.epochs.end_offset_for(epoch, self.log_end_offset)

    def read_raw(self, offset: int, max_bytes: int = DEFAULT_FETCH_MAX_BYTES) -> bytes:
        """Whole batches as stored from the one holding ``offset`` (a follower's fetch),
        up to the log end; raises OffsetOutOfRangeError outside [log start, log end]."""
        with self._lock:
            self._check_open()
            if not self.log_start_offset <= offset <= self.log_end_offset:
                raise OffsetOutOfRangeError(f"{self.name}: offset {offset} is outside the log")
            return read_raw(self.segments, offset, max_bytes)

    def append_as_follower(self, raw: bytes | memoryview) -> int:
        """Append batches exactly as the leader's log holds them; returns the new log end.
        No validator: state, txn index and epoch cache follow from the batches as recovery
        rebuilds them. All checked before any is written (``replica.parse_fetched``, whose
        errors it raises); StorageError on a write failure."""
        with self._lock:
            self._check_open()
            gaps, epoch = self.config.policy.compacts, self.epochs.latest_epoch
            fetched = parse_fetched(raw, self.log_end_offset, epoch, self.name, gaps=gaps)
            if self._schema_check is not None and not self._follower_schema_known:
                # A topic created without a schema takes its first batch's, on a follower
                # as on the leader, so it can serve reads once it leads.
                first = next((b for b in fetched if not b.header.is_control), None)
                if first is not None:
                    self._schema_check(decode_rows(first.header, first.data).schema)
                    self._follower_schema_known = True
            now = self._clock()
            for stored in fetched:
                self.epochs.assign(stored.header.leader_epoch, stored.header.base_offset)
                self._write(as_encoded(stored), now, stored.header.base_offset)
                apply_batch(self.state, self.active, stored)
            self._maybe_flush(now)
            return self.log_end_offset

    def truncate_to(self, offset: int) -> int:
        """Cut a diverged tail at ``offset`` (``replica.truncate_segments``), drop epochs and
        snapshots past the new end (returned), rebuild the state as recovery does. Raises
        OffsetOutOfRangeError below the log start. Rows a reader holds from the cut range
        point into a shrunk memory map: the caller keeps readers off it."""
        with self._lock:
            self._check_open()
            if offset >= self.log_end_offset:
                return self.log_end_offset
            if offset < self.log_start_offset:
                raise OffsetOutOfRangeError(f"{self.name}: truncation to {offset}, below start")
            self._join_flushers()
            self.segments = truncate_segments(
                self.directory,
                self.name,
                self.segments,
                offset,
                self.config.index_interval_bytes,
            )
            end = self.log_end_offset
            self.epochs.truncate_from_end(end)  # after the log, never before: see leader_epoch.py
            rebuild_state(self.directory, self.segments, self.state)
            if self._high_watermark is not None:
                self._high_watermark = min(self._high_watermark, end)
                self._hw_checkpoint.save(self._high_watermark, sync=True)
            return end

    def log_start_state(self) -> tuple[int, int, int, bytes]:
        """(log start, then ``replica.log_start_state``) for a follower below the start."""
        with self._lock:
            self._check_open()
            state = log_start_state(self.directory, self.segments, self.epochs, self.state)
            return (self.log_start_offset, *state)

    def reset_to(self, offset: int, epoch: int, snapshot: bytes) -> None:
        """An empty log at ``offset`` with the leader's state there (``replica.reset_log``;
        an OSError, once it deletes, closes the log: a restart recovers it)."""
        with self._lock:
            self._check_open()
            self._join_flushers()
            try:
                self.segments, self.epochs = reset_log(
                    self.directory,
                    self.name,
                    self.segments,
                    offset,
                    epoch,
                    snapshot,
                    self.state,
                    self._hw_checkpoint,
                )
            except OSError:
                self._closed = True
                raise
            self._high_watermark = offset

    def update_high_watermark(self, offset: int) -> int:
        """Set the high watermark (replicas only; else the log end), never back (truncate_to
        and reset_to set it), and return it. OffsetOutOfRangeError outside the log."""
        with self._lock:
            if not self.log_start_offset <= offset <= self.log_end_offset:
                raise OffsetOutOfRangeError(f"{self.name}: high watermark {offset} outside log")
            if self._high_watermark is None or offset > self._high_watermark:
                self._high_watermark = offset
            return self.high_watermark

    def checkpoint_high_watermark(self, *, sync: bool = False) -> None:
        """Save a tracked high watermark (HighWatermarkCheckpoint); nothing untracked."""
        with self._lock:
            if self._high_watermark is not None and not self._closed:
                self._hw_checkpoint.save(self.high_watermark, sync=sync)

    # -- lifecycle ---------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self.name}: the log is closed")

    def close(self) -> None:
        """Flush, snapshot the producer state at the log end, and mark the shutdown clean."""
        with self._lock:
            if self._closed:
                return
            self._join_flushers()
            self.checkpoint_high_watermark(sync=True)
            self.active.seal()
            for seg in self.segments:
                seg.flush()
            self.take_snapshot()
            marker = self.directory / CLEAN_SHUTDOWN_FILE
            marker.touch()
            fsync_directory(self.directory)
            for seg in self.segments:
                seg.close()
            self._closed = True

    def abandon(self) -> None:
        """Drop file handles without flushing or snapshotting (tests simulating a crash)."""
        with self._lock:
            self._join_flushers()
            for seg in self.segments:
                seg.close()
            self._closed = True

    def segment_files(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{LOG_SUFFIX}"))


def collect_batches(
    segments: Sequence[LogSegment],
    offset: int,
    upper: int,
    max_bytes: int,
    level: IsolationLevel,
    out: list[FetchedBatch],
) -> int:
    """Append to ``out`` the readable batches in [offset, upper), whole or sliced, at
    least one when any is readable and then none past ``max_bytes``; aborted data is
    skipped for read_committed. Offsets may have gaps (a compacted log): a batch starts
    at its first row's offset, and the next read never starts inside a gap. Returns
    where the next read continues. Raises CorruptRecordError for a batch that fails its
    CRC or does not decode.

    The caller checked the range and keeps the segments still: ``PartitionLog.read``
    under its lock, or the read-only view (``inspect.PartitionView.read``)."""
    aborted: dict[int, list[tuple[int, int]]] = {}
    if level is IsolationLevel.READ_COMMITTED:
        for seg in segments:
            if seg.next_offset > offset:
                for t in seg.txn_index.overlapping(offset, upper):
                    aborted.setdefault(t.producer_id, []).append((t.first_offset, t.last_offset))
    next_offset, size = offset, 0
    for seg, stored in batches_from(segments, offset):
        h = stored.header
        if h.base_offset >= upper:
            # Nothing is left below ``upper``: offsets up to it are read or absent (a gap
            # the cleaner left), so the next read starts there, not inside the gap.
            return upper
        if out and size + h.size > max_bytes:
            return next_offset
        next_offset = min(h.next_offset, upper)
        if h.is_control or _is_aborted(aborted, h):
            continue
        try:
            # Sealed segments are trusted on open (not re-scanned), so the CRC is
            # checked here: a damaged batch must fail, never yield garbage rows.
            verify_crc(h, stored.data)
            rows = decode_rows(h, stored.data)
        except CorruptRecordError as exc:
            raise CorruptRecordError(
                f"{seg.log_path} at byte {stored.position}: {exc.message}"
            ) from exc
        first = max(offset, h.base_offset)
        if first > h.base_offset or h.last_offset >= upper:
            rows = rows.slice(first - h.base_offset, min(h.next_offset, upper) - first)
        out.append(
            FetchedBatch(
                first,
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.is_transactional,
                h.max_timestamp,
                rows,
            )
        )
        size += h.size
    return upper  # every batch below ``upper`` was read (the log may end in a gap)


def _is_aborted(aborted: dict[int, list[tuple[int, int]]], h: BatchHeader) -> bool:
    if not h.is_transactional or h.producer_id not in aborted:
        return False
    return any(first <= h.base_offset <= last for first, last in aborted[h.producer_id])


def past_retention(
    segments: Sequence[LogSegment], config: LogConfig, now_ms: int, high_watermark: int
) -> list[LogSegment]:
    """The oldest sealed segments past ``retention.bytes`` / ``retention.ms``, in order.

    Never the active segment, and never one holding offsets at or above the high
    watermark: a follower may still need them (Kafka deletes only below it too). Nothing
    under ``cleanup.policy=compact`` alone: there the cleaner bounds the log instead.
    """
    if not config.policy.deletes:
        return []
    deletable: list[LogSegment] = []
    size = sum(int(s.size) for s in segments)
    for seg in segments[:-1]:
        over_size = config.retention_bytes >= 0 and size - seg.size >= config.retention_bytes
        over_age = config.retention_ms >= 0 and now_ms - seg.max_timestamp > config.retention_ms
        if not (over_size or over_age) or seg.next_offset > high_watermark:
            break
        deletable.append(seg)
        size -= seg.size
    return deletable


def should_roll(active: LogSegment, config: LogConfig, batch_size: int, now_ms: int) -> bool:
    """Whether a batch of ``batch_size`` bytes goes into a new segment: the active one is
    not empty and would pass ``segment.bytes``, or is ``segment.ms`` old."""
    if active.size == 0:
        return False
    too_big = active.size + batch_size > config.segment_bytes
    too_old = now_ms - active.first_timestamp >= config.segment_ms
    return too_big or too_old
