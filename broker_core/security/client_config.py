"""A client's SASL options, declared once: the broker client, the CLI's
``--command-config`` file, the producer and the Spark sink and source all read these keys,
beside ``security.protocol`` and ``ssl.*`` (``tls.py``).

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
from broker_core.security.tls import SECURITY_PROTOCOL, TLS_KEYS

# security.protocol is tls.py's key (declared once there); these are SASL's.
CLIENT_SASL_KEYS = [
    ConfigKey(
        "sasl.mechanism",
        str,
        "SCRAM-SHA-512",
        "SASL mechanism with security.protocol=SASL_PLAINTEXT or SASL_SSL: SCRAM-SHA-256 or "
        "SCRAM-SHA-512.",
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
CLIENT_SASL_KEY_NAMES = frozenset(k.name for k in CLIENT_SASL_KEYS)
_PROTOCOL_KEY = next(k for k in TLS_KEYS if k.name == SECURITY_PROTOCOL)
_SASL_CONFIG = ConfigDef([_PROTOCOL_KEY, *CLIENT_SASL_KEYS], what="client security")
_SASL_KEY_NAMES = frozenset(k.name for k in _SASL_CONFIG)


def uses_sasl(protocol: str) -> bool:
    """Whether ``security.protocol`` asks for SASL (SASL_PLAINTEXT, SASL_SSL): by its
    prefix, as Kafka names them."""
    return protocol.startswith("SASL_")


def sasl_credentials(options: Mapping[str, object]) -> SaslCredentials | None:
    """The credentials the security keys in ``options`` ask for (other keys ignored):
    None with PLAINTEXT. Raises InvalidConfigError naming the key that is wrong or
    missing (never a password's value)."""
    chosen = {k: v for k, v in options.items() if k in _SASL_KEY_NAMES}
    parsed = _SASL_CONFIG.parse(chosen)
    protocol = str(parsed[SECURITY_PROTOCOL])
    if not uses_sasl(protocol):
        # A default written out (conf/producer.properties lists every key) is no mistake;
        # a user name or password without SASL is: it would silently not be used.
        given = sorted(
            k for k in chosen if k.startswith("sasl.") and parsed[k] != _SASL_CONFIG.key(k).default
        )
        if given:
            raise InvalidConfigError(
                f"{', '.join(given)} set but {SECURITY_PROTOCOL}={protocol}: set "
                f"{SECURITY_PROTOCOL}=SASL_PLAINTEXT or SASL_SSL to authenticate"
            )
        return None
    return SaslCredentials.from_options(
        str(parsed["sasl.mechanism"]), str(parsed["sasl.username"]), str(parsed["sasl.password"])
    )
