"""Producer config: declared keys only, bad combinations named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker_core.config import load_properties
from broker_core.errors import InvalidConfigError
from spark_sink.producer import PRODUCER_CONFIG, Producer, ProducerConfig
from spark_sink.producer.config import describe, render_properties
from tests.producer.fakes import FakeTransport


def test_defaults() -> None:
    c = ProducerConfig.from_mapping({})
    assert c.enable_idempotence and c.max_in_flight == 5 and c.transactional_id is None
    assert {k.name for k in PRODUCER_CONFIG} >= {
        "bootstrap.servers", "linger.ms", "batch.size", "buffer.memory", "max.block.ms",
        "max.in.flight.requests.per.connection", "retries", "retry.backoff.ms",
        "request.timeout.ms", "delivery.timeout.ms", "enable.idempotence",
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
    ],
)
def test_bad_config_is_rejected_with_the_keys_named(values: dict[str, object], named: str) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape(named)):
        ProducerConfig.from_mapping(values)


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
