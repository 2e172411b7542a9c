"""notebooks/dedup_metrics.ipynb is committed with its outputs cleared. It is executed
headless by the wheel smoke, from the installed wheel outside the checkout
(``tests/packaging/test_wheel.py``), which checks what its cells print and show."""

from __future__ import annotations

from pathlib import Path

import nbformat

from tests.harness.notebooks import cells_with_stacks

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "dedup_metrics.ipynb"


def test_the_notebook_is_committed_with_outputs_cleared() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    dirty = [i for i, c in enumerate(code) if c.outputs or c.execution_count is not None]
    assert not dirty, f"code cells {dirty} have outputs: clear them before committing"
    # It once carried 21 KB of the injected faults' stacks in its stored outputs (issue 37).
    assert not cells_with_stacks(nb), "the stored notebook has stack traces in its outputs"
