"""Producer config: declared keys only, bad combinations named; the typed fields follow
the declarations."""

from __future__ import annotations

import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from broker_core.config import load_properties
from broker_core.errors import InvalidConfigError
from broker_core.producer import PRODUCER_CONFIG, Producer, ProducerConfig
from broker_core.producer.config import describe, key_of, render_properties
from broker_core.protocol.requests import ACKS_ALL, ACKS_LEADER
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.scram import Mechanism
from broker_core.security.tls import SecurityProtocol, TlsSettings
from tests.producer.fakes import FakeTransport


def test_defaults() -> None:
    c = ProducerConfig.from_mapping({})
    assert (
        c.enable_idempotence
        and c.max_in_flight_requests_per_connection == 5
        and c.transactional_id is None
    )
    assert c.acks == ACKS_ALL  # as Kafka >= 3.0, where idempotence is on by default
    assert {k.name for k in PRODUCER_CONFIG} >= {
        "bootstrap.servers", "linger.ms", "batch.size", "buffer.memory", "max.block.ms",
        "max.in.flight.requests.per.connection", "retries", "retry.backoff.ms",
        "request.timeout.ms", "delivery.timeout.ms", "enable.idempotence", "acks",
        "transactional.id", "transaction.timeout.ms", "partitioner", "key.column",
    }  # fmt: skip
    assert all(k.doc for k in PRODUCER_CONFIG)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"max.in.flight.requests.per.connection": 6}, "max.in.flight.requests.per.connection=6"),
        ({"transactional.id": "x", "enable.idempotence": False}, "enable.idempotence"),
        ({"delivery.timeout.ms": 100, "request.timeout.ms": 200}, "delivery.timeout.ms=100"),
        ({"batch.size": 10, "buffer.memory": 5}, "batch.size=10"),
        ({"transaction.timeout.ms": 0}, "transaction.timeout.ms=0 is below the minimum 1"),
        ({"linger.ms": -1}, "linger.ms"),
        ({"partitioner": "random"}, "partitioner"),
        ({"lingerms": 3}, "did you mean 'linger.ms'"),
        ({"acks": "0"}, "acks='0' is not supported: the producer needs the broker's answer"),
        ({"acks": 0, "enable.idempotence": False}, "acks='0' is not supported"),
        ({"acks": "2"}, "acks='2' is not one of all, -1, 1"),
        ({"acks": "leader"}, "acks='leader' is not one of all, -1, 1"),
        ({"acks": True, "enable.idempotence": False}, "acks='True' is not one of"),
        ({"acks": "1"}, "acks=1 requires enable.idempotence=false"),
        ({"acks": 1, "enable.idempotence": True}, "acks=1 requires enable.idempotence=false"),
        (
            {"acks": "1", "transactional.id": "x"},
            "acks=1 with transactional.id='x': a transactional producer requires acks=all",
        ),
        (
            {"acks": "1", "transactional.id": "x", "enable.idempotence": False},
            "a transactional producer requires acks=all",
        ),
    ],
)
def test_bad_config_is_rejected_with_the_keys_named(values: dict[str, object], named: str) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape(named)):
        ProducerConfig.from_mapping(values)


@pytest.mark.parametrize(
    ("value", "acks"),
    [("all", ACKS_ALL), ("-1", ACKS_ALL), (-1, ACKS_ALL), (" ALL ", ACKS_ALL), ("1", ACKS_LEADER),
     (1, ACKS_LEADER)],
)  # fmt: skip
def test_acks_spellings(value: object, acks: int) -> None:
    c = ProducerConfig.from_mapping({"acks": value, "enable.idempotence": "false"})
    assert c.acks == acks
    if acks == ACKS_ALL:  # with idempotence and transactions too
        assert ProducerConfig.from_mapping({"acks": value, "transactional.id": "t"}).acks == acks


def test_more_in_flight_is_fine_without_idempotence() -> None:
    c = ProducerConfig.from_mapping(
        {"max.in.flight.requests.per.connection": 10, "enable.idempotence": "false"}
    )
    assert c.max_in_flight_requests_per_connection == 10


def test_producer_rejects_on_construction() -> None:
    with pytest.raises(InvalidConfigError, match=r"max\.in\.flight"):
        Producer(transport=FakeTransport(), max_in_flight_requests_per_connection=9)
    with pytest.raises(InvalidConfigError, match=r"bootstrap\.servers is required"):
        Producer()
    with pytest.raises(InvalidConfigError, match=r"acks=1 requires enable\.idempotence=false"):
        Producer(transport=FakeTransport(), acks=1)


def test_every_key_is_a_field_with_its_declared_default() -> None:
    keyed = [f.name for f in fields(ProducerConfig) if f.name not in ("tls", "sasl")]
    security = {k.name for k in PRODUCER_CONFIG} - {key_of(name) for name in keyed}
    assert all(k.startswith(("security.", "ssl.", "sasl.")) for k in security), security
    assert all(key_of(name) in PRODUCER_CONFIG for name in keyed)
    # The typed defaults are the declared ones: the same settings as no keys at all.
    assert ProducerConfig() == ProducerConfig.from_mapping({})
    for name in keyed:
        key = PRODUCER_CONFIG.key(key_of(name))
        typed = ProducerConfig.from_mapping({key.name: key.default})
        assert getattr(typed, name) == getattr(ProducerConfig(), name), name


def test_typed_fields_match_the_dotted_keys() -> None:
    typed = ProducerConfig(
        linger_ms=7,
        max_in_flight_requests_per_connection=3,
        transactional_id="job-7/3",
        transaction_timeout_ms=9000,
        partitioner="round_robin",
    )
    dotted = ProducerConfig.from_mapping(
        {
            "linger.ms": "7",
            "max.in.flight.requests.per.connection": 3,
            "transactional.id": "job-7/3",
            "transaction.timeout.ms": 9000,
            "partitioner": "round_robin",
        }
    )
    assert typed == dotted
    assert ProducerConfig(acks=ACKS_LEADER, enable_idempotence=False).acks == ACKS_LEADER
    assert ProducerConfig(transactional_id="", key_column="") == ProducerConfig()


@pytest.mark.parametrize(
    ("fields_", "named"),
    [
        ({"linger_ms": -1}, "linger.ms=-1 is below the minimum 0"),
        ({"linger_ms": "5"}, "linger.ms='5' (linger_ms) must be int, got str"),
        ({"batch_size": True}, "batch.size=True (batch_size) must be int, got bool"),
        ({"enable_idempotence": 1}, "enable.idempotence=1 (enable_idempotence) must be bool"),
        ({"partitioner": "random"}, "partitioner='random' is not one of hash, round_robin"),
        ({"transaction_timeout_ms": 0}, "transaction.timeout.ms=0 is below the minimum 1"),
        ({"acks": 0, "enable_idempotence": False}, "acks=0 is not supported"),
        ({"acks": "all"}, "acks='all': the field holds the wire value"),
        ({"acks": ACKS_LEADER}, "acks=1 requires enable.idempotence=false"),
        ({"max_in_flight_requests_per_connection": 6}, "max.in.flight.requests.per.connection=6"),
        ({"transactional_id": "t", "enable_idempotence": False}, "requires enable.idempotence"),
        ({"batch_size": 10, "buffer_memory": 5}, "batch.size=10 is larger than buffer.memory=5"),
        (
            {"tls": TlsSettings(protocol=SecurityProtocol.SASL_PLAINTEXT)},
            "security.protocol=SASL_PLAINTEXT needs sasl credentials",
        ),
        (
            {"sasl": SaslCredentials(Mechanism.SCRAM_SHA_256, "u", "p")},
            "sasl credentials set but security.protocol=PLAINTEXT",
        ),
    ],
)
def test_typed_values_are_checked_with_the_key_named(
    fields_: dict[str, object], named: str
) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape(named)):
        ProducerConfig(**fields_)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match=re.escape(named)):
        replace(ProducerConfig(), **fields_)


def test_producer_takes_the_typed_config() -> None:
    config = ProducerConfig(linger_ms=0, key_column="account")
    with Producer(transport=FakeTransport(), config=config) as producer:
        assert producer.config == config
    with Producer("h:1", transport=FakeTransport(), config=config) as producer:
        assert producer.config.bootstrap_servers == "h:1"
    with pytest.raises(InvalidConfigError, match=r"config or as keys, not both"):
        Producer(transport=FakeTransport(), config=config, **{"linger.ms": 5})
    with pytest.raises(InvalidConfigError, match=r"give the brokers once"):
        Producer("h:1", transport=FakeTransport(), config=replace(config, bootstrap_servers="h:2"))
    with pytest.raises(InvalidConfigError, match=r"bootstrap\.servers is required"):
        Producer(config=config)
    with pytest.raises(InvalidConfigError, match=r"did you mean 'linger\.ms'"):
        Producer(transport=FakeTransport(), **{"linger.m": 5})


def test_conf_file_is_generated_from_the_code() -> None:
    path = Path(__file__).resolve().parents[2] / "conf" / "producer.properties"
    assert path.read_text() == render_properties()
    values = load_properties(path)
    assert set(values) == {k.name for k in PRODUCER_CONFIG}
    ProducerConfig.from_mapping(values)


def test_docs_table_matches_the_code() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    section = docs.split("## Producer configuration", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z.]+)` \| `([^`]*)` \|", section, re.MULTILINE))
    expected = {n: d.lower() if d in ("True", "False") else d for n, _t, d, _doc in describe()}
    assert rows == expected
