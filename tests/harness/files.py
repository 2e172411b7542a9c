"""What a directory holds, to prove that something left it unchanged.

``digest_tree(path)`` maps every file under ``path`` (relative name) to its size and
SHA-256; two digests compare equal only if no file was created, deleted or changed.
``changed_files(before, after, growing)`` names the differences, allowing files in
``growing`` (a live broker's active segments) to have grown with their old bytes kept as
their prefix (checked by hashing the first ``size`` bytes again).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple


class FileDigest(NamedTuple):
    size: int
    sha256: str


def _hash(path: Path, limit: int | None = None) -> str:
    h = hashlib.sha256()
    remaining = limit
    with open(path, "rb") as f:
        while remaining is None or remaining > 0:
            chunk = f.read(1 << 20 if remaining is None else min(1 << 20, remaining))
            if not chunk:
                break
            h.update(chunk)
            if remaining is not None:
                remaining -= len(chunk)
    return h.hexdigest()


def digest_tree(root: Path) -> dict[str, FileDigest]:
    """Every file under ``root`` (directories by their files), by relative path."""
    found: dict[str, FileDigest] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            found[str(path.relative_to(root))] = FileDigest(path.stat().st_size, _hash(path))
    return found


def changed_files(
    root: Path,
    before: dict[str, FileDigest],
    after: dict[str, FileDigest],
    growing: Iterable[str] = (),
) -> list[str]:
    """What differs between two digests of ``root``: new, missing and changed files, except
    that a file in ``growing`` may be longer if its first ``before.size`` bytes are the
    same (re-read now)."""
    allowed = set(growing)
    problems = [f"new file {name}" for name in sorted(set(after) - set(before))]
    problems += [f"missing file {name}" for name in sorted(set(before) - set(after))]
    for name in sorted(set(before) & set(after)):
        old, new = before[name], after[name]
        if old == new:
            continue
        if name in allowed and new.size >= old.size:
            if _hash(root / name, old.size) == old.sha256:
                continue
            problems.append(f"{name}: its first {old.size} bytes changed")
            continue
        problems.append(f"{name}: {old} -> {new}")
    return problems
