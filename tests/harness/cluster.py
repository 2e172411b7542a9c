"""A broker cluster and a Spark standalone cluster on hosts of the multi-host test bed
(docs/contributing.md, "The multi-host test bed"; docs/deployment.md).

* :class:`BrokerCluster`: the ZooKeeper server (Debian's package) on a host of its own and
  N broker processes in ZooKeeper mode, one per host, each bound to its host's address;
* :class:`SparkStandalone`: a Spark standalone master and workers, one per host, run with
  ``spark-class`` from the pyspark package (``org.apache.spark.deploy.master.Master`` /
  ``...worker.Worker``), each bound to its host's address; executors start on the
  workers' hosts when an application asks for them;
* :func:`code_zip`: the project's packages as one zip for ``spark.submit.pyFiles``;
* :func:`read_back`: an independent reader (the broker client, not Spark) of a topic's
  committed rows with their partition and offset, for ``spark_sink.verify``.

Every process is started on a host of the bed, so the bed's teardown kills it; the
drivers are ``tests/spark/driver_child.py`` started by ``DriverLauncher`` on the driver's
host (``launcher=host.command``).
"""

from __future__ import annotations

import functools
import json
import os
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark
import pytest

from broker_core.client.broker_client import BrokerClient
from broker_core.protocol.wire import Action
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.tls import PLAINTEXT_MATERIAL, TlsMaterial
from spark_sink.options import OFFSET_COLUMN, PARTITION_COLUMN
from testkit.zookeeper import ZooKeeperServer
from tests.harness.broker import BrokerProcess
from tests.harness.jvm import DAEMON_OPTS_ENV, with_short_lived_options
from tests.harness.netns import Host, TestBed
from tests.harness.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent
ZK_PORT = 2181
BROKER_PORT = 9092
MASTER_PORT = 7077
START_TIMEOUT = 90.0  # JVMs starting side by side on 2 cores


def _log_has(path: Path, text: str) -> bool:
    try:
        return text in path.read_text(errors="replace")
    except FileNotFoundError:
        return False


class BrokerCluster:
    """ZooKeeper on host ``zk`` and brokers ``1..count`` on hosts ``broker<i>``.

    A secured cluster (``tests/cluster/secured.py``) passes the rest: ``zookeeper`` makes
    the server for its host (default: a plaintext one on ``ZK_PORT``), ``host_config``
    gives each broker keys of its own host (its certificate), and ``client_tls`` /
    ``client_sasl`` are what :meth:`client` connects with."""

    def __init__(
        self,
        bed: TestBed,
        workdir: Path,
        *,
        count: int = 3,
        session_ms: int = 4000,
        config: Mapping[str, object] | None = None,
        zookeeper: Callable[[Host, Path], ZooKeeperServer] | None = None,
        host_config: Callable[[Host], Mapping[str, object]] | None = None,
        client_tls: TlsMaterial = PLAINTEXT_MATERIAL,
        client_sasl: SaslCredentials | None = None,
    ) -> None:
        self.bed = bed
        self.workdir = Path(workdir)
        self.client_tls = client_tls
        self.client_sasl = client_sasl
        self.zk_host = bed.add_host("zk")
        if zookeeper is not None:
            self.zk = zookeeper(self.zk_host, self.workdir / "zookeeper")
        else:
            self.zk = ZooKeeperServer(
                self.workdir / "zookeeper",
                host=self.zk_host.address,
                port=ZK_PORT,
                launcher=self.zk_host.command,
            )
        self.hosts: list[Host] = []
        self.brokers: list[BrokerProcess] = []
        for broker_id in range(1, count + 1):
            host = bed.add_host(f"broker{broker_id}")
            settings: dict[str, object] = {
                "listener.host": host.address,
                "listener.port": BROKER_PORT,
                "zookeeper.connect": f"{self.zk_host.address}:{ZK_PORT}",
                "zookeeper.session.timeout.ms": session_ms,
                "broker.id": broker_id,
                "transaction.abort.timed.out.transaction.cleanup.interval.ms": 200,
                **(config or {}),
                **(host_config(host) if host_config is not None else {}),
            }
            self.hosts.append(host)
            self.brokers.append(
                BrokerProcess(
                    self.workdir / "brokers",
                    settings,
                    name=f"broker{broker_id}",
                    launcher=host.command,
                )
            )

    @property
    def bootstrap(self) -> str:
        """Every broker's address (the ``brokers`` option and ``BrokerClient``'s bootstrap)."""
        return ",".join(f"{h.address}:{BROKER_PORT}" for h in self.hosts)

    def start(self) -> None:
        """ZooKeeper, then broker 1 alone (it becomes the controller), then the others;
        returns once every broker sees every other."""
        self.zk.start()
        self.start_brokers()

    def start_brokers(self) -> None:
        """:meth:`start` after ZooKeeper (started apart when something must be in it
        before any broker starts, e.g. the SCRAM users)."""
        self.brokers[0].start()
        for broker in self.brokers[1:]:
            broker.spawn()
        for broker in self.brokers[1:]:
            broker.start_wait()
        with self.client() as client:
            wait_until(
                lambda: len(client.metadata(refresh=True).brokers) == len(self.brokers),
                f"all {len(self.brokers)} brokers registered",
                timeout=START_TIMEOUT,
            )

    def client(self) -> BrokerClient:
        return BrokerClient(self.bootstrap, tls=self.client_tls, sasl=self.client_sasl)

    def close(self) -> None:
        for broker in self.brokers:
            broker.close()
        self.zk.stop()


class SparkStandalone:
    """A master on host ``master`` and ``workers`` workers on hosts ``worker<i>``, each
    offering ``cores`` cores."""

    def __init__(
        self, bed: TestBed, workdir: Path, *, workers: int = 2, cores: int = 1, memory: str = "2g"
    ) -> None:
        self.bed = bed
        self.workdir = Path(workdir)
        self.master_host = bed.add_host("master")
        self.worker_hosts = [bed.add_host(f"worker{i}") for i in range(1, workers + 1)]
        self.cores = cores
        self.memory = memory
        self.master_log = self.workdir / "master.log"
        self.worker_logs = [self.workdir / f"{h.name}.log" for h in self.worker_hosts]

    @property
    def url(self) -> str:
        return f"spark://{self.master_host.address}:{MASTER_PORT}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_NO_DAEMONIZE": "1",
            DAEMON_OPTS_ENV: with_short_lived_options(os.environ.get(DAEMON_OPTS_ENV)),
        }

    def start(self) -> None:
        """The master, then every worker; returns once each worker is registered."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        self.master_host.popen(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                *("--host", self.master_host.address, "--port", str(MASTER_PORT)),
                *("--webui-port", "8080"),
            ],
            env=self.env(),
            log=self.master_log,
        )
        for host, log in zip(self.worker_hosts, self.worker_logs, strict=True):
            host.popen(
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    *("--host", host.address, "--cores", str(self.cores)),
                    *("--memory", self.memory, "--webui-port", "8081"),
                    *("--work-dir", str(self.workdir / f"{host.name}-work")),
                    self.url,
                ],
                env=self.env(),
                log=log,
            )
        for log in self.worker_logs:
            wait_until(
                functools.partial(_log_has, log, "Successfully registered with master"),
                f"worker registered ({log.name})",
                timeout=START_TIMEOUT,
            )


@contextmanager
def cut_cluster(
    bed: TestBed,
    workdir: Path,
    request: pytest.FixtureRequest,
    *,
    session_ms: int,
    config: Mapping[str, object] | None = None,
    log_lines: int = 60,
) -> Iterator[BrokerCluster]:
    """A started 3-broker :class:`BrokerCluster` for a test that cuts links: at the end
    every host's links are healed before the brokers close, and each broker's last
    ``log_lines`` log lines go on the test's report (pytest shows them on failure)."""
    brokers = BrokerCluster(bed, workdir, count=3, session_ms=session_ms, config=config)
    try:
        brokers.start()
        yield brokers
    finally:
        for host in brokers.hosts:
            host.heal()
        brokers.close()
        for broker in brokers.brokers:
            request.node.add_report_section("teardown", broker.name, broker.log_tail(log_lines))


def live_ids(client: BrokerClient, broker: BrokerProcess) -> set[int]:
    """The broker ids live in METADATA as this one broker answers it (no routing)."""
    doc = client.action(broker.address, Action.METADATA, {})
    return {int(b["broker_id"]) for b in doc["brokers"]}


def code_zip(workdir: Path) -> Path:
    """The project's packages zipped for ``spark.submit.pyFiles``: how the executors get
    the sink's code (docs/deployment.md), and the hooks the fault tests' writes name
    (``testkit.spark_failpoints``)."""
    path = Path(workdir) / "idemlog-code.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for package in ("spark_sink", "broker_core", "testkit"):
            for file in sorted((REPO / package).rglob("*")):
                if file.is_file() and "__pycache__" not in file.parts:
                    z.write(file, file.relative_to(REPO))
    return path


def read_back(client: BrokerClient, topic: str) -> pa.Table:
    """Every committed row of ``topic`` (read_committed), with ``_partition`` and
    ``_offset``, read by the broker client: a reader independent of the sink's Spark
    source."""
    partitions = len(client.metadata(refresh=True).topics[topic])
    tables = []
    for p in range(partitions):
        for meta, batch in client.fetch(topic, p):
            n = batch.num_rows
            table = pa.Table.from_batches([batch])
            table = table.append_column(PARTITION_COLUMN, pa.array([p] * n, pa.int32()))
            table = table.append_column(
                OFFSET_COLUMN, pa.array(range(meta.base_offset, meta.base_offset + n), pa.int64())
            )
            tables.append(table)
    return pa.concat_tables(tables) if tables else pa.table({})


def spark_events(event_dir: Path, kind: str) -> list[dict[str, object]]:
    """The events named ``kind`` (e.g. ``SparkListenerTaskEnd``) in Spark's event logs
    under ``event_dir`` (uncompressed; rolled or not), in the order written."""
    needle = f'"Event":"{kind}"'
    found = []
    for path in sorted(p for p in Path(event_dir).rglob("*") if p.is_file()):
        for line in path.read_text(errors="replace").splitlines():
            if needle in line:
                found.append(json.loads(line))
    return found


@dataclass(frozen=True)
class TaskAttempt:
    """One task attempt as Spark's event log records it."""

    batch: int | None  # the micro-batch (``streaming.sql.batchId``) of its job, if any
    stage: int
    index: int  # the task's partition
    attempt: int
    speculative: bool
    host: str
    reason: str  # "Success", "TaskKilled", "ExceptionFailure", "ExecutorLostFailure", ...


def task_attempts(event_dir: Path) -> list[TaskAttempt]:
    """Every finished task attempt in Spark's event logs under ``event_dir``."""
    batch_of_stage: dict[int, int] = {}
    for job in spark_events(event_dir, "SparkListenerJobStart"):
        batch = (job.get("Properties") or {}).get("streaming.sql.batchId")  # type: ignore[attr-defined]
        for stage in job.get("Stage IDs", []):  # type: ignore[attr-defined]
            if batch is not None:
                batch_of_stage[int(stage)] = int(batch)
    attempts = []
    for end in spark_events(event_dir, "SparkListenerTaskEnd"):
        info: dict[str, Any] = end["Task Info"]  # type: ignore[assignment]
        stage = int(end["Stage ID"])  # type: ignore[call-overload]
        attempts.append(
            TaskAttempt(
                batch=batch_of_stage.get(stage),
                stage=stage,
                index=int(info["Index"]),
                attempt=int(info["Attempt"]),
                speculative=bool(info["Speculative"]),
                host=str(info["Host"]),
                reason=str(end["Task End Reason"]["Reason"]),  # type: ignore[index]
            )
        )
    return attempts
