"""A real crash test: SIGKILL an appending producer process, recover, check exactly-once.

The child (tests/store/crash_child.py) appends batches as an idempotent, sometimes
transactional, producer and prints SEND/ACK lines around each append. The parent kills it
at random points measured in child progress (after k ACKs, just after a SEND, just after
it announced a segment roll), or lets a failpoint make it kill itself at a precise spot
(half-written batch, half-written snapshot, between segment creation and snapshot, after
the append but before the ACK). After each kill the parent opens the store itself (crash
recovery) and checks:

- every ACKed batch is in the log exactly once, at the offsets it was acknowledged with,
  and the log holds nothing else but possibly the one in-flight batch;
- no row id appears twice;
- retrying the in-flight batch (same sequence and rows) answers a duplicate with the
  original offsets if it had landed, or appends it once; a second retry is a duplicate;
- an open transaction is resolved (committed, or aborted, sometimes with an epoch bump
  as a restarted transactional producer would do), and read_committed shows exactly the
  committed rows in order.

The next child resumes from the state file the parent writes.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker_core.log.partition_log import PartitionLog
from broker_core.log.store import LogStore
from broker_core.record.batch import ControlType, increment_sequence
from tests.store.crash_child import CONFIG, FAILPOINTS, ROW_WIDTH, TOPIC
from tests.store.helpers import SCHEMA, read_ids, rows

REPO = Path(__file__).resolve().parents[2]
# Fixed for reproducible runs; override to explore other interleavings.
SEED = int(os.environ.get("IDEMLOG_CRASH_SEED", "20240611"))
PRODUCER_ID = 4242
RANDOM_KILLS = 30  # parent-side SIGKILLs; each failpoint adds one more self-inflicted kill
EVENT_TIMEOUT_S = 20.0


@dataclass
class Batch:
    seq: int
    first_id: int
    n: int
    base: int
    last: int
    transactional: bool
    status: str  # "committed", "pending" (open transaction) or "aborted"

    @property
    def ids(self) -> list[int]:
        return list(range(self.first_id, self.first_id + self.n))


@dataclass
class Model:
    """What the parent knows for certain: acknowledged batches and resolved outcomes."""

    epoch: int = 0
    next_seq: int = 0
    next_id: int = 0
    log_end: int = 0
    batches: list[Batch] = field(default_factory=list)

    def committed_ids(self) -> list[int]:
        return [i for b in self.batches if b.status == "committed" for i in b.ids]

    def pending(self) -> list[Batch]:
        return [b for b in self.batches if b.status == "pending"]

    def add(self, batch: Batch) -> None:
        assert batch.seq == self.next_seq and batch.first_id == self.next_id, batch
        assert batch.base == self.log_end, (batch, self.log_end)
        self.batches.append(batch)
        self.next_seq = increment_sequence(batch.seq, batch.n)
        self.next_id += batch.n
        self.log_end = batch.last + 1


class Child:
    """A producer process whose stdout lines are read as events by a thread."""

    def __init__(self, state_file: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.store.crash_child", str(state_file)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._events: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.endswith("\n"):  # a line cut by the kill is not an event
                self._events.put(line.rstrip("\n"))
        self._events.put(None)

    def wait_for(self, accept: Callable[[str], bool], count: int = 1) -> bool:
        """Consume events until ``count`` accepted ones; False if the child ended first."""
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while count > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                pytest.fail(f"child made no progress in {EVENT_TIMEOUT_S}s: {self.lines[-5:]}")
            try:
                line = self._events.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                self._events.put(None)
                return False
            self.lines.append(line)
            if line.startswith("DONE"):
                pytest.fail("child ran out of batches before the kill")
            if accept(line):
                count -= 1
        return True

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:  # a failed check: never leave a producer running
            self.kill()
            self.proc.wait()

    def finish(self) -> int:
        """Wait for the process to die; collect every line it printed."""
        self.wait_for(lambda _line: False, count=1)
        returncode = self.proc.wait(timeout=EVENT_TIMEOUT_S)
        assert self.proc.stderr is not None and self.proc.stdin is not None
        stderr = self.proc.stderr.read()
        self.proc.stdin.close()
        self.proc.stderr.close()
        self._reader.join(timeout=EVENT_TIMEOUT_S)
        assert returncode == -signal.SIGKILL, f"child exited {returncode}:\n{stderr}"
        return returncode


@dataclass
class RunOutcome:
    in_flight: tuple[int, int, int] | None  # (seq, first_id, n) sent without an ACK
    ending: bool  # END printed without ENDED: a COMMIT marker may or may not have landed
    rolled: bool  # a ROLL line was seen


def apply_lines(model: Model, lines: list[str], transactional: bool) -> RunOutcome:
    """Fold the child's certain events into the model."""
    in_flight: tuple[int, int, int] | None = None
    ending = rolled = False
    for line in lines:
        word, *args = line.split()
        values = [int(a) for a in args]
        if word == "READY":
            assert values[0] == model.log_end, f"child opened at {values[0]}, not {model.log_end}"
            # Sequences start at 0 per epoch and never wrap here: the last one is next - 1.
            assert values[1] == model.next_seq - 1, f"child's state has last seq {values[1]}"
        elif word == "ROLL":
            rolled = True
        elif word == "SEND":
            in_flight = (values[0], values[1], values[2])
        elif word == "ACK":
            assert in_flight is not None and in_flight[0] == values[0], line
            seq, first_id, n = in_flight
            status = "pending" if transactional else "committed"
            model.add(Batch(seq, first_id, n, values[1], values[2], transactional, status))
            in_flight = None
        elif word == "END":
            ending = True
        elif word == "ENDED":
            for batch in model.pending():
                batch.status = "committed"
            assert values[0] == model.log_end, line
            model.log_end = values[0] + 1
            ending = False
        else:
            raise AssertionError(f"unexpected child line {line!r}")
    return RunOutcome(in_flight, ending, rolled)


def data_batches(log: PartitionLog) -> list[tuple[int, int, list[int]]]:
    """(base offset, last offset, ids) of every data batch, aborted ones included."""
    found: list[tuple[int, int, list[int]]] = []
    offset = log.log_start_offset
    while True:
        result = log.read(offset, isolation="read_uncommitted", max_bytes=1 << 20)
        for b in result.batches:
            found.append((b.base_offset, b.last_offset, b.records.column("id").to_pylist()))
        if result.next_offset == offset:
            return found
        offset = result.next_offset


def offsets_of(directory: Path, suffix: str) -> list[int]:
    return sorted(int(p.name[: -len(suffix)]) for p in directory.glob(f"*{suffix}"))


def mid_roll_evidence(directory: Path, segments_before: list[int]) -> str | None:
    """What a roll interrupted in this run left behind, seen before recovery tidies it."""
    if any(directory.glob("*.tmp")):
        return "temporary snapshot file"
    newest = offsets_of(directory, ".log")[-1]
    if newest not in segments_before and newest not in offsets_of(directory, ".snapshot"):
        return "segment without its snapshot"
    return None


def check_log(log: PartitionLog, model: Model, in_flight: tuple[int, int, int] | None) -> bool:
    """The log is the model, plus possibly the in-flight batch; True if that one landed."""
    found = data_batches(log)
    all_ids = [i for _b, _l, ids in found for i in ids]
    assert len(all_ids) == len(set(all_ids)), "a row id is in the log twice"
    expected = [(b.base, b.last, b.ids) for b in model.batches]
    assert found[: len(expected)] == expected, "an acknowledged batch is missing or moved"
    extra = found[len(expected) :]
    if not extra:
        return False
    assert in_flight is not None and len(extra) == 1, f"unexpected batches {extra}"
    _seq, first_id, n = in_flight
    assert extra[0][2] == list(range(first_id, first_id + n)), "a torn in-flight batch survived"
    return True


def recover_and_resolve(
    data_dir: Path, model: Model, outcome: RunOutcome, transactional: bool, rng: random.Random
) -> bool:
    """Recover, check, retry the in-flight batch, end an open transaction; True if it landed."""
    store = LogStore(data_dir, CONFIG)
    log = store.partition(TOPIC, 0)
    landed = check_log(log, model, outcome.in_flight)
    marker_landed = outcome.ending and log.log_end_offset == model.log_end + 1
    assert log.log_end_offset == model.log_end + int(marker_landed) + (
        outcome.in_flight[2] if landed and outcome.in_flight else 0
    )
    if marker_landed:  # the child's COMMIT is in the log though it never said so
        for batch in model.pending():
            batch.status = "committed"
        model.log_end += 1

    if outcome.in_flight is not None:
        seq, first_id, n = outcome.in_flight
        end_before = log.log_end_offset

        def retry() -> tuple[int, int, bool]:
            result = log.append(
                rows(n, first_id, width=ROW_WIDTH),
                producer_id=PRODUCER_ID,
                producer_epoch=model.epoch,
                base_sequence=seq,
                transactional=transactional,
            )
            return result.base_offset, result.last_offset, result.duplicate

        base, last, duplicate = retry()
        assert duplicate == landed, f"in-flight seq {seq}: landed={landed}, dup={duplicate}"
        expected_base = end_before - n if landed else end_before
        assert (base, last) == (expected_base, expected_base + n - 1)
        assert retry() == (base, last, True), "a second retry must be a duplicate"
        status = "pending" if transactional else "committed"
        model.add(Batch(seq, first_id, n, base, last, transactional, status))

    entry = log.state.get(PRODUCER_ID)
    is_open = entry is not None and entry.has_open_transaction
    assert is_open == bool(model.pending()), "open transaction does not match the model"
    if is_open:
        # A COMMIT that was under way must complete; otherwise the coordinator may abort,
        # sometimes bumping the epoch as a restarted transactional producer would.
        commit = outcome.ending or rng.random() < 0.5
        bump = not commit and rng.random() < 0.5
        epoch = model.epoch + int(bump)
        control = ControlType.COMMIT if commit else ControlType.ABORT
        assert log.write_marker(PRODUCER_ID, epoch, control).offset == model.log_end
        model.log_end += 1
        for batch in model.pending():
            batch.status = "committed" if commit else "aborted"
        if bump:
            model.epoch, model.next_seq = epoch, 0

    assert read_ids(log, "read_committed") == model.committed_ids()
    assert log.log_end_offset == model.log_end
    # Hand the next child a cleanly closed store or, sometimes, another crashed one.
    if rng.random() < 0.7:
        store.close()
    else:
        for open_log in store.open_logs():
            open_log.abandon()
    return landed


@pytest.mark.slow
def test_sigkill_during_appends_and_rolls_keeps_exactly_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="idemlog.recovery")
    rng = random.Random(SEED)
    data_dir = tmp_path / "data"
    partition_dir = data_dir / TOPIC / "0"
    state_file = tmp_path / "state.json"
    with LogStore(data_dir, CONFIG) as store:
        store.create_topic(TOPIC, 1, schema=SCHEMA)

    plan = ["acks"] * (RANDOM_KILLS * 2 // 3) + ["roll"] * (RANDOM_KILLS // 3) + list(FAILPOINTS)
    rng.shuffle(plan)
    model = Model()
    kills_in_roll: list[str] = []
    in_flight_landed = in_flight_lost = 0
    for run, kind in enumerate(plan):
        transactional = rng.random() < 0.4
        failpoint = kind if kind in FAILPOINTS else None
        state = {
            "data_dir": str(data_dir),
            "producer_id": PRODUCER_ID,
            "epoch": model.epoch,
            "next_seq": model.next_seq,
            "next_id": model.next_id,
            "transactional": transactional,
            "seed": rng.randrange(2**32),
            "failpoint": failpoint,
            "failpoint_at": rng.randint(1, 40),
            "max_batches": 5000,
        }
        state_file.write_text(json.dumps(state))
        segments_before = offsets_of(partition_dir, ".log")
        with Child(state_file) as child:
            child.wait_for(lambda line: line.startswith("READY"))
            if kind == "acks":
                child.wait_for(lambda line: line.startswith("ACK"), count=rng.randint(1, 80))
                if rng.random() < 0.5:  # aim inside an append: just after its SEND
                    child.wait_for(lambda line: line.startswith("SEND"))
                time.sleep(rng.uniform(0, 0.003))  # a random point, not a synchronisation
                child.kill()
            elif kind == "roll":
                child.wait_for(lambda line: line == "ROLL")
                time.sleep(rng.uniform(0, 0.002))  # lands in the roll or the append after it
                child.kill()
            child.finish()  # failpoint runs kill themselves

        evidence = mid_roll_evidence(partition_dir, segments_before)
        if failpoint in ("roll-before-snapshot", "roll-torn-snapshot"):
            # A snapshot at the new segment's offset may predate this run (a clean close
            # right at a full segment), so the proof of the roll is the new segment itself.
            rolled = offsets_of(partition_dir, ".log")[-1] not in segments_before
            assert rolled or evidence is not None, f"{failpoint} left no trace of a roll"
        if evidence is not None:
            kills_in_roll.append(f"run {run} ({kind}): {evidence}")
        outcome = apply_lines(model, child.lines, transactional)
        landed = recover_and_resolve(data_dir, model, outcome, transactional, rng)
        if outcome.in_flight is not None:
            in_flight_landed += landed
            in_flight_lost += not landed

    # The end state, through a clean reopen: exactly the committed rows, in order, once.
    with LogStore(data_dir, CONFIG) as store:
        log = store.partition(TOPIC, 0)
        committed = read_ids(log, "read_committed")
        assert committed == model.committed_ids()
        assert len(committed) == len(set(committed))
        segments = len(log.segment_files())
    torn = sum("truncating" in r.getMessage() for r in caplog.records)
    print(
        f"\n{torn} torn tails truncated by recovery; {len(plan)} kills ({RANDOM_KILLS} by "
        f"the parent, {len(FAILPOINTS)} failpoints), "
        f"{len(model.batches)} batches, {len(committed)} committed rows, {segments} segments; "
        f"in-flight batches landed/lost: {in_flight_landed}/{in_flight_lost}; "
        f"{len(kills_in_roll)} kills inside a roll: {kills_in_roll}"
    )
    assert len(plan) >= 20 and segments > 5 and torn >= 1
