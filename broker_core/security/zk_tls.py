"""TLS from a broker to ZooKeeper: the ``zookeeper.ssl.*`` keys and kazoo's arguments.

ZooKeeper 3.5+ serves TLS on its ``secureClientPort`` (with the Netty connection factory;
docs/security.md shows its ``zoo.cfg``), and kazoo connects to it with ``use_ssl``.
``zookeeper.connect`` then names the secure port. The keys follow Kafka's
``zookeeper.ssl.client.enable`` and take PEM files like the Flight keys of ``tls.py``
(Kafka's ZooKeeper keys take JKS/PKCS12 key stores; kazoo takes PEM). The files are
checked as the Flight keys' are, before the broker connects, and a problem names the
``zookeeper.ssl.*`` key and the path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker_core.config import ConfigKey
from broker_core.errors import InvalidConfigError
from broker_core.security.tls import (
    HOSTNAME_CHECK,
    SECURITY_PROTOCOL,
    SSL_CA_LOCATION,
    SSL_CERTIFICATE_LOCATION,
    SSL_ENDPOINT_IDENTIFICATION,
    SSL_KEY_LOCATION,
    SSL_KEY_PASSWORD,
    TLS_KEYS,
    SecurityProtocol,
    Side,
    TlsSettings,
)

PREFIX = "zookeeper."
ZK_SSL_ENABLE = "zookeeper.ssl.client.enable"

ZK_TLS_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        ZK_SSL_ENABLE,
        bool,
        False,
        "Connect to ZooKeeper with TLS (Kafka's name); zookeeper.connect must then name "
        "ZooKeeper's secureClientPort.",
    ),
    ConfigKey(
        PREFIX + SSL_CA_LOCATION,
        str,
        "",
        "PEM file of the CA that signs ZooKeeper's certificate. Empty: the system's roots.",
    ),
    ConfigKey(
        PREFIX + SSL_CERTIFICATE_LOCATION,
        str,
        "",
        "PEM file of the broker's certificate for ZooKeeper (ssl.clientAuth=need on the "
        "server); empty: none.",
    ),
    ConfigKey(
        PREFIX + SSL_KEY_LOCATION,
        str,
        "",
        "PEM file of the private key of zookeeper.ssl.certificate.location.",
    ),
    ConfigKey(
        PREFIX + SSL_KEY_PASSWORD,
        str,
        "",
        "Password of an encrypted zookeeper.ssl.key.location (a secret).",
    ),
    ConfigKey(
        PREFIX + SSL_ENDPOINT_IDENTIFICATION,
        str,
        HOSTNAME_CHECK,
        "https: check that ZooKeeper's certificate names the host connected to; empty: "
        "check only its CA.",
        choices=(HOSTNAME_CHECK, ""),
    ),
)


@dataclass(frozen=True)
class ZkTlsSettings:
    """The checked ``zookeeper.ssl.*`` values (the files are those of ``flight``, a
    :class:`TlsSettings` reused for their checks). ``enabled`` False: plaintext."""

    enabled: bool = False
    files: TlsSettings = field(default_factory=TlsSettings)

    @classmethod
    def from_values(cls, values: Mapping[str, object]) -> ZkTlsSettings:
        """From the broker's typed values (missing keys: defaults)."""
        enabled = bool(values.get(ZK_SSL_ENABLE, False))
        inner: dict[str, object] = {
            key[len(PREFIX) :]: value
            for key, value in values.items()
            if key.startswith(PREFIX + "ssl.") and key != ZK_SSL_ENABLE
        }
        inner[SECURITY_PROTOCOL] = SecurityProtocol.SSL.value
        try:
            files = TlsSettings.from_values(inner)
        except InvalidConfigError as exc:
            raise _renamed(exc) from None
        return cls(enabled, files)

    def check(self) -> None:
        """Read and check the files (as ``TlsSettings.load``); InvalidConfigError naming
        the ``zookeeper.ssl.*`` key and path otherwise. Nothing to check when disabled."""
        if not self.enabled:
            return
        try:
            self.files.load(Side.CLIENT)
        except InvalidConfigError as exc:
            raise _renamed(exc) from None

    def kazoo_arguments(self) -> dict[str, Any]:
        """``KazooClient`` keyword arguments: none for plaintext; else TLS with the CA
        verified always and the host name as ``zookeeper.ssl.endpoint.identification.
        algorithm`` says, once :meth:`check` passed (it raises as that does)."""
        if not self.enabled:
            return {}
        self.check()
        files = self.files
        arguments: dict[str, Any] = {
            "use_ssl": True,
            "verify_certs": True,
            "check_hostname": files.check_hostname,
        }
        if files.ca_location:
            arguments["ca"] = files.ca_location
        if files.certificate_location:
            arguments["certfile"] = files.certificate_location
            arguments["keyfile"] = files.key_location
        if files.key_password:
            arguments["keyfile_password"] = files.key_password
        return arguments


SECURITY_KEYS = (*TLS_KEYS, *ZK_TLS_KEYS)  # the broker's: its links, then ZooKeeper


def _renamed(exc: InvalidConfigError) -> InvalidConfigError:
    """The same error naming the zookeeper.ssl.* keys instead of the Flight ones."""
    message = exc.message.replace("ssl.", PREFIX + "ssl.")
    return type(exc)(f"ZooKeeper TLS: {message}")
