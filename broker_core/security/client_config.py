"""A client's security options, declared once: the broker client, the CLI's
``--command-config`` file and the Spark sink and source all read these keys.

``sasl.password`` is secret: its name matches Spark's default ``spark.redaction.regex``
(``(?i)secret|password|token``), so Spark redacts it wherever it shows options; it is
never put in a message here.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker_core.config import ConfigDef, ConfigKey
from broker_core.errors import InvalidConfigError
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.scram import MECHANISM_NAMES

PLAINTEXT = "PLAINTEXT"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SECURITY_PROTOCOLS = (PLAINTEXT, SASL_PLAINTEXT)

CLIENT_SECURITY_KEYS = [
    ConfigKey(
        "security.protocol",
        str,
        PLAINTEXT,
        "How the client talks to brokers: PLAINTEXT (no authentication) or SASL_PLAINTEXT "
        "(a SCRAM handshake on each connection, then a session token on each call).",
        choices=SECURITY_PROTOCOLS,
    ),
    ConfigKey(
        "sasl.mechanism",
        str,
        "SCRAM-SHA-512",
        "SASL mechanism with security.protocol=SASL_PLAINTEXT: SCRAM-SHA-256 or SCRAM-SHA-512.",
        choices=MECHANISM_NAMES,
    ),
    ConfigKey("sasl.username", str, "", "User to authenticate as (principal User:<name>)."),
    ConfigKey(
        "sasl.password",
        str,
        "",
        "The user's password (secret: redacted by Spark's spark.redaction.regex, never "
        "logged or written by idemlog).",
    ),
]
CLIENT_SECURITY_CONFIG = ConfigDef(CLIENT_SECURITY_KEYS, what="client security")
CLIENT_SECURITY_KEY_NAMES = frozenset(k.name for k in CLIENT_SECURITY_KEYS)


def uses_sasl(protocol: str) -> bool:
    """Whether ``security.protocol`` asks for SASL (SASL_PLAINTEXT, and SASL_SSL once TLS
    is there): by its prefix, as Kafka names them."""
    return protocol.startswith("SASL_")


def sasl_credentials(options: Mapping[str, object]) -> SaslCredentials | None:
    """The credentials the security keys in ``options`` ask for (other keys ignored):
    None with PLAINTEXT. Raises InvalidConfigError naming the key that is wrong or
    missing (never a password's value)."""
    chosen = {k: v for k, v in options.items() if k in CLIENT_SECURITY_KEY_NAMES}
    parsed = CLIENT_SECURITY_CONFIG.parse(chosen)
    if not uses_sasl(str(parsed["security.protocol"])):
        # A default written out (conf/producer.properties lists every key) is no mistake;
        # a user name or password with PLAINTEXT is: it would silently not be used.
        given = sorted(
            k
            for k in chosen
            if k.startswith("sasl.") and parsed[k] != CLIENT_SECURITY_CONFIG.key(k).default
        )
        if given:
            raise InvalidConfigError(
                f"{', '.join(given)} set but security.protocol={parsed['security.protocol']}: "
                "set security.protocol=SASL_PLAINTEXT to authenticate"
            )
        return None
    return SaslCredentials.from_options(
        str(parsed["sasl.mechanism"]), str(parsed["sasl.username"]), str(parsed["sasl.password"])
    )
