"""Read a data directory without changing it: what ``idemlog log describe|dump`` use.

Opening a ``LogStore`` for inspection is not harmless: recovery truncates a torn tail,
deletes orphan indexes and snapshots past the end, and a close writes a snapshot and
``.clean_shutdown`` into every partition. Done on a live broker's directory, the last
made that broker's next restart after a crash take its shutdown as clean and skip the
tail check, so a torn tail could be served (issue 24). Here nothing is written, renamed,
deleted or created:

* segments are opened ``O_RDONLY`` and read batch by batch (``readonly_segment``); every
  batch is CRC-checked, and the offset index is rebuilt in memory;
* a torn or corrupt tail, a segment that does not follow on, an unreadable snapshot are
  *reported* (``PartitionView.problems``), never repaired: the view ends where recovery
  would cut;
* the producer state comes from the newest readable snapshot within the log (read, not
  deleted) and the batches after it, replayed as recovery replays them, with the
  aborted-transaction index re-created in memory;
* a partition directory that does not exist reads as empty (a store would create it).

The directory may belong to a running broker (``lock_holder``): the view is then a
moment's picture, and its last batch may be one the broker is still writing (reported as
a torn tail, which a running broker's is not). Time: every batch is read once, so
proportional to the partition's bytes; memory: one batch at a time plus the indexes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from broker_core.errors import (
    CorruptRecordError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from broker_core.log.config import LogConfig
from broker_core.log.dir_lock import lock_holder
from broker_core.log.partition_log import (
    FetchedBatch,
    FetchResult,
    IsolationLevel,
    collect_batches,
)
from broker_core.log.producer_state import ProducerStateManager
from broker_core.log.readonly_segment import ReadOnlySegment
from broker_core.log.recovery import replay
from broker_core.log.segment import LOG_SUFFIX, LogSegment
from broker_core.log.snapshot import list_snapshots, read_snapshot
from broker_core.log.store import TOPIC_FILE, Topic
from broker_core.protocol.wire import DEFAULT_FETCH_MAX_BYTES

LIVE_NOTE = "reading a live directory read-only: the tail may be mid-write"


@dataclass
class PartitionView:
    """One partition as its files hold it now, read-only (see the module docstring)."""

    name: str
    directory: Path
    segments: list[ReadOnlySegment]
    state: ProducerStateManager
    snapshot_offset: int | None  # the producer snapshot the state started from, if any
    problems: list[str] = field(default_factory=list)  # what recovery would repair

    @property
    def log_start_offset(self) -> int:
        return self.segments[0].base_offset if self.segments else 0

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset if self.segments else 0

    @property
    def last_stable_offset(self) -> int:
        first_unstable = self.state.first_unstable_offset()
        end = self.log_end_offset
        return end if first_unstable is None else min(first_unstable, end)

    @property
    def size_bytes(self) -> int:
        return sum(int(s.size) for s in self.segments)

    def read(
        self,
        offset: int,
        *,
        max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
        isolation: IsolationLevel | str = IsolationLevel.READ_COMMITTED,
    ) -> FetchResult:
        """Batches from ``offset`` on, as ``PartitionLog.read`` answers them (committed
        only unless asked otherwise). Raises OffsetOutOfRangeError outside the log,
        CorruptRecordError for a batch that no longer reads back (the file changed)."""
        level = IsolationLevel.parse(isolation)
        start, end = self.log_start_offset, self.log_end_offset
        if offset < start or offset > end:
            raise OffsetOutOfRangeError(
                f"{self.name}: offset {offset} outside the log's range [{start}, {end}]"
            )
        lso = self.last_stable_offset
        upper = lso if level is IsolationLevel.READ_COMMITTED else end
        batches: list[FetchedBatch] = []
        next_offset = offset
        if offset < upper:
            next_offset = collect_batches(self.segments, offset, upper, max_bytes, level, batches)
        return FetchResult(batches, next_offset, end, lso, start)

    def close(self) -> None:
        for seg in self.segments:
            seg.close()
        self.segments = []


def open_partition(directory: Path, config: LogConfig, *, name: str = "") -> PartitionView:
    """Read ``directory`` as recovery after a crash would, changing nothing on disk."""
    name = name or directory.name
    problems: list[str] = []
    segments = _open_segments(directory, name, problems)
    _scan(name, segments, config.index_interval_bytes, problems, config.policy.compacts)
    state = ProducerStateManager(
        window=config.producer_state_batch_window,
        expiration_ms=config.producer_id_expiration_ms,
    )
    view = PartitionView(name, directory, segments, state, None, problems)
    if segments:
        view.snapshot_offset = _load_snapshot(view)
        replay_from = (
            view.log_start_offset if view.snapshot_offset is None else view.snapshot_offset
        )
        try:
            as_read: list[LogSegment] = list(segments)
            replay(as_read, state, replay_from)
        except CorruptRecordError as exc:
            problems.append(f"{name}: replay stopped: {exc.message}")
    return view


def _open_segments(directory: Path, name: str, problems: list[str]) -> list[ReadOnlySegment]:
    try:
        entries = list(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []  # never opened (a store would create it), or deleted with its topic
    bases = []
    for path in entries:
        stem, _, suffix = path.name.partition(".")
        if f".{suffix}" == LOG_SUFFIX:
            if len(stem) == 20 and stem.isdigit():
                bases.append(int(stem))
            else:
                problems.append(f"{name}: {path.name} is not a segment name (ignored)")
    segments = []
    for base in sorted(bases):
        try:
            segments.append(ReadOnlySegment(directory, base))
        except FileNotFoundError:
            continue  # deleted by retention since the listing; the next one starts the log
    return segments


def _scan(
    name: str, segments: list[ReadOnlySegment], interval: int, problems: list[str], gaps: bool
) -> None:
    """CRC-check every segment, ending the view at the first bad batch (in memory); with
    ``gaps`` (a compacted log) offsets may jump forward, as recovery allows."""
    expected = segments[0].base_offset if segments else 0
    for i, seg in enumerate(segments):
        if seg.base_offset < expected or (seg.base_offset != expected and not gaps):
            problems.append(
                f"{name}: segment {seg.log_path.name} does not follow on (expected offset "
                f"{expected}); it and {len(segments) - i - 1} later segments are not read"
            )
            _drop_from(segments, i)
            return
        batches = seg.scan(0, expected, gaps=gaps)  # bound to the size as opened
        seg.restore_position_state(0)
        for stored in batches:
            seg.account_recovered(stored, interval)
        if seg.scan_error is not None or seg.size != seg.file_size:
            problems.append(
                f"{name}: {seg.log_path.name} ends in a torn or unreadable tail at byte "
                f"{seg.size} of {seg.file_size} ({seg.scan_error or 'trailing bytes'}); "
                f"recovery would truncate it there"
                + (
                    f" and drop {len(segments) - i - 1} later segments"
                    if i + 1 < len(segments)
                    else ""
                )
            )
            _drop_from(segments, i + 1)
            return
        expected = seg.next_offset


def _drop_from(segments: list[ReadOnlySegment], index: int) -> None:
    for seg in segments[index:]:
        seg.close()
    del segments[index:]


def _load_snapshot(view: PartitionView) -> int | None:
    """Load the newest readable snapshot within the log into the state; its offset, or None."""
    start, end = view.log_start_offset, view.log_end_offset
    for offset, path in reversed(list_snapshots(view.directory)):
        if offset > end:
            continue  # beyond the log as read (a live broker's newer one, or a cut tail)
        if offset < start:
            break  # older than the log: its producers' later writes are gone
        try:
            _offset, entries = read_snapshot(path, window=view.state.window)
        except (CorruptRecordError, OSError) as exc:
            view.problems.append(f"{view.name}: unreadable producer snapshot skipped: {exc}")
            continue
        view.state.load(entries)
        return offset
    return None


class StoreView:
    """The topics of a data directory, read-only: ``LogStore``'s reading calls without its
    side effects (no directory is created, no partition is recovered or closed)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.defaults = LogConfig.from_mapping(None)
        self.holder = lock_holder(data_dir)  # a live process's pid (-1: unknown), or None
        self._topics: dict[str, Topic] = {}
        for path in sorted(data_dir.iterdir()):
            if (path / TOPIC_FILE).is_file():
                topic = Topic.load(path, self.defaults)
                self._topics[topic.name] = topic
        self._open: list[PartitionView] = []

    @property
    def live(self) -> bool:
        """A running process (a broker) holds the directory's lock."""
        return self.holder is not None

    def topics(self) -> list[str]:
        return sorted(self._topics)

    def topic(self, name: str) -> Topic:
        topic = self._topics.get(name)
        if topic is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist in {self.data_dir}")
        return topic

    def partition(self, name: str, partition: int) -> PartitionView:
        topic = self.topic(name)
        if not 0 <= partition < topic.partitions:
            raise UnknownTopicOrPartitionError(
                f"topic {name!r} has partitions 0..{topic.partitions - 1}, not {partition}"
            )
        view = open_partition(
            topic.directory / str(partition), topic.config, name=f"{name}-{partition}"
        )
        self._open.append(view)
        return view

    def close(self) -> None:
        for view in self._open:
            view.close()
        self._open = []

    def __enter__(self) -> StoreView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
