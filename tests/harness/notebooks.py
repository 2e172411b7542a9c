"""What the tests read in an executed notebook (``nbformat``): its printed text and the
cells whose outputs hold a stack trace."""

from __future__ import annotations

import nbformat


def output_text(output: nbformat.NotebookNode) -> str:
    """What an output shows as text: a stream's, an error's traceback, a result's text."""
    parts = [output.get("text", ""), *output.get("traceback", [])]
    parts.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def cells_with_stacks(nb: nbformat.NotebookNode) -> list[int]:
    """The code cells whose outputs hold a Python traceback or a JVM stack (a logged one)."""
    return [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        and any(
            "Traceback" in text or "\tat org.apache." in text or "\tat java." in text
            for text in map(output_text, cell.outputs)
        )
    ]


def printed(nb: nbformat.NotebookNode) -> str:
    """Everything the code cells printed (their stream outputs), in order."""
    return "".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.output_type == "stream"
    )


def images(nb: nbformat.NotebookNode) -> int:
    """How many PNG images the code cells show."""
    return sum(
        "image/png" in out.get("data", {})
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
    )
