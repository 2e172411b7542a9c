"""A factory of the sink's per-batch figures (``spark_sink.progress_spool``) for the tests."""

from __future__ import annotations

from typing import Any

from spark_sink import progress_spool


def figures(batch_id: int, **changes: Any) -> progress_spool.SinkProgress:
    values: dict[str, Any] = dict(
        query_id="q",
        batch_id=batch_id,
        committed=True,
        tasks=2,
        tasks_reused=0,
        rows=10,
        producer_batches=4,
        duplicates_acked=1,
        producer_retries=1,
        write_ms_max=5.0,
        commit_ms=2.0,
        committed_at_ms=1,
    )
    values.update(changes)
    return progress_spool.SinkProgress(**values)
