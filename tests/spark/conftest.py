"""Fixtures of the Spark tests: an embedded broker per test (a real process, always
stopped at teardown) and a launcher of driver children (killed at teardown, before the
broker is stopped)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_sink import progress_spool
from spark_sink.embedded import ensure_broker, stop_broker
from tests.spark.helpers import DriverLauncher


@pytest.fixture(scope="session", autouse=True)
def progress_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The sink's progress spool, out of the user's home. Session-wide and set before any
    SparkSession starts, because Spark's processes inherit the environment at their start."""
    with pytest.MonkeyPatch.context() as mp:
        where = tmp_path_factory.mktemp("progress")
        mp.setenv(progress_spool.ENV_DIR, str(where))
        yield where


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    """The sink option ``path``: the embedded broker's directory. Started here, by the
    test process, so no driver child's environment leaks into it."""
    where = str(tmp_path / "store")
    try:
        ensure_broker(where)
        yield where
    finally:
        stop_broker(where)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[DriverLauncher]:
    """A launcher of driver children, without an embedded broker (for tests that bring
    their own brokers, e.g. a ``ReplicatedCluster``); its children are killed at teardown."""
    drivers = DriverLauncher(tmp_path)
    try:
        yield drivers
    finally:
        drivers.close()


@pytest.fixture
def drivers(store: str, launcher: DriverLauncher) -> DriverLauncher:
    """:func:`launcher` after the embedded broker ``store``: set up after it, so its
    children are killed before the broker is stopped."""
    return launcher
