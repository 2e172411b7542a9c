"""The broker's authorization keys (declared here, beside ``config.py``, which lists them
with the others): whether requests are checked against ACLs, who is exempt, and what a
resource without any ACL means. docs/security.md, Authorization, says how they fit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from broker_core.config import ConfigKey, ConfigValue
from broker_core.errors import InvalidConfigError
from broker_core.security.acl import parse_super_users
from broker_core.security.principal import ANONYMOUS, Principal
from broker_core.security.principal_mapping import PRINCIPAL_MAPPING_RULES, NoMatchingRuleError
from broker_core.security.tls import ClientAuth, TlsSettings
from broker_core.server.config.security import SecurityConfig

AUTHORIZER_ENABLE = "authorizer.enable"
SUPER_USERS = "super.users"

ACL_KEYS = [
    ConfigKey(
        AUTHORIZER_ENABLE,
        bool,
        False,
        "Check every request against the ACLs (idemlog acls): a request no ACL allows is "
        "refused. Kafka names an authorizer class (authorizer.class.name); idemlog has "
        "one, turned on here. On a cluster the broker's own principal must be in "
        "super.users.",
    ),
    ConfigKey(
        SUPER_USERS,
        str,
        "",
        "Principals allowed everything, separated by ';' (e.g. User:broker;User:admin). "
        "With authorizer.enable on a cluster, the brokers' principal "
        "(User:<sasl.inter.broker.username>) must be one.",
    ),
    ConfigKey(
        "allow.everyone.if.no.acl.found",
        bool,
        False,
        "With authorizer.enable: a resource that no ACL names is open to every principal. "
        "Off (the default): a request no ACL allows is refused.",
    ),
]


@dataclass(frozen=True)
class AuthorizationConfig:
    """The parsed keys."""

    enabled: bool
    super_users: frozenset[Principal]
    allow_if_no_acl: bool

    @classmethod
    def from_parsed(
        cls,
        parsed: Mapping[str, ConfigValue],
        *,
        embedded: bool,
        broker_principal: Principal | None,
    ) -> AuthorizationConfig:
        """Raises InvalidConfigError naming the key: a super user that is not
        ``Type:name``, or an authorizer on a cluster whose brokers could not serve each
        other (their principal, ``broker_principal`` or ``User:ANONYMOUS`` without SASL,
        is not a super user: Kafka requires the same in practice)."""
        try:
            supers = frozenset(parse_super_users(str(parsed[SUPER_USERS])))
        except ValueError as exc:
            raise InvalidConfigError(f"{SUPER_USERS}: {exc}") from None
        enabled = bool(parsed[AUTHORIZER_ENABLE])
        if enabled and not embedded:
            own = broker_principal or ANONYMOUS
            if own not in supers:
                hint = (
                    ""
                    if broker_principal is not None
                    else " (without SASL or mutual TLS every caller is User:ANONYMOUS: listing "
                    "it makes every client a super user; use security.protocol=SASL_*, or SSL "
                    "with ssl.client.auth=required)"
                )
                raise InvalidConfigError(
                    f"{AUTHORIZER_ENABLE}=true: the brokers' own principal {own} must be in "
                    f"{SUPER_USERS} (now {str(parsed[SUPER_USERS])!r}): replication, "
                    f"markers and leader epochs are its ClusterAction calls{hint}"
                )
        return cls(
            enabled=enabled,
            super_users=supers,
            allow_if_no_acl=bool(parsed["allow.everyone.if.no.acl.found"]),
        )


def brokers_principal(
    parsed: Mapping[str, ConfigValue], security: SecurityConfig, tls: TlsSettings
) -> Principal | None:
    """The principal the other brokers see this broker as, which the authorizer's start
    check needs: ``User:<sasl.inter.broker.username>`` under SASL; under mutual TLS
    without SASL its own certificate's subject mapped by ``ssl.principal.mapping.rules``
    (docs/security.md, Brokers, super users and SASL); None otherwise (``User:ANONYMOUS``).
    Read only with the authorizer on, so a broker without it never opens the file here."""
    if security.inter_broker is not None:
        return Principal.user(security.inter_broker.username)
    mutual = tls.encrypted and tls.client_auth is ClientAuth.REQUIRED
    if not (bool(parsed[AUTHORIZER_ENABLE]) and mutual and tls.certificate_location):
        return None
    from cryptography import x509

    from broker_core.security.cert_auth import distinguished_name

    path = Path(tls.certificate_location)
    try:
        leaf = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise InvalidConfigError(f"ssl.certificate.location={str(path)!r}: {exc}") from None
    try:
        name = security.principal_mapper.name(distinguished_name(leaf.subject))
    except NoMatchingRuleError as exc:
        # The broker could never be recognised by the others: a configuration error, told
        # at start (exit 2), not an unexpected failure.
        raise InvalidConfigError(
            f"{PRINCIPAL_MAPPING_RULES}: no rule maps this broker's own certificate "
            f"({str(path)!r}): {exc}"
        ) from None
    return Principal.user(name)
