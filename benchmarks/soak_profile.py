"""A broker process with ``tracemalloc`` on, for ``bench_soak --profile``.

    python -m benchmarks.soak_profile <dump dir> broker start --config broker.properties

Starts ``tracemalloc`` (frames of depth ``FRAMES``), then runs the ``idemlog`` command
line as ``python -m broker_core.cli.main`` would. A daemon thread watches ``<dump dir>``
for a request file ``request-<tag>`` and answers it with ``<tag>.snapshot`` (a
``tracemalloc`` snapshot, pickled by ``Snapshot.dump``) and ``<tag>.json`` (traced bytes,
the peak, RSS and the live objects counted per type by ``gc``), written under temporary
names and renamed, so that the bench reads only whole files. The bench's own clock never
waits on it for more than ``--profile``'s timeout.

A tool of the benchmarks: no product module imports it or knows of it, and a broker
started the usual way runs without ``tracemalloc``.
"""

from __future__ import annotations

import collections
import gc
import json
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import psutil

FRAMES = 12
REQUEST_PREFIX = "request-"
POLL_S = 0.2
# Object types listed per dump: the most numerous.
TOP_TYPES = 60


def _dump(directory: Path, tag: str) -> None:
    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    traced, peak = tracemalloc.get_traced_memory()
    counts = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    info = {
        "traced_bytes": traced,
        "peak_bytes": peak,
        "rss_bytes": psutil.Process().memory_info().rss,
        "objects": len(gc.get_objects()),
        "types": dict(counts.most_common(TOP_TYPES)),
        "time": time.time(),
    }
    part = directory / f"{tag}.snapshot.part"
    snapshot.dump(str(part))
    part.rename(directory / f"{tag}.snapshot")
    part = directory / f"{tag}.json.part"
    part.write_text(json.dumps(info))
    part.rename(directory / f"{tag}.json")


def _watch(directory: Path) -> None:
    while True:
        for request in sorted(directory.glob(f"{REQUEST_PREFIX}*")):
            tag = request.name[len(REQUEST_PREFIX) :]
            request.unlink()
            _dump(directory, tag)
        time.sleep(POLL_S)


def main() -> int:
    directory = Path(sys.argv[1])
    directory.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(FRAMES)
    threading.Thread(target=_watch, args=(directory,), name="soak-profile", daemon=True).start()
    from broker_core.cli.main import main as idemlog_main

    return idemlog_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
