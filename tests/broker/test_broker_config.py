"""Broker keys are declared once in code; conf/broker.properties and docs/configuration.md agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker_core.config import load_properties
from broker_core.errors import InvalidConfigError
from broker_core.log.config import LOG_CONFIG
from broker_core.server.config.broker_config import (
    BROKER_CONFIG,
    BrokerConfig,
    parse_overrides,
    render_markdown_table,
    render_properties,
)
from tests.harness.broker import BrokerFactory

ROOT = Path(__file__).resolve().parents[2]


def test_conf_file_is_the_generated_one_and_lists_every_key() -> None:
    path = ROOT / "conf" / "broker.properties"
    assert path.read_text() == render_properties(), "regenerate: idemlog config broker --properties"
    values = load_properties(path)
    assert set(values) == {k.name for k in BROKER_CONFIG}
    for key in BROKER_CONFIG:
        assert key.parse(values[key.name]) == key.default, key.name
    BrokerConfig.from_mapping(values)


def test_every_topic_key_has_a_broker_default() -> None:
    # The replication factor's is default.replication.factor, the cluster's choice.
    keys = {k.name for k in BROKER_CONFIG}
    assert {f"log.{k.name}" for k in LOG_CONFIG if k.name != "replication.factor"} <= keys
    assert "default.replication.factor" in keys and "log.replication.factor" not in keys


def test_docs_table_matches_the_code() -> None:
    docs = (ROOT / "docs" / "configuration.md").read_text()
    section = docs.split("## Broker configuration", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z.]+)` \| `([^`]*)` \| \w+ \|", section, re.MULTILINE))
    expected = {k.name: '""' if k.default == "" else str(k.default) for k in BROKER_CONFIG}
    assert rows == expected
    # The table is the generated one, docs included, not only the same keys and defaults.
    assert render_markdown_table() in section


def test_values_reach_the_broker_and_its_topic_defaults(tmp_path: Path) -> None:
    path = tmp_path / "b.properties"
    path.write_text("broker.id=7\nlog.dir=/data/x\nlog.flush.messages=1\n")
    config = BrokerConfig.load(path, ["listener.port=0", "log.retention.ms=-1"])
    assert (config.broker_id, config.listener_port, config.log_dir) == (7, 0, Path("/data/x"))
    assert config.log_defaults.flush_messages == 1 and config.log_defaults.retention_ms == -1
    assert config.embedded and config.max_request_bytes == 100 * 1024**2


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"broker.idd": "1"},
            r"unknown broker config key 'broker\.idd' \(did you mean 'broker\.id'\?\)",
        ),
        ({"listener.port": "70000"}, r"listener\.port='70000' is above the maximum 65535"),
        ({"log.flush.messages": "0"}, r"log\.flush\.messages='0' is below the minimum 1"),
        ({"log.dir": " "}, r"log\.dir=' ' must name a directory"),
        ({"log.segment.bytes": "4096"}, r"log\.\*\): max\.message\.bytes=67108864 is larger"),
    ],
)
def test_bad_values_name_the_key(values: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message) as info:
        BrokerConfig.from_mapping(values)
    assert info.value.code == 40


def test_the_kafka_listener_is_off_by_default_and_parsed_in_kafkas_form() -> None:
    assert not BrokerConfig.from_mapping({}).kafka.enabled
    kafka = BrokerConfig.from_mapping({"kafka.listener": "PLAINTEXT://127.0.0.1:0"}).kafka
    assert (kafka.enabled, kafka.host, kafka.port, kafka.advertised_host) == (
        True, "127.0.0.1", 0, "127.0.0.1",
    )  # fmt: skip
    behind_nat = BrokerConfig.from_mapping(
        {
            "kafka.listener": "plaintext://0.0.0.0:9093",
            "kafka.advertised.listener": "PLAINTEXT://[::1]:19093",
        }
    ).kafka
    assert (behind_nat.host, behind_nat.advertised_host, behind_nat.advertised_port) == (
        "0.0.0.0", "::1", 19093,
    )  # fmt: skip


FLIGHT_TLS = {
    "security.protocol": "SSL",
    "ssl.certificate.location": "/c.pem",
    "ssl.key.location": "/k.pem",
    "ssl.ca.location": "/ca.pem",
}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kafka.listener": "127.0.0.1:9093"}, r"is not PROTOCOL://host:port"),
        ({"kafka.listener": "HTTP://h:1"}, r"'HTTP' is not one of Kafka's security protocols"),
        (
            {"kafka.listener": "SSL://h:1", "kafka.advertised.listener": "PLAINTEXT://h:2"},
            r"kafka\.advertised\.listener='PLAINTEXT://h:2': its protocol is not "
            r"kafka\.listener's SSL",
        ),
        ({"kafka.listener": "PLAINTEXT://h:99999"}, r"the port must be a number in 0\.\.65535"),
        ({"kafka.listener": "PLAINTEXT://0.0.0.0:9093"}, r"set kafka\.advertised\.listener"),
        ({"kafka.advertised.listener": "PLAINTEXT://h:1"}, r"kafka\.listener is empty"),
        (
            {"kafka.listener": "PLAINTEXT://h:1", "kafka.advertised.listener": "PLAINTEXT://h:0"},
            r"port 0 is not an address a client can connect to",
        ),
        (
            {"kafka.listener": "PLAINTEXT://h:1", "listener.token.file": "/tmp/token"},
            r"kafka\.listener=PLAINTEXT://\.\.\.: listener\.token\.file keeps other local "
            r"users out of the Flight listener, and PLAINTEXT would let them in",
        ),
        (
            {"kafka.listener": "PLAINTEXT://h:1", "security.protocol": "SASL_PLAINTEXT"},
            r"security\.protocol=SASL_PLAINTEXT authenticates the Flight listener's clients, "
            r"and PLAINTEXT would not",
        ),
        (
            {"kafka.listener": "SASL_PLAINTEXT://h:1", **FLIGHT_TLS},
            r"security\.protocol=SSL encrypts the Flight listener, and SASL_PLAINTEXT would "
            r"not: use SSL:// or SASL_SSL://",
        ),
        (
            {"kafka.listener": "SSL://h:1", **FLIGHT_TLS, "security.protocol": "SASL_SSL"},
            r"security\.protocol=SASL_SSL authenticates the Flight listener's clients, and "
            r"SSL would not",
        ),
        ({"kafka.max.connections": "0"}, r"kafka\.max\.connections=0: must be at least 1"),
        ({"kafka.max.connections": "many"}, r"kafka\.max\.connections"),
    ],
)
def test_bad_kafka_listener_values_name_the_key(values: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        BrokerConfig.from_mapping(values)


@pytest.mark.parametrize(
    "values",
    [
        # As closed as the Flight listener, or more: served (ACLs apply on both).
        {"kafka.listener": "SASL_SSL://h:1", "security.protocol": "SASL_PLAINTEXT"},
        {"kafka.listener": "SASL_PLAINTEXT://h:1", "listener.token.file": "/tmp/token"},
        {"kafka.listener": "PLAINTEXT://h:1", "authorizer.enable": "true"},
        {
            "kafka.listener": "SSL://h:1",
            **FLIGHT_TLS,
            "ssl.client.auth": "required",
            "security.protocol": "SSL",
        },
    ],
)
def test_a_kafka_listener_as_closed_as_the_flight_one_is_served(values: dict[str, str]) -> None:
    kafka = BrokerConfig.from_mapping(values).kafka
    assert kafka.enabled and kafka.protocol.value == values["kafka.listener"].split(":")[0]


def test_replica_keys_parse_and_name_bad_values() -> None:
    config = BrokerConfig.from_mapping(
        {"default.replication.factor": "3", "replica.lag.time.max.ms": "5000"}
    )
    assert config.default_replication_factor == 3
    assert BrokerConfig.from_mapping({}).default_replication_factor == -1
    with pytest.raises(InvalidConfigError, match=r"default\.replication\.factor=0"):
        BrokerConfig.from_mapping({"default.replication.factor": "0"})
    with pytest.raises(InvalidConfigError, match=r"log\.replication\.factor"):
        BrokerConfig.from_mapping({"log.replication.factor": "2"})
    assert config.replica_lag_time_max_ms == 5000
    assert config.replica_fetch_wait_max_ms == 500
    with pytest.raises(InvalidConfigError, match=r"replica\.fetch\.max\.bytes"):
        BrokerConfig.from_mapping({"replica.fetch.max.bytes": "10"})


def test_overrides_must_be_key_value() -> None:
    assert parse_overrides(["a=b", " c = d=e "]) == {"a": "b", "c": "d=e"}
    with pytest.raises(InvalidConfigError, match="override 'nokey' must be key=value"):
        parse_overrides(["nokey"])


@pytest.mark.parametrize(
    ("connect", "message"),
    [
        ("127.0.0.1:2181/a/b/", r"the chroot '/a/b/' must not end with '/'"),
        ("127.0.0.1:2181//a", r"the chroot '//a' has an empty level \('//'\)"),
        ("127.0.0.1:2181/a//b", r"the chroot '/a//b' has an empty level \('//'\)"),
        ("127.0.0.1:2181/a/../b", r"the chroot '/a/\.\./b' has a relative level"),
        ("h1:2181/a,h2:2181", r"the chroot '/a,h2:2181' holds a ',': it comes once, after"),
        ("/idemlog", r"'' is not host\[:port\]"),
        ("h1:2181,,h2:2181", r"'' is not host\[:port\]"),
        ("h1:abc/idemlog", r"'h1:abc' is not host\[:port\]"),
    ],
)
def test_a_malformed_zookeeper_connect_names_the_key(connect: str, message: str) -> None:
    # kazoo would quietly connect to another chroot than the one written (/a/b/ -> /a/b).
    with pytest.raises(InvalidConfigError, match=message) as info:
        BrokerConfig.from_mapping({"zookeeper.connect": connect})
    assert info.value.message.startswith(f"zookeeper.connect={connect!r}: ")
    assert info.value.code == 40


def test_zookeeper_connect_splits_into_hosts_and_chroot() -> None:
    cases = {
        "": ("", ""),
        "h1:2181,h2:2182": ("h1:2181,h2:2182", ""),
        "h1:2181/": ("h1:2181", ""),  # "/" alone: no chroot, as in ZooKeeper
        "h1:2181,[::1]:2182/prod/idemlog": ("h1:2181,[::1]:2182", "/prod/idemlog"),
    }
    for connect, (hosts, chroot) in cases.items():
        config = BrokerConfig.from_mapping({"zookeeper.connect": connect})
        assert (config.zookeeper_hosts, config.zookeeper_chroot) == (hosts, chroot), connect
        assert config.zookeeper_connect == connect and config.embedded == (not connect)


def test_broker_with_a_malformed_chroot_exits_2_naming_zookeeper_connect(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory({"zookeeper.connect": "127.0.0.1:1/prod//idemlog"}, start=False)
    broker.spawn()
    assert broker.wait_exit() == 2
    log = broker.log_text()
    # A configuration error: one line naming the key, no wire code (docs/broker.md).
    errors = [line for line in log.splitlines() if line.startswith("idemlog:")]
    assert len(errors) == 1, log
    assert errors[0].startswith("idemlog: zookeeper.connect='127.0.0.1:1/prod//idemlog': ")
    assert "Traceback" not in log
