"""The leader-epoch cache of one partition: at which offset each leader epoch began.

Kafka's LeaderEpochFileCache (KIP-101): an ordered list of (epoch, start offset), one per
leader epoch that wrote to this log, persisted as ``leader-epoch-checkpoint`` in the
partition directory. It answers OffsetsForLeaderEpoch (``end_offset_for``), which is how a
follower finds where its log diverged from a new leader's, and it is cut back whenever
the log is (truncation, retention).

Checkpoint file (text, Kafka's layout): a version line (0), an entry-count line, then one
``<epoch> <start offset>`` line per entry, oldest first. It is replaced atomically
(``broker_core.fileutil.atomic_write``), so a crash leaves the old file or the new one.

No file means "every batch is of epoch 0 (INITIAL_LEADER_EPOCH)": that is what a
directory written before leader epochs holds, and a cache that says only that is never
written (so a log that is never replicated pays no fsync for it). Any other content is
written, durably, before the first batch it describes.

Ordering that keeps the file safe across crashes: an epoch is written to the checkpoint
*before* the first batch of that epoch is appended, and the log is cut *before* the
checkpoint is. So after any crash the file knows every epoch present in the log, plus at
most entries beyond the recovered log end, which opening the log drops
(``truncate_from_end``).

Not thread-safe: the partition log holds its lock around every call.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from broker_core.errors import CorruptRecordError, InvalidRequestError
from broker_core.fileutil import atomic_write
from broker_core.record.batch import INITIAL_LEADER_EPOCH, MAX_LEADER_EPOCH, NO_LEADER_EPOCH

log = logging.getLogger("idemlog.leader_epoch")

CHECKPOINT_FILE = "leader-epoch-checkpoint"
CHECKPOINT_VERSION = 0
# The end offset answered for an epoch this log cannot place (Kafka's UNDEFINED_EPOCH_OFFSET).
UNDEFINED_EPOCH_OFFSET = -1


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """Leader epoch ``epoch`` wrote this log's batches from ``start_offset`` on."""

    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """The answer to OffsetsForLeaderEpoch for a requested epoch.

    ``epoch`` is the largest epoch of this log at or below the requested one, and
    ``end_offset`` the offset where it ended (the start of the next higher epoch, or the
    log end for the latest epoch). Both are the sentinels NO_LEADER_EPOCH and
    UNDEFINED_EPOCH_OFFSET when the log cannot place the requested epoch.
    """

    epoch: int
    end_offset: int

    @property
    def undefined(self) -> bool:
        return self.end_offset == UNDEFINED_EPOCH_OFFSET


UNDEFINED = EpochEndOffset(NO_LEADER_EPOCH, UNDEFINED_EPOCH_OFFSET)


def encode_checkpoint(entries: Iterable[EpochEntry]) -> bytes:
    items = list(entries)
    lines = [str(CHECKPOINT_VERSION), str(len(items))]
    lines += [f"{e.epoch} {e.start_offset}" for e in items]
    return ("\n".join(lines) + "\n").encode()


def decode_checkpoint(data: bytes, *, name: str = CHECKPOINT_FILE) -> list[EpochEntry]:
    """Parse a checkpoint file. Raises CorruptRecordError for anything malformed,
    including epochs or start offsets that do not strictly increase."""
    try:
        lines = data.decode("ascii").splitlines()
        version, count = int(lines[0]), int(lines[1])
        if version != CHECKPOINT_VERSION:
            raise CorruptRecordError(f"{name}: unknown checkpoint version {version}")
        if count != len(lines) - 2:
            raise CorruptRecordError(f"{name}: says {count} entries, holds {len(lines) - 2}")
        entries = []
        for line in lines[2:]:
            epoch, start = line.split(" ")
            entries.append(EpochEntry(int(epoch), int(start)))
    except (UnicodeDecodeError, IndexError, ValueError) as exc:
        raise CorruptRecordError(f"{name}: malformed leader-epoch checkpoint ({exc})") from exc
    for before, after in itertools.pairwise(entries):
        if not (before.epoch < after.epoch and before.start_offset <= after.start_offset):
            raise CorruptRecordError(f"{name}: entries out of order: {before} then {after}")
    if entries and (entries[0].epoch < INITIAL_LEADER_EPOCH or entries[0].start_offset < 0):
        raise CorruptRecordError(f"{name}: negative epoch or offset in {entries[0]}")
    return entries


class LeaderEpochCache:
    """The (epoch, start offset) entries of one partition directory, kept on disk.

    Build it with ``load`` (the checkpoint as found, empty when there is none, None when
    it is unreadable: the caller rebuilds it from the log's batch headers, ``rebuild``).
    """

    def __init__(self, directory: Path, entries: Iterable[EpochEntry] = ()) -> None:
        self.path = directory / CHECKPOINT_FILE
        self._entries: list[EpochEntry] = list(entries)

    @classmethod
    def load(cls, directory: Path) -> LeaderEpochCache | None:
        """The cache stored in ``directory``: empty without a checkpoint (see the module
        doc), None when it is unreadable (logged), so that the caller rebuilds it."""
        path = directory / CHECKPOINT_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return cls(directory)
        try:
            return cls(directory, decode_checkpoint(data, name=str(path)))
        except CorruptRecordError as exc:
            log.warning("rebuilding the leader-epoch cache from the log: %s", exc)
            return None

    @classmethod
    def rebuild(cls, directory: Path, epochs: Iterable[tuple[int, int]]) -> LeaderEpochCache:
        """A cache from (leader epoch, base offset) of every batch in offset order, written.

        A batch whose epoch is lower than an earlier one's (which a log never holds) is
        counted under the earlier, higher epoch.
        """
        cache = cls(directory)
        for epoch, offset in epochs:
            if epoch > cache.latest_epoch:
                cache._entries.append(EpochEntry(epoch, offset))
        cache._persist()
        return cache

    # -- reading --------------------------------------------------------------------------
    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        """The highest epoch that wrote (or is about to write) this log; NO_LEADER_EPOCH
        for an empty cache."""
        return self._entries[-1].epoch if self._entries else NO_LEADER_EPOCH

    @property
    def earliest_epoch(self) -> int:
        return self._entries[0].epoch if self._entries else NO_LEADER_EPOCH

    def end_offset_for(self, epoch: int, log_end_offset: int) -> EpochEndOffset:
        """Kafka's OffsetsForLeaderEpoch answer for ``epoch`` (see EpochEndOffset).

        - the latest epoch: (epoch, ``log_end_offset``);
        - an epoch between known ones: (largest known epoch <= it, start offset of the
          next higher known epoch);
        - an epoch below every known one: (that epoch, start offset of the earliest);
        - NO_LEADER_EPOCH, an epoch above every known one, or an empty cache: UNDEFINED.
        """
        if epoch == NO_LEADER_EPOCH or not self._entries:
            return UNDEFINED
        if epoch == self.latest_epoch:
            return EpochEndOffset(epoch, log_end_offset)
        epochs = [e.epoch for e in self._entries]
        higher = bisect.bisect_right(epochs, epoch)
        if higher == len(epochs):
            return UNDEFINED
        end = self._entries[higher].start_offset
        if higher == 0:
            return EpochEndOffset(epoch, end)
        return EpochEndOffset(self._entries[higher - 1].epoch, end)

    def start_offset_of(self, epoch: int) -> int | None:
        """Where ``epoch`` began in this log; None if it wrote nothing here."""
        return next((e.start_offset for e in self._entries if e.epoch == epoch), None)

    def epoch_at(self, offset: int) -> int:
        """The epoch that wrote ``offset`` (NO_LEADER_EPOCH below the earliest entry)."""
        starts = [e.start_offset for e in self._entries]
        i = bisect.bisect_right(starts, offset)
        return self._entries[i - 1].epoch if i else NO_LEADER_EPOCH

    # -- changes --------------------------------------------------------------------------
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` writes from ``start_offset`` on; durable when it returns.

        Returns False (nothing changed) when ``epoch`` is already the latest epoch: its
        start offset stays the first one recorded. Raises InvalidRequestError for an epoch
        outside [0, 2^31 - 1], below the latest one, or starting before the latest entry.
        """
        if not INITIAL_LEADER_EPOCH <= epoch <= MAX_LEADER_EPOCH:
            raise InvalidRequestError(f"leader epoch {epoch} outside [0, {MAX_LEADER_EPOCH}]")
        if epoch == self.latest_epoch:
            return False
        if epoch < self.latest_epoch:
            raise InvalidRequestError(
                f"leader epoch {epoch} is older than this log's latest epoch {self.latest_epoch}"
            )
        if self._entries and start_offset < self._entries[-1].start_offset:
            raise InvalidRequestError(
                f"leader epoch {epoch} cannot start at offset {start_offset}, before epoch "
                f"{self._entries[-1].epoch}'s start {self._entries[-1].start_offset}"
            )
        self._entries.append(EpochEntry(epoch, start_offset))
        self._persist()
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop the entries starting at or after ``end_offset`` (the log was cut there)."""
        kept = [e for e in self._entries if e.start_offset < end_offset]
        if len(kept) != len(self._entries):
            self._entries = kept
            self._persist()

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget epochs wholly below ``start_offset`` (retention deleted their data); the
        epoch holding ``start_offset`` is kept, starting there."""
        starts = [e.start_offset for e in self._entries]
        i = bisect.bisect_right(starts, start_offset)
        if i == 0 or (i == 1 and starts[0] == start_offset):
            return
        first = self._entries[i - 1]
        self._entries = [EpochEntry(first.epoch, start_offset), *self._entries[i:]]
        self._persist()

    def _persist(self) -> None:
        only_initial = all(e.epoch == INITIAL_LEADER_EPOCH for e in self._entries)
        if only_initial and not self.path.exists():
            return  # what no file says already (see the module doc)
        atomic_write(self.path, encode_checkpoint(self._entries))
