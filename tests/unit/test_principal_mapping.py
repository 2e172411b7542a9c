"""``ssl.principal.mapping.rules``: Kafka's grammar and results (its own examples), the
refusals, and the distinguished name as Kafka prints it (docs/security.md)."""

from __future__ import annotations

import re

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID, ObjectIdentifier

from broker_core.errors import InvalidConfigError
from broker_core.security.cert_auth import distinguished_name
from broker_core.security.principal_mapping import (
    DEFAULT_MAPPER,
    NoMatchingRuleError,
    PrincipalMapper,
)
from broker_core.server.config.broker_config import BrokerConfig

# The rule list of Kafka's own mapper tests, one rule of each kind.
KAFKA_RULES = (
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
    "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U,"
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U,"
    "DEFAULT"
)


@pytest.mark.parametrize(
    ("subject", "name"),
    [
        ("CN=Duke,OU=ServiceUsers,O=Org,L=City,ST=State,C=US", "Duke"),
        ("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
        ("cn=duke,ou=JavaSoft,dc=sun,dc=com", "DUKE@JAVASOFT"),
        ("cn=duke,ou=IT,o=example,c=US", "DUKE"),
        ("OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
    ],
)
def test_kafka_examples_map_as_kafka_maps_them(subject: str, name: str) -> None:
    assert PrincipalMapper.parse(KAFKA_RULES).name(subject) == name


def test_the_rules_split_on_commas_between_rules_only_and_keep_their_order() -> None:
    mapper = PrincipalMapper.parse(KAFKA_RULES)
    assert mapper.rules[0].text == "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/"
    assert len(mapper.rules) == 5 and mapper.rules[-1].pattern is None
    # Whitespace around rules and an escaped slash inside one.
    spaced = PrincipalMapper.parse("  RULE:^CN=(.*)\\/x$/$1\\/y/ ,  DEFAULT ")
    assert spaced.name("CN=a/x") == "a/y"
    assert spaced.name("CN=b") == "CN=b"


def test_default_and_empty_are_the_full_name() -> None:
    assert DEFAULT_MAPPER.name("CN=spark-job,OU=data") == "CN=spark-job,OU=data"
    assert PrincipalMapper.parse("").name("CN=x") == "CN=x"


def test_the_first_rule_that_applies_wins_and_a_rule_must_match_the_whole_name() -> None:
    mapper = PrincipalMapper.parse("RULE:CN=(.*)/$1/,RULE:^CN=(.*?),OU=(.*)$/$2-$1/")
    assert mapper.name("CN=a") == "a"
    assert mapper.name("CN=a,OU=b") == "a,OU=b"  # the first rule matches all of it
    only_second = PrincipalMapper.parse("RULE:^CN=a$/x/,RULE:^CN=(.*?),OU=(.*)$/$2-$1/")
    assert only_second.name("CN=a,OU=b") == "b-a"


def test_back_references_beyond_the_groups_and_escaped_dollars_are_literal() -> None:
    assert PrincipalMapper.parse("RULE:^CN=(.*)$/$1$2/").name("CN=z") == "z$2"
    assert PrincipalMapper.parse("RULE:^CN=(.*)$/\\$1/").name("CN=z") == "$1"


def test_no_rule_applying_is_kafkas_error() -> None:
    mapper = PrincipalMapper.parse("RULE:^CN=(.*?),OU=data$/$1/L")
    with pytest.raises(NoMatchingRuleError) as refused:
        mapper.name("CN=client")
    assert str(refused.value) == (
        "No rules apply to CN=client, rules [RULE:^CN=(.*?),OU=data$/$1/L]"
    )


@pytest.mark.parametrize(
    ("rules", "problem"),
    [
        ("RULE:^CN=(.*)$/$1", "invalid rule 'RULE:^CN=(.*)$/$1'"),
        ("DEFAULT,garbage", "invalid rule 'garbage'"),
        ("RULE:^CN=(.*)$/$1/X", "unmatched substring 'X'"),
        ("RULE:^CN=((.*)$/$1/", "is not a regular expression"),
    ],
)
def test_a_bad_rule_refuses_the_broker_config_naming_the_key_and_rule(
    rules: str, problem: str
) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape(problem)) as refused:
        BrokerConfig.from_mapping({"ssl.principal.mapping.rules": rules})
    assert "ssl.principal.mapping.rules" in refused.value.message


def test_the_broker_config_parses_the_rules() -> None:
    config = BrokerConfig.from_mapping({"ssl.principal.mapping.rules": "RULE:^CN=(.*)$/$1/L"})
    assert config.security.principal_mapper.name("CN=Alice") == "alice"
    assert BrokerConfig.from_mapping({}).security.principal_mapper == DEFAULT_MAPPER


def test_the_distinguished_name_is_rfc2253_as_kafka_prints_it() -> None:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme, Inc"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "data"),
            x509.NameAttribute(NameOID.COMMON_NAME, "spark-job"),
        ]
    )
    # Most specific first; a comma in a value escaped.
    assert distinguished_name(name) == "CN=spark-job,OU=data,O=Acme\\, Inc,C=US"
    email = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "ops"),
            x509.NameAttribute(ObjectIdentifier("1.2.840.113549.1.9.1"), "a@b.c"),
        ]
    )
    # An attribute without an RFC 2253 keyword: its OID and its DER value in hex (Java's
    # X500Principal.getName()): IA5String (0x16), 5 bytes.
    assert distinguished_name(email) == "1.2.840.113549.1.9.1=#16056140622e63,CN=ops"
