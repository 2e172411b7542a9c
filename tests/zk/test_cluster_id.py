"""The cluster's id (broker_core.cluster.cluster_id): in ZooKeeper (real server), brokers
asking at once all get the one the first created, and a root begun again gets a new one;
embedded, the directory's file, written once; a stored value that is no id is refused
naming where it is; asked once per broker."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from broker_core.cluster.cluster_id import (
    CLUSTER_ID_FILE,
    ClusterId,
    embedded_cluster_id,
    zk_cluster_id,
)
from broker_core.errors import CorruptRecordError
from testkit.zookeeper import ZooKeeperHarness

ROOT = "/idemlog"
TIMEOUT_S = 10.0


def test_brokers_asking_at_once_share_one_id_and_a_new_root_gets_another(
    zk_chroot: ZooKeeperHarness,
) -> None:
    clients = [zk_chroot.client() for _ in range(4)]
    clients[0].ensure_path(ROOT)
    found: list[str] = []
    start = threading.Barrier(len(clients))

    def ask(client: object) -> None:
        start.wait()
        found.append(zk_cluster_id(client, ROOT, TIMEOUT_S))

    threads = [threading.Thread(target=ask, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert len(found) == 4 and len(set(found)) == 1 and len(found[0]) == 22
    stored, _ = clients[0].get(f"{ROOT}/cluster_id")
    assert stored.decode() == found[0]

    clients[0].delete(ROOT, recursive=True)  # the cluster's metadata begun again
    clients[0].ensure_path(ROOT)
    assert zk_cluster_id(clients[1], ROOT, TIMEOUT_S) not in found

    clients[0].set(f"{ROOT}/cluster_id", b"not an id")
    with pytest.raises(CorruptRecordError, match=f"{ROOT}/cluster_id holds 'not an id'"):
        zk_cluster_id(clients[0], ROOT, TIMEOUT_S)


def test_an_embedded_directory_keeps_its_id_and_another_has_its_own(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = embedded_cluster_id(tmp_path / "a")
    assert embedded_cluster_id(tmp_path / "a") == first
    assert embedded_cluster_id(tmp_path / "b") != first
    (tmp_path / "a" / CLUSTER_ID_FILE).write_text("x")
    with pytest.raises(CorruptRecordError, match=CLUSTER_ID_FILE):
        embedded_cluster_id(tmp_path / "a")


def test_the_id_is_loaded_once() -> None:
    loads: list[int] = []

    def load() -> str:
        loads.append(1)
        return "a" * 22

    cluster_id = ClusterId(load)
    assert cluster_id() == cluster_id() == "a" * 22
    assert loads == [1]
