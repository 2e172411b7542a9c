"""A replicated cluster for the benchmarks: a real ZooKeeper on loopback and broker
processes ``1..n`` on a chroot of it.

The ZooKeeper server is the tests' own (``testkit.zookeeper``: the Debian package's
jars, a free loopback port; the module imports no pytest). The brokers are started here
rather than with ``tests.harness.broker``, which imports pytest: each is ``idemlog broker
start --config <file>``, awaited on its ``LISTENING host:port`` line, restarted on the
same port and log.dir after a kill (so clients holding its address reconnect to it).

Every wait polls the brokers' own answers with a deadline, as the test harness does.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TypeVar

from broker_core.client.broker_client import BrokerClient
from broker_core.cluster.records import PartitionState
from broker_core.errors import IdemlogError
from broker_core.protocol.admin_requests import MetadataRequest, MetadataResponse
from broker_core.protocol.wire import Action
from testkit.zookeeper import ZooKeeperHarness, ZooKeeperServer

REPO = Path(__file__).resolve().parents[1]
SESSION_MS = 2000  # as the replication tests: a SIGKILLed leader's partitions move this late
WAIT_S = 60.0
T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, timeout: float = WAIT_S) -> T:
    """Poll ``condition`` every 20 ms until it is truthy; raise after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)  # another process's state: nothing to wait on but a poll


class Node:
    """One broker process; ``start`` again after ``kill`` reuses its port and log.dir."""

    def __init__(self, workdir: Path, broker_id: int, config: Mapping[str, object]) -> None:
        self.broker_id = broker_id
        self.config: dict[str, object] = {
            "listener.port": 0,
            "log.dir": str(workdir / f"b{broker_id}-data"),
            **config,
            "broker.id": broker_id,
        }
        self.config_path = workdir / f"b{broker_id}.properties"
        self.log_path = workdir / f"b{broker_id}.log"
        self.process: subprocess.Popen[str] | None = None
        self.address = ""
        self._log: IO[str] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 60.0) -> None:
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in self.config.items()))
        self.address = ""
        self._log = open(self.log_path, "a")  # noqa: SIM115 -- the child's stderr while it runs
        command = [sys.executable, "-m", "broker_core.cli.main", "broker", "start"]
        self.process = subprocess.Popen(
            [*command, "--config", str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=REPO,
            start_new_session=True,
        )
        listening = threading.Event()
        threading.Thread(target=self._read_stdout, args=(listening,), daemon=True).start()
        if not listening.wait(timeout) or not self.address:
            self.kill()
            raise RuntimeError(f"broker {self.broker_id} did not start; see {self.log_path}")
        self.config["listener.port"] = self.address.rpartition(":")[2]  # the same on restart

    def _read_stdout(self, listening: threading.Event) -> None:
        process = self.process
        assert process is not None and process.stdout is not None
        for line in process.stdout:  # drained to the end, so the broker never blocks on it
            if line.startswith("LISTENING ") and not listening.is_set():
                self.address = line.split()[1]
                listening.set()
        listening.set()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


class LocalCluster:
    """ZooKeeper plus brokers ``1..count`` (broker 1 first: the first controller)."""

    def __init__(
        self, workdir: Path, count: int = 3, extra: Mapping[str, object] | None = None
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.zk_server = ZooKeeperServer(workdir / "zookeeper")
        self.zk = ZooKeeperHarness(self.zk_server, chroot="/idemlog-bench")
        self.nodes: dict[int, Node] = {}
        self.client: BrokerClient | None = None
        self.config: dict[str, object] = {
            "zookeeper.session.timeout.ms": SESSION_MS,
            **(extra or {}),
        }
        try:
            self.zk.setup()
            self.config["zookeeper.connect"] = self.zk.hosts
            for broker_id in range(1, count + 1):
                self.nodes[broker_id] = node = Node(workdir, broker_id, self.config)
                node.start()
            self.bootstrap = ",".join(n.address for n in self.nodes.values())
            self.client = BrokerClient(self.bootstrap)
            wait_until(
                lambda: all(self._live(n) == count for n in self.nodes.values()),
                f"all {count} brokers registered",
            )
        except BaseException:
            self.close()
            raise

    @property
    def admin(self) -> BrokerClient:
        assert self.client is not None
        return self.client

    def _live(self, node: Node) -> int:
        try:
            doc = self.admin.action(node.address, Action.METADATA, MetadataRequest().to_doc())
            return len(MetadataResponse.from_doc(doc).brokers)
        except IdemlogError:
            return -1

    def close(self) -> None:
        """Stop every broker, then ZooKeeper, whatever fails on the way (a failed run must
        leave no server behind)."""
        try:
            if self.client is not None:
                self.client.close()
            for node in self.nodes.values():
                node.kill(signal.SIGTERM)
        finally:
            self.zk_server.stop()

    def running(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.running]

    def pids(self) -> list[int]:
        return [n.pid for n in self.running()]

    def controller(self) -> int | None:
        for node in self.running():
            with contextlib.suppress(IdemlogError):
                found = self.admin.action(node.address, Action.METADATA, {})["controller"]
                return None if found is None else int(found)
        return None

    # -- partition state -------------------------------------------------------------------
    def state(self, topic: str, partition: int, via: Node) -> PartitionState:
        """The partition's state as broker ``via`` describes it."""
        answer = self.admin.action(via.address, Action.DESCRIBE_TOPICS, {"names": [topic]})
        entry = answer["topics"][0]["partitions"][partition]
        return PartitionState(
            tuple(entry["replicas"]), entry["leader"], entry["leader_epoch"], tuple(entry["isr"])
        )

    def agreed_state(self, topic: str, partition: int) -> PartitionState | None:
        """The state every running broker describes, or None while they differ."""
        try:
            states = {self.state(topic, partition, n) for n in self.running()}
        except (IdemlogError, IndexError, KeyError):
            return None
        return states.pop() if len(states) == 1 else None

    def create_topic(self, name: str, partitions: int, factor: int, **extra: object) -> None:
        """Create a topic and wait until every broker describes each partition with its
        full ISR and a leader."""
        config = {"replication.factor": str(factor), **{k: str(v) for k, v in extra.items()}}
        self.admin.create_topic(name, partitions, config=config)
        for p in range(partitions):
            self.wait_in_sync(name, p)

    def wait_in_sync(self, topic: str, partition: int, timeout: float = WAIT_S) -> None:
        """Every replica in the ISR, on every broker's word, and the leader's high
        watermark at its log end (the followers have the whole log)."""

        def in_sync() -> bool:
            state = self.agreed_state(topic, partition)
            if state is None or state.leader not in self.nodes:
                return False
            if set(state.isr) != set(state.replicas):
                return False
            body = {"topic": topic, "partition": partition}
            try:
                offsets = self.admin.action(
                    self.nodes[state.leader].address, Action.LIST_OFFSETS, body
                )
            except IdemlogError:
                return False
            return bool(offsets["high_watermark"] == offsets["log_end_offset"])

        wait_until(in_sync, f"{topic}-{partition}: every replica in sync", timeout)
