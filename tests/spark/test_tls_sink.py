"""The Spark sink and source through mutual TLS: a real Spark driver (local mode, its own
process) writes a DataFrame to a broker that requires client certificates, then reads it
back with ``spark.read``, the security options passed as ``.option(...)`` down to every
task's client and the driver's commit (docs/security.md). The broker refuses any link
without the client certificate, so the write landing at all shows the options reached
every link; exactly once is checked as in the plaintext tests."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from broker_core.security.tls import Side, TlsSettings
from testkit.tls import TlsCerts
from tests.broker.helpers import TEST_BROKER_CONFIG
from tests.harness.broker import BrokerFactory
from tests.spark.helpers import (
    DriverLauncher,
    assert_one_copy,
    assert_succeeded,
    batch_spec,
    make_input,
)


def test_spark_writes_and_reads_through_mutual_tls_exactly_once(
    tmp_path: Path, broker_factory: BrokerFactory, tls_certs: TlsCerts, launcher: DriverLauncher
) -> None:
    broker = broker_factory(
        {**TEST_BROKER_CONFIG, **tls_certs.broker_keys(client_auth="required")}, name="tls"
    )
    security = {"brokers": broker.address, **tls_certs.client_keys(with_cert=True)}
    ids = make_input(tmp_path / "src", 4, 500)
    out = tmp_path / "read.parquet"
    spec = batch_spec(
        tmp_path / "src",
        "",
        "secured",
        sink_options=security,
        steps=[{"mode": "batch"}, {"mode": "read", "out": str(out)}],
    )
    run = launcher.start(spec)
    assert run.wait() == 0, run.describe()
    assert_succeeded(run)
    client = TlsSettings.from_values(tls_certs.client_keys(with_cert=True)).load(Side.CLIENT)
    assert_one_copy("", "secured", ids, brokers=broker.address, tls=client)
    read = pq.read_table(out).column("id").to_pylist()
    assert sorted(read) == sorted(ids)  # spark.read through TLS: each row once
