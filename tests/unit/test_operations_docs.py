"""docs/operations.md, its Grafana dashboard and its alert rules name only metrics a
broker exports: every ``idemlog_*`` / ``process_*`` name in them is found in a real
broker's scrape (an embedded broker with ``metrics.port``), or, for a counter a broker
adds to its document's ``counters`` section, in what the collector makes of such a
section (the generic path, no code per counter). The names operations.md gives as renamed
are the one exception: no broker exports them any more."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker_core.client.broker_client import BrokerClient
from broker_core.protocol.metrics import AppendOutcome
from broker_core.server.observability.metrics import Metrics
from broker_core.server.observability.prometheus import DocumentCollector
from tests.harness.broker import BrokerFactory
from tests.harness.promtool import check_rules
from tests.store.helpers import rows

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
NAME = re.compile(r"\b((?:idemlog|process)_[a-z0-9_]+)\b")
ENDPOINT = re.compile(r"metrics endpoint: http://127\.0\.0\.1:(\d+)/metrics")
# Counters the alert rules expect from a document's counters section (the authorizer's).
FROM_COUNTERS_SECTION = {"authorization_refusals": {"CLUSTER_AUTHORIZATION_FAILED": 2}}


def _names(text: str) -> set[str]:
    """Every sample's name and every family's (one without samples yet, as a single
    broker's follower lag, is still described by the endpoint)."""
    families = list(text_string_to_metric_families(text))
    return {f.name for f in families} | {s.name for f in families for s in f.samples}


def _exported(broker_factory: BrokerFactory) -> set[str]:
    # With a Kafka listener: its consumer groups' families are exported too.
    broker = broker_factory({"metrics.port": 0, "kafka.listener": "PLAINTEXT://127.0.0.1:0"})
    with BrokerClient(broker.address) as client:
        client.create_topic("ops", 1)
        pid, epoch = client.init_producer_id()
        with client.produce_stream("ops", 0) as stream:
            stream.send(rows(2), producer_id=pid, producer_epoch=epoch, base_sequence=0).offsets(10)
        assert len(list(client.fetch("ops", 0, 0))) == 1  # a fetch, for its request metrics
    (port,) = ENDPOINT.findall(broker.log_text())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        names = _names(answer.read().decode())
    metrics = Metrics()
    metrics.record_append("t", 0, 1, AppendOutcome.APPENDED, 1, 1)
    doc = metrics.document(0, {}, None)
    doc["counters"] = FROM_COUNTERS_SECTION
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DocumentCollector(lambda: doc))
    generic = _names(generate_latest(registry).decode())
    assert "idemlog_broker_authorization_refusals_total" in generic
    return names | generic


def _renamed() -> set[str]:
    """The old names in operations.md's table of renamed metrics (its first column; a
    name with labels there is a family whose labels were renamed, not the family)."""
    text = OPERATIONS.read_text()
    table = text[text.index("| old | new |") :].split("\n\n", 1)[0]
    renamed = re.compile(NAME.pattern + r"(?!\{)")
    old = {n for line in table.splitlines()[2:] for n in renamed.findall(line.split("|")[1])}
    assert "idemlog_log_log_start_offset" in old, table
    return old


def _dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads((ROOT / "docs" / "grafana" / "idemlog.json").read_text())
    return dashboard


def _dashboard_exprs() -> list[str]:
    """Every PromQL expression of the dashboard: its panels' and its variables' queries,
    with the legends (which name labels)."""
    dashboard = _dashboard()
    targets = [t for panel in dashboard["panels"] for t in panel.get("targets", [])]
    exprs = [t["expr"] for t in targets] + [t.get("legendFormat", "") for t in targets]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert len(targets) >= 10 and all(t["expr"].strip() for t in targets)
    return exprs


def test_the_dashboard_has_units_variables_and_sink_panels() -> None:
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"datasource", "instance", "topic"} <= set(variables)
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    for panel in panels:
        unit = panel["fieldConfig"]["defaults"]["unit"]
        assert unit in {"s", "Bps", "ops", "reqps", "short"}, (panel["title"], unit)
        for target in panel["targets"]:  # every idemlog figure follows the broker chosen
            for name in NAME.findall(target["expr"]):
                assert name.startswith("idemlog_"), name
                assert re.search(name + r'(_bucket)?\{[^}]*instance=~"\$instance"', target["expr"])
    (p99,) = [p for p in panels if "p99" in p["title"]]
    assert [t["expr"].split(",")[0] for t in p99["targets"]] == ["histogram_quantile(0.99"]
    assert p99["fieldConfig"]["defaults"]["unit"] == "s"
    sink = {n for p in panels for t in p["targets"] for n in NAME.findall(t["expr"]) if "sink" in n}
    assert {
        "idemlog_transaction_coordinator_sink_batches_committed_total",
        "idemlog_transaction_coordinator_sink_batches_repeated_total",
        "idemlog_transaction_coordinator_sink_leftovers_aborted_total",
    } <= sink


def test_promtool_loads_the_alert_rules() -> None:
    check_rules(ROOT / "docs" / "prometheus" / "alerts.yml")


def test_promtool_parses_the_dashboards_queries(tmp_path: Path) -> None:
    """Each panel's PromQL, its variables given a value, as a recording rule: promtool
    parses them all (a rule file in JSON, which is YAML)."""
    exprs = [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])]
    rules = [
        {
            "record": f"dashboard:query_{i}",
            "expr": e.replace("$instance", ".*").replace("$topic", ".*"),
        }
        for i, e in enumerate(exprs)
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    check_rules(path)


def _alert_exprs() -> list[str]:
    text = (ROOT / "docs" / "prometheus" / "alerts.yml").read_text()
    assert text.startswith("#") and "\ngroups:\n" in text
    alerts = re.findall(r"^      - alert: (\w+)$", text, re.MULTILINE)
    exprs = re.findall(r"^        expr: (.+)$", text, re.MULTILINE)
    assert len(alerts) == len(exprs) >= 5, (alerts, exprs)
    return exprs


def test_the_dashboard_alerts_and_names_table_use_exported_metrics(
    broker_factory: BrokerFactory,
) -> None:
    exported = _exported(broker_factory)
    assert "process_start_time_seconds" in exported
    renamed = _renamed()
    assert not renamed & exported, f"renamed but still exported: {sorted(renamed & exported)}"
    sources = {
        "docs/grafana/idemlog.json": _dashboard_exprs(),
        "docs/prometheus/alerts.yml": _alert_exprs(),
        "docs/operations.md": [OPERATIONS.read_text()],
    }
    for source, texts in sources.items():
        # A name ending in "_" is a pattern in prose (idemlog_broker_<counter>_total).
        named = {n for text in texts for n in NAME.findall(text) if not n.endswith("_")}
        if source != "docs/operations.md":
            assert not named & renamed, f"{source} uses renamed metrics: {named & renamed}"
            old_labels = {"topic_partition", "state_partition"} & set(
                re.findall(r"\w+", str(texts))
            )
            assert not old_labels, f"{source} uses renamed labels: {old_labels}"
        named -= renamed
        assert named, source
        # A name may be given without its suffix in prose (a family): accept either.
        unknown = {
            n
            for n in named
            if n not in exported and not any(e.startswith(n + "_") for e in exported)
        }
        assert not unknown, f"{source} names metrics no broker exports: {sorted(unknown)}"
