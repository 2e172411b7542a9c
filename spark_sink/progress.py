"""The sink's per-batch figures in Spark's streaming progress (``query.lastProgress``).

A JVM sink reports its own figures in ``progress["sink"]["metrics"]`` by implementing
``ReportsSinkMetrics``. A Python data source cannot: in Spark 4.1 ``PythonTable`` is only
``SupportsRead``/``SupportsWrite`` and its ``PythonStreamingWrite`` has no metrics hook.
Observed metrics (``df.observe``) cannot carry them either: they aggregate the rows
*before* the sink sees them, so they cannot know what the sink then did (duplicates,
retries, reused attempts, commit time).

So the figures take this path:

1. the driver's commit of a micro-batch (a Python process Spark starts on the driver's
   host) writes them to ``<dir>/<query id>/<batch id>.json`` (``dir``: the environment
   variable ``IDEMLOG_PROGRESS_DIR``, default ``~/.idemlog/progress``; the last
   ``KEEP_BATCHES`` batches per query are kept);
2. :func:`install` (run by ``spark_sink.register``) registers an
   :class:`IdemlogProgressListener` -- a ``StreamingQueryListener`` that logs one line
   per batch and keeps each query's figures -- and makes ``StreamingQuery.lastProgress``
   and ``recentProgress`` fill ``progress["sink"]["metrics"]`` of a batch that has
   figures, with string values, as Spark does for every sink metric.

A batch Spark re-runs after a driver restart (already committed, its repeat aborted)
reports ``committed = "false"``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
    StreamingQueryProgress,
)
from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("idemlog.progress")

ENV_DIR = "IDEMLOG_PROGRESS_DIR"
KEEP_BATCHES = 100


def progress_dir() -> Path:
    return Path(os.environ.get(ENV_DIR) or Path.home() / ".idemlog" / "progress")


@dataclass(frozen=True)
class SinkBatchFigures:
    """What the sink did for one micro-batch (one driver commit)."""

    query_id: str
    batch_id: int
    committed: bool  # False: committed before (a re-run after a restart), repeat aborted
    tasks: int
    tasks_reused: int  # attempts that found their batch already prepared or committed
    rows: int
    producer_batches: int
    duplicates_acked: int  # produce requests answered "already written" (retries)
    producer_retries: int
    write_ms_max: float  # the slowest task attempt
    commit_ms: float  # the driver's commit request(s), retries included
    committed_at_ms: int  # wall clock, epoch ms

    def metrics(self) -> dict[str, str]:
        """``progress["sink"]["metrics"]``: camelCase names and string values, as Spark's."""
        return {
            "committed": "true" if self.committed else "false",
            "tasks": str(self.tasks),
            "tasksReused": str(self.tasks_reused),
            "rows": str(self.rows),
            "producerBatches": str(self.producer_batches),
            "duplicatesAcked": str(self.duplicates_acked),
            "producerRetries": str(self.producer_retries),
            "writeMsMax": f"{self.write_ms_max:.1f}",
            "commitMs": f"{self.commit_ms:.1f}",
        }


def _path(directory: Path, query_id: str, batch_id: int) -> Path:
    return directory / query_id / f"{batch_id}.json"


def record(figures: SinkBatchFigures, directory: Path | None = None) -> None:
    """Spool one batch's figures (atomically) and drop the batch ``KEEP_BATCHES`` back."""
    directory = directory or progress_dir()
    target = _path(directory, figures.query_id, figures.batch_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(figures)))
    os.replace(tmp, target)  # a reader sees all of it or none of it
    _path(directory, figures.query_id, figures.batch_id - KEEP_BATCHES).unlink(missing_ok=True)


def read(query_id: str, batch_id: int, directory: Path | None = None) -> SinkBatchFigures | None:
    """The figures of one batch; None when the batch wrote nothing through idemlog."""
    try:
        doc = json.loads(_path(directory or progress_dir(), query_id, batch_id).read_text())
    except FileNotFoundError:
        return None
    return SinkBatchFigures(**doc)


def history(query_id: str, directory: Path | None = None) -> list[SinkBatchFigures]:
    """Every spooled batch of a query (at most ``KEEP_BATCHES``), by batch id."""
    folder = (directory or progress_dir()) / query_id
    if not folder.is_dir():
        return []
    ids = sorted(int(p.stem) for p in folder.glob("*.json"))
    return [f for f in (read(query_id, i, directory) for i in ids) if f is not None]


def enrich(progress: StreamingQueryProgress | None) -> StreamingQueryProgress | None:
    """``progress`` with the sink's figures of its batch in ``sink.metrics`` (and in its
    ``json``); unchanged when the batch has none."""
    if progress is None:
        return None
    figures = read(str(progress["id"]), int(progress["batchId"]))
    if figures is not None:
        sink = progress["sink"]
        sink["metrics"].update(figures.metrics())
        raw = getattr(sink, "_jdict", None)  # what .json / .prettyJson print
        if isinstance(raw, dict):
            raw.setdefault("metrics", {}).update(figures.metrics())
    return progress


class IdemlogProgressListener(StreamingQueryListener):
    """Logs each batch's sink figures and keeps the recent ones per query id."""

    def __init__(self, keep: int = KEEP_BATCHES) -> None:
        self._changed = threading.Condition()
        self._figures: defaultdict[str, deque[SinkBatchFigures]] = defaultdict(
            lambda: deque(maxlen=keep)
        )

    def figures(self, query_id: str) -> list[SinkBatchFigures]:
        with self._changed:
            return list(self._figures.get(query_id, ()))

    def wait_for_batch(
        self, query_id: str, batch_id: int, timeout: float = 30.0
    ) -> SinkBatchFigures:
        """The figures of a batch once its progress event arrived (Spark delivers listener
        events asynchronously, after ``lastProgress`` is updated)."""

        def found() -> SinkBatchFigures | None:
            return next((f for f in self._figures[query_id] if f.batch_id == batch_id), None)

        with self._changed:
            if not self._changed.wait_for(lambda: found() is not None, timeout):
                raise TimeoutError(f"no progress event of query {query_id} batch {batch_id}")
            figures = found()
            assert figures is not None
            return figures

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        figures = read(str(progress.id), progress.batchId)
        if figures is None:
            return
        with self._changed:
            self._figures[figures.query_id].append(figures)
            self._changed.notify_all()
        log.info(
            "query %s batch %d: %s rows in %d tasks (%d reused), %d duplicates acked, "
            "%d producer retries, slowest task %.0f ms, commit %.0f ms",
            figures.query_id,
            figures.batch_id,
            figures.rows,
            figures.tasks,
            figures.tasks_reused,
            figures.duplicates_acked,
            figures.producer_retries,
            figures.write_ms_max,
            figures.commit_ms,
        )

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass


_install_lock = threading.Lock()
_listeners: dict[int, IdemlogProgressListener] = {}  # by id() of the JVM session
_patched = False


def _patch_streaming_query() -> None:
    """lastProgress/recentProgress of every StreamingQuery of this process run through
    :func:`enrich` (a batch without idemlog figures is returned as Spark made it)."""
    global _patched
    if _patched:
        return
    last: Any = StreamingQuery.lastProgress
    recent: Any = StreamingQuery.recentProgress

    def last_progress(self: StreamingQuery) -> StreamingQueryProgress | None:
        return enrich(last.fget(self))

    def recent_progress(self: StreamingQuery) -> Sequence[StreamingQueryProgress]:
        return [p for p in (enrich(p) for p in recent.fget(self)) if p is not None]

    setattr(StreamingQuery, "lastProgress", property(last_progress, doc=last.__doc__))  # noqa: B010
    setattr(StreamingQuery, "recentProgress", property(recent_progress, doc=recent.__doc__))  # noqa: B010
    _patched = True


def install(spark: SparkSession) -> IdemlogProgressListener:
    """The session's :class:`IdemlogProgressListener` (added on the first call)."""
    with _install_lock:
        _patch_streaming_query()
        key = id(spark._jsparkSession)
        listener = _listeners.get(key)
        if listener is None:
            listener = _listeners[key] = IdemlogProgressListener()
            spark.streams.addListener(listener)
        return listener
