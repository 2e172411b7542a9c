"""A Spark stream, a batch write and a read on a SASL broker with the password in the
options: every row once, and no copy of the password in any log, the event log,
``lastProgress`` or the checkpoint; then a read with a wrong password fails naming the
user, not the password (issue 25, "Secrets"; docs/security.md)."""

from __future__ import annotations

import collections
from pathlib import Path

import pyarrow.parquet as pq

from broker_core.client.broker_client import BrokerClient
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.scram import Mechanism
from tests.broker.test_sasl import add_user
from tests.harness.broker import BrokerFactory
from tests.spark.helpers import (
    DriverLauncher,
    batch_spec,
    make_input,
    stream_spec,
)

PASSWORD = "Spark-sasl-Pa55-6d1e0b"
WRONG = "Wrong-sasl-Pa55-93ac"
FILES, ROWS = 3, 500


def _files_holding(root: Path, secret: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and secret in p.read_bytes()]


def test_sasl_job_runs_exactly_once_and_leaks_no_password(
    tmp_path: Path, broker_factory: BrokerFactory, progress_dir: Path
) -> None:
    data = tmp_path / "broker-data"
    data.mkdir()
    add_user(["--data-dir", str(data)], "etl", PASSWORD)
    broker = broker_factory(
        {"log.dir": str(data), "security.protocol": "SASL_PLAINTEXT"}, name="sasl"
    )
    options = {
        "brokers": broker.address,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "etl",
        "sasl.password": PASSWORD,
    }
    ids = make_input(tmp_path / "src", FILES, ROWS)
    events = tmp_path / "events"
    events.mkdir()
    progress = tmp_path / "progress.jsonl"
    spec = stream_spec(
        tmp_path / "src",
        "",
        "secured",
        tmp_path / "ck",
        FILES,
        sink_options=options,
        progress_out=str(progress),
        conf={
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": str(events),
            "spark.eventLog.compress": "false",  # greppable as written
        },
        steps=[
            {},
            {**batch_spec(tmp_path / "src", "", "secured_batch"), "sink_options": options},
            {
                "mode": "read",
                "topic": "secured",
                "out": str(tmp_path / "read.parquet"),
                "sink_options": options,
            },
            {
                "mode": "read",
                "topic": "secured",
                "out": str(tmp_path / "refused.parquet"),
                "sink_options": {**options, "sasl.password": WRONG},
            },
        ],
    )
    launcher = DriverLauncher(tmp_path)
    try:
        run = launcher.run(spec)
    finally:
        launcher.close()
    # Stream, batch write and read succeeded; the read with the wrong password failed.
    done = [line for line in run.lines if line.startswith("DONE")]
    assert len(done) == 3, run.describe()
    assert run.proc.returncode == 3, run.describe()
    assert [line for line in run.lines if line.startswith("FAILED")], run.describe()
    # The FAILED line is cut short; the whole traceback is in the driver's log: the
    # refusal names the user, not the password.
    refusal = (
        "SASL_AUTHENTICATION_FAILED (58): authentication of User:etl with SCRAM-SHA-512 "
        "failed: invalid credentials"
    )
    assert refusal in run.log_path.read_text()

    etl = SaslCredentials(Mechanism.SCRAM_SHA_512, "etl", PASSWORD)
    with BrokerClient(broker.address, sasl=etl) as client:
        for topic in ("secured", "secured_batch"):
            got: collections.Counter[int] = collections.Counter()
            for p in range(len(client.describe_topics([topic])[0].partitions)):
                for _meta, batch in client.fetch(topic, p):
                    got.update(batch.column("id").to_pylist())
            assert got == collections.Counter(ids), topic
    read = pq.read_table(tmp_path / "read.parquet").column("id").to_pylist()
    assert sorted(read) == ids

    # The scenario happened: the event log recorded the idemlog plans, the progresses
    # the sink, the checkpoint its offsets and commits.
    event_text = "".join(p.read_text() for p in events.rglob("*") if p.is_file())
    assert "BatchScan idemlog" in event_text and "AppendData" in event_text
    assert progress.read_text().count('"numOutputRows"') >= FILES
    assert (tmp_path / "ck" / "commits").is_dir()
    # Nothing under tmp_path (driver logs, the event log, progresses, the checkpoint, the
    # broker's log and data) nor the sink's progress spool holds either password.
    for secret in (PASSWORD, WRONG):
        leaks = _files_holding(tmp_path, secret.encode())
        leaks += _files_holding(progress_dir, secret.encode())
        assert leaks == [], leaks
        assert all(secret not in line for line in run.lines)
