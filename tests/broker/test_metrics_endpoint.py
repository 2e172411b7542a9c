"""The Prometheus endpoint (``metrics.port``) of a real broker process: scraped over HTTP,
parsed with Prometheus' own text parser, its figures equal to ``idemlog metrics --json``
after traffic that made duplicates and a fenced producer, and across a restart (counters
start again from zero with a newer start time, as Prometheus' ``rate()`` expects); its
names and help checked by Prometheus' own ``promtool check metrics`` (installed by ``make
setup``), the counters' ``_created`` samples in the OpenMetrics answer only; the
per-producer detail paged from the broker; a taken port refusing the start in one line."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from broker_core.cli.main import main as cli_main
from broker_core.client.broker_client import BrokerClient
from broker_core.errors import DuplicateSequenceError, InvalidProducerEpochError
from broker_core.protocol.requests import ACKS_LEADER
from testkit.broker_failpoints import ENV, WITHHOLD_REPLICA_FETCH
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.helpers import rows
from tests.harness.broker import TEST_HOOKS, BrokerFactory, BrokerHarnessError, BrokerProcess
from tests.harness.promtool import check_metrics
from tests.harness.replicated import ReplicatedCluster
from tests.harness.waiting import wait_until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
ENDPOINT = re.compile(r"metrics endpoint: http://127\.0\.0\.1:(\d+)/metrics")


OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def exposition(port: int, accept: str | None = None) -> str:
    headers = {"Accept": accept} if accept else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith(
            "application/openmetrics-text" if accept else "text/plain"
        )
        text: str = answer.read().decode()
    return text


def scrape(port: int) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(exposition(port))
        for s in family.samples
    }


def scrape_openmetrics(port: int) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in openmetrics_families(exposition(port, OPENMETRICS))
        for s in family.samples
    }


def promtool_check(port: int) -> None:
    """``promtool check metrics`` over the endpoint's text answer (what Prometheus' own
    linter says of the names, units, types and help): nothing to report."""
    check_metrics(exposition(port))


def endpoint_port(broker: BrokerProcess) -> int:
    """The bound port, from the broker's log (metrics.port=0 picks a free one)."""
    found = ENDPOINT.findall(broker.log_text())
    assert found, broker.log_tail()
    return int(found[-1])


def cli_document(broker: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert cli_main(["metrics", "--bootstrap", broker.address, "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def produce_with_duplicates(client: BrokerClient, topic: str, batches: int) -> int:
    """``batches`` batches of 5 rows from one idempotent producer, then one duplicate in
    the cached window (answered with its offsets) and one beyond it (refused)."""
    pid, epoch = client.init_producer_id()
    with client.produce_stream(topic, 0) as stream:

        def send(seq: int) -> Any:
            r = stream.send(
                rows(5, start=seq), producer_id=pid, producer_epoch=epoch, base_sequence=seq
            )
            return r.result(10)

        for i in range(batches):
            assert send(5 * i).error() is None
        assert send(5 * (batches - 1)).duplicate  # the last one again: in the window
        if batches > 5:
            assert isinstance(send(0).error(), DuplicateSequenceError)
    return pid


def fence_a_producer(client: BrokerClient, topic: str) -> None:
    """A transactional producer's older instance appends after a newer one started."""
    old_pid, old_epoch = client.init_producer_id("metrics-app")
    client.add_partitions_to_txn("metrics-app", old_pid, old_epoch, [(topic, 0)])
    with client.produce_stream(topic, 0, transactional_id="metrics-app") as stream:
        stream.send(
            rows(2), producer_id=old_pid, producer_epoch=old_epoch, base_sequence=0,
            transactional=True,
        ).offsets(10)  # fmt: skip
    client.init_producer_id("metrics-app")  # the new instance: the old epoch is fenced
    with client.produce_stream(topic, 0, transactional_id="metrics-app") as stream:
        answer = stream.send(
            rows(2, start=2), producer_id=old_pid, producer_epoch=old_epoch, base_sequence=2,
            transactional=True,
        ).result(10)  # fmt: skip
    assert isinstance(answer.error(), InvalidProducerEpochError)  # the fault happened


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"{name}{labels} not exported; have {sorted(k[0] for k in samples)[:50]}"
    return samples[key]


def check_equal(samples: Samples, doc: dict[str, Any]) -> None:
    """The endpoint's figures are the document's, counter by counter."""
    for name, figure in doc["totals"].items():
        assert value(samples, f"idemlog_broker_{name}_total") == figure, name
    for row in doc["partitions"]:
        where = {"topic": row["topic"], "partition": str(row["partition"])}
        topic = "idemlog_server_brokertopicmetrics"
        assert value(samples, f"{topic}_messagesin_total", **where) == row["records_appended"]
        assert value(samples, f"{topic}_bytesin_total", **where) == row["bytes_appended"]
        assert value(samples, f"{topic}_duplicates_total", **where) == row["duplicates_in_window"]
        assert (
            value(samples, f"{topic}_duplicates_beyond_window_total", **where)
            == row["duplicates_beyond_window"]
        )
        assert value(samples, f"{topic}_fenced_producers_total", **where) == row["fenced_appends"]
        assert value(samples, "idemlog_log_end_offset", **where) == row["log_end_offset"]
        assert value(samples, "idemlog_log_producers", **where) == row["producers"]
    txns = doc["transactions"]
    for name in ("transactions_committed", "transactions_aborted", "transactions_fenced"):
        assert value(samples, f"idemlog_transaction_coordinator_{name}_total") == txns[name]
    assert value(samples, "idemlog_transaction_open") == txns["open_transactions"]
    produce = doc["requests"]["produce"]
    request = {"request": "produce"}
    assert (
        value(samples, "idemlog_network_requestmetrics_requests_total", **request)
        == (produce["count"])
    )
    assert (
        value(samples, "idemlog_network_requestmetrics_latency_seconds_count", **request)
        == produce["count"]
    )
    assert value(samples, "idemlog_broker_producers_active") == doc["producers_active"]


def test_the_endpoint_serves_the_documents_figures_across_a_restart(
    broker_factory: BrokerFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    broker = broker_factory({"metrics.port": 0})
    port = endpoint_port(broker)
    with BrokerClient(broker.address) as client:
        client.create_topic("dups", 1)
        client.create_topic("zombie", 1)
        produce_with_duplicates(client, "dups", 7)
        fence_a_producer(client, "zombie")
    before = scrape(port)
    doc = cli_document(broker, capsys)
    assert doc["totals"]["duplicates_in_window"] == 1  # the scenario happened
    assert doc["totals"]["duplicates_beyond_window"] == 1
    assert doc["totals"]["fenced_appends"] == 1
    check_equal(before, doc)
    promtool_check(port)
    for code in ("TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID"):  # every code from 0, not absent
        refused = value(
            before,
            "idemlog_broker_authorization_refusals_total",
            code=code + "_AUTHORIZATION_FAILED",
        )
        assert refused == 0
    started = value(before, "idemlog_broker_start_time_seconds")
    # _created: in the OpenMetrics answer, part of each counter; not in the text one.
    assert not any(name.endswith("_created") for name, _ in before)
    openmetrics = scrape_openmetrics(port)
    assert value(openmetrics, "idemlog_broker_duplicates_in_window_created") == started
    assert value(openmetrics, "idemlog_broker_duplicates_in_window_total") == 1
    assert value(before, "process_start_time_seconds") <= started + 1
    assert value(before, "idemlog_broker_info", broker_id="0") == 1

    # A restart on the same port: the counters start from zero with a newer start time
    # (what rate() reads as a reset), then count the new traffic as the document does.
    broker.stop()
    broker.config["metrics.port"] = port
    broker.restart()
    after_restart = scrape(port)
    restarted = value(after_restart, "idemlog_broker_start_time_seconds")
    assert restarted > started
    assert value(after_restart, "idemlog_broker_records_appended_total") == 0
    assert value(scrape_openmetrics(port), "idemlog_broker_records_appended_created") == restarted
    with BrokerClient(broker.address) as client:
        produce_with_duplicates(client, "dups", 2)
    after = scrape(port)
    doc = cli_document(broker, capsys)
    assert doc["totals"]["duplicates_in_window"] == 1
    check_equal(after, doc)


def test_the_default_document_lists_the_top_producers_and_pages_every_one(
    broker_factory: BrokerFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    broker = broker_factory()
    with BrokerClient(broker.address) as client:
        client.create_topic("many", 1)
        pids = [produce_with_duplicates(client, "many", 1) for _ in range(12)]
        clean_pid, epoch = client.init_producer_id()
        with client.produce_stream("many", 0) as stream:
            stream.send(
                rows(1), producer_id=clean_pid, producer_epoch=epoch, base_sequence=0
            ).offsets(10)
        doc = client.metrics(top=3)
        assert doc["top"] == 3 and len(doc["producers"]) == 3
        assert doc["producers_tracked"] == 13 and doc["producers_active"] == 13
        assert [r["producer_id"] for r in doc["producers"]] == sorted(pids)[:3]  # ties: by id
        pages = list(client.producer_pages(page_size=5))
        assert [len(p.producers) for p in pages] == [5, 5, 3]
        assert pages[-1].next_page_token is None
        listed = [r["producer_id"] for p in pages for r in p.producers]
        assert listed == sorted([*pids, clean_pid])  # every producer exactly once, by id
    capsys.readouterr()
    assert (
        cli_main(
            ["metrics", "--bootstrap", broker.address, "--producers", "--page-size", "4", "--json"]
        )
        == 0
    )
    shown = json.loads(capsys.readouterr().out)
    assert [r["producer_id"] for r in shown["producers"]] == listed


def test_a_taken_metrics_port_refuses_the_start_in_one_line(broker_factory: BrokerFactory) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        broker = broker_factory({"metrics.port": taken}, start=False)
        with pytest.raises(BrokerHarnessError):
            broker.start()
    assert broker.process is not None and broker.process.returncode == 2  # a config error
    assert f"metrics.port={taken}: 127.0.0.1:{taken} is already in use" in broker.log_text()
    assert "Traceback" not in broker.log_text()


def test_a_replicated_clusters_endpoint_shows_a_follower_lost_and_back(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    cluster = ReplicatedCluster(zk_chroot, broker_factory, count=2, extra={"metrics.port": 0})
    try:
        cluster.create_topic("rep", 1)
        cluster.wait_in_sync("rep", 0)
        leader = cluster.leader_of("rep", 0)
        (follower,) = [b for b in cluster.running() if b is not leader]
        port = endpoint_port(leader)
        replica = "idemlog_server_replicamanager"
        before = scrape(port)
        assert value(before, f"{replica}_underreplicatedpartitions") == 0
        shrinks = value(before, f"{replica}_isrshrinks_total")

        # A real SIGKILL: the controller drops the dead follower from the ISR (its session
        # expired), which is no shrink of the leader's (Kafka's IsrShrinks counts those of a
        # lagging follower); the under-replicated gauge shows it, and the expand on return.
        follower.kill()
        wait_until(
            lambda: value(scrape(port), f"{replica}_underreplicatedpartitions") == 1,
            "the leader to report rep-0 under-replicated",
            timeout=30,
        )
        doc = cluster.replication(leader)
        shrunk = scrape(port)
        assert doc["under_replicated_partitions"] == ["rep-0"]  # the fault took effect
        merged = cluster.client.metrics()  # idemlog metrics: replication by broker id
        assert merged["replication"][str(follower_id(cluster, leader))] == doc
        assert value(shrunk, f"{replica}_isrshrinks_total") == doc["isr_shrinks"] == shrinks
        assert value(shrunk, f"{replica}_leadercount") == doc["leader_partitions"]

        follower.restart()
        cluster.wait_in_sync("rep", 0)
        doc = cluster.replication(leader)
        healed = scrape(port)
        assert value(healed, f"{replica}_underreplicatedpartitions") == 0
        assert value(healed, f"{replica}_isrexpands_total") == doc["isr_expands"] >= 1
        lag = doc["follower_lag"]["rep-0"][str(follower_id(cluster, follower))]
        assert value(
            healed, f"{replica}_follower_lag", topic="rep", partition="0",
            follower=str(follower_id(cluster, follower)),
        ) == lag  # fmt: skip
        promtool_check(port)  # with the replication figures
    finally:
        cluster.close()


def follower_id(cluster: ReplicatedCluster, broker: BrokerProcess) -> int:
    (broker_id,) = [i for i, b in cluster.brokers.items() if b is broker]
    return broker_id


def test_a_lagging_follower_is_the_leaders_isr_shrink_on_the_endpoint(
    zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    """The preferred leader is restarted with the hook that withholds its followers'
    batches, made leader again, and takes a batch alone: its follower lags past
    replica.lag.time.max.ms and the leader drops it from the ISR, one isrshrinks."""
    cluster = ReplicatedCluster(zk_chroot, broker_factory, count=2, extra={"metrics.port": 0})
    try:
        cluster.create_topic("lag", 1)
        cluster.wait_in_sync("lag", 0)
        preferred = cluster.state("lag", 0).replicas[0]
        victim = cluster.brokers[preferred]
        victim.stop()  # a clean shutdown hands the leadership over first
        cluster.wait_leader_change("lag", 0, preferred)
        victim.config.update(TEST_HOOKS)  # started for the test hook, explicitly
        victim.restart(env={ENV: WITHHOLD_REPLICA_FETCH})
        cluster.wait_in_sync("lag", 0)
        cluster.client.elect_leaders(["lag"])
        cluster.wait_state("lag", 0, lambda s: s.leader == preferred, "the preferred leader back")
        port = endpoint_port(victim)  # its new start's endpoint
        replica = "idemlog_server_replicamanager"
        assert value(scrape(port), f"{replica}_isrshrinks_total") == 0
        pid, epoch = cluster.client.init_producer_id()
        cluster.client.refresh_metadata()  # the client routes to the leader of now
        with cluster.client.produce_stream("lag", 0, acks=ACKS_LEADER) as stream:
            stream.send(rows(3), producer_id=pid, producer_epoch=epoch, base_sequence=0).offsets(10)
        wait_until(
            lambda: value(scrape(port), f"{replica}_isrshrinks_total") == 1,
            "the leader to drop its lagging follower",
            timeout=30,
        )
        doc = cluster.replication(victim)
        samples = scrape(port)
        assert doc["isr_shrinks"] == 1 and doc["under_replicated_partitions"] == ["lag-0"]
        assert value(samples, f"{replica}_underreplicatedpartitions") == 1
        assert cluster.state("lag", 0).isr == (preferred,)  # the fault took effect
    finally:
        cluster.close()
