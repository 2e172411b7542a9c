"""Child process of the cleaner crash test: one forced cleaning pass that SIGKILLs itself.

    python -m tests.store.clean_crash_child <data dir> <now ms> <failpoint> [<n>]

Failpoints (patched here, in the child only; the product code has no test hook):

    before-install   the cleaned segment is built in .cleaning/, no rename done yet
    rename <n>       right after the n-th rename of the swap (1..3: to .swap names,
                     4..6: over the final names)
    fsync <n>        at the n-th directory fsync inside the swap (1: the swap is decided)
    after-snapshots  a fresh snapshot written and the older ones deleted, no swap yet
    checkpoint       every segment swapped, the cleaner checkpoint not yet written

It prints ``CLEANING`` before the pass and ``DONE`` if the pass ends (the failpoint was
never reached: the parent fails the test then).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from broker_core.log import cleaner, swap
from broker_core.log.store import LogStore

TOPIC = "compacted"
CONFIG: dict[str, object] = {
    "cleanup.policy": "compact",
    "compaction.key.columns": "kind,key",
    "delete.retention.ms": 0,  # tombstones and markers go in the first pass
    "segment.bytes": 4096,
    "max.message.bytes": 4096,
}


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install(failpoint: str, n: int) -> None:
    if failpoint == "before-install":

        def dying_install(*_args: Any) -> None:
            die()

        swap.install = dying_install  # type: ignore[assignment]
    elif failpoint == "rename":
        original_rename, count = os.rename, 0

        def counting_rename(src: Any, dst: Any) -> None:
            nonlocal count
            original_rename(src, dst)
            count += 1
            if count == n:
                die()

        swap.os.rename = counting_rename  # type: ignore[assignment]
    elif failpoint == "fsync":
        original_fsync, calls = swap.fsync_directory, 0

        def dying_fsync(directory: Any) -> None:
            nonlocal calls
            calls += 1
            if calls == n:
                die()
            original_fsync(directory)

        swap.fsync_directory = dying_fsync  # type: ignore[assignment]
    elif failpoint == "after-snapshots":
        original_forget = cleaner.PartitionCleaner._forget_snapshots_below

        def dying_forget(self: cleaner.PartitionCleaner, offset: int) -> None:
            original_forget(self, offset)
            die()

        cleaner.PartitionCleaner._forget_snapshots_below = dying_forget  # type: ignore[method-assign]
    elif failpoint == "checkpoint":

        def dying_write(*_args: Any, **_kwargs: Any) -> None:
            die()

        cleaner.atomic_write = dying_write  # type: ignore[assignment]
    else:
        raise SystemExit(f"unknown failpoint {failpoint!r}")


def main(argv: list[str]) -> int:
    data_dir, now_ms, failpoint = argv[0], int(argv[1]), argv[2]
    install(failpoint, int(argv[3]) if len(argv) > 3 else 0)
    store = LogStore(data_dir)
    log = store.partition(TOPIC, 0)
    print("CLEANING", flush=True)
    log.clean(now_ms, force=True)
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
