"""The Spark sink and reader on a 3-broker SASL cluster with ``authorizer.enable``, holding
only the minimal ACLs docs/security.md documents (Authorization, "The minimal ACLs of a
job"): a stream and a ``df.write`` write every row exactly once, a reading job reads them;
a job whose principal lacks Write on the topic fails with TOPIC_AUTHORIZATION_FAILED and
leaves nothing in the topic, not even uncommitted."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from broker_core.client.broker_client import BrokerClient
from testkit.zookeeper import ZooKeeperHarness
from tests.broker.test_acls import authorizer_cluster
from tests.broker.test_sasl import idemlog
from tests.harness.broker import BrokerFactory
from tests.harness.replicated import ReplicatedCluster
from tests.spark.helpers import DriverLauncher, batch_spec, make_input, stream_spec

PASSWORDS = {
    "broker": "broker-Secret-a1",
    "admin": "admin-Secret-b2",
    "etl": "etl-Secret-c3",
    "report": "report-Secret-d4",
    "rogue": "rogue-Secret-e5",
}
QUERY_ID = "5b7e61c2-3d0a-4f7e-9f15-ac1000000001"  # fixed by the checkpoint's metadata
FILES, ROWS, PARTITIONS = 2, 300, 3


def _options(cluster: ReplicatedCluster, user: str) -> dict[str, str]:
    return {
        "brokers": cluster.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": user,
        "sasl.password": PASSWORDS[user],
    }


def _acl(where: list[str], *args: str) -> None:
    done = idemlog("acls", "add", *where, *args)
    assert done.returncode == 0, done.stderr


def _ids(client: BrokerClient, topic: str, isolation: str = "read_committed") -> list[int]:
    got: list[int] = []
    for p in range(PARTITIONS):
        for _meta, batch in client.fetch(topic, p, isolation=isolation):
            got.extend(batch.column("id").to_pylist())
    return got


@pytest.mark.slow
def test_minimal_acls_write_and_read_exactly_once_and_a_job_without_write_fails(
    tmp_path: Path, zk_chroot: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    where = ["--zookeeper", zk_chroot.hosts]
    cluster = authorizer_cluster(zk_chroot, broker_factory, PASSWORDS)
    launcher = DriverLauncher(tmp_path)
    try:
        for topic in ("streamed", "written", "denied"):
            cluster.create_topic(topic, PARTITIONS)
        # The documented minimal ACLs: a writing job (User:etl) ...
        for topic in ("streamed", "written"):
            _acl(where, "--allow-principal", "User:etl", "--operation", "Write", "--topic", topic)
        for prefix in (f"{QUERY_ID}/", "batch-"):
            _acl(
                where,
                "--allow-principal",
                "User:etl",
                "--operation",
                "Write",
                "--transactional-id",
                prefix,
                "--resource-pattern-type",
                "prefixed",
            )
        # ... a reading job (User:report) ...
        _acl(
            where, "--allow-principal", "User:report", "--operation", "Read", "--topic", "streamed"
        )
        # ... and a job allowed its transactional ids and to see the topic, not to write it.
        _acl(
            where, "--allow-principal", "User:rogue", "--operation", "Describe", "--topic", "denied"
        )
        _acl(
            where,
            "--allow-principal",
            "User:rogue",
            "--operation",
            "Write",
            "--transactional-id",
            "batch-",
            "--resource-pattern-type",
            "prefixed",
        )

        ids = make_input(tmp_path / "src", FILES, ROWS)
        checkpoint = tmp_path / "ck"
        checkpoint.mkdir()
        # Spark reads the query id from here when the file exists: the stream's sink id is
        # then known before its first start, so its prefixed ACL can be written first.
        (checkpoint / "metadata").write_text(json.dumps({"id": QUERY_ID}) + "\n")
        etl = _options(cluster, "etl")
        spec = stream_spec(
            tmp_path / "src",
            "",
            "streamed",
            checkpoint,
            FILES,
            sink_options=etl,
            steps=[
                {},
                {**batch_spec(tmp_path / "src", "", "written"), "sink_options": etl},
                {
                    "mode": "read",
                    "topic": "streamed",
                    "out": str(tmp_path / "read.parquet"),
                    "sink_options": _options(cluster, "report"),
                },
            ],
        )
        run = launcher.run(spec)
        done = [line for line in run.lines if line.startswith("DONE")]
        assert run.proc.returncode == 0 and len(done) == 3, run.describe()

        client = cluster.client
        for topic in ("streamed", "written"):
            assert collections.Counter(_ids(client, topic)) == collections.Counter(ids), topic
        assert sorted(pq.read_table(tmp_path / "read.parquet").column("id").to_pylist()) == ids
        # The scenario happened as documented: the stream's sink id is the fixed query id.
        listed = client.list_transactions(every_id=True)
        assert any(t.transactional_id.startswith(f"{QUERY_ID}/") for t in listed), listed

        refused = launcher.run(
            {
                **batch_spec(tmp_path / "src", "", "denied"),
                "sink_options": _options(cluster, "rogue"),
            }
        )
        assert refused.proc.returncode == 3, refused.describe()
        assert [line for line in refused.lines if line.startswith("FAILED")], refused.describe()
        log_text = refused.log_path.read_text()
        assert "TOPIC_AUTHORIZATION_FAILED (29): User:rogue" in log_text
        assert "Write on Topic:denied" in log_text
        assert _ids(client, "denied", "read_uncommitted") == []
        refusals = sum(
            doc["counters"]["authorization_refusals"].get("TOPIC_AUTHORIZATION_FAILED", 0)
            for doc in client.metrics_per_broker()
        )
        assert refusals >= 1
    finally:
        launcher.close()
        cluster.close()
