"""Options, hooks and failpoint specs: declared once, documented in docs/, checked by name."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from broker_core.errors import InvalidConfigError
from spark_sink.embedded import DEFAULT_PATH
from spark_sink.hooks import NO_HOOKS, Point, load_hooks
from spark_sink.options import OPTIONS, SCOPES, Scope, parse_options
from testkit import spark_failpoints

ROOT = Path(__file__).resolve().parents[2]


def test_docs_table_matches_the_code() -> None:
    docs = (ROOT / "docs" / "configuration.md").read_text()
    section = docs.split("## Spark options", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w[\w.]*)` \| `([^`]*)` \| ([a-z, ]+) \|", section, re.MULTILINE)
    documented = {name: (default, scope) for name, default, scope in rows}
    expected = {}
    for key in OPTIONS:
        default = str(key.default).lower() if isinstance(key.default, bool) else str(key.default)
        if key.name == "path":
            default = "~/.idemlog/embedded"
        expected[key.name] = (default, SCOPES[key.name].value)
    assert documented == expected
    assert DEFAULT_PATH.endswith("/.idemlog/embedded")


def test_names_are_case_insensitive_and_spark_options_are_ignored() -> None:
    options = parse_options(
        {"topic": "t", "maxoffsetspertrigger": "10", "INCLUDEMETADATA": "true"}, Scope.READ
    )
    assert options.max_offsets_per_trigger == 10 and options.include_metadata
    written = parse_options(
        {"topic": "t", "checkpointlocation": "/x", "producer.linger.ms": "7"}, Scope.WRITE
    )
    assert written.producer == {"linger.ms": "7"} and written.embedded


@pytest.mark.parametrize(
    ("options", "scope", "message"),
    [
        (
            {"topic": "t", "maxOfsetsPerTrigger": "1"},
            Scope.READ,
            "did you mean 'maxOffsetsPerTrigger'",
        ),
        ({"topic": "t", "key": "k"}, Scope.READ, "'key' applies to writes only"),
        ({"topic": "t", "producer.batch.size": "1"}, Scope.READ, "applies to writes only"),
        ({"topic": "t", "producer.batch.size": "x"}, Scope.WRITE, "batch.size='x'"),
        ({"topic": "__consumer"}, Scope.WRITE, "reserved for internal topics"),
        ({"topic": "t", "transaction.timeout.ms": "0"}, Scope.WRITE, "below the minimum 1"),
        ({"topic": "t", "includeMetadata": "perhaps"}, Scope.READ, "is not a boolean"),
        (
            {"topic": "t", "minPartitions": "0"},
            Scope.READ,
            "minPartitions='0' is below the minimum 1",
        ),
        (
            {"topic": "t", "minPartitions": "many"},
            Scope.READ,
            "minPartitions='many' is not an integer",
        ),
        (
            {"topic": "t", "maxRecordsPerPartition": "-5"},
            Scope.READ,
            "maxRecordsPerPartition='-5' is below the minimum 1",
        ),
        (
            {"topic": "t", "minPartitions": "2"},
            Scope.WRITE,
            "'minPartitions' applies to reads only",
        ),
        (
            {"topic": "t", "startingOffsets": "middle"},
            Scope.READ,
            "option 'startingOffsets'='middle' is not earliest, latest or per-partition JSON",
        ),
        (
            {"topic": "t", "startingOffsets": '{"other":{"0":1}}'},
            Scope.READ,
            "it names ['other'], but this read is of topic 't'",
        ),
        (
            {"topic": "t", "endingOffsets": '{"t":{"0":-3}}'},
            Scope.READ,
            "option 'endingOffsets'='{\"t\":{\"0\":-3}}' is not earliest, latest or",
        ),
        (
            {"topic": "t", "endingOffsets": '{"t":{"x":1}}'},
            Scope.READ,
            "partition 'x' is not a partition number",
        ),
        ({"topic": "t", "endingOffsets": "{"}, Scope.READ, "'endingOffsets'='{' is not"),
        ({"topic": "t", "endingOffsets": "latest"}, Scope.WRITE, "applies to reads only"),
        (
            {"topic": "t", "kafka.bootstrap.servers": "h:9092"},
            Scope.WRITE,
            "unknown idemlog option 'kafka.bootstrap.servers' (an option of Spark's Kafka "
            "connector: idemlog's is 'brokers'",
        ),
        ({"subscribe": "t"}, Scope.READ, "'subscribe' (an option of Spark's Kafka connector: "),
        ({"topic": "t", "kafka.linger.ms": "5"}, Scope.WRITE, "idemlog's is 'producer.linger.ms'"),
        ({"topic": "t", "failOnDataLoss": "false"}, Scope.READ, "lost offsets always fail"),
        ({"topic": "t", "embedded.metrics.port": "-2"}, Scope.WRITE, "below the minimum -1"),
        ({"topic": "t", "embedded.metrics.port": "70000"}, Scope.READ, "above the maximum"),
        (
            {"topic": "t", "brokers": "h:1", "embedded.metrics.port": "0"},
            Scope.WRITE,
            "option 'embedded.metrics.port'=0 applies to the embedded broker only",
        ),
        ({"topic": "t", "embedded.idle.shutdown.ms": "-1"}, Scope.WRITE, "below the minimum 0"),
        (
            {"topic": "t", "brokers": "h:1", "embedded.idle.shutdown.ms": "0"},
            Scope.READ,
            "option 'embedded.idle.shutdown.ms' applies to the embedded broker only",
        ),
    ],
)
def test_bad_options_are_named(options: dict[str, str], scope: Scope, message: str) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape(message)):
        parse_options(options, scope)


def test_split_options_are_unset_by_default_and_read_case_insensitively() -> None:
    default = parse_options({"topic": "t"}, Scope.READ)
    assert (default.min_partitions, default.max_records_per_partition) == (0, 0)
    asked = parse_options(
        {"topic": "t", "minpartitions": "8", "MAXRECORDSPERPARTITION": "1_000"}, Scope.READ
    )
    assert (asked.min_partitions, asked.max_records_per_partition) == (8, 1000)
    assert pickle.loads(pickle.dumps(asked)) == asked


def test_embedded_metrics_port_is_off_unless_asked_for() -> None:
    assert parse_options({"topic": "t"}, Scope.WRITE).embedded_metrics_port == -1
    asked = parse_options({"topic": "t", "EMBEDDED.METRICS.PORT": "0"}, Scope.READ)
    assert asked.embedded_metrics_port == 0 and asked.embedded
    assert pickle.loads(pickle.dumps(asked)) == asked


def test_the_embedded_broker_stops_after_30_idle_minutes_unless_asked_otherwise() -> None:
    assert parse_options({"topic": "t"}, Scope.WRITE).embedded_idle_shutdown_ms == 1_800_000
    never = parse_options({"topic": "t", "Embedded.Idle.Shutdown.Ms": "0"}, Scope.READ)
    assert never.embedded_idle_shutdown_ms == 0


def test_parsed_options_pickle_for_the_executors() -> None:
    options = parse_options({"topic": "t", "brokers": "h:1,h:2", "key": "k"}, Scope.WRITE)
    assert pickle.loads(pickle.dumps(options)) == options
    assert options.bootstrap() == "h:1,h:2"


def test_failpoints_parse_match_and_fire_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = "mid_write@3/1=raise;inside_commit@5=kill_driver;before_write@0=sleep:0.01"
    entries = spark_failpoints.parse(spec)
    assert [(e.point, e.batch_id, e.partition, e.action) for e in entries] == [
        ("mid_write", 3, 1, "raise"),
        ("inside_commit", 5, None, "kill_driver"),
        ("before_write", 0, None, "sleep:0.01"),
    ]
    monkeypatch.setenv(spark_failpoints.ENV, spec)
    monkeypatch.setenv(spark_failpoints.ENV_DIR, str(tmp_path))
    spark_failpoints.hit("mid_write", 3, 0)  # another partition: nothing
    with pytest.raises(Exception, match="failpoint mid_write@3/1=raise fired"):
        spark_failpoints.hit("mid_write", 3, 1)
    spark_failpoints.hit("mid_write", 3, 1)  # fired once already: passes now
    with pytest.raises(InvalidConfigError, match="is not <point>@<batch>"):
        spark_failpoints.parse("during_lunch@1=raise")


def test_failpoints_need_a_marker_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(spark_failpoints.ENV, "mid_write@1=raise")
    monkeypatch.delenv(spark_failpoints.ENV_DIR, raising=False)
    with pytest.raises(InvalidConfigError, match=spark_failpoints.ENV_DIR):
        spark_failpoints.hit("mid_write", 1, 0)


def test_the_hooks_option_names_a_sinkhooks_class_loaded_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failpoints' variables armed, but a write that names no hooks class never reads
    # them: its hooks are the no-op default (docs/security.md, Test hooks).
    monkeypatch.setenv(spark_failpoints.ENV, "mid_write@1=raise")
    monkeypatch.setenv(spark_failpoints.ENV_DIR, str(tmp_path))
    plain = parse_options({"topic": "t"}, Scope.WRITE)
    assert plain.hooks == "" and load_hooks(plain.hooks) is NO_HOOKS
    NO_HOOKS.at(Point.MID_WRITE, 1, 0)
    assert list(tmp_path.iterdir()) == []  # nothing claimed
    named = parse_options({"topic": "t", "HOOKS": spark_failpoints.HOOKS}, Scope.WRITE)
    hooks = load_hooks(named.hooks)
    assert isinstance(hooks, spark_failpoints.SparkFailpoints)
    # Pickled by name (to the tasks and the commit): the process's one instance.
    assert pickle.loads(pickle.dumps(hooks)) is hooks is load_hooks(spark_failpoints.HOOKS)
    with pytest.raises(Exception, match="failpoint mid_write@1=raise fired"):
        hooks.at(Point.MID_WRITE, 1, 0)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("testkit.spark_failpoints", "not module:Class"),
        ("testkit.no_such_module:Hooks", "cannot import 'testkit.no_such_module'"),
        ("testkit.spark_failpoints:Nothing", "has no 'Nothing'"),
        ("testkit.spark_failpoints:Failpoint", "is not a subclass of spark_sink.hooks.SinkHooks"),
    ],
)
def test_a_bad_hooks_value_fails_the_plan_naming_the_option(value: str, why: str) -> None:
    with pytest.raises(
        InvalidConfigError, match=re.escape(f"option 'hooks'={value!r}: ") + ".*" + re.escape(why)
    ):
        parse_options({"topic": "t", "hooks": value}, Scope.WRITE)
    with pytest.raises(InvalidConfigError, match="option 'hooks' applies to writes only"):
        parse_options({"topic": "t", "hooks": spark_failpoints.HOOKS}, Scope.READ)


def test_security_options_reach_every_link_and_ssl_needs_brokers() -> None:
    keys = {
        "topic": "t",
        "brokers": "h:1",
        "security.protocol": "SSL",
        "ssl.ca.location": "/ca.pem",
        "ssl.key.password": "pw-secret",
    }
    options = parse_options(keys, Scope.WRITE)
    assert options.tls.encrypted and options.tls.ca_location == "/ca.pem"
    assert "pw-secret" not in repr(options)  # kept out of logs that print the options
    with pytest.raises(
        InvalidConfigError, match=re.escape("'security.protocol'=SSL needs option 'brokers'")
    ):
        parse_options({"topic": "t", "security.protocol": "SSL"}, Scope.READ)
    with pytest.raises(
        InvalidConfigError, match=re.escape("the sink sets producer key 'ssl.ca.location'")
    ):
        parse_options({"topic": "t", "producer.ssl.ca.location": "/x"}, Scope.WRITE)
    # SASL_SSL: the TLS settings and the credentials from the same options.
    both = parse_options(
        {**keys, "security.protocol": "SASL_SSL", "sasl.username": "u", "sasl.password": "pw"},
        Scope.READ,
    )
    assert both.tls.encrypted and both.sasl is not None and both.sasl.username == "u"
    with pytest.raises(InvalidConfigError, match=re.escape("sasl.username is empty")):
        parse_options({"topic": "t", "brokers": "h:1", "security.protocol": "SASL_SSL"}, Scope.READ)
    with pytest.raises(
        InvalidConfigError, match=re.escape("the sink sets producer key 'sasl.password'")
    ):
        parse_options({"topic": "t", "producer.sasl.password": "x"}, Scope.WRITE)
