"""``make layout`` (scripts/layout.py): the folders with their modules, and the most
changed modules counted under today's names through renames."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _layout() -> ModuleType:
    spec = importlib.util.spec_from_file_location("layout", ROOT / "scripts" / "layout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["layout"] = module
    spec.loader.exec_module(module)
    return module


def test_every_folder_is_listed_with_its_modules() -> None:
    found = _layout().folders(ROOT)
    assert {"broker_core/producer", "broker_core/txn", "spark_sink", "testkit"} <= set(found)
    lines = (ROOT / "broker_core/producer/producer.py").read_bytes().count(b"\n")
    assert ("producer.py", lines) in found["broker_core/producer"]


def _commit(repo: Path, message: str) -> None:
    for argv in (["add", "-A"], ["commit", "-q", "-m", message]):
        subprocess.run(["git", *argv], cwd=repo, check=True)


def test_a_moved_module_keeps_its_history(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for key, value in (("user.name", "t"), ("user.email", "t@t")):
        subprocess.run(["git", "config", key, value], cwd=tmp_path, check=True)
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    body = "".join(f"line_{i} = {i}\n" for i in range(40))
    (tmp_path / "old" / "moved.py").write_text(body)
    (tmp_path / "new" / "other.py").write_text("x = 1\n")
    _commit(tmp_path, "both")
    for i in range(3):
        (tmp_path / "old" / "moved.py").write_text(body + f"step = {i}\n")
        _commit(tmp_path, f"step {i}")
    subprocess.run(["git", "mv", "old/moved.py", "new/moved.py"], cwd=tmp_path, check=True)
    _commit(tmp_path, "move")
    (tmp_path / "new" / "moved.py").write_text(body + "step = 9\n")
    _commit(tmp_path, "after the move")
    ranked = _layout().most_changed(tmp_path, 10, None, packages=("new",))
    # 1 creation + 3 changes + the move + 1 after it, all under its name of today.
    assert ranked == [(6, "new/moved.py"), (1, "new/other.py")]
    assert _layout().most_changed(tmp_path, 1, None, packages=("new",)) == ranked[:1]
