"""The broker's ZooKeeper session, as ``Broker.start`` opens it: the chroot created first
(every missing level, as Kafka does), TLS (``zookeeper.ssl.*``) and the brokers' digest
identity (``zookeeper.auth.digest.*``, docs/security.md), reconnecting for as long as it
takes, and access to the broker's root checked before anything is read there.
"""

from __future__ import annotations

import logging
from typing import Any

from broker_core.security import zk_acl
from broker_core.security.zk_acl import ZkAuth
from broker_core.security.zk_tls import ZkTlsSettings
from broker_core.server.config.broker_config import ZK_ROOT, BrokerConfig

log = logging.getLogger("idemlog.security")


def connect_zookeeper(cfg: BrokerConfig) -> Any:
    """A started KazooClient on ``zookeeper.connect`` (with its chroot), its access to the
    broker's root checked; the caller stops and closes it. Raises kazoo's timeout when no
    server answers within ``zookeeper.session.timeout.ms``, and what the ACL check raises
    (the client is closed first)."""
    from kazoo.client import KazooClient

    timeout_s = cfg.zookeeper_session_timeout_ms / 1000.0
    # Reconnect for as long as it takes, quickly: a broker without ZooKeeper
    # keeps serving its partitions and waits for the connection to come back.
    retry = {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 2.0}
    secure = ZkTlsSettings.from_values(cfg.values).kazoo_arguments()  # files checked
    auth = ZkAuth.from_values(cfg.values)
    secure.update(auth.kazoo_arguments())  # digest identity; ACLs with zookeeper.set.acl
    if auth.set_acl and not cfg.zookeeper_chroot:
        # ZooKeeper checks a delete against the parent's ACL, and "/" is open to all by
        # default: a top-level node's own ACL cannot stop its deletion.
        log.warning(
            "zookeeper.set.acl=true without a chroot in zookeeper.connect: any ZooKeeper "
            "client can delete the top-level /latest_producer_id_block whatever its ACL; "
            "add a chroot (zookeeper.connect=%s/idemlog) or set an ACL on / "
            "(docs/security.md, Authentication and node ACLs)",
            cfg.zookeeper_hosts,
        )
    if cfg.zookeeper_chroot:
        # Create the chroot first, every missing level of it, as Kafka does on first
        # start. A client on the chroot cannot: kazoo's ensure_path climbs up to the
        # chroot's own node and creates only that one, so /prod/idemlog without /prod
        # failed with NoNodeError. Hence a short-lived client without the chroot, whose
        # requests are retried across a lost connection for up to the session timeout.
        admin = KazooClient(
            hosts=cfg.zookeeper_hosts,
            timeout=timeout_s,
            connection_retry=retry,
            command_retry={**retry, "deadline": timeout_s},
            **secure,
        )
        admin.start(timeout=timeout_s)
        try:
            admin.retry(zk_acl.ensure_path, admin, cfg.zookeeper_chroot)
        finally:
            admin.stop()
            admin.close()
    client = KazooClient(
        hosts=cfg.zookeeper_connect, timeout=timeout_s, connection_retry=retry, **secure
    )
    client.start(timeout=timeout_s)
    try:
        zk_acl.check_access(client, ZK_ROOT, auth)
    except BaseException:
        client.stop()
        client.close()
        raise
    return client
