"""Timed spans of the sink's own steps, for the micro-batch breakdown: :class:`TraceHooks`,
the write's hooks (``spark_sink.hooks``) when a write names it,
``.option("hooks", "benchmarks.trace_hooks:TraceHooks")`` (:data:`HOOKS`).

Off unless the environment variable ``IDEMLOG_TRACE`` names a file (Spark's Python
processes inherit the driver's environment in local mode): then every span appends one
JSON line to it when it ends::

    {"name": "commit", "pid": 4242, "start": 1763.51, "end": 1763.54,
     "proc_start": 1763.02, "imported": 1763.31, "attrs": {"batch": 3}}

Times are wall-clock epoch seconds, so spans of different processes line up with each
other and with Spark's event log. ``proc_start`` is when the process was created,
``imported`` when it first imported ``spark_sink`` (noted by ``import_clock/sitecustomize.py``
when the benchmark put that folder on the ``PYTHONPATH``; else None): their difference is
the interpreter's and pyspark's start-up, the rest up to the first span is ours
(imports, unpickling). ``benchmarks/bench_microbatch.py`` reads the file. Disabled, a span
costs one dict lookup; the lines are appended with one ``write`` each (``O_APPEND``), so
concurrent processes never interleave within a line.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from spark_sink.hooks import SinkHooks, class_name

ENV = "IDEMLOG_TRACE"
# Put on PYTHONPATH, it notes when each process first imported spark_sink.
IMPORT_CLOCK = Path(__file__).resolve().parent / "import_clock"

log = logging.getLogger("idemlog.trace")

_proc_start: float | None = None


def _imported() -> float | None:
    clock = sys.modules.get("sitecustomize")
    when = getattr(clock, "SPARK_SINK_IMPORTED", None)
    return when if isinstance(when, float) else None


def _process_start() -> float:
    global _proc_start
    if _proc_start is None:
        import psutil

        _proc_start = psutil.Process().create_time()
    return _proc_start


def emit(name: str, start: float, end: float, **attrs: Any) -> None:
    """Append one span (no-op when tracing is off). A file that cannot be written is
    logged, not raised."""
    path = os.environ.get(ENV)
    if not path:
        return
    proc_start = _process_start()
    imported = _imported()
    record = {
        "name": name,
        "pid": os.getpid(),
        "start": start,
        "end": end,
        "proc_start": proc_start,
        # A worker forked by spark_sink.worker_daemon inherited the import: none of its own.
        "imported": None if imported is None else max(imported, proc_start),
        "attrs": attrs,
    }
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        # A measurement aid: a trace that cannot be written must not fail a write.
        log.warning("%s=%s: span %s not recorded: %s", ENV, path, name, exc)


@contextmanager
def span(name: str, **attrs: Any) -> Iterator[dict[str, Any]]:
    """Time the block as span ``name``; the yielded dict adds attributes. Recorded even
    when the block raises (with ``error`` set to the exception's type name)."""
    if not os.environ.get(ENV):
        yield attrs
        return
    start = time.time()
    try:
        yield attrs
    except BaseException as exc:
        attrs["error"] = type(exc).__name__
        raise
    finally:
        emit(name, start, time.time(), **attrs)


class TraceHooks(SinkHooks):
    """The sink's hooks that record its steps as spans (nothing else)."""

    def span(self, name: str, **attrs: Any) -> AbstractContextManager[dict[str, Any]]:
        return span(name, **attrs)


HOOKS = class_name(TraceHooks)  # the value of the sink option ``hooks`` that traces


def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The spans in a trace file, in the order they ended."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
