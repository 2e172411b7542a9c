"""The shipped package cannot kill its own process (issue 38, docs/security.md, Test hooks):
no module of ``broker_core`` or ``spark_sink`` signals itself, its process group or every
process, aborts, or raises a signal in itself. The kills the fault tests need are in
``testkit/``, outside the wheel, reached only through hooks a broker's key or a write's
option names. Signals to another process are the broker CLI's (``idemlog broker stop``:
SIGTERM, then SIGKILL, through a pidfd of that process); the Spark side signals nothing
itself (it stops the embedded broker it started with ``Popen``), so there any ``os.kill``,
``os.killpg`` or SIGKILL counts, whatever its target.

Read from the sources' syntax trees, not imported: a module that would kill on import
is found too. ``tests/packaging/test_wheel.py`` runs the same check on the built wheel's
files."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("broker_core", "spark_sink")
# Packages that signal no process of their own choosing at all.
SIGNAL_FREE = ("spark_sink", "testkit/spark_failpoints.py")

# Calls that can only act on the calling process.
ALWAYS_SELF = {
    ("os", "abort"),
    ("signal", "raise_signal"),
    ("signal", "pthread_kill"),
    ("os", "_exit"),  # not a signal, but checked below: only the CLI's own exits
}
# Calls that signal a target given as their first argument.
TARGETED = {("os", "kill"), ("os", "killpg"), ("signal", "pidfd_send_signal")}
# Targets that are this process, its group, or every process (0 and -1 mean those).
SELF_TARGETS = {("os", "getpid"), ("os", "getpgrp"), ("os", "getpgid"), ("os", "getppid")}
# The broker CLI leaves with os._exit on purpose: after an interrupted start, and after its
# clean stop (threads that cannot be joined must not hold the exit); neither is a kill.
EXITS_ALLOWED = {"broker_core/cli/broker_cmd.py"}


def _qualified(node: ast.expr, aliases: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
    """``os.kill`` -> ("os", "kill"); a name imported with ``from os import kill`` too."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return (node.value.id, node.attr)
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    return None


def self_kills(source: str, path: str = "<source>") -> Iterator[str]:
    """Each call in ``source`` that can signal or end its own process, as ``path:line``;
    in a :data:`SIGNAL_FREE` path, each signal sent at all and each use of SIGKILL."""
    tree = ast.parse(source, path)
    strict = path.startswith(SIGNAL_FREE)
    aliases = {
        alias.asname or alias.name: (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "signal")
        for alias in node.names
    }
    for node in ast.walk(tree):
        if strict and isinstance(node, ast.Attribute) and node.attr == "SIGKILL":
            yield f"{path}:{node.lineno}: SIGKILL"
        if not isinstance(node, ast.Call):
            continue
        called = _qualified(node.func, aliases)
        if called in ALWAYS_SELF:
            if called == ("os", "_exit") and path in EXITS_ALLOWED:
                continue
            yield f"{path}:{node.lineno}: {'.'.join(called)}"
        elif called in TARGETED and strict:
            yield f"{path}:{node.lineno}: {'.'.join(called)}"
        elif called in TARGETED and node.args:
            target = node.args[0]
            if isinstance(target, ast.Call) and _qualified(target.func, aliases) in SELF_TARGETS:
                yield f"{path}:{node.lineno}: {'.'.join(called)} of its own process"
            elif isinstance(target, ast.UnaryOp | ast.Constant):
                # A literal target: 0 (its own group) or -1 (every process it may signal).
                yield f"{path}:{node.lineno}: {'.'.join(called)} of a literal pid"


def _sources() -> Iterator[Path]:
    for package in SHIPPED:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_no_shipped_module_kills_its_own_process() -> None:
    found = [
        hit
        for path in _sources()
        for hit in self_kills(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == [], "kills of its own process belong in testkit/: " + ", ".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
        "from os import kill, getpid\nkill(getpid(), 9)\n",
        "import os\nos.killpg(os.getpgrp(), 9)\n",
        "import os\nos.kill(0, 9)\n",
        "import os\nos.kill(-1, 9)\n",
        "import signal\nsignal.raise_signal(signal.SIGKILL)\n",
        "import os\nos.abort()\n",
        "import os\nos._exit(1)\n",
    ],
)
def test_the_check_finds_a_self_kill(source: str) -> None:
    assert list(self_kills(source)) != []


def test_the_check_lets_a_stop_of_another_process_through() -> None:
    # broker_core.cli.registry's stop of a listed broker, through a pidfd of its process.
    source = (
        "import os, signal\n"
        "pidfd = os.pidfd_open(pid)\n"
        "signal.pidfd_send_signal(pidfd, signal.SIGTERM)\n"
        "os.kill(child.pid, signal.SIGKILL)\n"
    )
    assert list(self_kills(source)) == []


def test_the_spark_failpoints_that_kill_are_found_where_the_wheel_does_not_reach() -> None:
    injector = ROOT / "testkit" / "spark_failpoints.py"
    assert list(self_kills(injector.read_text(), "testkit/spark_failpoints.py")) != []
    # Signalling any process from the Spark side counts, whatever the target.
    assert list(self_kills("import os\nos.killpg(group, 9)\n", "spark_sink/x.py")) != []
    assert list(self_kills("import os\nos.killpg(group, 9)\n", "broker_core/x.py")) == []


def test_the_demo_names_the_testkit_hooks() -> None:
    from jobs.streaming_demo import FAULT_HOOKS
    from testkit.spark_failpoints import HOOKS

    assert FAULT_HOOKS == HOOKS
