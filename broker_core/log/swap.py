"""Installing a cleaned segment in place of the old one, crash-safely.

The cleaner builds a segment's new files (``.log``, ``.index``, ``.txnindex``) in the
partition's ``.cleaning/`` directory, fsynced. Installing them is two rounds of renames:

1. each new file is renamed to ``<name>.swap`` in the partition directory, the ``.log``
   last, then the directory is fsynced: from the moment ``<base>.log.swap`` exists the
   swap is decided;
2. each ``.swap`` is renamed over its final name, the ``.log`` last, and the directory is
   fsynced.

A crash before ``<base>.log.swap`` exists leaves the old segment whole (recovery deletes
the stray ``.swap`` files and ``.cleaning/``); a crash after it leaves the new segment
whole once recovery has finished the renames (:func:`finish_swaps`, which recovery runs
before it opens any segment). Either the old or the new segment, never a mix.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from broker_core.fileutil import fsync_directory

log = logging.getLogger("idemlog.cleaner")

CLEANING_DIR = ".cleaning"
SWAP_SUFFIX = ".swap"
# The order files are renamed in; the .log last, so its presence decides the swap.
_SEGMENT_SUFFIXES = (".txnindex", ".index", ".log")


def _name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def install(directory: Path, base_offset: int) -> None:
    """Swap the segment at ``base_offset`` for the one built in ``.cleaning/`` (above).
    Raises OSError if a rename or fsync fails; what is on disk then is still one of the
    two segments, as recovery will find it."""
    staging = directory / CLEANING_DIR
    for suffix in _SEGMENT_SUFFIXES:
        name = _name(base_offset, suffix)
        os.rename(staging / name, directory / (name + SWAP_SUFFIX))
    fsync_directory(directory)
    for suffix in _SEGMENT_SUFFIXES:
        name = _name(base_offset, suffix)
        os.rename(directory / (name + SWAP_SUFFIX), directory / name)
    fsync_directory(directory)


def finish_swaps(directory: Path) -> int:
    """Complete or undo the swaps a crash interrupted (see the module docstring); returns
    how many segments were completed. Removes ``.cleaning/`` and undecided ``.swap`` files."""
    staging = directory / CLEANING_DIR
    if staging.exists():
        shutil.rmtree(staging)
    swaps = sorted(p for p in directory.iterdir() if p.name.endswith(SWAP_SUFFIX))
    if not swaps:
        return 0
    decided = {p.name.split(".")[0] for p in swaps if p.name.endswith(".log" + SWAP_SUFFIX)}
    # The .log last, as install() renames: until it is renamed the swap stays decided.
    for path in sorted(swaps, key=lambda p: p.name.endswith(".log" + SWAP_SUFFIX)):
        if path.name.split(".")[0] in decided:
            final = directory / path.name[: -len(SWAP_SUFFIX)]
            log.warning("finishing an interrupted segment swap: %s -> %s", path.name, final.name)
            os.rename(path, final)
        else:
            log.warning("dropping an undecided segment swap file %s", path.name)
            path.unlink()
    fsync_directory(directory)
    return len(decided)
