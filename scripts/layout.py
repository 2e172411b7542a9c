"""The house as it stands: each folder of the product, the benchmarks and the testkit with
its modules and lines, the largest modules, and the files most often changed.

    python scripts/layout.py [--top N] [--since REV]

(``make layout``.) Lines are a module's physical lines. "Most changed" counts the commits
(merges left out) that touched each module of those folders, from ``--since`` (default: the
whole history), under its name of today; docs/architecture.md says where each kind of
change belongs. Only the standard library and ``git`` are used.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("broker_core", "spark_sink", "jobs", "benchmarks", "testkit")


def _lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def folders(root: Path) -> dict[str, list[tuple[str, int]]]:
    """Every folder of :data:`PACKAGES` holding Python modules: its modules and lines."""
    found: dict[str, list[tuple[str, int]]] = {}
    for package in PACKAGES:
        for module in sorted((root / package).rglob("*.py")):
            folder = module.parent.relative_to(root).as_posix()
            found.setdefault(folder, []).append((module.name, _lines(module)))
    return found


def most_changed(
    root: Path, top: int, since: str | None, packages: Sequence[str] = PACKAGES
) -> list[tuple[int, str]]:
    """The ``top`` modules of ``packages`` touched by the most non-merge commits, a
    renamed module counted under its name of today (renames followed through history)."""
    revs = [f"{since}..HEAD"] if since else []
    log = subprocess.run(
        ["git", "log", "--no-merges", "-M", "--format=%x00", "--name-status", *revs],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    today: dict[str, str] = {}  # an older name -> the module's name today
    counts: collections.Counter[str] = collections.Counter()
    for commit in log.split("\0"):  # newest first
        for line in commit.splitlines():
            fields = line.split("\t")
            if len(fields) == 3 and fields[0].startswith("R"):
                old, new = fields[1], fields[2]
                today[old] = today.get(new, new)
                counts[today[old]] += 1
            elif len(fields) == 2:
                counts[today.get(fields[1], fields[1])] += 1
    modules = {
        path.relative_to(root).as_posix()
        for package in packages
        for path in (root / package).rglob("*.py")
    }
    ranked = [(n, path) for path, n in counts.most_common() if path in modules]
    return ranked[:top]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--top", type=int, default=10, help="how many files in each list")
    parser.add_argument("--since", help="count changes after this revision only")
    args = parser.parse_args(argv)
    found = folders(REPO)
    print(f"{'folder':<32} {'modules':>7} {'lines':>7}  largest")
    for folder, modules in found.items():
        name, size = max(modules, key=lambda m: m[1])
        total = sum(n for _, n in modules)
        print(f"{folder:<32} {len(modules):>7} {total:>7}  {name} ({size})")
    everything = [(n, f"{folder}/{name}") for folder, ms in found.items() for name, n in ms]
    print(f"\nlargest modules (of {len(everything)}):")
    for n, path in sorted(everything, reverse=True)[: args.top]:
        print(f"{n:>7}  {path}")
    print(f"\nmost changed modules{f' since {args.since}' if args.since else ''} (commits):")
    for n, path in most_changed(REPO, args.top, args.since):
        print(f"{n:>7}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
