"""The sink's progress spool (``spark_sink.progress_spool``), its reading
(``spark_sink.query_progress``) and the ``lost_ack`` failpoint, in isolation. Their
end-to-end proofs run real Spark: ``tests/spark/test_progress.py`` (``progress(query)``,
the listener, the opt-in ``lastProgress``), ``tests/spark/test_api.py`` and
``tests/packaging/test_wheel.py`` (the notebook from the wheel: lost acknowledgements
deduplicated)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.listener import QueryProgressEvent, StreamingQueryProgress

from broker_core.errors import InvalidConfigError, NetworkError
from spark_sink import progress_spool, query_progress
from spark_sink.progress_spool import SinkProgress
from testkit import spark_failpoints
from tests.sink_figures import figures


def test_spool_keeps_the_last_batches_and_a_rerun_overwrites(tmp_path: Path) -> None:
    spool = progress_spool
    assert spool.latest("q", tmp_path) is None and spool.history("q", tmp_path) == []
    for b in range(spool.KEEP_BATCHES + 5):
        spool.record(figures(b), tmp_path)
    kept = spool.history("q", tmp_path)
    assert [f.batch_id for f in kept] == list(range(5, spool.KEEP_BATCHES + 5))
    assert spool.latest("q", tmp_path) == figures(spool.KEEP_BATCHES + 4)
    spool.record(figures(7, committed=False), tmp_path)  # Spark re-ran batch 7
    assert spool.read("q", 7, tmp_path) == figures(7, committed=False)
    assert spool.read("q", 0, tmp_path) is None
    assert spool.read("other", 7, tmp_path) is None
    assert not list(tmp_path.rglob("*.tmp*"))


def progress_doc(query_id: str, batch_id: int, rows: int = 42) -> dict[str, Any]:
    """A StreamingQueryProgress document as Spark's JVM hands it to Python."""
    return {
        "id": query_id,
        "runId": "7c9e6679-7425-40de-944b-e07fc1f90ae7",
        "name": None,
        "timestamp": "2026-01-01T00:00:00.000Z",
        "batchId": batch_id,
        "batchDuration": 1,
        "durationMs": {},
        "eventTime": {},
        "stateOperators": [],
        "sources": [],
        "sink": {"description": "PythonTable@1", "numOutputRows": rows, "metrics": {}},
        "numInputRows": rows,
        "inputRowsPerSecond": 0.0,
        "processedRowsPerSecond": 0.0,
        "observedMetrics": {},
    }


def test_enrich_fills_the_sink_metrics_and_the_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(progress_spool.ENV_DIR, str(tmp_path))
    query_id = "0f8fad5b-d9cb-469f-a165-70867728950e"
    progress_spool.record(figures(3, rows=42, query_id=query_id), tmp_path)
    doc = progress_doc(query_id, 3)
    p = query_progress.enrich(StreamingQueryProgress.fromJson(doc))
    assert p is not None
    assert query_progress.progress(p) == figures(3, rows=42, query_id=query_id)
    assert p["sink"]["metrics"]["rows"] == "42"
    assert p["sink"]["metrics"]["committed"] == "true"
    assert '"rows": "42"' in p.json
    fresh = {"description": "PythonTable@1", "numOutputRows": 0, "metrics": {}}
    other = StreamingQueryProgress.fromJson({**doc, "batchId": 4, "sink": fresh})
    assert query_progress.progress(other) is None
    assert query_progress.enrich(other)["sink"]["metrics"] == {}  # type: ignore[index]
    assert query_progress.enrich(None) is None


def test_enrich_shows_each_sources_offsets_as_the_json_spark_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyspark renders a missing offset as the text ``'null'`` (4.1 rendered every offset
    with str() of the parsed JSON, issue 37: ``"{'0': 481}"``, ``'None'``); enriched, a
    missing one is None and the others Spark's JSON."""
    monkeypatch.setenv(progress_spool.ENV_DIR, str(tmp_path))
    source = {
        "description": "PythonMicroBatchStream",
        "startOffset": None,
        "endOffset": {"0": 481, "1": 17},
        "latestOffset": {"0": 481, "1": 17},
        "numInputRows": 498,
        "inputRowsPerSecond": 0.0,
        "processedRowsPerSecond": 0.0,
        "metrics": {},
    }
    file_source = {**source, "startOffset": '{"logOffset":0}', "endOffset": "1"}
    doc = {**progress_doc("0f8fad5b-d9cb-469f-a165-70867728950e", 0), "sources": [source]}
    doc["sources"] = [source, file_source]
    raw = StreamingQueryProgress.fromJson(doc)
    assert json.loads(raw["sources"][0]["endOffset"]) == {"0": 481, "1": 17}  # pyspark's own
    assert raw["sources"][0]["startOffset"] == "null"
    p = query_progress.enrich(raw)
    assert p is not None
    idemlog, other = p["sources"]
    assert json.loads(idemlog["endOffset"]) == {"0": 481, "1": 17}
    assert json.loads(idemlog["latestOffset"]) == {"0": 481, "1": 17}
    assert idemlog["startOffset"] is None
    assert (other["startOffset"], other["endOffset"]) == ('{"logOffset":0}', "1")  # as they were
    assert json.loads(p.json)["sources"][0]["endOffset"] == {"0": 481, "1": 17}


def test_listener_keeps_the_last_batches_of_the_last_queries_and_hands_each_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(progress_spool.ENV_DIR, str(tmp_path))
    ids = [f"0f8fad5b-d9cb-469f-a165-7086772895{n:02d}" for n in range(3)]
    handed: list[tuple[int, int]] = []

    class Forward(query_progress.SinkProgressListener):
        def on_sink_progress(self, event: QueryProgressEvent, f: SinkProgress) -> None:
            handed.append((ids.index(f.query_id), f.batch_id))

    listener = Forward(keep=2, queries=2)
    for q, query_id in enumerate(ids):
        for b in range(3):
            progress_spool.record(figures(b, query_id=query_id, rows=10 * q + b), tmp_path)
            event = QueryProgressEvent(StreamingQueryProgress.fromJson(progress_doc(query_id, b)))
            listener.onQueryProgress(event)
    # A batch without figures (nothing written through idemlog) is neither kept nor handed on.
    listener.onQueryProgress(
        QueryProgressEvent(StreamingQueryProgress.fromJson(progress_doc(ids[2], 9)))
    )
    assert handed == [(q, b) for q in range(3) for b in range(3)]
    assert listener.figures(ids[0]) == []  # the oldest query made room for the third
    assert [f.batch_id for f in listener.figures(ids[1])] == [1, 2]
    assert listener.wait_for_batch(ids[2], 2, timeout=0).rows == 22
    with pytest.raises(TimeoutError, match="batch 0"):
        listener.wait_for_batch(ids[2], 0, timeout=0)  # fell out of the last two


def test_lost_ack_is_parsed_only_with_drop() -> None:
    (entry,) = spark_failpoints.parse("lost_ack@2/1=drop:3")
    assert (entry.point, entry.batch_id, entry.partition, entry.action) == (
        "lost_ack",
        2,
        1,
        "drop:3",
    )
    with pytest.raises(InvalidConfigError, match="drop:<n> is the action of lost_ack only"):
        spark_failpoints.parse("lost_ack@2=raise")
    with pytest.raises(InvalidConfigError, match="drop:<n> is the action of lost_ack only"):
        spark_failpoints.parse("mid_write@2=drop:1")


class _Done:
    def __init__(self) -> None:
        self.waited = False

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        self.waited = True
        return "response"


class _Transport:
    def __init__(self) -> None:
        self.sent = 0

    def send(self, tp: Any, batch: Any, **kwargs: Any) -> _Done:
        self.sent += 1
        return _Done()

    def partitions_for(self, topic: str) -> int:
        return 4


def test_losing_acks_loses_the_first_n_answers_after_the_request_completed() -> None:
    (entry,) = spark_failpoints.parse("lost_ack@0=drop:2")
    inner = _Transport()
    proxy = spark_failpoints.losing_acks(entry, inner)  # type: ignore[arg-type]
    handles = [proxy.send(None, None) for _ in range(3)]  # type: ignore[arg-type]
    for lost in handles[:2]:
        with pytest.raises(NetworkError, match="answer was lost"):
            lost.result(1)
        assert lost.inner.waited  # type: ignore[attr-defined]  # the request did complete
    assert handles[2].result(1) == "response"
    assert inner.sent == 3 and proxy.partitions_for("t") == 4
    assert spark_failpoints.losing_acks(None, inner) is inner  # type: ignore[arg-type]
