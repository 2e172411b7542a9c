"""The embedded broker's Prometheus endpoint, switched on by a Spark option
(``embedded.metrics.port``, docs/spark.md): the session that starts the broker gets the
endpoint, on the port the broker chose for 0, published in ``broker.json`` and
``idemlog broker list``; a later write asking for another port is refused, naming the
option, and writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession

from broker_core.client.broker_client import BrokerClient
from spark_sink import local_session
from spark_sink.embedded import broker_pid, ensure_broker, metrics_address, stop_broker

ROWS = 40
TOPIC = "metrics_scraped"


@pytest.fixture(scope="module")
def unstarted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An embedded broker's path with no broker yet: the Spark session starts it."""
    path = str(tmp_path_factory.mktemp("store"))
    try:
        yield path
    finally:
        stop_broker(path)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = local_session("idemlog-embedded-metrics", cores=1, max_failures=1, quiet=True)
    try:
        yield session
    finally:
        session.stop()


def _write(spark: SparkSession, path: str, **options: str) -> None:
    df = spark.range(ROWS).selectExpr("id", "cast(id as string) as value")
    writer = df.write.format("idemlog").option("topic", TOPIC).option("path", path)
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.mode("append").save()


def _scrape(address: str) -> dict[str, float]:
    """Every sample of the endpoint's text, parsed by prometheus_client: name{labels}."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        assert answer.status == 200
        text = answer.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def _end_offsets(path: str) -> list[int]:
    with BrokerClient(ensure_broker(path)) as client:
        parts = len(client.describe_topics([TOPIC])[0].partitions)
        return [client.list_offsets(TOPIC, p)["log_end_offset"] for p in range(parts)]


def test_option_starts_the_endpoint_where_it_is_published_and_refuses_another_port(
    spark: SparkSession, unstarted: str
) -> None:
    assert broker_pid(unstarted) is None  # the write below starts it, with the option
    _write(spark, unstarted, **{"embedded.metrics.port": "0"})

    # Published where the port chosen for 0 can be found: broker.json, the broker's log
    # and `idemlog broker list`.
    endpoint = metrics_address(unstarted)
    assert endpoint is not None and endpoint.startswith("127.0.0.1:")
    port = int(endpoint.rpartition(":")[2])
    assert port > 0
    state = json.loads(Path(unstarted, "broker.json").read_text())
    assert state["metrics"] == endpoint
    log = Path(unstarted, "broker.log").read_text()
    assert f"metrics endpoint: http://{endpoint}/metrics" in log
    listed = subprocess.run(
        [sys.executable, "-m", "broker_core.cli.main", "broker", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (mine,) = [b for b in json.loads(listed.stdout) if b["pid"] == broker_pid(unstarted)]
    assert mine["metrics"] == endpoint and mine["started_by"] == "spark"

    # The endpoint serves the broker's figures: the rows just written, per partition.
    samples = _scrape(endpoint)
    appended = {
        name: value
        for name, value in samples.items()
        if name.startswith("idemlog_server_brokertopicmetrics_messagesin_total{")
        and f"topic={TOPIC}" in name
    }
    assert appended and sum(appended.values()) == ROWS, appended
    assert samples["idemlog_broker_info{broker_id=0}"] == 1.0

    # A later write that asks for another port is refused, naming the option and the
    # endpoint the broker has; nothing is written, and the endpoint stays as it was.
    before = _end_offsets(unstarted)
    other = port + 1 if port < 65535 else port - 1
    with pytest.raises(
        Exception, match=r"embedded\.metrics\.port'=\d+: the embedded broker"
    ) as refused:
        _write(spark, unstarted, **{"embedded.metrics.port": str(other)})
    assert f"with its metrics endpoint at {endpoint}" in str(refused.value)
    assert _end_offsets(unstarted) == before
    assert metrics_address(unstarted) == endpoint
    # Without the option a write uses the broker as it is.
    _write(spark, unstarted)
    assert sum(_end_offsets(unstarted)) > sum(before)
