"""Prometheus' own ``promtool`` for the tests that check what operators load: the metrics
endpoint's answer (``promtool check metrics``) and the alert rules (``promtool check
rules``). ``make setup`` installs it (Makefile, ``PROMTOOL``); a machine without it fails
the test saying so, never skips it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS`` with ``stdin``, its output captured."""
    path = shutil.which("promtool")
    assert path, "promtool is not installed: `make setup` installs it (Makefile, PROMTOOL)"
    return subprocess.run(
        [path, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def check_metrics(exposition: str) -> None:
    """``promtool check metrics`` over a text exposition: nothing to report."""
    checked = promtool("check", "metrics", stdin=exposition)
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, ""), exposition


def check_rules(path: Path) -> None:
    """``promtool check rules`` over a rule file: it loads, every expression parses."""
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout, checked.stdout + checked.stderr
