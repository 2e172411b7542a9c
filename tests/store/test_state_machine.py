"""One partition log driven by random producers, restarts and crashes, against a model.

The model is a list of the batches the log must hold (data and markers, with their offsets
and where each one ends in its segment file) plus, per producer, what the client believes
(epoch, next sequence, batches it sent). Everything the broker knows about a producer is
derived from that list alone, following docs/design.md §4, so a restart or a crash needs no
special model code: a crash just removes the batches that the cut or the corruption loses,
and the next predictions follow from what is left.

The model imports nothing from broker_core but errors, the public store API, ControlType
and the sentinels. A longer shake-out: IDEMLOG_SM_EXAMPLES=2000 IDEMLOG_SM_STEPS=150.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from broker_core.errors import (
    DuplicateSequenceError,
    IdemlogError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    UnknownProducerIdError,
)
from broker_core.log.partition_log import PartitionLog
from broker_core.log.store import LogStore
from broker_core.record.batch import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, ControlType
from tests.store.helpers import SCHEMA, read_ids, rows

SEQ_SPACE = 2**31
WINDOW = 3
CONFIG: dict[str, object] = {
    # ~10 data batches (600-1040 bytes each) per segment: rolls every few steps.
    "segment.bytes": 8192,
    "max.message.bytes": 2048,
    "producer.state.batch.window": WINDOW,
}
TOPIC = "sm"
PIDS = (11, 12, 13)
ISSUED = frozenset(PIDS)
NEVER_ISSUED_PID = 999
# The third producer's first epoch starts near the top of the sequence space (a producer
# id new to the partition is accepted at any sequence), so its sequences wrap to 0.
WRAP_START = SEQ_SPACE - 25
MAX_ROWS = 20
# ~10 s on a 2-core machine.
EXAMPLES = int(os.environ.get("IDEMLOG_SM_EXAMPLES", "200"))
STEPS = int(os.environ.get("IDEMLOG_SM_STEPS", "50"))
# Rolls and closes fsync; on tmpfs that costs nothing and the run is ~3x faster. The model
# loses bytes by cutting files, not by dropping the page cache, so durability is not at
# stake here.
TMP_ROOT = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def seq_add(seq: int, delta: int) -> int:
    return (seq + delta) % SEQ_SPACE


def seq_dist(lower: int, upper: int) -> int:
    return (upper - lower) % SEQ_SPACE


# -- the model of the log -------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """A batch the log must hold, and the byte where it ends in its segment file."""

    offset: int
    ids: tuple[int, ...]  # row ids; empty for a marker
    pid: int
    epoch: int
    first_seq: int
    transactional: bool
    control: ControlType | None
    segment: str
    end: int

    @property
    def next_offset(self) -> int:
        return self.offset + max(len(self.ids), 1)  # a marker takes one offset

    @property
    def last_seq(self) -> int:
        return seq_add(self.first_seq, len(self.ids) - 1)


@dataclass
class BrokerView:
    """What the partition must know about one producer, derived from the model log."""

    epoch: int
    window: list[Entry] = field(default_factory=list)  # last WINDOW batches at this epoch
    start_seq: int | None = None  # first sequence written at this epoch
    written: int = 0  # sequences written at this epoch
    open_txn: int | None = None  # first offset of the open transaction


def broker_view(entries: Sequence[Entry], pid: int) -> BrokerView | None:
    view: BrokerView | None = None
    for e in entries:
        if e.pid != pid:
            continue
        if view is None:
            view = BrokerView(e.epoch)
        elif e.epoch > view.epoch:
            # A transaction is the producer id's, not the epoch's: it stays open.
            view = BrokerView(e.epoch, open_txn=view.open_txn)
        if e.control is not None:
            view.open_txn = None
            continue
        view.window = [*view.window, e][-WINDOW:]
        if view.start_seq is None:
            view.start_seq = e.first_seq
        view.written += len(e.ids)
        if e.transactional and view.open_txn is None:
            view.open_txn = e.offset
    return view


# What the model predicts for a send: None = appended as a new batch, an Entry = a
# duplicate answered with that batch's original offsets, an error class = rejected.
Expected = Entry | type[IdemlogError] | None


def expected_send(
    entries: Sequence[Entry], pid: int, epoch: int, seq: int, n: int, transactional: bool
) -> Expected:
    if pid == NO_PRODUCER_ID:
        return None  # not idempotent: nothing to check
    last = seq_add(seq, n - 1)
    view = broker_view(entries, pid)
    if view is None:
        return None if pid in ISSUED else UnknownProducerIdError
    if epoch == view.epoch:
        for b in view.window:
            if (b.first_seq, b.last_seq) == (seq, last):
                return b
    if view.open_txn is not None and not transactional:
        return InvalidTxnStateError  # before the epoch and sequence: nothing of them told
    if epoch < view.epoch:
        return InvalidProducerEpochError
    if epoch > view.epoch:
        if seq != 0:
            return OutOfOrderSequenceError
    else:
        next_seq = seq_add(view.window[-1].last_seq, 1) if view.window else 0
        if seq != next_seq:
            start = view.start_seq
            if start is not None and seq_dist(start, seq) <= seq_dist(start, last) < view.written:
                return DuplicateSequenceError
            return OutOfOrderSequenceError
    return None


def transaction_outcomes(entries: Sequence[Entry]) -> tuple[dict[int, bool], dict[int, int]]:
    """(entry index -> committed? for ended transactions, pid -> first offset of open txn)."""
    fate: dict[int, bool] = {}
    pending: dict[int, list[int]] = {}
    for i, e in enumerate(entries):
        if e.control is not None:
            for j in pending.pop(e.pid, []):
                fate[j] = e.control is ControlType.COMMIT
        elif e.transactional:
            pending.setdefault(e.pid, []).append(i)
    return fate, {pid: entries[idx[0]].offset for pid, idx in pending.items()}


def describe(expected: Expected) -> str:
    if expected is None:
        return "a new append"
    if isinstance(expected, Entry):
        return f"a duplicate of offsets {expected.offset}..{expected.next_offset - 1}"
    return expected.__name__


# -- the model of the clients ---------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    epoch: int
    seq: int
    ids: tuple[int, ...]
    transactional: bool


@dataclass
class Producer:
    pid: int
    epoch: int = 0
    next_seq: int = 0
    epoch_start: int = 0  # the sequence this epoch began at
    in_txn: bool = False  # the client began a transaction and has not ended it
    sent: list[Sent] = field(default_factory=list)

    @property
    def used(self) -> int:
        return seq_dist(self.epoch_start, self.next_seq)


class PartitionLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="idemlog-sm-", dir=TMP_ROOT))
        self.now = 1_700_000_000_000
        self.entries: list[Entry] = []
        self.producers = [Producer(pid) for pid in PIDS]
        self.producers[2].next_seq = self.producers[2].epoch_start = WRAP_START
        self.next_id = 0
        self.closed_at = ("", -1)  # (active segment, log end) at the last clean close
        self.store = self._new_store()
        self.store.create_topic(TOPIC, 1, schema=SCHEMA)
        self.log: PartitionLog = self.store.partition(TOPIC, 0)

    def _tick(self) -> int:
        # A deterministic clock: no segment.ms roll, no producer expiry, same every run.
        self.now += 1
        return self.now

    def _new_store(self) -> LogStore:
        return LogStore(
            self.directory, CONFIG, clock=self._tick, producer_id_known=ISSUED.__contains__
        )

    def _reopen(self) -> None:
        self.store = self._new_store()
        self.log = self.store.partition(TOPIC, 0)

    def teardown(self) -> None:
        try:
            self.store.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    # -- model helpers ---------------------------------------------------------------------
    @property
    def leo(self) -> int:
        return self.entries[-1].next_offset if self.entries else 0

    @property
    def lso(self) -> int:
        _, open_txns = transaction_outcomes(self.entries)
        return min(open_txns.values(), default=self.leo)

    def _fresh_ids(self, n: int) -> tuple[int, ...]:
        ids = tuple(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids

    def _active_segment(self) -> Path:
        return self.log.segment_files()[-1]

    def _record(self, entry: Entry) -> None:
        """Add a batch the log just accepted, with where it ended on disk."""
        segment = self._active_segment()
        end = segment.stat().st_size
        prev = self.entries[-1] if self.entries else None
        if prev is not None and prev.segment == segment.name:
            assert end > prev.end
        else:
            # A batch that opens a segment (new or emptied by a crash) names it.
            assert segment.name == f"{entry.offset:020d}.log"
            if prev is not None:
                event("batch opened a later segment")
        self.entries.append(replace(entry, segment=segment.name, end=end))

    def _send(
        self, pid: int, epoch: int, seq: int, ids: tuple[int, ...], transactional: bool
    ) -> Expected:
        """Send a batch; the store's answer must be the one the model predicts."""
        expected = expected_send(self.entries, pid, epoch, seq, len(ids), transactional)
        leo = self.leo
        try:
            result = self.log.append(
                rows(len(ids), ids[0]),
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=seq,
                transactional=transactional,
            )
        except IdemlogError as exc:
            assert type(exc) is expected, (
                f"pid {pid} epoch {epoch} seq {seq} n {len(ids)}: got {exc}, "
                f"model expected {describe(expected)}"
            )
            event(f"send: {type(exc).__name__}")
            return expected
        assert not isinstance(expected, type), f"got {result}, model expected {describe(expected)}"
        if expected is None:
            assert (result.base_offset, result.last_offset, result.duplicate) == (
                leo,
                leo + len(ids) - 1,
                False,
            )
            self._record(Entry(leo, ids, pid, epoch, seq, transactional, None, "", 0))
            event("send: appended")
        else:
            assert (result.base_offset, result.last_offset, result.duplicate) == (
                expected.offset,
                expected.next_offset - 1,
                True,
            ), "a duplicate must be answered with the original's offsets"
            event("send: duplicate")
        return expected

    def _marker(self, pid: int, epoch: int, control: ControlType) -> bool:
        view = broker_view(self.entries, pid)
        fenced = view is not None and epoch < view.epoch
        leo = self.leo
        try:
            written = self.log.write_marker(pid, epoch, control)
        except InvalidProducerEpochError:
            assert fenced, f"marker of pid {pid} at epoch {epoch} was refused"
            event("marker: fenced")
            return False
        offset = written.offset
        assert not fenced, f"a zombie marker (epoch {epoch}) was written at offset {offset}"
        assert offset == leo
        self._record(Entry(offset, (), pid, epoch, NO_SEQUENCE, True, control, "", 0))
        assert written.last_stable_offset == self.lso, "the LSO the marker reports"
        event(f"marker: {control.name}")
        return True

    def _bump_epoch(self, p: Producer, write_abort: bool) -> None:
        """A new producer instance: epoch + 1, sequences from 0 (InitProducerId)."""
        p.epoch += 1
        p.next_seq = p.epoch_start = 0
        view = broker_view(self.entries, p.pid)
        if write_abort and (p.in_txn or (view is not None and view.open_txn is not None)):
            # The coordinator ends what the old instance left open, at the new epoch.
            assert self._marker(p.pid, p.epoch, ControlType.ABORT)
            p.in_txn = False

    # -- rules -----------------------------------------------------------------------------
    def _append(self, pi: int, n: int, transactional: bool, write_abort: bool) -> None:
        p = self.producers[pi]
        ids = self._fresh_ids(n)
        expected = self._send(p.pid, p.epoch, p.next_seq, ids, transactional)
        if expected is OutOfOrderSequenceError:
            # Acknowledged batches were lost (a crash): a Kafka client bumps its epoch.
            event("append: lost acked batches, epoch bumped")
            self._bump_epoch(p, write_abort)
        elif expected is None or isinstance(expected, Entry) or expected is DuplicateSequenceError:
            if p.next_seq + n > SEQ_SPACE:
                event("append: sequence wrapped")
            p.sent.append(Sent(p.epoch, p.next_seq, ids, transactional))
            p.next_seq = seq_add(p.next_seq, n)
            p.in_txn = p.in_txn or transactional

    # Two rules with one body: appends are most of what a log sees.
    @rule(
        pi=st.integers(0, len(PIDS) - 1),
        n=st.integers(1, MAX_ROWS),
        transactional=st.booleans(),
        write_abort=st.booleans(),
    )
    def append(self, pi: int, n: int, transactional: bool, write_abort: bool) -> None:
        self._append(pi, n, transactional, write_abort)

    @rule(
        pi=st.integers(0, len(PIDS) - 1),
        n=st.integers(1, MAX_ROWS),
        transactional=st.booleans(),
        write_abort=st.booleans(),
    )
    def append_again(self, pi: int, n: int, transactional: bool, write_abort: bool) -> None:
        self._append(pi, n, transactional, write_abort)

    @precondition(lambda self: any(p.sent for p in self.producers))
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        """Resend an earlier batch unchanged (a lost ack, or a late network duplicate)."""
        p = data.draw(st.sampled_from([p for p in self.producers if p.sent]), label="producer")
        recent = st.integers(max(0, len(p.sent) - WINDOW - 2), len(p.sent) - 1)
        i = data.draw(st.one_of(recent, st.integers(0, len(p.sent) - 1)), label="batch")
        s = p.sent[i]
        before = [e.ids for e in self.entries if e.control is None]
        self._send(p.pid, s.epoch, s.seq, s.ids, s.transactional)
        if any(s.ids == ids for ids in before):
            # The original is in the log: nothing may have been written.
            assert [e.ids for e in self.entries if e.control is None] == before

    @rule(
        pi=st.integers(0, len(PIDS) - 1),
        overlap=st.booleans(),
        k=st.integers(1, 5),
        extra=st.integers(1, 5),
        transactional=st.booleans(),
    )
    def out_of_order(self, pi: int, overlap: bool, k: int, extra: int, transactional: bool) -> None:
        """A batch past a gap, or one overlapping the tail partly: OUT_OF_ORDER_SEQUENCE."""
        p = self.producers[pi]
        if overlap and p.used > 0:
            back = min(k, p.used)
            seq, n = seq_add(p.next_seq, -back), back + extra  # ends past the last sent
        else:
            seq, n = seq_add(p.next_seq, k), extra
        self._send(p.pid, p.epoch, seq, self._fresh_ids(n), transactional)

    @rule(pi=st.integers(0, len(PIDS) - 1), write_abort=st.booleans())
    def bump_epoch(self, pi: int, write_abort: bool) -> None:
        self._bump_epoch(self.producers[pi], write_abort)

    def _txn_candidates(self) -> list[Producer]:
        _, open_txns = transaction_outcomes(self.entries)
        return [p for p in self.producers if p.in_txn or p.pid in open_txns]

    @precondition(lambda self: bool(self._txn_candidates()))
    @rule(data=st.data(), commit=st.booleans())
    def end_transaction(self, data: st.DataObject, commit: bool) -> None:
        p = data.draw(st.sampled_from(self._txn_candidates()), label="producer")
        assert self._marker(p.pid, p.epoch, ControlType.COMMIT if commit else ControlType.ABORT)
        p.in_txn = False

    @precondition(lambda self: any(p.epoch > 0 for p in self.producers))
    @rule(data=st.data(), commit=st.booleans())
    def zombie_marker(self, data: st.DataObject, commit: bool) -> None:
        """A coordinator request from a fenced epoch; refused unless a crash lost the fence."""
        p = data.draw(st.sampled_from([p for p in self.producers if p.epoch > 0]), label="pid")
        epoch = data.draw(st.integers(0, p.epoch - 1), label="epoch")
        control = ControlType.COMMIT if commit else ControlType.ABORT
        view = broker_view(self.entries, p.pid)
        if view is not None and epoch < view.epoch:
            assert not self._marker(p.pid, epoch, control)

    @rule(n=st.integers(1, MAX_ROWS), transactional=st.booleans())
    def never_issued_producer(self, n: int, transactional: bool) -> None:
        expected = self._send(NEVER_ISSUED_PID, 0, 0, self._fresh_ids(n), transactional)
        assert expected is UnknownProducerIdError

    @rule(n=st.integers(1, MAX_ROWS))
    def plain_append(self, n: int) -> None:
        """A batch without producer id: never deduplicated, always appended."""
        ids = self._fresh_ids(n)
        assert self._send(NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE, ids, False) is None

    @rule()
    def restart(self) -> None:
        self.store.close()
        self.closed_at = (self._active_segment().name, self.leo)
        self._reopen()

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """Die without flush or snapshot; lose or damage the active segment's tail; reopen."""
        active = self._active_segment()
        self.log.abandon()
        in_active = [i for i, e in enumerate(self.entries) if e.segment == active.name]
        size = active.stat().st_size
        assert size == (self.entries[in_active[-1]].end if in_active else 0)
        modes = ["intact", "batch boundary", "torn"] + (["corrupt"] if in_active else [])
        mode = data.draw(st.sampled_from(modes), label="crash")
        keep = len(self.entries)
        if mode == "corrupt":
            # Mostly the last batch (a torn write); any batch of the segment may be hit.
            k = data.draw(
                st.one_of(st.just(in_active[-1]), st.sampled_from(in_active)),
                label="corrupt batch",
            )
            start = self.entries[k - 1].end if k != in_active[0] else 0
            # From the CRC field on: every such byte is covered by the CRC or is the CRC.
            pos = data.draw(st.integers(start + 16, self.entries[k].end - 1), label="byte")
            flip = data.draw(st.integers(1, 255), label="xor")
            with active.open("r+b") as f:
                f.seek(pos)
                byte = f.read(1)[0]
                f.seek(pos)
                f.write(bytes([byte ^ flip]))
            keep = k
        elif mode != "intact":
            ends = [0] + [self.entries[i].end for i in in_active]
            if mode == "batch boundary":
                # Favour the cuts that land exactly where recovery starts replaying: the
                # segment's start and the log end at the last clean close.
                favoured = [0] + [
                    self.entries[i].end
                    for i in in_active
                    if (active.name, self.entries[i].next_offset) == self.closed_at
                ]
                cut = data.draw(
                    st.one_of(st.sampled_from(favoured), st.sampled_from(ends)), label="cut"
                )
            else:
                cut = data.draw(st.integers(0, size), label="cut")
            os.truncate(active, cut)
            keep = next((i for i in in_active if self.entries[i].end > cut), keep)
        event(f"crash: {mode}")
        if keep < len(self.entries):
            event("crash: acknowledged batches lost")
        del self.entries[keep:]
        self._reopen()
        survivors = [e for e in self.entries if e.segment == active.name]
        assert self._active_segment() == active
        assert active.stat().st_size == (survivors[-1].end if survivors else 0)

    # -- what must hold after every step ---------------------------------------------------
    @invariant()
    def log_matches_model(self) -> None:
        fate, _ = transaction_outcomes(self.entries)
        lso = self.lso
        # (offset, row id, visible to read_committed) for every row the log must hold
        model_rows = [
            (e.offset + k, i, e.offset < lso and (not e.transactional or fate.get(j, False)))
            for j, e in enumerate(self.entries)
            if e.control is None
            for k, i in enumerate(e.ids)
        ]
        every = [i for _, i, _ in model_rows]
        assert len(set(every)) == len(every), "the model holds a row twice"
        assert read_ids(self.log, "read_uncommitted") == every
        assert read_ids(self.log, "read_committed") == [i for _, i, c in model_rows if c]
        # From mid-log too: reads that start inside a batch must slice it.
        mid = self.leo // 2
        assert read_ids(self.log, "read_uncommitted", mid) == [
            i for o, i, _ in model_rows if o >= mid
        ]
        assert read_ids(self.log, "read_committed", mid) == [
            i for o, i, c in model_rows if c and o >= mid
        ]
        assert self.log.log_end_offset == self.leo
        assert self.log.last_stable_offset == lso


PartitionLogMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestPartitionLogStateMachine = PartitionLogMachine.TestCase
