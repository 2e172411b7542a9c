"""Record the broker's dedup metrics into a Delta table, periodically.

    idemlog metrics record --table DELTA_PATH [--path STORE | --brokers HOST:PORT]
        [--interval 5] [--compact-every 720] [--once | --duration SECONDS]

(``python -m jobs.metrics_recorder`` in a checkout takes the same options.)

Every ``interval`` seconds the cluster's metrics document (``BrokerClient.metrics``: every
live broker's counters merged) is flattened into rows and appended to the table in one
Delta commit. The table is written with ``deltalake`` (no JVM), so the recorder is cheap to
run next to a stream; Spark reads it with ``format("delta")``, pandas with
``deltalake.DeltaTable(path).to_pandas()`` (or :func:`read_metrics`).

One row per (time, scope, subject, metric), long format so new counters need no schema
change:

=============  ===========================================================================
column         meaning
=============  ===========================================================================
recorded_at    when the document was taken (UTC, microseconds)
day            ``YYYY-MM-DD`` of recorded_at: the partition column
scope          ``total`` (whole cluster), ``partition``, ``producer``, ``transactions``
               (the coordinator's counters), ``sink_batch`` (a Spark micro-batch's figures)
topic          the partition's topic (``partition`` scope)
partition      the log partition (``partition`` scope)
producer_id    the producer id (``producer`` scope)
query_id       the streaming query id (``sink_batch`` scope)
batch_id       the Spark batch id (``sink_batch`` scope)
metric         counter or gauge name, e.g. ``duplicates_in_window``, ``fenced_appends``,
               ``out_of_order``, ``transactions_aborted``, ``commit_ms``
value          its value (counters are cumulative since the broker process started)
=============  ===========================================================================

Counters restart from zero with a broker process (they live in its memory): take
differences per broker run, not across a restart. ``sink_batch`` rows come from the
progress spool of the Spark driver on this host (``spark_sink.progress_spool``): each batch
committed since the recorder started is recorded once.

A poll that fails (a broker being restarted) is logged and skipped; the next one records.
The first poll runs in :meth:`MetricsRecorder.start`, so a wrong table path or broker fails
there, loudly.

Each poll is one small Delta commit (one file per day partition). Every ``compact_every``
polls (``--compact-every``, default 720: hourly at 5 s) the recorder compacts the table
(``OPTIMIZE``: small files rewritten into larger ones, the rows unchanged), so a recorder
left running for weeks does not leave readers listing tens of thousands of files. The
replaced files stay on disk until a ``VACUUM``, which is left to the table's owner.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from broker_core.client.broker_client import BrokerClient
from broker_core.protocol.metrics import COUNTER_NAMES
from spark_sink import progress_spool
from spark_sink.embedded import DEFAULT_PATH, ensure_broker

__all__ = ["DEFAULT_PATH", "SCHEMA", "MetricsRecorder", "flatten", "read_metrics", "run_recorder"]

log = logging.getLogger("idemlog.metrics_recorder")

SCHEMA = pa.schema(
    [
        pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("day", pa.string(), nullable=False),
        pa.field("scope", pa.string(), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("producer_id", pa.int64()),
        pa.field("query_id", pa.string()),
        pa.field("batch_id", pa.int64()),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
    ]
)
PARTITION_BY = ["day"]
# Gauges of a partition besides its counters (broker_core.protocol.metrics.PartitionGauges).
_PARTITION_GAUGES = (
    "log_start_offset",
    "log_end_offset",
    "last_stable_offset",
    "producers",
    "open_transactions",
    "lso_lag",
)
_SINK_FIGURES = (
    "committed",
    "tasks",
    "tasks_reused",
    "rows",
    "producer_batches",
    "duplicates_acked",
    "producer_retries",
    "write_ms_max",
    "commit_ms",
)


def _numbers(doc: Mapping[str, Any], names: Sequence[str]) -> Iterator[tuple[str, float]]:
    for name in names:
        value = doc.get(name)
        if isinstance(value, (int, float)):  # bool is an int: committed -> 1.0 / 0.0
            yield name, float(value)


def flatten(
    doc: Mapping[str, Any],
    at: dt.datetime,
    sink_batches: Sequence[progress_spool.SinkProgress] = (),
) -> pa.Table:
    """One metrics document (and sink batch figures) as rows of :data:`SCHEMA`."""
    cols: dict[str, list[Any]] = {f.name: [] for f in SCHEMA}

    def add(scope: str, metric: str, value: float, **subject: Any) -> None:
        cols["recorded_at"].append(at)
        cols["day"].append(at.strftime("%Y-%m-%d"))
        cols["scope"].append(scope)
        for name in ("topic", "partition", "producer_id", "query_id", "batch_id"):
            cols[name].append(subject.get(name))
        cols["metric"].append(metric)
        cols["value"].append(value)

    for metric, value in _numbers(doc["totals"], COUNTER_NAMES):
        add("total", metric, value)
    for row in doc["partitions"]:
        where = {"topic": row["topic"], "partition": int(row["partition"])}
        for metric, value in _numbers(row, (*COUNTER_NAMES, *_PARTITION_GAUGES)):
            add("partition", metric, value, **where)
    for row in doc["producers"]:
        for metric, value in _numbers(row, COUNTER_NAMES):
            add("producer", metric, value, producer_id=int(row["producer_id"]))
    txns = doc.get("transactions") or {}
    for metric, value in _numbers(txns, sorted(txns)):
        add("transactions", metric, value)
    for figures in sink_batches:
        values = asdict(figures)
        for metric, value in _numbers(values, _SINK_FIGURES):
            add("sink_batch", metric, value, query_id=figures.query_id, batch_id=figures.batch_id)
    return pa.table(cols, schema=SCHEMA)


def read_metrics(table: str | Path) -> Any:
    """The metrics table as a pandas DataFrame (no Spark needed)."""
    return DeltaTable(str(table)).to_pandas()


class MetricsRecorder:
    """Polls the cluster's metrics every ``interval_s`` seconds on a daemon thread and
    appends them to the Delta table ``table``; a context manager (a last poll on exit)."""

    def __init__(
        self,
        table: str | Path,
        bootstrap: str | Callable[[], str],
        *,
        interval_s: float = 5.0,
        progress_dir: Path | None = None,
        compact_every: int = 720,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        if compact_every < 1:
            raise ValueError(f"compact_every must be >= 1 poll, got {compact_every}")
        self.compact_every = compact_every
        self.compactions = 0
        self.table = str(table)
        # A callable is asked before each poll: the embedded broker may move ports.
        self._bootstrap = bootstrap if callable(bootstrap) else (lambda: bootstrap)
        self.interval_s = interval_s
        self.progress_dir = progress_dir
        self.polls = 0
        self.failed_polls = 0
        self.rows_written = 0
        self._since_ms = int(time.time() * 1000)
        self._seen: set[tuple[str, int, int]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _new_sink_batches(self) -> list[progress_spool.SinkProgress]:
        folder = self.progress_dir or progress_spool.progress_dir()
        if not folder.is_dir():
            return []
        found = []
        for query in folder.iterdir():
            for figures in progress_spool.history(query.name, folder):
                key = (figures.query_id, figures.batch_id, figures.committed_at_ms)
                if figures.committed_at_ms >= self._since_ms and key not in self._seen:
                    self._seen.add(key)
                    found.append(figures)
        return found

    def record_once(self) -> int:
        """Poll and append once; the number of rows appended. Raises on failure."""
        with BrokerClient(self._bootstrap()) as client:
            doc = client.metrics()
        at = dt.datetime.now(dt.UTC)
        rows = flatten(doc, at, self._new_sink_batches())
        write_deltalake(self.table, rows, mode="append", partition_by=PARTITION_BY)
        count = int(rows.num_rows)
        self.polls += 1
        self.rows_written += count
        log.info("recorded %d metric rows into %s", count, self.table)
        if self.polls % self.compact_every == 0:
            self.compact()
        return count

    def compact(self) -> None:
        """Rewrite the table's small files into larger ones (the rows stay the same)."""
        done = DeltaTable(self.table).optimize.compact()
        self.compactions += 1
        log.info(
            "compacted %s: %s files into %s",
            self.table,
            done.get("numFilesRemoved"),
            done.get("numFilesAdded"),
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.record_once()
            except Exception as exc:
                # Metrics are wanted most while a broker restarts: keep polling. Counted and
                # logged, never silent; start() has already proven the configuration.
                self.failed_polls += 1
                log.warning("metrics poll failed (%r); next in %.1f s", exc, self.interval_s)

    def start(self) -> MetricsRecorder:
        if self._thread is not None:
            raise RuntimeError("the recorder is already running")
        self.record_once()  # configuration errors surface here, not on the thread
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="idemlog-metrics", daemon=True)
        self._thread.start()
        return self

    def stop(self, *, final_poll: bool = True) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if final_poll:
            self.record_once()

    def __enter__(self) -> MetricsRecorder:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(final_poll=exc_type is None)


def run_recorder(
    table: str,
    *,
    brokers: str = "",
    path: str = DEFAULT_PATH,
    interval_s: float = 5.0,
    compact_every: int = 720,
    once: bool = False,
    duration_s: float | None = None,
) -> MetricsRecorder:
    """The recorder as a job: one poll (``once``), or polls every ``interval_s`` until
    ``duration_s`` has passed or Ctrl-C; the recorder returned holds what was recorded.

    The cluster is ``brokers``, else the embedded broker serving ``path`` (started if
    needed). Raises ValueError for a bad interval or compaction period, and an
    IdemlogError if the first poll fails (which proves the configuration)."""
    bootstrap: str | Callable[[], str] = brokers or (lambda: ensure_broker(path))
    recorder = MetricsRecorder(table, bootstrap, interval_s=interval_s, compact_every=compact_every)
    if once:
        recorder.record_once()
        return recorder
    recorder.start()
    try:
        if duration_s:
            threading.Event().wait(duration_s)
        else:
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        recorder.stop()
    return recorder
