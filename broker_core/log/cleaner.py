"""The log cleaner: one compaction pass over a partition's closed segments.

Kafka's cleaner rules, adapted to Arrow batches (docs/storage.md, Compaction):

* only closed segments wholly below min(last stable offset, high watermark), and older
  than ``min.compaction.lag.ms``, are cleaned: never the active segment, never rows of an
  open transaction;
* the newest committed row of each key (``compaction.key.columns``) survives, older ones
  go; rows of aborted transactions go; tombstones go ``delete.retention.ms`` after a pass
  first reached them, and so do transaction markers once no data of their transaction is
  left before them;
* offsets never change: a batch that loses rows is split into runs of consecutive kept
  rows, each its own batch with the run's base offset and base sequence, unless the runs
  would take more bytes than the batch (then it stays whole, for a later pass): a pass
  never grows the log;
* the batches the producer state caches (each producer's last ones) are kept whole, so a
  retry is still answered as a duplicate with its original offsets, even after a replay,
  and so is the last batch of the cleanable range (a log ends where its last batch does);
  a tombstone stays while a superseded row of its key is kept in such a batch;
* a cleaned segment is built in ``.cleaning/`` and swapped in (``swap.py``).

The pass runs under the partition's lock (``PartitionLog.clean``): appends to that
partition wait for it. Its memory: the offset map, one entry per distinct key in the
cleanable range (a compacted log holds about one row per live key there, plus what was
written since the last pass; unlike Kafka's dedupe buffer it has no fixed cap: the map is
built from the log start, so a pass cut short at a cap would never get past it), one
batch's rows at a time, and the planned batches of the segments.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from broker_core.fileutil import atomic_write, fsync_directory
from broker_core.log import swap
from broker_core.log.compaction import row_keys, tombstones
from broker_core.log.config import LogConfig
from broker_core.log.producer_state import ProducerStateManager
from broker_core.log.segment import LogSegment, StoredBatch
from broker_core.log.snapshot import list_snapshots
from broker_core.record.batch import (
    HEADER_SIZE,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    BatchHeader,
    EncodedBatch,
    decode_rows,
    encode_data,
    increment_sequence,
    verify_crc,
)

log = logging.getLogger("idemlog.cleaner")

CHECKPOINT_FILE = "cleaner-checkpoint"
# Passes remembered within delete.retention.ms; more are merged (see CleanerCheckpoint).
MAX_YOUNG_PASSES = 32


@dataclass(frozen=True, slots=True)
class CleanPass:
    end_offset: int  # the pass cleaned offsets below this
    time_ms: int


class CleanerCheckpoint:
    """When cleaning first reached each offset: ``cleaner-checkpoint`` in the partition.

    Offsets below ``expired_end`` were reached more than ``delete.retention.ms`` ago;
    each young pass says "offsets below ``end_offset`` (and above the previous pass's)
    were first reached at ``time_ms``". At most MAX_YOUNG_PASSES are kept: past that the
    two oldest merge into the later one, which only delays a removal (never hastens one).
    The file is text, replaced atomically; an unreadable one is dropped (every offset is
    then reached anew: tombstones and markers are kept longer, never shorter).
    """

    def __init__(self, directory: Path) -> None:
        self.path = directory / CHECKPOINT_FILE
        self.expired_end = 0
        self.young: list[CleanPass] = []
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        try:
            lines = self.path.read_text().split("\n")
            if lines[0] != "0":
                raise ValueError(f"version {lines[0]!r}")
            self.expired_end = int(lines[1])
            count = int(lines[2])
            young = []
            for line in lines[3 : 3 + count]:
                end, time_ms = line.split()
                young.append(CleanPass(int(end), int(time_ms)))
            if len(young) != count:
                raise ValueError("truncated")
            self.young = young
        except (OSError, ValueError, IndexError) as exc:
            log.warning("%s: unreadable, starting afresh (%s)", self.path, exc)
            self.expired_end, self.young = 0, []

    @property
    def clean_end(self) -> int:
        """Where the last pass ended: offsets from here on are dirty."""
        return self.young[-1].end_offset if self.young else self.expired_end

    def removable(self, offset: int, now_ms: int, retention_ms: int) -> bool:
        """Whether a tombstone or marker at ``offset`` was reached ``retention_ms`` ago
        (an offset no pass reached yet is reached now)."""
        if offset < self.expired_end:
            return True
        for p in self.young:
            if offset < p.end_offset:
                return p.time_ms + retention_ms <= now_ms
        return retention_ms == 0

    def horizon_due(self, now_ms: int, retention_ms: int) -> bool:
        """A young pass's tombstones and markers may now be removed: worth a pass."""
        return any(p.time_ms + retention_ms <= now_ms for p in self.young)

    def truncate(self, log_end: int) -> None:
        """Forget what passes reached at or above ``log_end`` (in memory; every pass calls
        it first, and the next :meth:`record` saves it)."""
        self.expired_end = min(self.expired_end, log_end)
        young, below = [], self.expired_end
        for p in self.young:
            end = min(p.end_offset, log_end)
            if end > below:  # a pass cut to nothing new says nothing
                young.append(CleanPass(end, p.time_ms))
                below = end
        self.young = young

    def record(self, end_offset: int, now_ms: int, retention_ms: int) -> None:
        """Remember a pass that cleaned below ``end_offset`` at ``now_ms``; durable."""
        for p in [p for p in self.young if p.time_ms + retention_ms <= now_ms]:
            self.expired_end = max(self.expired_end, p.end_offset)
            self.young.remove(p)
        if end_offset > self.clean_end:
            self.young.append(CleanPass(end_offset, now_ms))
        while len(self.young) > MAX_YOUNG_PASSES:
            del self.young[0]
        lines = ["0", str(self.expired_end), str(len(self.young))]
        lines += [f"{p.end_offset} {p.time_ms}" for p in self.young]
        atomic_write(self.path, ("\n".join(lines) + "\n").encode())


@dataclass(slots=True)
class CleanerStats:
    """Per partition, since the log was opened (the metrics document's cleaner gauges)."""

    passes: int = 0
    cleaned_bytes: int = 0  # bytes of the segments rewritten, before cleaning
    removed_rows: int = 0
    removed_markers: int = 0
    last_clean_ms: int = NO_TIMESTAMP


@dataclass(frozen=True, slots=True)
class CleanResult:
    """What one pass did (the log's segment list was updated in place)."""

    clean_end: int
    rewritten: int  # segments rewritten or deleted
    bytes_before: int
    bytes_after: int
    removed_rows: int
    removed_markers: int


@dataclass(slots=True)
class _SegmentPlan:
    segment: LogSegment
    out: list[EncodedBatch] = field(default_factory=list)
    removed_markers: set[int] = field(default_factory=set)
    removed_rows: int = 0
    changed: bool = False


def _whole(stored: StoredBatch) -> EncodedBatch:
    data = stored.data
    return EncodedBatch(bytearray(data[:HEADER_SIZE]), [data[HEADER_SIZE:]], len(data), True)


def _runs(keep: Sequence[bool]) -> list[tuple[int, int]]:
    """(start, length) of each run of True in ``keep``."""
    runs, start = [], None
    for i, k in enumerate(keep):
        if k and start is None:
            start = i
        elif not k and start is not None:
            runs.append((start, i - start))
            start = None
    if start is not None:
        runs.append((start, len(keep) - start))
    return runs


def _run_batch(h: BatchHeader, rows: pa.RecordBatch, start: int, length: int) -> EncodedBatch:
    """Rows [start, start + length) of a batch as a batch of their own, same offsets."""
    return encode_data(
        rows.slice(start, length),
        base_offset=h.base_offset + start,
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=(
            NO_SEQUENCE
            if h.base_sequence == NO_SEQUENCE
            else increment_sequence(h.base_sequence, start)
        ),
        transactional=h.is_transactional,
        first_timestamp=h.first_timestamp,
        max_timestamp=h.max_timestamp,
        leader_epoch=h.leader_epoch,
    )


class PartitionCleaner:
    """Compaction of one partition's log (``PartitionLog`` holds one and its lock).

    ``take_snapshot`` writes a producer-state snapshot at the log end, durably (recovery
    deletes it if the log turns out shorter); the cleaner calls it before removing a
    transaction marker (see :meth:`clean`).
    """

    def __init__(
        self,
        directory: Path,
        name: str,
        config: LogConfig,
        state: ProducerStateManager,
        take_snapshot: Callable[[], object],
    ) -> None:
        self.directory = directory
        self.name = name
        self.config = config
        self.state = state
        self._take_snapshot = take_snapshot
        self.checkpoint = CleanerCheckpoint(directory)
        self.stats = CleanerStats()

    def cleanable(self, segments: Sequence[LogSegment], upper: int, now_ms: int) -> int:
        """How many leading segments a pass may clean: closed, wholly below ``upper``
        (min(last stable offset, high watermark)) and past ``min.compaction.lag.ms``."""
        count = 0
        for seg, after in itertools.pairwise(segments):
            if after.base_offset > upper:
                break
            if seg.max_timestamp != NO_TIMESTAMP and (
                now_ms - seg.max_timestamp < self.config.min_compaction_lag_ms
            ):
                break
            count += 1
        return count

    def due(self, segments: Sequence[LogSegment], upper: int, now_ms: int) -> bool:
        """Worth a pass: dirty bytes at least ``min.cleanable.dirty.ratio`` of the
        cleanable bytes, or tombstones and markers whose retention ran out."""
        count = self.cleanable(segments, upper, now_ms)
        if count == 0:
            return False
        if self.checkpoint.horizon_due(now_ms, self.config.delete_retention_ms):
            return True
        total = sum(int(s.size) for s in segments[:count])
        dirty = sum(
            int(s.size) for s in segments[:count] if s.base_offset >= self.checkpoint.clean_end
        )
        return dirty > 0 and dirty >= self.config.min_cleanable_dirty_ratio * total

    def clean(
        self, segments: list[LogSegment], upper: int, now_ms: int, *, force: bool = False
    ) -> CleanResult | None:
        """One pass (rules in the module docstring) over the log's ``segments``, which it
        updates in place; None when the topic is not compacted or nothing is due
        (``force``: run whenever a segment is cleanable).

        Crash safety: each rewritten segment is swapped in whole (``swap.py``). Before a
        marker is removed a snapshot is written at the log end and the snapshots at or
        below the marker are deleted, so no recovery loads a snapshot whose open
        transaction the marker would have ended. Raises CorruptRecordError for a batch
        that fails its CRC (nothing is changed then), OSError / StorageError on a write.
        """
        cfg = self.config
        if not cfg.policy.compacts:
            return None
        # A log cut back below a pass's end (a diverged follower) holds new rows there.
        self.checkpoint.truncate(segments[-1].next_offset)
        count = self.cleanable(segments, upper, now_ms)
        if count == 0 or not (force or self.due(segments, upper, now_ms)):
            return None
        cleanable = list(segments[:count])
        end = segments[count].base_offset
        aborted = _aborted_ranges(segments)
        protected = {
            (entry.producer_id, meta.first_offset) for entry in self.state for meta in entry.batches
        }
        key_columns = cfg.key_columns
        newest = self._offset_map(cleanable, aborted, key_columns)
        plans: list[_SegmentPlan] = []
        txn_has_data: dict[int, bool] = {}  # producer id -> data of its open txn kept
        stale: set[Hashable] = set()  # keys with a superseded row kept (in a whole batch)
        # (an empty first segment, left by an earlier pass, has no last batch)
        last = (len(cleanable) - 1, max((b.position for b in cleanable[-1].batches()), default=-1))
        for i, seg in enumerate(cleanable):
            plan = _SegmentPlan(seg)
            for stored in seg.batches():
                is_last = (i, stored.position) == last
                self._plan_batch(
                    plan, stored, newest, aborted, protected, txn_has_data, stale, now_ms, is_last
                )
            plans.append(plan)
        removed_markers = set().union(*(p.removed_markers for p in plans))
        if removed_markers:
            self._forget_snapshots_below(max(removed_markers))
        rewritten, before, after = 0, 0, 0
        rows = sum(p.removed_rows for p in plans)
        try:
            for plan in plans:
                if not plan.changed:
                    continue
                rewritten += 1
                before += int(plan.segment.size)
                # In place, one segment at a time: if a later one fails, the list still
                # matches the files (the swapped segments new, the others old).
                i = segments.index(plan.segment)
                new = self._rewrite(plan, first=i == 0)
                if new is None:
                    del segments[i]
                else:
                    segments[i] = new
                    after += int(new.size)
        finally:
            if rewritten:
                fsync_directory(self.directory)
        self.checkpoint.record(end, now_ms, cfg.delete_retention_ms)
        self.stats.passes += 1
        self.stats.cleaned_bytes += before
        self.stats.removed_rows += rows
        self.stats.removed_markers += len(removed_markers)
        self.stats.last_clean_ms = now_ms
        if rewritten:
            log.info(
                "%s: cleaned below offset %d: %d segments rewritten, %d -> %d bytes, "
                "%d rows and %d markers removed",
                self.name,
                end,
                rewritten,
                before,
                after,
                rows,
                len(removed_markers),
            )
        return CleanResult(end, rewritten, before, after, rows, len(removed_markers))

    # -- the pass's parts ----------------------------------------------------------------
    def _offset_map(
        self,
        cleanable: Sequence[LogSegment],
        aborted: dict[int, list[tuple[int, int]]],
        key_columns: Sequence[str],
    ) -> dict[Hashable, int]:
        """Key -> offset of its newest committed row in the cleanable range."""
        newest: dict[Hashable, int] = {}
        for seg in cleanable:
            for stored in seg.batches():
                h = stored.header
                verify_crc(h, stored.data)
                if h.is_control or _is_aborted(aborted, h):
                    continue
                for i, key in enumerate(row_keys(decode_rows(h, stored.data), key_columns)):
                    newest[key] = h.base_offset + i
        return newest

    def _plan_batch(
        self,
        plan: _SegmentPlan,
        stored: StoredBatch,
        newest: dict[Hashable, int],
        aborted: dict[int, list[tuple[int, int]]],
        protected: set[tuple[int, int]],
        txn_has_data: dict[int, bool],
        stale_keys: set[Hashable],
        now_ms: int,
        is_last: bool,
    ) -> None:
        h = stored.header
        retention = self.config.delete_retention_ms
        if h.is_control:
            has_data = txn_has_data.pop(h.producer_id, False)
            if (
                not is_last
                and not has_data
                and self.checkpoint.removable(h.base_offset, now_ms, retention)
            ):
                plan.removed_markers.add(h.base_offset)
                plan.changed = True
            else:
                plan.out.append(_whole(stored))
            return
        # The last batch of the range stays whole: a log whose active segment is still
        # empty then ends where its last batch does, on leaders and followers alike.
        keep_whole = is_last or (h.has_producer_id and (h.producer_id, h.base_offset) in protected)
        aborted_batch = _is_aborted(aborted, h)
        if keep_whole:
            kept = h.record_count
            plan.out.append(_whole(stored))
            if not aborted_batch:
                # Its superseded rows stay readable: their keys' tombstones must stay too,
                # or removing one would bring an old value back.
                keys = row_keys(decode_rows(h, stored.data), self.config.key_columns)
                stale_keys.update(k for i, k in enumerate(keys) if newest[k] != h.base_offset + i)
        elif aborted_batch:
            kept = 0
        else:
            rows = decode_rows(h, stored.data)
            keys = row_keys(rows, self.config.key_columns)
            dead = tombstones(rows, self.config.key_columns)
            keep = [
                newest.get(key) == h.base_offset + i
                and not (
                    dead[i]
                    and key not in stale_keys
                    and self.checkpoint.removable(h.base_offset + i, now_ms, retention)
                )
                for i, key in enumerate(keys)
            ]
            kept = sum(keep)
            runs = [_run_batch(h, rows, s, n) for s, n in _runs(keep)] if kept else []
            if kept and (kept == h.record_count or sum(r.size for r in runs) >= h.size):
                # Split, the kept rows would take more room than the whole batch (one
                # schema message per run): keep it whole, so a pass never grows the log.
                kept = h.record_count
                plan.out.append(_whole(stored))
                stale_keys.update(k for i, k in enumerate(keys) if newest[k] != h.base_offset + i)
            else:
                plan.out.extend(runs)
        if kept < h.record_count:
            plan.removed_rows += h.record_count - kept
            plan.changed = True
        if h.is_transactional and kept:
            txn_has_data[h.producer_id] = True

    def _forget_snapshots_below(self, marker_offset: int) -> None:
        """A fresh snapshot at the log end, then none at or below ``marker_offset``: a
        snapshot taken inside the marker's transaction would reopen it after a crash."""
        self._take_snapshot()
        for offset, path in list_snapshots(self.directory):
            if offset <= marker_offset:
                path.unlink(missing_ok=True)
        fsync_directory(self.directory)

    def _rewrite(self, plan: _SegmentPlan, *, first: bool) -> LogSegment | None:
        """Swap in the planned segment; None when it is left empty and deleted (the
        first segment is kept, empty: the log start offset never moves)."""
        old = plan.segment
        interval = self.config.index_interval_bytes
        if not plan.out and not first:
            log.info("%s: cleaning empties segment %s; deleted", self.name, old.log_path.name)
            old.delete()
            return None
        staging = self.directory / swap.CLEANING_DIR
        staging.mkdir(exist_ok=True)
        for stale in staging.glob(f"{old.base_offset:020d}.*"):
            stale.unlink()
        built = LogSegment(staging, old.base_offset)
        built.txn_index.path.touch()  # the old one must be replaced even when empty
        for encoded in plan.out:
            built.append(encoded, interval)
        for txn in old.txn_index.entries:
            if txn.last_offset not in plan.removed_markers:
                built.txn_index.append(txn)
        built.seal()
        built.flush()
        built.close()
        fsync_directory(staging)
        swap.install(self.directory, old.base_offset)
        old.close()  # readers holding rows keep the old file's map alive
        new = LogSegment(self.directory, old.base_offset)
        new.load_summary(interval)
        return new


def _aborted_ranges(segments: Sequence[LogSegment]) -> dict[int, list[tuple[int, int]]]:
    aborted: dict[int, list[tuple[int, int]]] = {}
    for seg in segments:
        for t in seg.txn_index.entries:
            aborted.setdefault(t.producer_id, []).append((t.first_offset, t.last_offset))
    return aborted


def _is_aborted(aborted: dict[int, list[tuple[int, int]]], h: BatchHeader) -> bool:
    if not h.is_transactional or h.producer_id not in aborted:
        return False
    return any(first <= h.base_offset <= last for first, last in aborted[h.producer_id])
