"""notebooks/dedup_metrics.ipynb runs headless from an empty setup, without any error.

The notebook is executed by a real Jupyter kernel (nbclient + ipykernel, this venv's
Python), so it starts its own Spark driver and embedded broker like a user's would.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "dedup_metrics.ipynb"


def test_the_notebook_is_committed_with_outputs_cleared() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    dirty = [i for i, c in enumerate(code) if c.outputs or c.execution_count is not None]
    assert not dirty, f"code cells {dirty} have outputs: clear them before committing"
    # It once carried 21 KB of the injected faults' stacks in its stored outputs (issue 37).
    assert not _stacks(nb), "the stored notebook has stack traces in its outputs"


def _stacks(nb: nbformat.NotebookNode) -> list[int]:
    """The code cells whose outputs hold a Python traceback or a JVM stack (a logged one)."""
    return [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        and any(
            "Traceback" in text or "\tat org.apache." in text or "\tat java." in text
            for text in map(_text, cell.outputs)
        )
    ]


def _text(output: nbformat.NotebookNode) -> str:
    """What an output shows as text: a stream's, an error's traceback, a result's text."""
    parts = [output.get("text", ""), *output.get("traceback", [])]
    parts.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


@pytest.mark.slow
def test_the_notebook_runs_headless(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    monkeypatch.setenv("IDEMLOG_NOTEBOOK_DIR", str(work))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # Raises CellExecutionError (with the cell and its traceback) on any error.
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()

    streams = "".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.output_type == "stream"
    )
    summary = re.search(
        r"exactly_once=OK .*duplicates_in_window=(\d+) transactions_fenced=(\d+) "
        r"sink_batches=(\d+) metric_rows=(\d+)",
        streams,
    )
    assert summary, streams[-2000:]
    dups, fenced, sink_batches, metric_rows = map(int, summary.groups())
    assert dups >= 3  # lost acknowledgements were answered as duplicates, not appended twice
    assert fenced >= 2  # the attempt that raised mid-write and the killed worker's
    assert sink_batches == 6  # one per input file
    assert metric_rows > 0
    images = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if "image/png" in out.get("data", {})
    ]
    assert len(images) == 5  # over time, by reason, by partition, fenced, commit latency
    assert (work / "metrics" / "_delta_log").is_dir()
    # The injected faults fail task attempts that Spark logs with their stacks: none of
    # those logs reaches a cell's output (the faults fired: fenced and dups above).
    assert not _stacks(nb), [nb.cells[i].outputs for i in _stacks(nb)]
