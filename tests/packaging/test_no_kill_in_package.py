"""Issue 38: the Spark side of the package holds no code that can kill its own process.
Failure injection lives in the checkout's ``testkit/`` (``testkit.spark_failpoints``),
reached only through the write's hooks (``spark_sink.hooks``); ``spark_sink`` may stop
the embedded broker it started (``Popen.kill``), never signal itself or its group.
The wheel's own copy is checked in ``test_wheel.py`` with :func:`self_kills`."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Module-level functions that end or signal a process of one's own choosing (a pid).
_FORBIDDEN_CALLS = {
    ("os", "kill"),
    ("os", "killpg"),
    ("os", "abort"),
    ("os", "_exit"),
    ("signal", "raise_signal"),
    ("signal", "pthread_kill"),
}


def self_kills(source: str, name: str) -> list[str]:
    """``name:line: what`` for each call of those functions and each use of SIGKILL."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in _FORBIDDEN_CALLS or node.attr == "SIGKILL":
                found.append(f"{name}:{node.lineno}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in {"os", "signal"}:
            for alias in node.names:
                if (node.module, alias.name) in _FORBIDDEN_CALLS or alias.name == "SIGKILL":
                    found.append(f"{name}:{node.lineno}: from {node.module} import {alias.name}")
    return found


def test_the_spark_side_holds_no_self_kill() -> None:
    files = sorted((REPO / "spark_sink").rglob("*.py"))
    assert len(files) > 20  # the package, not an empty glob
    found = [hit for f in files for hit in self_kills(f.read_text(), str(f.relative_to(REPO)))]
    assert found == []
    # The failpoints that do kill are where the wheel does not reach.
    injector = REPO / "testkit" / "spark_failpoints.py"
    assert self_kills(injector.read_text(), "testkit/spark_failpoints.py")


def test_the_demo_names_the_testkit_hooks() -> None:
    from jobs.streaming_demo import FAULT_HOOKS
    from testkit.spark_failpoints import HOOKS

    assert FAULT_HOOKS == HOOKS
