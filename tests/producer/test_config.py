"""Producer config: declared keys only, bad combinations named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker_core.config import load_properties
from broker_core.errors import InvalidConfigError
from broker_core.producer import PRODUCER_CONFIG, Producer, ProducerConfig
from broker_core.producer.config import describe, render_properties
from broker_core.protocol.requests import ACKS_ALL, ACKS_LEADER
from tests.producer.fakes import FakeTransport


def test_defaults() -> None:
    c = ProducerConfig.from_mapping({})
    assert c.enable_idempotence and c.max_in_flight == 5 and c.transactional_id is None
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
    assert c.max_in_flight == 10


def test_producer_rejects_on_construction() -> None:
    with pytest.raises(InvalidConfigError, match=r"max\.in\.flight"):
        Producer(transport=FakeTransport(), max_in_flight_requests_per_connection=9)
    with pytest.raises(InvalidConfigError, match=r"bootstrap\.servers is required"):
        Producer()
    with pytest.raises(InvalidConfigError, match=r"acks=1 requires enable\.idempotence=false"):
        Producer(transport=FakeTransport(), acks=1)


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
