"""The main job (``make demo``) runs its faults and proves exactly-once, as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = [sys.executable, "-m", "jobs.streaming_demo"]


@pytest.mark.slow
def test_streaming_demo_survives_its_faults_and_reports_exactly_once(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    proc = subprocess.run(
        [*DEMO, "--files", "4", "--rows", "3000", "--workdir", str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout
    log = (work / "driver.log").read_text()[-3000:] if (work / "driver.log").exists() else ""
    assert proc.returncode == 0, out + proc.stderr + log
    assert "exactly_once=OK rows_expected=12000 rows_committed=12000 duplicates=0 missing=0" in out
    assert "driver killed (SIGKILL); restarting the query from its checkpoint" in out
    progress = [line for line in out.splitlines() if line.strip().startswith("progress batch=")]
    assert {line.split()[1] for line in progress} == {f"batch={b}" for b in range(4)}
    metrics = dict(line.rsplit(None, 1) for line in out.splitlines()[-11:] if line[-1:].isdigit())
    assert metrics["driver restarts from the checkpoint"] == "1"
    # The task that raised after InitProducerId, and the killed worker, were fenced.
    assert int(metrics["task attempts fenced (their transaction aborted)"]) >= 1
