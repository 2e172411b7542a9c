"""Every folder of tests is collected by the suite's command (`make test` runs `pytest`
from the root): pytest skips folders matching its ``norecursedirs`` (by default ``dist``,
``build``, ``venv``, ``.*``, ...), so a test folder with such a name would silently never
run. The wheel smoke once lived in ``tests/dist`` and did not run in CI for that reason."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_no_test_folder_is_skipped_by_norecursedirs(pytestconfig: pytest.Config) -> None:
    patterns = pytestconfig.getini("norecursedirs")
    assert "dist" in patterns  # pytest's default list is what applies here
    folders = sorted({p.parent for p in (ROOT / "tests").rglob("test_*.py")})
    assert folders, "no test folders found"
    skipped = [
        str(folder.relative_to(ROOT))
        for folder in folders
        for part in folder.relative_to(ROOT / "tests").parts
        if any(fnmatch.fnmatch(part, pattern) for pattern in patterns)
    ]
    assert skipped == [], f"pytest never collects {skipped}: rename the folder"
