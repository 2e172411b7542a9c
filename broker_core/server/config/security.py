"""The broker's authentication keys (declared here, beside ``config.py``, which lists them
with the others): the mechanisms a SASL listener offers (``security.protocol``, declared
in ``broker_core.security.tls``, says whether it requires SASL), the
sessions' lifetime and bound, and the credentials this broker authenticates with to the
others (its inter-broker principal). docs/security.md says how they fit together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker_core.config import INT_MAX, ConfigKey, ConfigValue
from broker_core.errors import InvalidConfigError
from broker_core.security.client_config import uses_sasl
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.local_token import TOKEN_FILE_KEY
from broker_core.security.principal_mapping import (
    DEFAULT_RULES,
    PRINCIPAL_MAPPING_RULES,
    PrincipalMapper,
)
from broker_core.security.scram import MECHANISM_NAMES, Mechanism
from broker_core.security.tls import SECURITY_PROTOCOL

# security.protocol itself is tls.py's key (one declaration; SASL_PLAINTEXT or SASL_SSL
# turns these on, read by uses_sasl).
SASL_KEYS = [
    ConfigKey(
        "sasl.enabled.mechanisms",
        str,
        ",".join(MECHANISM_NAMES),
        "SASL mechanisms a SASL_PLAINTEXT or SASL_SSL listener accepts, comma-separated.",
    ),
    ConfigKey(
        "sasl.session.lifetime.ms",
        int,
        3_600_000,
        "How long a session token stays valid after its handshake; clients authenticate "
        "again after half of it.",
        min=1000,
        max=INT_MAX,
    ),
    ConfigKey(
        "sasl.session.max.count",
        int,
        10_000,
        "Most sessions the broker holds (about 200 bytes each); a handshake that finds "
        "this many unexpired ones is refused.",
        min=1,
        max=1_000_000,
    ),
    ConfigKey(
        "sasl.mechanism.inter.broker.protocol",
        str,
        "SCRAM-SHA-512",
        "Mechanism this broker authenticates with to the other brokers.",
        choices=MECHANISM_NAMES,
    ),
    ConfigKey(
        "sasl.inter.broker.username",
        str,
        "",
        "User this broker authenticates as to the other brokers (replication, markers, "
        "offsets): the broker principal, e.g. User:broker. Required with SASL on a cluster.",
    ),
    ConfigKey(
        "sasl.inter.broker.password",
        str,
        "",
        "Password of sasl.inter.broker.username (secret: keep this file mode 0600).",
    ),
    # Mutual TLS's principals (security.protocol=SSL, ssl.client.auth=required).
    ConfigKey(
        PRINCIPAL_MAPPING_RULES,
        str,
        DEFAULT_RULES,
        "With security.protocol=SSL and ssl.client.auth=required: how a client "
        "certificate's subject (RFC 2253, e.g. CN=spark-job,OU=data) becomes its principal's "
        "name, Kafka's rules: comma-separated RULE:pattern/replacement/[LU] tried in order, "
        "DEFAULT the subject as it is; no rule applying refuses the client.",
    ),
    # The embedded broker's owner-only access (broker_core/security/local_token.py).
    ConfigKey(
        TOKEN_FILE_KEY,
        str,
        "",
        "A file the broker writes a fresh random token to at each start (mode 0600) and "
        "that every call must present: only its owner's processes can call it. Set by "
        "the embedded broker (spark_sink/embedded.py); requires a loopback listener.host.",
    ),
]


@dataclass(frozen=True)
class SecurityConfig:
    """The parsed keys. ``inter_broker`` is None on a PLAINTEXT broker."""

    protocol: str
    mechanisms: frozenset[Mechanism]
    session_lifetime_ms: int
    session_max_count: int
    inter_broker: SaslCredentials | None
    principal_mapper: PrincipalMapper  # ssl.principal.mapping.rules, parsed
    token_file: str  # listener.token.file; "": no token required

    @property
    def sasl(self) -> bool:
        return uses_sasl(self.protocol)

    @classmethod
    def from_parsed(cls, parsed: Mapping[str, ConfigValue], *, embedded: bool) -> SecurityConfig:
        """Raises InvalidConfigError naming the key: an unknown mechanism, SASL on a
        cluster without inter-broker credentials (the brokers could not reach each other),
        a rule of ssl.principal.mapping.rules that does not parse."""
        mechanisms: set[Mechanism] = set()
        for name in str(parsed["sasl.enabled.mechanisms"]).split(","):
            try:
                mechanisms.add(Mechanism.parse(name))
            except ValueError as exc:
                raise InvalidConfigError(f"sasl.enabled.mechanisms: {exc}") from None
        protocol = str(parsed[SECURITY_PROTOCOL])
        username = str(parsed["sasl.inter.broker.username"])
        password = str(parsed["sasl.inter.broker.password"])
        inter_broker = None
        if uses_sasl(protocol) and (username or password or not embedded):
            mechanism = str(parsed["sasl.mechanism.inter.broker.protocol"])
            if Mechanism.parse(mechanism) not in mechanisms:
                raise InvalidConfigError(
                    f"sasl.mechanism.inter.broker.protocol={mechanism} is not in "
                    f"sasl.enabled.mechanisms={parsed['sasl.enabled.mechanisms']}"
                )
            if not username or not password:
                raise InvalidConfigError(
                    f"{SECURITY_PROTOCOL}={protocol} on a cluster needs "
                    "sasl.inter.broker.username and sasl.inter.broker.password: the brokers "
                    "authenticate to each other"
                )
            inter_broker = SaslCredentials.from_options(mechanism, username, password)
        return cls(
            protocol=protocol,
            mechanisms=frozenset(mechanisms),
            session_lifetime_ms=int(parsed["sasl.session.lifetime.ms"]),
            session_max_count=int(parsed["sasl.session.max.count"]),
            inter_broker=inter_broker,
            principal_mapper=PrincipalMapper.parse(str(parsed[PRINCIPAL_MAPPING_RULES])),
            token_file=str(parsed[TOKEN_FILE_KEY]).strip(),
        )
