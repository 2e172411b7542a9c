"""The sink's per-batch figures for users: ``spark_sink.progress(query)``, a listener, and
the opt-in enriched ``lastProgress`` (docs/spark.md, "The sink's figures").

Spark (4.2 too) gives a Python data source no way to put its own figures in the streaming
progress (``spark_sink.progress_spool`` says why), so the driver's commit spools them and
everything here reads that spool:

* :func:`progress` / :func:`progress_history`: a query's last batch, or its recent ones;
  given a ``StreamingQueryProgress`` (a listener's ``event.progress``), that batch's;
* :class:`SinkProgressListener`: a ``StreamingQueryListener`` a user adds to a session
  (``spark.streams.addListener``) that logs one line per batch and keeps the recent ones;
* :func:`enable_enriched_progress`: what ``local_session()`` does by default and
  ``register(spark, patch_progress=True)`` on request: ``StreamingQuery.lastProgress`` and
  ``recentProgress`` of this process fill ``progress["sink"]["metrics"]`` and show the
  sources' offsets as JSON. It replaces two pyspark properties process-wide, which is why
  ``register`` on a user's own session never does it unasked;
  :func:`disable_enriched_progress` puts them back.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
    StreamingQueryProgress,
)
from pyspark.sql.streaming.query import StreamingQuery

from . import progress_spool as spool
from .progress_spool import KEEP_BATCHES, SinkProgress

log = logging.getLogger("idemlog.progress")

__all__ = [
    "SinkProgress",
    "SinkProgressListener",
    "disable_enriched_progress",
    "enable_enriched_progress",
    "enrich",
    "progress",
    "progress_history",
]


def progress(
    of: StreamingQuery | StreamingQueryProgress, directory: Path | None = None
) -> SinkProgress | None:
    """What the sink did for a micro-batch.

    Args:
        of: A query: its last batch the sink committed (the highest batch id spooled
            under the query's id, which a restart from the checkpoint keeps), so it may be
            newer than ``query.lastProgress``, which Spark updates after the commit. Or a
            progress (a listener's ``event.progress``, an item of ``recentProgress``):
            the figures of exactly that batch.
        directory: The spool to read; by default ``IDEMLOG_PROGRESS_DIR`` of this
            process, which must be the driver's.

    Returns:
        The batch's figures, or None when the sink has committed no batch of it (a batch
        without rows for idemlog, another sink, or a driver whose spool is elsewhere).

    Raises:
        OSError: The spool cannot be read (a missing batch raises nothing).
    """
    if isinstance(of, StreamingQueryProgress):
        return spool.read(str(of.id), int(of.batchId), directory)
    return spool.latest(str(of.id), directory)


def progress_history(
    query: StreamingQuery | str, directory: Path | None = None
) -> list[SinkProgress]:
    """The sink's figures of a query's recent batches, also from its earlier runs.

    Args:
        query: The query, or its id.
        directory: The spool to read, as :func:`progress`.

    Returns:
        At most ``KEEP_BATCHES`` figures by batch id; ``[]`` for a query with none.

    Raises:
        OSError: The spool cannot be read.
    """
    return spool.history(query if isinstance(query, str) else str(query.id), directory)


_OFFSETS = ("startOffset", "endOffset", "latestOffset")


def enrich(p: StreamingQueryProgress | None) -> StreamingQueryProgress | None:
    """``p`` with the sink's figures of its batch in ``sink.metrics`` (and in its ``json``),
    when it has any, and every source's offsets as JSON text.

    pyspark renders a source's ``startOffset``/``endOffset``/``latestOffset`` as JSON text
    but a missing one (a query's first batch has no start) as the text ``'null'``; here a
    missing offset is ``None`` and each other the JSON Spark reported (``'{"0": 481}'``), as
    ``p.json`` has them. (pyspark 4.1 rendered every one with ``str()`` of the parsed JSON:
    ``"{'0': 481}"``, ``'None'``.)"""
    if p is None:
        return None
    for source in p["sources"]:
        raw = getattr(source, "_jdict", None)
        if isinstance(raw, dict):
            for name in _OFFSETS:
                if name in raw:
                    value = raw[name]
                    source[name] = (
                        value if value is None or isinstance(value, str) else json.dumps(value)
                    )
    figures = progress(p)
    if figures is not None:
        sink = p["sink"]
        sink["metrics"].update(figures.metrics())
        raw = getattr(sink, "_jdict", None)  # what .json / .prettyJson print
        if isinstance(raw, dict):
            raw.setdefault("metrics", {}).update(figures.metrics())
    return p


class SinkProgressListener(StreamingQueryListener):
    """A ``StreamingQueryListener`` for the sink's figures: add it with
    ``spark.streams.addListener(SinkProgressListener())``. For each progress event of a
    batch the sink committed it calls :meth:`on_sink_progress` (by default: one log line
    on ``idemlog.progress``) and keeps the figures: the last ``keep`` batches of each of
    the last ``queries`` query ids it heard from (its memory's bound, ``keep * queries``
    figures of about 300 bytes). Spark delivers events on its listener thread, after
    ``lastProgress`` is updated."""

    def __init__(self, keep: int = KEEP_BATCHES, queries: int = 100) -> None:
        self._changed = threading.Condition()
        self._keep, self._queries = keep, queries
        self._figures: OrderedDict[str, deque[SinkProgress]] = OrderedDict()

    def figures(self, query_id: str) -> list[SinkProgress]:
        """The figures kept for a query id, oldest first."""
        with self._changed:
            return list(self._figures.get(query_id, ()))

    def wait_for_batch(self, query_id: str, batch_id: int, timeout: float = 30.0) -> SinkProgress:
        """The figures of a batch once its progress event arrived; raises TimeoutError
        when it has not within ``timeout`` seconds."""

        def found() -> SinkProgress | None:
            kept = self._figures.get(query_id, ())
            return next((f for f in kept if f.batch_id == batch_id), None)

        with self._changed:
            if not self._changed.wait_for(lambda: found() is not None, timeout):
                raise TimeoutError(f"no progress event of query {query_id} batch {batch_id}")
            figures = found()
            assert figures is not None
            return figures

    def on_sink_progress(self, event: QueryProgressEvent, figures: SinkProgress) -> None:
        """Called for each batch the sink committed; override to send the figures on."""
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

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        figures = progress(event.progress)
        if figures is None:
            return
        with self._changed:
            kept = self._figures.pop(figures.query_id, None) or deque(maxlen=self._keep)
            kept.append(figures)
            self._figures[figures.query_id] = kept  # the most recent query last
            while len(self._figures) > self._queries:
                self._figures.popitem(last=False)
            self._changed.notify_all()
        self.on_sink_progress(event, figures)

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass


_patch_lock = threading.Lock()
_originals: dict[str, Any] = {}  # the properties pyspark defined, while the patch is on


def enable_enriched_progress() -> None:
    """Opt-in, process-wide: ``lastProgress`` and ``recentProgress`` of every
    ``StreamingQuery`` of this process run through :func:`enrich` (a batch without idemlog
    figures is returned as Spark made it). A repeat is harmless."""
    with _patch_lock:
        if _originals:
            return
        last: Any = StreamingQuery.lastProgress
        recent: Any = StreamingQuery.recentProgress

        def last_progress(self: StreamingQuery) -> StreamingQueryProgress | None:
            return enrich(last.fget(self))

        def recent_progress(self: StreamingQuery) -> Sequence[StreamingQueryProgress]:
            return [p for p in (enrich(p) for p in recent.fget(self)) if p is not None]

        _originals.update(lastProgress=last, recentProgress=recent)
        setattr(StreamingQuery, "lastProgress", property(last_progress, doc=last.__doc__))  # noqa: B010
        setattr(StreamingQuery, "recentProgress", property(recent_progress, doc=recent.__doc__))  # noqa: B010


def disable_enriched_progress() -> None:
    """Undo :func:`enable_enriched_progress`: pyspark's own properties, the very objects,
    are back on ``StreamingQuery``. Harmless when it is off."""
    with _patch_lock:
        for name, original in _originals.items():
            setattr(StreamingQuery, name, original)
        _originals.clear()


def enriched_progress_enabled() -> bool:
    """Whether :func:`enable_enriched_progress` is in force in this process."""
    return bool(_originals)
