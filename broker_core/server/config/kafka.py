"""The Kafka listener's keys (declared here, beside ``broker_config.py``, which lists them
with the others): whether the broker serves Kafka's binary protocol, where, and what
address Kafka clients are told (docs/broker.md, "The Kafka listener").

Off by default: a second port is the operator's choice to open. The value is Kafka's own
listener form, ``PROTOCOL://host:port``, so an operator reads it as Kafka's
``listeners``. The protocol is any of Kafka's four; its TLS uses the broker's ``ssl.*``
keys and its SASL the broker's ``sasl.enabled.mechanisms`` and SCRAM users (declared
once, in ``security/tls.py`` and ``config/security.py``: one certificate and one set of
users for both listeners; docs/security.md, "The Kafka listener").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker_core.config import ConfigKey, ConfigValue
from broker_core.errors import InvalidConfigError
from broker_core.security.tls import SecurityProtocol

KAFKA_LISTENER = "kafka.listener"
KAFKA_ADVERTISED_LISTENER = "kafka.advertised.listener"
KAFKA_MAX_CONNECTIONS = "kafka.max.connections"
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})

KAFKA_KEYS = [
    ConfigKey(
        KAFKA_LISTENER,
        str,
        "",
        "Serve Kafka's binary protocol (any Kafka client reads the topics) on this address, "
        "in Kafka's listener form PROTOCOL://host:port, PROTOCOL one of PLAINTEXT, SSL, "
        "SASL_PLAINTEXT, SASL_SSL (port 0: any free one, logged at start). Empty: no Kafka "
        "listener (the default). TLS uses the broker's ssl.* keys (ssl.client.auth=required: "
        "the client certificate's principal, ssl.principal.mapping.rules), SASL the SCRAM "
        "users and sasl.enabled.mechanisms of the Flight listener, and with "
        "authorizer.enable the same ACLs. It may not be more open than the Flight listener: "
        "without TLS when that one has it, or without authentication (SASL or "
        "ssl.client.auth=required) when that one authenticates or listener.token.file is "
        "set, it is refused. APIs served: docs/kafka.md; security: docs/security.md.",
    ),
    ConfigKey(
        KAFKA_ADVERTISED_LISTENER,
        str,
        "",
        "What Kafka clients are told to connect to (Kafka's advertised.listeners), in the "
        "same form, when it differs from kafka.listener's address: behind NAT, a proxy or "
        "in a container. Empty: kafka.listener's host and the bound port; that host must "
        "then not be a wildcard address.",
    ),
    ConfigKey(
        KAFKA_MAX_CONNECTIONS,
        int,
        1000,
        "The most connections the Kafka listener holds at once (Kafka's max.connections); "
        "each holds a thread while it is open. A connection past it is closed at once "
        "(logged at most every 10 s, with the count refused since).",
    ),
]


@dataclass(frozen=True)
class KafkaListenerConfig:
    """The parsed keys; ``enabled`` is False with ``kafka.listener`` empty. ``host`` ""
    binds every interface; ``advertised_port`` 0: the bound port."""

    enabled: bool
    host: str
    port: int
    advertised_host: str
    advertised_port: int
    max_connections: int = 1000
    protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT

    @property
    def encrypted(self) -> bool:
        return self.protocol in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self.protocol in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)

    @classmethod
    def from_parsed(cls, parsed: Mapping[str, ConfigValue]) -> KafkaListenerConfig:
        """Raises InvalidConfigError naming the key: not ``PROTOCOL://host:port`` with one
        of Kafka's protocols, an advertised address without a listener or a wildcard host
        advertised."""
        listener = str(parsed[KAFKA_LISTENER]).strip()
        advertised = str(parsed[KAFKA_ADVERTISED_LISTENER]).strip()
        max_connections = int(parsed[KAFKA_MAX_CONNECTIONS])
        if max_connections < 1:
            raise InvalidConfigError(
                f"{KAFKA_MAX_CONNECTIONS}={max_connections}: must be at least 1"
            )
        if not listener:
            if advertised:
                raise InvalidConfigError(
                    f"{KAFKA_ADVERTISED_LISTENER}={advertised!r} is set but {KAFKA_LISTENER} "
                    "is empty: there is no Kafka listener to advertise"
                )
            return cls(False, "", 0, "", 0)
        protocol, host, port = parse_listener(KAFKA_LISTENER, listener)
        if advertised:
            advertised_protocol, advertised_host, advertised_port = parse_listener(
                KAFKA_ADVERTISED_LISTENER, advertised
            )
            if advertised_protocol is not protocol:
                raise InvalidConfigError(
                    f"{KAFKA_ADVERTISED_LISTENER}={advertised!r}: its protocol is not "
                    f"{KAFKA_LISTENER}'s {protocol.value} (clients connect as the listener "
                    "serves)"
                )
            if advertised_port == 0:
                raise InvalidConfigError(
                    f"{KAFKA_ADVERTISED_LISTENER}={advertised!r}: port 0 is not an address a "
                    "client can connect to"
                )
        else:
            advertised_host, advertised_port = host, 0
        if advertised_host in _WILDCARD_HOSTS:
            raise InvalidConfigError(
                f"{KAFKA_LISTENER}={listener!r} binds every interface, which no client can "
                f"connect to: set {KAFKA_ADVERTISED_LISTENER} to the address clients use"
            )
        return cls(True, host, port, advertised_host, advertised_port, max_connections, protocol)


def parse_listener(key: str, value: str) -> tuple[SecurityProtocol, str, int]:
    """``PROTOCOL://host:port`` -> (protocol, host, port); an InvalidConfigError naming
    ``key`` otherwise (an IPv6 host is written in brackets, as in Kafka). The advertised
    listener's protocol must be the listener's own."""
    name, sep, address = value.partition("://")
    if not sep:
        raise InvalidConfigError(
            f"{key}={value!r} is not PROTOCOL://host:port (Kafka's listener form, e.g. "
            "SASL_SSL://host:9093)"
        )
    try:
        protocol = SecurityProtocol(name.strip().upper())
    except ValueError:
        raise InvalidConfigError(
            f"{key}={value!r}: {name!r} is not one of Kafka's security protocols "
            f"({', '.join(SecurityProtocol)})"
        ) from None
    host, colon, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not colon or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise InvalidConfigError(f"{key}={value!r}: the port must be a number in 0..65535")
    return protocol, host, int(port_text)
