"""The broker's side of authentication: the credential store, the session table and the
Flight auth handler, built from its configuration (docs/security.md). SASL listeners offer
SCRAM; an ``SSL`` listener with ``ssl.client.auth=required`` offers the certificate
mechanism (``broker_core.security.cert_auth``), whose principal is the client
certificate's subject mapped by ``ssl.principal.mapping.rules``. Under ``SASL_SSL`` SCRAM's
principal wins, as in Kafka: the certificate only opens the TLS link.

The SCRAM users are read once per broker (:func:`scram_users`) and shared by the Flight
listener and the Kafka listener (``server/kafka/sasl.py``): one set of users, one cache,
one ZooKeeper watch."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

from broker_core.errors import BrokerNotAvailableError, InvalidConfigError
from broker_core.security.cert_auth import CertificateMechanism
from broker_core.security.credentials import FileCredentialStore, ZkCredentialStore
from broker_core.security.flight_auth import (
    SECRET_BYTES,
    CredentialLookup,
    ServerAuth,
    scram_mechanisms,
)
from broker_core.security.local_token import (
    TOKEN_FILE_KEY,
    TokenServerMiddlewareFactory,
    write_token_file,
)
from broker_core.security.principal import Principal
from broker_core.security.sessions import SessionTable
from broker_core.security.tls import ClientAuth, SecurityProtocol, TlsMaterial, is_loopback
from broker_core.server.config.broker_config import ZK_ROOT, BrokerConfig

log = logging.getLogger("idemlog.security")


class ScramUsers:
    """The SCRAM users of the broker: ``lookup(user, mechanism)`` their credentials,
    ``refresh()`` before each authentication (the embedded file's look for a change; a
    no-op on ZooKeeper, whose watch feeds the cache), and every listener told, by
    :meth:`on_change`, of each user whose credential changed or went."""

    def __init__(self) -> None:
        # Unknown users' salts derive from it: one for every listener (flight_auth.py).
        self.secret = secrets.token_bytes(SECRET_BYTES)
        self._listeners: list[Callable[[str], None]] = []
        self.lookup: CredentialLookup = lambda user, mechanism: None
        self.refresh: Callable[[], None] = lambda: None

    def on_change(self, listener: Callable[[str], None]) -> None:
        self._listeners.append(listener)

    def changed(self, user: str) -> None:
        for listener in self._listeners:
            listener(user)


def scram_users(cfg: BrokerConfig, zk: Any) -> ScramUsers:
    """The users both listeners authenticate against: on a cluster from ZooKeeper
    (``zk``, the broker's client on its chroot), watched and cached before this returns;
    embedded from ``<log.dir>/__users.json``, checked before every authentication (a
    stat). Raises BrokerNotAvailableError if ZooKeeper's users cannot be read within the
    session timeout."""
    users = ScramUsers()
    if cfg.embedded:
        file_store = FileCredentialStore(cfg.log_dir, on_change=users.changed)
        users.lookup, users.refresh = file_store.lookup, file_store.refresh
        return users
    # Watched: a removal is told to the listeners when the watch fires, well within a second.
    store = ZkCredentialStore(zk, ZK_ROOT, watch=True, on_change=users.changed)
    if not store.wait_loaded(cfg.zookeeper_session_timeout_ms / 1000.0):
        raise BrokerNotAvailableError(f"the SCRAM users under {store.path} did not load")
    users.lookup = store.lookup
    return users


def server_auth(cfg: BrokerConfig, users: ScramUsers | None, tls: TlsMaterial) -> ServerAuth | None:
    """The Flight listener's auth handler: None with ``security.protocol=PLAINTEXT``, and
    with ``SSL`` unless ``ssl.client.auth=required`` (then the certificate mechanism,
    checking chains against ``tls``'s CA, the broker's loaded files). With SASL, SCRAM
    over ``users`` (:func:`scram_users`: given whenever ``security.protocol`` is a SASL
    one); a user whose credential changes or goes loses its sessions at once."""
    security = cfg.security
    sessions = SessionTable(
        lifetime_s=security.session_lifetime_ms / 1000.0,
        max_sessions=security.session_max_count,
    )
    if not security.sasl:
        settings = tls.settings
        if (
            settings.protocol is SecurityProtocol.SSL
            and settings.client_auth is ClientAuth.REQUIRED
        ):
            assert tls.ca is not None  # TlsSettings.load requires the CA then
            return ServerAuth(sessions, [CertificateMechanism(tls.ca, security.principal_mapper)])
        return None
    assert users is not None  # the broker reads them under SASL

    def revoke(user: str) -> None:
        ended = sessions.revoke(Principal.user(user))
        if ended:
            log.info("User:%s changed or removed: %d sessions ended", user, ended)

    users.on_change(revoke)
    # The embedded file is checked before every call (a stat): a removal ends the user's
    # sessions at once.
    return ServerAuth(
        sessions,
        scram_mechanisms(users.lookup, security.mechanisms, users.secret),
        on_call=users.refresh if cfg.embedded else None,
    )


def local_token_middleware(cfg: BrokerConfig) -> dict[str, TokenServerMiddlewareFactory]:
    """The per-start token check of ``listener.token.file`` ({} when unset): writes a fresh
    token there (mode 0600) before the listener exists. Raises InvalidConfigError naming
    the key when the listener is not on loopback (a token file guards local users; other
    machines are kept out by the loopback address alone) or the file cannot be written."""
    path = cfg.security.token_file
    if not path:
        return {}
    if not is_loopback(cfg.listener_host):
        raise InvalidConfigError(
            f"{TOKEN_FILE_KEY}={path} needs a loopback listener.host (127.0.0.1), not "
            f"listener.host={cfg.listener_host}: the token keeps out other local users, "
            "only the loopback address keeps out other machines"
        )
    try:
        token = write_token_file(path)
    except OSError as exc:
        raise InvalidConfigError(
            f"{TOKEN_FILE_KEY}={path}: cannot write it: {exc.strerror or exc}"
        ) from None
    log.info("calls must carry the token of %s (%s), rewritten at this start", path, TOKEN_FILE_KEY)
    return {"local-token": TokenServerMiddlewareFactory(token, path)}
