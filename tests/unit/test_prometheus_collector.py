"""The collector's mapping of the metrics document
(broker_core/server/observability/prometheus.py) on documents built by :class:`Metrics`
itself: the cleaner's last pass as a timestamp in seconds, absent before the first pass;
the refusal codes at 0 before any refusal; the counters' ``_created`` samples in the
OpenMetrics answer and not in the text one; the replication's and the coordinator's
figures labelled ``topic`` and ``partition``."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.parser import text_string_to_metric_families

from broker_core.protocol.metrics import AppendOutcome, PartitionGauges
from broker_core.server.observability.metrics import Metrics
from broker_core.server.observability.prometheus import DocumentCollector, WithoutCreated
from tests.harness.promtool import check_metrics

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
LAST_CLEAN = "idemlog_log_cleaner_last_clean_timestamp_seconds"


def _gauges(last_clean_ms: int) -> PartitionGauges:
    return PartitionGauges(
        log_start_offset=0, log_end_offset=5, last_stable_offset=5, producers=1,
        open_transactions=0, cleaner_last_clean_ms=last_clean_ms,
    )  # fmt: skip


def _document() -> dict[str, Any]:
    metrics = Metrics()
    metrics.record_append("t", 0, 1, AppendOutcome.APPENDED, 5, 100)
    gauges = {("t", 0): _gauges(-1), ("t", 1): _gauges(1_700_000_123_456)}
    doc = metrics.document(7, gauges, {"open_transactions": 0, "coordinator_epochs": {"3": 2}})
    doc["replication"] = {
        "leader_partitions": 1, "follower_partitions": 0, "under_replicated_partitions": [],
        "isr_shrinks": 0, "isr_expands": 0, "truncations_refused": 0,
        "unclean_leader_elections": 0, "follower_lag": {"my-topic-0": {"2": 4}},
    }  # fmt: skip
    return doc


def _registry() -> CollectorRegistry:
    doc = _document()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DocumentCollector(lambda: doc))
    return registry


def _samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_text_answer_maps_the_document_to_conventional_names_and_labels() -> None:
    samples = _samples(generate_latest(WithoutCreated(_registry())).decode())
    last_clean = {dict(k[1])["partition"]: v for k, v in samples.items() if k[0] == LAST_CLEAN}
    assert last_clean == {"1": 1_700_000_123.456}  # partition 0: never cleaned, no sample
    refusals = {
        dict(k[1])["code"]: v
        for k, v in samples.items()
        if k[0] == "idemlog_broker_authorization_refusals_total"
    }
    assert refusals == {
        "TOPIC_AUTHORIZATION_FAILED": 0,
        "GROUP_AUTHORIZATION_FAILED": 0,
        "CLUSTER_AUTHORIZATION_FAILED": 0,
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": 0,
    }
    lag = frozenset({"topic": "my-topic", "partition": "0", "follower": "2"}.items())
    assert samples[("idemlog_server_replicamanager_follower_lag", lag)] == 4
    epoch = frozenset({"topic": "__transaction_state", "partition": "3"}.items())
    assert samples[("idemlog_transaction_coordinator_epoch", epoch)] == 2
    assert (
        samples[("idemlog_log_end_offset", frozenset({"topic": "t", "partition": "0"}.items()))]
        == 5
    )
    assert not any(name.endswith("_created") for name, _ in samples)


def test_created_samples_are_in_the_openmetrics_answer_only() -> None:
    registry = _registry()
    openmetrics = openmetrics_latest(registry).decode()
    assert "idemlog_broker_records_appended_created " in openmetrics
    assert "idemlog_broker_records_appended_total 5.0" in openmetrics
    text = generate_latest(WithoutCreated(registry)).decode()
    assert "_created" not in text
    assert "idemlog_broker_records_appended_total 5.0" in text
    # A scrape asking for some names (?name[]=...) gets them, still without _created.
    some = WithoutCreated(registry).restricted_registry(["idemlog_broker_records_appended_total"])
    assert [f.name for f in some.collect()] == ["idemlog_broker_records_appended"]
    assert "_created" not in generate_latest(some).decode()


def test_consumer_groups_and_the_largest_lags_are_exported() -> None:
    doc = _document()
    doc["groups"] = {
        "coordinators": ["__consumer_offsets-0"], "groups": 2, "members": 3, "offsets": 7,
        "lag": 12, "top": [{"group": "reports", "lag": 10}, {"group": "audit", "lag": 2}],
    }  # fmt: skip
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DocumentCollector(lambda: doc))
    text = generate_latest(WithoutCreated(registry)).decode()
    check_metrics(text)
    samples = _samples(text)
    assert samples[("idemlog_consumer_groups", frozenset())] == 2
    assert samples[("idemlog_consumer_group_members", frozenset())] == 3
    assert samples[("idemlog_consumer_group_committed_partitions", frozenset())] == 7
    assert samples[("idemlog_consumer_groups_lag", frozenset())] == 12
    by_group = {
        dict(k[1])["group"]: v for k, v in samples.items() if k[0] == "idemlog_consumer_group_lag"
    }
    assert by_group == {"reports": 10, "audit": 2}
