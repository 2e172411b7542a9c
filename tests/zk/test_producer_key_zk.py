"""The producer tokens' key in ZooKeeper (``security.producer_token.zk_key``): created once
by whichever broker comes first, read by every other, readable by the brokers' identity
only under ``zookeeper.set.acl``; a broker without that identity gets one line naming the
keys. In-process, on a real ZooKeeper."""

from __future__ import annotations

import threading

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import ANYONE_ID_UNSAFE

from broker_core.errors import InvalidConfigError
from broker_core.security.producer_token import KEY_BYTES, KEY_ZNODE, zk_key
from broker_core.security.zk_acl import ZkAuth
from broker_core.server.config.broker_config import ZK_ROOT
from testkit.zookeeper import ZooKeeperHarness

PATH = f"{ZK_ROOT}/{KEY_ZNODE}"
KEYS = {
    "zookeeper.set.acl": "true",
    "zookeeper.auth.digest.username": "idemlog-brokers",
    "zookeeper.auth.digest.password": "zk-Secret-key",
}


def test_brokers_racing_at_start_all_read_the_one_key(zk_chroot: ZooKeeperHarness) -> None:
    clients = [zk_chroot.client() for _ in range(4)]
    keys: list[bytes] = []
    start = threading.Barrier(len(clients))

    def read(client: object) -> None:
        start.wait()
        keys.append(zk_key(client, PATH, 10.0))

    threads = [threading.Thread(target=read, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 4 and len(set(keys)) == 1 and len(keys[0]) == KEY_BYTES
    data, stat = clients[0].get(PATH)
    assert data == keys[0] and stat.version == 0  # created once, never rewritten


def test_the_key_is_the_brokers_only_under_set_acl(zk_chroot: ZooKeeperHarness) -> None:
    auth = ZkAuth.from_values(KEYS)
    zk_chroot.admin_auth = [("digest", "idemlog-brokers:zk-Secret-key")]  # teardown's delete
    broker = zk_chroot.client(**auth.kazoo_arguments())
    key = zk_key(broker, PATH, 10.0)
    acl, _ = broker.get_acls(PATH)
    assert all(a.id != ANYONE_ID_UNSAFE for a in acl), acl  # not even world-readable
    outsider = zk_chroot.client()
    with pytest.raises(NoAuthError):
        outsider.get(PATH)
    outsider.get(f"{ZK_ROOT}/config")  # its parent stays world-readable metadata
    with pytest.raises(InvalidConfigError, match=r"zookeeper\.auth\.digest\.username") as err:
        zk_key(outsider, PATH, 10.0)
    assert key.hex() not in err.value.message
