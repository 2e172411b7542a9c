"""The sink's per-batch figures, spooled by the driver's commit (no pyspark needed).

A JVM sink reports its own figures in ``progress["sink"]["metrics"]`` by implementing
``ReportsSinkMetrics``. A Python data source cannot: in Spark 4.2 (as in 4.1)
``PythonTable`` is only ``SupportsRead``/``SupportsWrite``, its ``PythonStreamingWrite`` has
no metrics hook, and the custom metrics of ``PythonWrite`` are the Python worker's own
(time, memory), none the data source can add. Observed metrics (``df.observe``) cannot
carry them either: they aggregate the rows *before* the sink sees them, so they cannot
know what the sink then did (duplicates, retries, reused attempts, commit time).

So the driver's commit of a micro-batch (a Python process Spark starts on the driver's
host) writes them to ``<dir>/<query id>/<batch id>.json`` (``dir``: the environment
variable ``IDEMLOG_PROGRESS_DIR``, default ``~/.idemlog/progress``). The bound: the last
``KEEP_BATCHES`` batches per query (each file about 300 bytes); a query's folder stays
until it is deleted. Users read them through ``spark_sink.query_progress``
(docs/spark.md, "The sink's figures").

A batch Spark re-runs after a driver restart (already committed, its repeat aborted)
reports ``committed = False``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

ENV_DIR = "IDEMLOG_PROGRESS_DIR"
KEEP_BATCHES = 100


def progress_dir() -> Path:
    """Where this process spools and reads the figures (``IDEMLOG_PROGRESS_DIR``)."""
    return Path(os.environ.get(ENV_DIR) or Path.home() / ".idemlog" / "progress")


@dataclass(frozen=True)
class SinkProgress:
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


def record(figures: SinkProgress, directory: Path | None = None) -> None:
    """Spool one batch's figures (atomically) and drop the batch ``KEEP_BATCHES`` back.
    Raises OSError when the directory cannot be written."""
    directory = directory or progress_dir()
    target = _path(directory, figures.query_id, figures.batch_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(figures)))
    os.replace(tmp, target)  # a reader sees all of it or none of it
    _path(directory, figures.query_id, figures.batch_id - KEEP_BATCHES).unlink(missing_ok=True)


def read(query_id: str, batch_id: int, directory: Path | None = None) -> SinkProgress | None:
    """The figures of one batch; None when the batch wrote nothing through idemlog."""
    try:
        doc = json.loads(_path(directory or progress_dir(), query_id, batch_id).read_text())
    except FileNotFoundError:
        return None
    return SinkProgress(**doc)


def _batch_ids(query_id: str, directory: Path | None) -> list[int]:
    folder = (directory or progress_dir()) / query_id
    if not folder.is_dir():
        return []
    return sorted(int(p.stem) for p in folder.glob("*.json"))


def history(query_id: str, directory: Path | None = None) -> list[SinkProgress]:
    """Every spooled batch of a query (at most ``KEEP_BATCHES``), by batch id."""
    found = (read(query_id, i, directory) for i in _batch_ids(query_id, directory))
    return [f for f in found if f is not None]


def latest(query_id: str, directory: Path | None = None) -> SinkProgress | None:
    """The spooled batch of a query with the highest batch id; None before its first."""
    for batch_id in reversed(_batch_ids(query_id, directory)):
        figures = read(query_id, batch_id, directory)
        if figures is not None:  # dropped between the listing and the read: the one before
            return figures
    return None
