"""The stack of the cluster scenarios, the cluster demo and the scaling benchmark:
ZooKeeper and three brokers on hosts of their own, a Spark standalone master and two
workers (one core each) on theirs, and a host for the drivers (``tests/harness/cluster.py``
has the parts; docs/deployment.md the same layout for real machines). With a
``Security`` (``tests/cluster/secured.py``) the same stack is secured: TLS with client
certificates and SCRAM on every link, ZooKeeper over TLS, the Spark job's options set.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import IdemlogError
from broker_core.protocol.wire import Action
from testkit import spark_failpoints
from tests.cluster.secured import Principal, SecuredZooKeeper, Security
from tests.harness.client_calls import answering_address
from tests.harness.cluster import BrokerCluster, SparkStandalone, code_zip
from tests.harness.jvm import EXECUTOR_OPTS_CONF, SHORT_LIVED_JVM_OPTIONS
from tests.harness.netns import Host, TestBed
from tests.harness.waiting import wait_until
from tests.spark.helpers import DriverLauncher, DriverRun, make_input, stream_spec


@dataclass
class Stack:
    bed: TestBed
    brokers: BrokerCluster
    spark: SparkStandalone
    driver: Host
    code: Path
    security: Security | None = None  # None: plaintext, nobody authenticated

    def sink_options(self, user: Principal | None = None) -> dict[str, str]:
        """The ``brokers`` option and, on a secured stack, ``user``'s security options
        (default: the writer's)."""
        keys = {}
        if self.security is not None:
            keys = self.security.client_keys(user or self.security.writer)
        return {"brokers": self.brokers.bootstrap, **keys}

    def client(self, user: Principal | None = None) -> BrokerClient:
        """A broker client (on a secured stack: as ``user``, default the admin)."""
        if self.security is None or user is None:
            return self.brokers.client()
        return self.security.client(self.brokers.bootstrap, user)

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
            EXECUTOR_OPTS_CONF: SHORT_LIVED_JVM_OPTIONS,
            **extra.pop("conf", {}),
        }
        sink = {**self.sink_options(), **extra.pop("sink_options", {})}
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

    def start_stream(
        self,
        drivers: DriverLauncher,
        work: Path,
        topic: str,
        *,
        files: int,
        rows: int,
        failpoints: Sequence[str] = (),
        conf: Mapping[str, str] | None = None,
        sink_options: Mapping[str, str] | None = None,
    ) -> StreamRun:
        """A stream of ``files`` micro-batches of ``rows`` rows (input written under
        ``work``) to ``topic``, with ``failpoints`` armed on the driver and the executors,
        started on the driver's host."""
        src, events, marks = work / "incoming", work / "events", work / "failpoints"
        ids = make_input(src, files, rows)
        spec = self.spec(
            events,
            **stream_spec(src, "", topic, work / "checkpoint", files),
            conf={**(conf or {}), **self.failpoint_conf(failpoints, marks)},
            sink_options=dict(sink_options or {}),
        )
        run = self.start(drivers, spec, failpoints=failpoints, failpoints_dir=marks)
        return StreamRun(run, spec, ids, events, marks, tuple(failpoints))

    def restart(self, drivers: DriverLauncher, stream: StreamRun) -> DriverRun:
        """The same query again, from its checkpoint (fired failpoints stay fired)."""
        stream.run = self.start(
            drivers, stream.spec, failpoints=stream.failpoints, failpoints_dir=stream.marks
        )
        return stream.run

    def failpoint_conf(self, entries: Iterable[str], directory: Path) -> dict[str, str]:
        """``spark.executorEnv`` settings that arm ``entries`` in the executors' Python
        workers (the driver's own environment is set by ``DriverLauncher``)."""
        directory.mkdir(parents=True, exist_ok=True)
        return {
            "spark.executorEnv.IDEMLOG_SPARK_FAILPOINTS": ";".join(entries),
            "spark.executorEnv.IDEMLOG_SPARK_FAILPOINTS_DIR": str(directory),
        }


@dataclass
class StreamRun:
    """A stream started by :meth:`Stack.start_stream`: its driver (the latest launch),
    spec, input ids, event-log and failpoint-marker folders."""

    run: DriverRun
    spec: dict[str, Any]
    ids: list[int]
    events: Path
    marks: Path
    failpoints: tuple[str, ...]


@contextlib.contextmanager
def running_stack(
    workdir: Path, *, workers: int = 2, security: Security | None = None
) -> Iterator[Stack]:
    """The whole stack started on a new test bed, secured by ``security`` if given (its
    users added before the brokers start, its ACLs granted once they serve); everything
    removed on exit."""
    bed = TestBed(workdir / "bed")
    if security is None:
        brokers = BrokerCluster(bed, workdir, count=3)
    else:
        brokers = BrokerCluster(
            bed,
            workdir,
            count=3,
            zookeeper=security.zookeeper,
            host_config=security.broker_config,
            client_tls=security.tls(security.broker),
            client_sasl=security.broker.credentials,
        )
    try:
        spark = SparkStandalone(bed, workdir / "spark", workers=workers, cores=1)
        driver = bed.add_host("driver")
        brokers.zk.start()
        if security is not None:
            assert isinstance(brokers.zk, SecuredZooKeeper)
            security.before_brokers(brokers.zk)
        brokers.start_brokers()
        spark.start()
        stack = Stack(bed, brokers, spark, driver, code_zip(workdir), security)
        if security is not None:
            security.grant(stack)
        yield stack
    finally:
        brokers.close()
        bed.close()


def fired_by(marks: Path, entry: str, run: DriverRun) -> int:
    """Wait for ``entry`` to fire; the pid of the process it fired in."""
    marker = Path(spark_failpoints.marker_path(str(marks), entry))

    def there() -> bool:
        if run.proc.poll() is not None:
            raise AssertionError(f"the driver exited before {entry} fired:\n{run.describe()}")
        return marker.exists() and len(marker.read_text().splitlines()) == 2

    wait_until(there, f"failpoint {entry} to fire", timeout=240)
    return int(marker.read_text().splitlines()[1])


def host_of(stack: Stack, pid: int) -> Host:
    """The test-bed host a process runs on."""
    netns = subprocess.run(
        ["ip", "netns", "identify", str(pid)], capture_output=True, text=True, check=True
    ).stdout.strip()
    (host,) = [h for h in stack.bed.hosts if h.netns == netns]
    return host


def executor_of(pid: int) -> psutil.Process:
    """The executor JVM a Spark Python worker ``pid`` belongs to."""
    (executor,) = [
        p
        for p in psutil.Process(pid).parents()
        if "CoarseGrainedExecutorBackend" in " ".join(p.cmdline())
    ]
    return executor


def partition_leaders(client: BrokerClient, topic: str) -> dict[int, tuple[int, int]]:
    """Each partition of ``topic``: (its leader's broker id, its leader epoch)."""
    (described,) = client.describe_topics([topic])
    return {e.partition: (e.leader, e.leader_epoch) for e in described.partitions}


def sink_coordinators(client: BrokerClient) -> set[int]:
    """The brokers coordinating a sink's transactional ids (the leaders of the
    ``__transaction_state`` partitions that hold them): empty before any sink wrote, or
    while no broker answers."""
    try:
        rows = client.list_transactions(every_id=True)
        homes = {r.state_partition for r in rows if r.sink_id}
        address = answering_address(client)
        return {
            int(
                client.action(address, Action.FIND_COORDINATOR, {"state_partition": p})["broker_id"]
            )
            for p in homes
        }
    except IdemlogError:
        return set()


def leader_moved(
    client: BrokerClient, topic: str, before: Mapping[int, tuple[int, int]], gone: int
) -> bool:
    """Whether every partition ``gone`` led has another leader at a higher epoch."""
    try:
        now = partition_leaders(client, topic)
    except IdemlogError:
        return False
    return all(
        now[p][0] != gone and now[p][1] > epoch
        for p, (leader, epoch) in before.items()
        if leader == gone
    )
