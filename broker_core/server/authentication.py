"""The broker's side of SASL: the credential store, the session table and the Flight auth
handler, built from its configuration (docs/security.md)."""

from __future__ import annotations

import logging
from typing import Any

from broker_core.errors import BrokerNotAvailableError
from broker_core.security.credentials import FileCredentialStore, ZkCredentialStore
from broker_core.security.flight_auth import ScramServerAuth
from broker_core.security.principal import Principal
from broker_core.security.sessions import SessionTable
from broker_core.server.config import ZK_ROOT, BrokerConfig

log = logging.getLogger("idemlog.security")


def server_auth(cfg: BrokerConfig, zk: Any) -> ScramServerAuth | None:
    """The listener's auth handler: None with ``security.protocol=PLAINTEXT``. On a
    cluster the users come from ZooKeeper (``zk``, the broker's client on its chroot),
    cached before this returns; embedded from ``<log.dir>/__users.json``. A user whose
    credential changes or goes loses its sessions at once. Raises BrokerNotAvailableError
    if ZooKeeper's users cannot be read within the session timeout."""
    security = cfg.security
    if not security.sasl:
        return None
    sessions = SessionTable(
        lifetime_s=security.session_lifetime_ms / 1000.0,
        max_sessions=security.session_max_count,
    )

    def revoke(user: str) -> None:
        ended = sessions.revoke(Principal.user(user))
        if ended:
            log.info("User:%s changed or removed: %d sessions ended", user, ended)

    if cfg.embedded:
        # Checked before every call (a stat): a removal ends the user's sessions at once.
        users = FileCredentialStore(cfg.log_dir, on_change=revoke)
        return ScramServerAuth(users.lookup, sessions, security.mechanisms, on_call=users.refresh)
    # Watched: a removal ends the sessions when the watch fires, well within a second.
    store = ZkCredentialStore(zk, ZK_ROOT, watch=True, on_change=revoke)
    if not store.wait_loaded(cfg.zookeeper_session_timeout_ms / 1000.0):
        raise BrokerNotAvailableError(f"the SCRAM users under {store.path} did not load")
    return ScramServerAuth(store.lookup, sessions, security.mechanisms)
