"""The stack the cluster scenarios share (one per module: JVMs take a while to start on
two cores): ZooKeeper and three brokers on hosts of their own, a Spark standalone master
and two workers (one core each) on theirs, and a host for the drivers.

Each test writes its own topics with its own input and checkpoint, and heals every link
it cut (in ``finally``), so the next test finds the stack whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cluster import BrokerCluster, SparkStandalone, code_zip
from tests.harness.netns import Host, TestBed
from tests.spark.helpers import DriverLauncher, DriverRun


@dataclass
class Stack:
    bed: TestBed
    brokers: BrokerCluster
    spark: SparkStandalone
    driver: Host
    code: Path

    def spec(self, events: Path, *, cores: int = 2, **extra: Any) -> dict[str, Any]:
        """What every driver child on the cluster needs (``tests/spark/driver_child.py``):
        the master, the driver's address, the code shipped as ``spark.submit.pyFiles``,
        Spark's event log in ``events``; ``extra`` (e.g. a stream_spec) on top. ``cores``
        is ``spark.cores.max``: 1 runs one executor on one worker."""
        events.mkdir(parents=True, exist_ok=True)
        conf = {
            "spark.submit.pyFiles": str(self.code),
            "spark.cores.max": str(cores),
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": str(events),
            "spark.eventLog.compress": "false",
            "spark.sql.shuffle.partitions": "4",
            **extra.pop("conf", {}),
        }
        sink = {"brokers": self.brokers.bootstrap, **extra.pop("sink_options", {})}
        return {
            "master": self.spark.url,
            "driver_host": self.driver.address,
            "conf": conf,
            **extra,
            "store": "",
            "sink_options": sink,
        }

    def start(self, drivers: DriverLauncher, spec: dict[str, Any], **kwargs: Any) -> DriverRun:
        """A driver child (``tests/spark/driver_child.py``) on the driver's host."""
        return drivers.start(spec, launcher=self.driver.command, **kwargs)

    def failpoint_conf(self, entries: Iterable[str], directory: Path) -> dict[str, str]:
        """``spark.executorEnv`` settings that arm ``entries`` in the executors' Python
        workers (the driver's own environment is set by ``DriverLauncher``)."""
        directory.mkdir(parents=True, exist_ok=True)
        return {
            "spark.executorEnv.IDEMLOG_SPARK_FAILPOINTS": ";".join(entries),
            "spark.executorEnv.IDEMLOG_SPARK_FAILPOINTS_DIR": str(directory),
        }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("cluster")
    bed = TestBed(work / "bed")
    brokers = BrokerCluster(bed, work, count=3)
    try:
        spark = SparkStandalone(bed, work / "spark", workers=2, cores=1)
        driver = bed.add_host("driver")
        brokers.start()
        spark.start()
        yield Stack(bed, brokers, spark, driver, code_zip(work))
    finally:
        brokers.close()
        bed.close()


@pytest.fixture(autouse=True)
def stack_logs(request: pytest.FixtureRequest) -> Iterator[None]:
    """For a test on the stack: every process's log tail on its report (pytest shows it
    on failure)."""
    yield
    if "stack" not in request.fixturenames:
        return
    stack: Stack = request.getfixturevalue("stack")
    request.node.add_report_section("teardown", "cluster logs", stack.bed.logs())
    for broker in stack.brokers.brokers:
        request.node.add_report_section("teardown", broker.name, broker.log_tail(40))


@pytest.fixture
def drivers(tmp_path: Path, stack: Stack) -> Iterator[DriverLauncher]:
    launcher = DriverLauncher(tmp_path)
    try:
        yield launcher
    finally:
        launcher.close()
