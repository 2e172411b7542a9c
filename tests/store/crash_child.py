"""Child process of the SIGKILL crash test: an idempotent producer appending in a loop.

    python -m tests.store.crash_child <state.json>

The state file (written by the parent, tests/store/test_crash_kill.py) says where to
resume: producer id, epoch, next sequence, next row id, transactional or not, the RNG
seed and an optional failpoint. The child prints one line per event, flushed at once so
that the parent sees every line written before the kill:

    READY <log_end_offset> <last_sequence>   the partition is open (recovered)
    ROLL                                     the next append will roll the segment
    SEND <seq> <first_id> <n>                before an append
    ACK <seq> <base_offset> <last_offset>    after the append returned (fsynced)
    END                                      before writing a COMMIT marker
    ENDED <offset>                           after it returned

It never stops by itself before ``max_batches``; the parent SIGKILLs it, or a failpoint
makes it SIGKILL itself at a precise point (inside a roll, mid-write, before an ACK).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker_core.fileutil import write_all
from broker_core.log import partition_log, snapshot
from broker_core.log.partition_log import PartitionLog
from broker_core.log.segment import LogSegment
from broker_core.log.store import LogStore
from broker_core.record.batch import HEADER_SIZE, ControlType, increment_sequence, ipc_stream_size
from tests.store.helpers import rows

TOPIC = "crash"
# Small segments so that rolls (and their snapshots) happen every few dozen appends;
# flush.messages=1 so that an ACK means the batch is fsynced.
SEGMENT_BYTES = 256 * 1024
CONFIG: dict[str, object] = {
    "segment.bytes": SEGMENT_BYTES,
    "max.message.bytes": SEGMENT_BYTES,
    "flush.messages": 1,
}
ROW_WIDTH = 100  # ~110 bytes a row: a 1-50 row batch is 0.7-6 KB, ~80 per segment
MAX_ROWS = 50

FAILPOINTS = (
    "torn-write",  # the k-th batch write stops half-way (a torn tail)
    "before-ack",  # the k-th append returned, the process dies before printing ACK
    "roll-before-snapshot",  # new segment created, its snapshot not written yet
    "roll-torn-snapshot",  # the snapshot's temporary file half written
    "roll-after-snapshot",  # roll complete, the batch that caused it not yet written
)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def patch(module: object, attribute: str, replacement: Callable[..., Any]) -> Callable[..., Any]:
    """Swap a module-level function for a dying one; returns the original."""
    original: Callable[..., Any] = getattr(module, attribute)
    setattr(module, attribute, replacement)
    return original


def install_failpoint(name: str, at: int, rng: random.Random) -> Callable[[int], None]:
    """Patch the store so it dies at ``name``; returns the per-append hook."""
    if name == "torn-write":
        original_append = LogSegment.append
        count = 0

        def torn_append(self: LogSegment, batch: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal count
            count += 1
            if count < at:
                return original_append(self, batch, *args, **kwargs)
            data = batch.to_buffer().to_pybytes()
            fd = os.open(self.log_path, os.O_WRONLY)
            if rng.random() < 0.5:
                # A prefix of the batch reached the file.
                os.lseek(fd, self.size, os.SEEK_SET)
                write_all(fd, data[: rng.randint(1, len(data) - 1)])
            else:
                # The large-batch path writes the payload before the header: die between.
                os.lseek(fd, self.size + HEADER_SIZE, os.SEEK_SET)
                write_all(fd, data[HEADER_SIZE : rng.randint(HEADER_SIZE + 1, len(data))])
            die()
            raise AssertionError("unreachable")

        LogSegment.append = torn_append  # type: ignore[method-assign]
    elif name in ("roll-before-snapshot", "roll-after-snapshot"):

        def dying_snapshot(*args: Any, **kwargs: Any) -> Path:
            if name == "roll-before-snapshot":
                die()
            path: Path = original_snapshot(*args, **kwargs)
            die()
            return path

        original_snapshot = patch(partition_log, "write_snapshot", dying_snapshot)
    elif name == "roll-torn-snapshot":

        def torn_atomic_write(path: Path, data: bytes, **_kwargs: object) -> None:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(data[: len(data) // 2])
            die()

        patch(snapshot, "atomic_write", torn_atomic_write)

    def after_append(appended: int) -> None:
        if name == "before-ack" and appended == at:
            die()

    return after_append


def will_roll(log: PartitionLog, batch_size: int) -> bool:
    active = log.active
    return active.size > 0 and active.size + batch_size > log.config.segment_bytes


def main(argv: list[str]) -> int:
    state = json.loads(Path(argv[0]).read_text())
    pid, epoch = int(state["producer_id"]), int(state["epoch"])
    seq, next_id = int(state["next_seq"]), int(state["next_id"])
    transactional = bool(state["transactional"])
    rng = random.Random(int(state["seed"]))
    after_append: Callable[[int], None] = lambda _n: None  # noqa: E731
    if state.get("failpoint"):
        after_append = install_failpoint(state["failpoint"], int(state["failpoint_at"]), rng)

    store = LogStore(state["data_dir"], CONFIG)
    log = store.partition(TOPIC, 0)
    entry = log.state.get(pid)
    print(f"READY {log.log_end_offset} {entry.last_seq if entry else -1}", flush=True)

    appended = 0

    def send() -> None:
        nonlocal seq, next_id, appended
        n = rng.randint(1, MAX_ROWS)
        batch = rows(n, next_id, width=ROW_WIDTH)
        if will_roll(log, HEADER_SIZE + ipc_stream_size(batch)):
            print("ROLL", flush=True)
        print(f"SEND {seq} {next_id} {n}", flush=True)
        result = log.append(
            batch,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            transactional=transactional,
        )
        appended += 1
        after_append(appended)
        if result.duplicate:
            raise AssertionError(f"fresh batch seq {seq} answered as a duplicate")
        print(f"ACK {seq} {result.base_offset} {result.last_offset}", flush=True)
        seq = increment_sequence(seq, n)
        next_id += n

    while appended < int(state["max_batches"]):
        if not transactional:
            send()
            continue
        for _ in range(rng.randint(1, 4)):
            send()
        print("END", flush=True)
        offset = log.write_marker(pid, epoch, ControlType.COMMIT).offset
        print(f"ENDED {offset}", flush=True)
    print("DONE", flush=True)
    # Never exit while the parent may still want to kill us; stdin closes if it dies.
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
