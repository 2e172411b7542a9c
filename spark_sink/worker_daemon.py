"""Spark's Python worker daemon, without re-reading ``pyspark.zip`` before every task.

Run by Spark as ``python -m spark_sink.worker_daemon <worker module>`` when a session sets
``spark.python.daemon.module=spark_sink.worker_daemon`` (``local_session`` does; see
docs/spark.md, "Spark's Python workers"). It drops the zip archives no import needs from
the path, then runs Spark's own daemon (``pyspark.daemon.manager``) unchanged: the
workers it forks, their reuse, signals and exit codes are Spark's.

Why: Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on its Python workers' path,
and each worker calls ``importlib.invalidate_caches()`` before every task and every
driver-side call of a Python data source (``worker_util.setup_spark_files``). Before
Python 3.13 a zip importer's invalidation re-reads the archive's whole directory at once:
for PySpark's 3.5 MB archive (4.1's, measured; 4.2's is 3.7 MB) that is ~60 ms of CPU per
task on the project's 2-core test machine, more than half of what a small read task
costs, and ~27 ms more for the ``spark-core`` jar Spark also puts there, which holds no
Python at all (benchmarks/README.md, "Spark's Python workers"). A pip-installed PySpark ships the
archive inside the very package it was built from, so importing ``pyspark`` from the
package directory runs the same code without it.

What it guarantees: ``pyspark.zip`` is dropped only if a directory later on the path holds
a ``pyspark`` package whose ``version.py`` is byte-identical to the archive's (the same
release); any other archive only if it holds no ``.py``/``.pyc`` file, so nothing could be
imported from it. Otherwise (a Spark distribution whose PySpark lives only in the archive,
another version installed beside it, an unreadable archive) the entry stays as Spark put
it. Nothing else of the worker changes.
"""

from __future__ import annotations

import os
import sys
import zipfile
from collections.abc import Sequence

ARCHIVE_NAME = "pyspark.zip"
VERSION_FILE = "pyspark/version.py"
IMPORTABLE = (".py", ".pyc")


def _archive_version(archive: str) -> bytes | None:
    try:
        with zipfile.ZipFile(archive) as zipped:
            return zipped.read(VERSION_FILE)
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def _package_version(directory: str) -> bytes | None:
    try:
        with open(os.path.join(directory or os.curdir, *VERSION_FILE.split("/")), "rb") as f:
            return f.read()
    except OSError:
        return None


def _holds_python(archive: str) -> bool | None:
    """Whether a zip archive has any file zipimport could import (``.py``/``.pyc``);
    None if it is not a readable zip."""
    try:
        with zipfile.ZipFile(archive) as zipped:
            return any(name.endswith(IMPORTABLE) for name in zipped.namelist())
    except (OSError, zipfile.BadZipFile):
        return None


def redundant_archives(path: Sequence[str]) -> list[str]:
    """The zip archives on ``path`` that no import needs: a PySpark archive whose release
    is also installed as a package directory later on ``path`` (the same
    ``pyspark/version.py``, byte for byte), and an archive with no ``.py``/``.pyc`` file at
    all (Spark adds its ``spark-core`` jar). Reads the archives' directories and the
    packages' version files; changes nothing."""
    redundant = []
    for index, entry in enumerate(path):
        if not os.path.isfile(entry):
            continue
        if os.path.basename(entry) != ARCHIVE_NAME:
            if _holds_python(entry) is False:
                redundant.append(entry)
            continue
        archived = _archive_version(entry)
        if archived is None:
            continue
        for later in path[index + 1 :]:
            if os.path.isdir(os.path.join(later or os.curdir, "pyspark")):
                # The first package later on the path is the one imports would find.
                if _package_version(later) == archived:
                    redundant.append(entry)
                break
    return redundant


def drop_redundant_archives() -> list[str]:
    """Removes ``redundant_archives(sys.path)`` from ``sys.path`` and their importers from
    ``sys.path_importer_cache`` (where ``invalidate_caches`` would still find them); the
    entries removed. Call before anything imports ``pyspark``."""
    dropped = redundant_archives(sys.path)
    for entry in dropped:
        while entry in sys.path:
            sys.path.remove(entry)
        for cached in [
            k for k in sys.path_importer_cache if k == entry or k.startswith(entry + os.sep)
        ]:
            # Sub-paths too (``<jar>/org``): importers of an archive's inner directories.
            del sys.path_importer_cache[cached]
    return dropped


def main() -> None:
    path, cached = list(sys.path), dict(sys.path_importer_cache)
    try:
        drop_redundant_archives()
    except Exception as exc:  # a saving, never a reason for no workers
        # The path goes back to Spark's: every task then runs, only slower. Said on
        # stderr, which Spark keeps in the executor's log.
        sys.path[:], sys.path_importer_cache = path, cached
        print(
            f"spark_sink.worker_daemon: the path is left as Spark made it: {exc!r}", file=sys.stderr
        )
    # Imported only now, from where the path leads. Its module code reads the worker
    # module from sys.argv[1], as it does when Spark runs it directly.
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
