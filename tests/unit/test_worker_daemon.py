"""``spark_sink.worker_daemon``: which PySpark archives it drops from the path (real zip
files and package directories in a temporary directory; the Spark side is
``tests/spark/test_api.py::test_python_workers_run_without_the_redundant_pyspark_zip``)."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from spark_sink.worker_daemon import drop_redundant_archives, redundant_archives

RELEASE = b'__version__: str = "4.2.0"\n'


def archive(where: Path, version: bytes | None) -> str:
    where.mkdir(parents=True)
    path = where / "pyspark.zip"
    with zipfile.ZipFile(path, "w") as zipped:
        zipped.writestr("pyspark/__init__.py", "")
        if version is not None:
            zipped.writestr("pyspark/version.py", version)
    return str(path)


def package(where: Path, version: bytes) -> str:
    (where / "pyspark").mkdir(parents=True)
    (where / "pyspark" / "version.py").write_bytes(version)
    return str(where)


def jar(path: Path, names: list[str]) -> str:
    with zipfile.ZipFile(path, "w") as zipped:
        for name in names:
            zipped.writestr(name, "")
    return str(path)


def test_an_archive_of_the_installed_release_is_redundant(tmp_path: Path) -> None:
    zipped = archive(tmp_path / "lib", RELEASE)
    missing = str(tmp_path / "py4j.zip")
    site = package(tmp_path / "site", RELEASE)
    assert redundant_archives([zipped, missing, site]) == [zipped]


def test_an_archive_without_python_is_redundant_one_with_python_stays(tmp_path: Path) -> None:
    classes = jar(tmp_path / "core.jar", ["org/apache/spark/SparkContext.class", "META-INF/"])
    sources = jar(tmp_path / "py4j.zip", ["py4j/__init__.py", "py4j/java_gateway.py"])
    compiled = jar(tmp_path / "compiled.zip", ["lib/module.pyc"])
    assert redundant_archives([classes, sources, compiled]) == [classes]


def test_an_archive_of_another_release_or_without_a_package_stays(tmp_path: Path) -> None:
    zipped = archive(tmp_path / "lib", RELEASE)
    older = package(tmp_path / "site", b'__version__: str = "4.0.0"\n')
    assert redundant_archives([zipped, older]) == []
    assert redundant_archives([zipped, str(tmp_path / "empty")]) == []
    # Only a package *after* the archive counts: one before it is found first anyway.
    same = package(tmp_path / "before", RELEASE)
    assert redundant_archives([same, zipped]) == []


def test_the_first_package_after_the_archive_decides(tmp_path: Path) -> None:
    zipped = archive(tmp_path / "lib", RELEASE)
    older = package(tmp_path / "a", b'__version__: str = "4.0.0"\n')
    same = package(tmp_path / "b", RELEASE)
    assert redundant_archives([zipped, older, same]) == []


def test_an_unreadable_or_incomplete_archive_stays(tmp_path: Path) -> None:
    site = package(tmp_path / "site", RELEASE)
    broken = tmp_path / "broken" / "pyspark.zip"
    broken.parent.mkdir()
    broken.write_bytes(b"not a zip")
    no_version = archive(tmp_path / "lib", None)
    assert redundant_archives([str(broken), no_version, site]) == []


def test_dropping_removes_the_entry_and_its_cached_importer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    zipped = archive(tmp_path / "lib", RELEASE)
    site = package(tmp_path / "site", RELEASE)
    classes = jar(tmp_path / "core.jar", ["org/apache/spark/SparkContext.class"])
    inner = classes + "/org"
    monkeypatch.setattr(sys, "path", [zipped, classes, site, *sys.path])
    monkeypatch.setattr(
        sys,
        "path_importer_cache",
        {**sys.path_importer_cache, zipped: None, classes: None, inner: None},
    )
    assert drop_redundant_archives() == [zipped, classes]
    assert zipped not in sys.path and classes not in sys.path
    assert not {zipped, classes, inner} & set(sys.path_importer_cache)
    assert site in sys.path


def test_a_failure_leaves_the_path_as_spark_made_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The daemon still starts Spark's loop when the check fails: slower workers, never none."""
    from pyspark import daemon  # before the path holds the fake archive's ``pyspark``

    from spark_sink import worker_daemon

    zipped = archive(tmp_path / "lib", RELEASE)
    monkeypatch.setattr(sys, "path", [zipped, *sys.path])
    before = list(sys.path)

    def broken() -> list[str]:
        sys.path.remove(zipped)  # half done when it fails
        raise RuntimeError("unreadable")

    started = []
    monkeypatch.setattr(worker_daemon, "drop_redundant_archives", broken)
    monkeypatch.setattr(daemon, "manager", lambda: started.append(list(sys.path)))
    worker_daemon.main()
    assert started == [before]
    assert "left as Spark made it" in capsys.readouterr().err
