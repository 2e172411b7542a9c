"""The cluster's id: Kafka's ``cluster.id``, answered by the Kafka listener's Metadata and
DescribeCluster so a Kafka client can tell one cluster from another.

Random, made once per cluster (22 characters of base64url over 16 random bytes, the form
of Kafka's ids), never derived from a name: a cluster whose metadata is wiped and begun
again gets a new one, as a replaced broker or topic gets a new epoch or id.

* With ZooKeeper: the node ``<root>/cluster_id``, created by the first broker that asks;
  one that loses the race (``NodeExistsError``) reads the winner's. Deleting the root
  (a new cluster) deletes it with everything else.
* Embedded: the file ``log.dir/cluster.id``, written once; the directory is the cluster.
"""

from __future__ import annotations

import base64
import contextlib
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.exceptions import KazooException, NodeExistsError

from broker_core.errors import CorruptRecordError, RequestTimedOutError
from broker_core.fileutil import atomic_write
from broker_core.security import zk_acl

__all__ = ["CLUSTER_ID_FILE", "ClusterId", "embedded_cluster_id", "new_cluster_id", "zk_cluster_id"]

CLUSTER_ID_FILE = "cluster.id"
_ID_LENGTH = 22


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")


def _checked(raw: bytes, where: str) -> str:
    text = raw.decode("ascii", errors="replace").strip()
    if len(text) != _ID_LENGTH:
        raise CorruptRecordError(f"{where} holds {text!r}, not a cluster id")
    return text


def zk_cluster_id(client: Any, root: str, timeout_s: float) -> str:
    """The id at ``<root>/cluster_id``, created now if there is none. RequestTimedOutError
    (retriable) when ZooKeeper does not answer within ``timeout_s``."""
    path = f"{root}/cluster_id"
    try:
        with contextlib.suppress(NodeExistsError):  # another broker made it first: read it
            zk_acl.create_async(client, path, new_cluster_id().encode()).get(timeout=timeout_s)
        data, _ = client.get_async(path).get(timeout=timeout_s)
    except (KazooException, client.handler.timeout_exception) as exc:
        raise RequestTimedOutError(f"reading the cluster id at {path}: {exc!r}") from exc
    return _checked(data, path)


def embedded_cluster_id(log_dir: Path) -> str:
    """The id in ``log_dir/cluster.id``, written now if there is none."""
    path = log_dir / CLUSTER_ID_FILE
    if not path.exists():
        atomic_write(path, new_cluster_id().encode())
    return _checked(path.read_bytes(), str(path))


class ClusterId:
    """``load()``'s id, asked at the first call and kept: a cluster's id never changes
    while its brokers run."""

    def __init__(self, load: Callable[[], str]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._id: str | None = None

    def __call__(self) -> str:
        with self._lock:
            if self._id is None:
                self._id = self._load()
            return self._id
