"""``Broker.start`` fails at each of its steps in turn, for real (a port another socket
holds, a data directory another holder locked, a ZooKeeper nobody answers, a cluster file
of a newer version), and leaves nothing open: the ports it bound are free again, the
data-directory lock is free, its threads are gone, and it is STOPPED (docs/broker.md,
"Failures and exit codes"; the steps in ``broker_core/server/process/broker.py``).

In-process, so that what is left open is seen from inside: the broker's own threads and
sockets, which a process's exit would hide.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from kazoo.handlers.threading import KazooTimeoutError

from broker_core.cli.failures import port_in_use
from broker_core.errors import CorruptRecordError, InvalidConfigError, LogDirLockedError
from broker_core.log.dir_lock import lock_data_dir
from broker_core.server.config.broker_config import BrokerConfig
from broker_core.server.process.broker import CLUSTER_FILE, Broker, BrokerState
from tests.harness.waiting import wait_until

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


@dataclass
class Setup:
    log_dir: Path
    listener_port: int
    metrics_port: int

    def config(self, **extra: object) -> BrokerConfig:
        values: dict[str, object] = {
            "log.dir": str(self.log_dir),
            "listener.port": self.listener_port,
            "metrics.port": self.metrics_port,
            **extra,
        }
        return BrokerConfig.from_mapping(values)


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path / "data", free_port(), free_port())


@pytest.fixture
def threads_before() -> Iterator[set[threading.Thread]]:
    yield set(threading.enumerate())


def lock_is_free(log_dir: Path) -> bool:
    if not log_dir.exists():
        return True
    try:
        lock = lock_data_dir(log_dir)
    except LogDirLockedError:
        return False
    lock.release()
    return True


def new_threads(before: set[threading.Thread]) -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t not in before and t.is_alive())


def assert_nothing_left(setup: Setup, broker: Broker, before: set[threading.Thread]) -> None:
    assert broker.state is BrokerState.STOPPED
    assert not port_in_use(HOST, setup.listener_port), "the Flight listener is still bound"
    assert not port_in_use(HOST, setup.metrics_port), "the metrics endpoint is still bound"
    assert lock_is_free(setup.log_dir), "the data-directory lock is still held"
    # The server's shutdown finishes on a thread of its own: wait for it, bounded.
    wait_until(lambda: not new_threads(before), lambda: f"threads left: {new_threads(before)}")


def test_a_started_broker_holds_what_the_checks_look_for_and_close_frees_it(
    setup: Setup, threads_before: set[threading.Thread]
) -> None:
    # The checks below can fail: a running broker holds both ports, the lock, threads.
    broker = Broker(setup.config())
    broker.start()
    try:
        assert port_in_use(HOST, setup.listener_port)
        assert port_in_use(HOST, setup.metrics_port)
        assert not lock_is_free(setup.log_dir)
        assert new_threads(threads_before)
    finally:
        broker.close()
    assert_nothing_left(setup, broker, threads_before)


def test_step_metrics_endpoint_fails_on_a_taken_port(
    setup: Setup, threads_before: set[threading.Thread]
) -> None:
    broker = Broker(setup.config())
    with socket.socket() as holder:
        holder.bind((HOST, setup.metrics_port))
        holder.listen()
        with pytest.raises(InvalidConfigError, match=f"metrics.port={setup.metrics_port}"):
            broker.start()
    assert not setup.log_dir.exists()  # refused before the directory was touched
    assert_nothing_left(setup, broker, threads_before)


def test_step_data_dir_lock_fails_on_a_locked_directory(
    setup: Setup, threads_before: set[threading.Thread]
) -> None:
    setup.log_dir.mkdir()
    other = lock_data_dir(setup.log_dir)  # another holder (its own open file: flock)
    broker = Broker(setup.config())
    try:
        with pytest.raises(LogDirLockedError, match=str(setup.log_dir)):
            broker.start()
        assert broker.metrics_endpoint is not None  # the earlier step had opened it
    finally:
        other.release()
    assert_nothing_left(setup, broker, threads_before)


def test_step_producer_ids_fails_on_an_unreachable_zookeeper(
    setup: Setup, threads_before: set[threading.Thread]
) -> None:
    broker = Broker(
        setup.config(**{"zookeeper.connect": "127.0.0.1:1", "zookeeper.session.timeout.ms": 2000})
    )
    with pytest.raises(KazooTimeoutError):
        broker.start()
    assert broker.store is None  # failed before the store: the ZooKeeper step
    assert_nothing_left(setup, broker, threads_before)


def test_step_listener_fails_on_a_taken_port(
    setup: Setup, threads_before: set[threading.Thread]
) -> None:
    broker = Broker(setup.config())
    with socket.socket() as holder:
        holder.bind((HOST, setup.listener_port))
        holder.listen()
        # gRPC's words (the CLI adds the port's owner, cli/broker_cmd.py).
        with pytest.raises(pa.ArrowException, match="Server did not start properly"):
            broker.start()
        assert broker.store is not None  # the earlier step had opened (and recovered) it
    assert_nothing_left(setup, broker, threads_before)


def test_step_cluster_fails_on_metadata_of_a_newer_version(
    setup: Setup, threads_before: set[threading.Thread]
) -> None:
    setup.log_dir.mkdir()
    (setup.log_dir / CLUSTER_FILE).write_text(json.dumps({"version": 999, "broker_id": 0}))
    broker = Broker(setup.config())
    with pytest.raises(CorruptRecordError, match="cluster metadata version 999"):
        broker.start()
    assert broker.info is not None and broker.cluster is None  # listener bound, no cluster
    assert_nothing_left(setup, broker, threads_before)
