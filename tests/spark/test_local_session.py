"""``local_session()`` as a new user gets it (issue 37): Spark's web UI and console
progress bar on, the sink's figures in ``lastProgress`` and the sources' offsets there as
JSON; ``quiet=True`` turns the UI and the bar off. Each session is built in a child
process (one SparkContext per process, and the other modules' sessions are quiet)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spark_sink.embedded import stop_broker

CHILD = textwrap.dedent(
    """
    import json, sys
    from spark_sink import local_session, progress
    from spark_sink.query_progress import enriched_progress_enabled

    store, ck, quiet = sys.argv[1], sys.argv[2], sys.argv[3] == "quiet"
    spark = local_session("idemlog-local-session-test", quiet=quiet)
    rows = spark.range(0, 3000).selectExpr("id", "cast(id % 7 as int) AS account")
    (rows.write.format("idemlog").option("path", store).option("topic", "ls_src")
        .option("key", "account").option("partitions", "2").mode("append").save())
    query = (
        spark.readStream.format("idemlog").option("path", store).option("topic", "ls_src")
        .option("maxOffsetsPerTrigger", "1000").load()
        .writeStream.format("idemlog").option("path", store).option("topic", "ls_dst")
        .option("key", "account").option("checkpointLocation", ck).start()
    )
    query.processAllAvailable()
    recent = [p for p in query.recentProgress if p["numInputRows"] > 0]
    query.stop()
    print(json.dumps({
        "ui": spark.conf.get("spark.ui.enabled"),
        "bar": spark.conf.get("spark.ui.showConsoleProgress"),
        "url": spark.sparkContext.uiWebUrl,
        "enriched": enriched_progress_enabled(),
        "batches": [
            {"metrics": p["sink"]["metrics"], "expected": progress(p).metrics(),
             "start": p["sources"][0]["startOffset"], "end": p["sources"][0]["endOffset"]}
            for p in recent
        ],
    }))
    spark.stop()
    """
)


def run_child(tmp_path: Path, mode: str) -> dict[str, object]:
    args = [sys.executable, "-c", CHILD, str(tmp_path / "store"), str(tmp_path / "ck"), mode]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        try:
            out, err = child.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            pytest.fail(f"the {mode} session's child did not finish in 600 s:\n{err[-4000:]}")
    assert child.returncode == 0, err[-4000:]
    found: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("mode", ["default", "quiet"])
def test_local_session_shows_progress_and_the_sinks_figures(tmp_path: Path, mode: str) -> None:
    try:
        got = run_child(tmp_path, mode)
    finally:
        stop_broker(str(tmp_path / "store"))  # the embedded broker the child started
    on = mode == "default"
    assert got["ui"] == str(on).lower() and got["bar"] == str(on).lower()
    assert (got["url"] is not None) == on
    assert got["enriched"] is True
    batches = got["batches"]
    assert isinstance(batches, list) and len(batches) >= 3  # 3000 rows, 1000 a batch
    first = batches[0]
    assert first["start"] is None  # the query's first batch: no start, not 'None'
    for batch in batches:
        assert batch["metrics"] == batch["expected"]
        assert batch["metrics"]["committed"] == "true"
        assert set(json.loads(batch["end"])) >= {"0", "1"}
    for batch in batches[1:]:
        assert set(json.loads(batch["start"])) >= {"0", "1"}
