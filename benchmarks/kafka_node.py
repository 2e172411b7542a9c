"""A real Kafka node for benchmarks: KRaft, one combined broker+controller on loopback.

    with kafka_node() as node:
        producer = confluent_kafka.Producer({"bootstrap.servers": node.bootstrap})

Runs Kafka's own jars (``jars/kafka-broker/``, fetched from Maven Central by ``make
kafka-jars``) as a JVM of its own, with ``java`` from ``PATH``; nothing is downloaded:

1. a fresh directory (a temporary one unless ``directory`` is given) holds
   ``server.properties``, ``log4j2.properties``, the log directory ``data/``, Kafka's log
   ``server.log`` and the JVM's stdout/stderr ``kafka.out``;
2. two free loopback ports (the kernel's choice): the PLAINTEXT listener and the controller;
3. ``kafka.tools.StorageTool format`` (what ``kafka-storage.sh format`` runs) with a fresh
   cluster id, then ``kafka.Kafka server.properties`` with ``kafka-server-start.sh``'s JVM
   options (1 GiB heap, G1);
4. ready when the broker answers a metadata request naming itself (confluent-kafka's
   ``AdminClient``), polled until ``start_timeout_s``; a JVM that exits first fails the
   start with the tail of its log;
5. on leaving the ``with`` block, also through an exception or Ctrl-C: SIGTERM (a clean
   controlled shutdown), SIGKILL after ``stop_timeout_s``, then the temporary directory is
   removed. The JVM runs in its own session, so a Ctrl-C in the terminal reaches only this
   process, which then stops it; and it gets SIGTERM from the kernel if this process dies
   without cleaning up (``PR_SET_PDEATHSIG``), so no broker outlives its owner.

Durability is Kafka's default, stated explicitly: ``log.flush.interval.messages`` and
``log.flush.interval.ms`` are 2^63-1, i.e. the OS writes the page cache back (topics
created by a benchmark may set ``flush.messages``/``flush.ms`` themselves).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
)

from spark_sink.options import OPTIONS

REPO = Path(__file__).resolve().parents[1]
BROKER_JARS = REPO / "jars" / "kafka-broker"
NODE_ID = 1
LONG_MAX = 2**63 - 1
# kafka-server-start.sh's KAFKA_HEAP_OPTS and kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS.
JVM_OPTIONS = (
    "-Xmx1G",
    "-Xms1G",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
)
_PR_SET_PDEATHSIG = 1
_LOG_TAIL_LINES = 30


class KafkaNodeError(RuntimeError):
    """The node could not be set up or did not start."""


@dataclass(frozen=True)
class KafkaNode:
    bootstrap: str  # "127.0.0.1:<port>"
    directory: Path
    process: subprocess.Popen[bytes]

    @property
    def log_file(self) -> Path:
        return self.directory / "server.log"

    @property
    def pid(self) -> int:
        return self.process.pid


def broker_jars(jars_dir: Path = BROKER_JARS) -> list[Path]:
    """The broker's classpath; a clear error when ``make kafka-jars`` has not run."""
    jars = sorted(jars_dir.glob("*.jar")) if jars_dir.is_dir() else []
    if not any(p.name.startswith("kafka_2.13-") for p in jars):
        raise KafkaNodeError(
            f"no Kafka broker jars (kafka_2.13-*.jar) in {jars_dir}: run `make kafka-jars` "
            "(scripts/fetch_kafka_jars.sh)"
        )
    return jars


def free_port() -> int:
    # The kernel picks a free port; it is closed again before Kafka binds it, so another
    # process could take it in between -- then the start fails, it is not silently wrong.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cluster_id() -> str:
    """What ``kafka-storage.sh random-uuid`` prints: 16 random bytes, URL-safe base64,
    never starting with "-" (Kafka's Uuid.randomUuid rule: it would read as an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def server_properties(
    directory: Path, port: int, controller_port: int, overrides: Mapping[str, str]
) -> dict[str, str]:
    props = {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "controller.quorum.voters": f"{NODE_ID}@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(directory / "data"),
        # One node: internal topics cannot have more replicas than that.
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        # A write to a topic nobody created is a mistake, not a 1-partition topic.
        "auto.create.topics.enable": "false",
        # Kafka's defaults, spelled out: flushing is left to the OS.
        "log.flush.interval.messages": str(LONG_MAX),
        "log.flush.interval.ms": str(LONG_MAX),
    }
    props.update(overrides)
    return props


def _log4j2_properties(directory: Path) -> str:
    # Everything to server.log in the node's directory, nothing to the console.
    return "\n".join(
        [
            "status = warn",
            "appender.file.type = File",
            "appender.file.name = file",
            f"appender.file.fileName = {directory / 'server.log'}",
            "appender.file.layout.type = PatternLayout",
            "appender.file.layout.pattern = [%d] %p %m (%c)%n",
            "rootLogger.level = INFO",
            "rootLogger.appenderRef.file.ref = file",
            "",
        ]
    )


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: SIGTERM it when its parent dies.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise KafkaNodeError("java not found on PATH (the Kafka node needs a JDK >= 17)")
    return java


def _wait_ready(process: subprocess.Popen[bytes], bootstrap: str, deadline: float) -> None:
    """Until the broker answers a metadata request that lists itself."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    while True:
        if process.poll() is not None:
            raise KafkaNodeError(f"exited with status {process.returncode} while starting")
        left = deadline - time.monotonic()
        if left <= 0:
            raise KafkaNodeError("not ready before the start timeout")
        try:
            metadata = admin.list_topics(timeout=min(2.0, left))
        except KafkaException:
            # Not listening yet: the call failed fast; a short pause before the next try.
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            continue
        if NODE_ID in metadata.brokers:
            return


def stop(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM (Kafka's controlled shutdown), SIGKILL after ``timeout_s``; reaps it."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait()


@contextlib.contextmanager
def kafka_node(
    *,
    directory: Path | None = None,
    jars_dir: Path = BROKER_JARS,
    config: Mapping[str, str] | None = None,
    start_timeout_s: float = 120.0,
    stop_timeout_s: float = 30.0,
) -> Iterator[KafkaNode]:
    """Start a KRaft node (module docstring), yield it, stop it. ``directory`` (created,
    must not exist yet) is kept afterwards; without it a temporary one is removed.
    ``config`` overrides or adds ``server.properties`` keys."""
    jars = broker_jars(jars_dir)
    java = _java()
    classpath = os.pathsep.join(str(p) for p in jars)
    owned = directory is None
    home = Path(tempfile.mkdtemp(prefix="kafka-node-")) if directory is None else directory
    process: subprocess.Popen[bytes] | None = None
    try:
        if not owned:
            home.mkdir(parents=True)
        port, controller_port = free_port(), free_port()
        properties = home / "server.properties"
        properties.write_text(
            "".join(
                f"{k}={v}\n"
                for k, v in server_properties(home, port, controller_port, config or {}).items()
            )
        )
        log4j = home / "log4j2.properties"
        log4j.write_text(_log4j2_properties(home))
        jvm = [java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
        formatted = subprocess.run(
            [*jvm, "kafka.tools.StorageTool", "format", "-t", cluster_id(), "-c", str(properties)],
            capture_output=True,
            text=True,
            timeout=start_timeout_s,
            check=False,
        )
        if formatted.returncode != 0:
            raise KafkaNodeError(
                f"StorageTool format failed ({formatted.returncode}):\n"
                f"{formatted.stdout}{formatted.stderr}"
            )
        bootstrap = f"127.0.0.1:{port}"
        with open(home / "kafka.out", "wb") as out:
            process = subprocess.Popen(
                [*jvm, "kafka.Kafka", str(properties)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=home,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        try:
            _wait_ready(process, bootstrap, time.monotonic() + start_timeout_s)
        except KafkaNodeError as exc:
            raise KafkaNodeError(
                f"Kafka node in {home}: {exc}\n{_tail(home / 'kafka.out')}\n"
                f"{_tail(home / 'server.log')}"
            ) from None
        yield KafkaNode(bootstrap=bootstrap, directory=home, process=process)
    finally:
        if process is not None:
            stop(process, stop_timeout_s)
        if owned:
            shutil.rmtree(home, ignore_errors=True)


# -- administration ---------------------------------------------------------------------------
# idemlog's default partition count, so both systems spread the same keys as widely.
PARTITIONS = int(OPTIONS.key("partitions").default)
# Neither broker fsyncs on its own: Kafka's defaults, spelled out, and the same for idemlog.
FLUSH = {"flush.messages": str(LONG_MAX), "flush.ms": str(LONG_MAX)}


class KafkaAdmin:
    """The topics this benchmark creates on the Kafka node."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.client = AdminClient({"bootstrap.servers": bootstrap})
        # Reads end offsets only: it never subscribes, joins its group or commits.
        self.offsets = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "bench-peers", "enable.auto.commit": False}
        )

    def close(self) -> None:
        """Closes the connections (before the node stops: librdkafka would log every
        failed reconnect otherwise)."""
        self.offsets.close()
        del self.client  # AdminClient has no close(): its handle goes with the last reference

    def create(self, topic: str) -> None:
        new = NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1, config=FLUSH)
        for future in self.client.create_topics([new], operation_timeout=60).values():
            future.result()

    def delete(self, topic: str) -> None:
        for future in self.client.delete_topics([topic], operation_timeout=60).values():
            future.result()

    def records(self, topic: str) -> int:
        """The sum of the topic's end offsets: its records (nothing transactional here)."""
        return sum(
            self.offsets.get_watermark_offsets(TopicPartition(topic, p), timeout=60)[1]
            for p in range(PARTITIONS)
        )

    def check(self, what: str, topic: str, rows: int) -> None:
        records = self.records(topic)
        if records != rows:
            raise SystemExit(f"{what}: Kafka topic {topic} holds {records} records, not {rows}")

    def flush_config(self, topic: str) -> dict[str, str]:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = next(iter(self.client.describe_configs([resource]).values())).result()
        return {k: str(entries[k].value) for k in FLUSH}


def fresh(what: str) -> str:
    return f"bench-peers-{what}-{uuid.uuid4().hex[:12]}"
