"""The ``tls`` part of ``make bench-spark``: ``df.write.format("idemlog")`` into a broker
with TLS and SCRAM (``SASL_SSL``, SCRAM-SHA-256) against a plaintext broker, in one run.

Two broker processes side by side on the default configuration (``bench_sasl.start``; the
certificates are made for the run by ``testkit/tls.py``, as bench-broker's ``tls``
part does: an EC P-256 CA and broker certificate), both reached through the ``brokers``
option. The same DataFrame (``spark_workload.source``) is written to a new topic on each,
alternately, ``--repeats`` times after one warm-up write each, so the load of this shared
machine hits both alike; every run's log is checked (all rows, nothing open). The medians
count: ``tls_vs_plaintext_ratio`` is the plaintext write's seconds over the TLS one's (its
throughput over plaintext's; goal >= 0.8, docs/security.md). The TLS handshake and the
SCRAM exchange happen once per connection, and every Spark process keeps its connections
(``spark_sink/connections.py``), so what is measured is mostly the records' encryption.

    python -m benchmarks.spark_tls [--rows 20000000] [--repeats 3]   # this part alone
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from benchmarks.bench_sasl import PASSWORD, USER, start
from benchmarks.broker_process import Server
from benchmarks.common import print_table, verdict
from benchmarks.spark_workload import parse_sizes, source
from broker_core.client.broker_client import BrokerClient
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.scram import Mechanism
from broker_core.security.tls import Side, TlsSettings
from spark_sink import local_session
from testkit.tls import make_certs

TARGET_TLS_RATIO = 0.8
MECHANISM = Mechanism.SCRAM_SHA_256.sasl_name


class _Target:
    """One broker and the options (and admin client) that reach it."""

    def __init__(self, server: Server, options: dict[str, str], client: BrokerClient) -> None:
        self.server, self.options, self.client = server, options, client
        self.seconds: list[float] = []

    def write(self, df: DataFrame, rows: int) -> float:
        topic = f"bench-spark-tls-{uuid.uuid4().hex[:12]}"
        writer = df.write.format("idemlog").mode("append").option("topic", topic)
        for key, value in {**self.options, "key": "key"}.items():
            writer = writer.option(key, value)
        started = time.perf_counter()
        writer.save()
        elapsed = time.perf_counter() - started
        partitions = len(self.client.describe_topics([topic])[0].partitions)
        offsets = [self.client.list_offsets(topic, p) for p in range(partitions)]
        end = sum(o["log_end_offset"] for o in offsets)
        stable = sum(o["last_stable_offset"] for o in offsets)
        if not rows < end <= rows + df.rdd.getNumPartitions() * partitions or stable != end:
            raise SystemExit(f"{self.server.name} topic {topic}: log end {end}, stable {stable}")
        self.client.delete_topic(topic)
        return elapsed


def tls_part(spark: SparkSession, df: DataFrame, rows: int, repeats: int, scratch: Path) -> float:
    """Print the TLS + SCRAM against plaintext table; the ratio."""
    workdir = Path(tempfile.mkdtemp(prefix=".bench-spark-tls-", dir=scratch))
    servers: list[Server] = []
    targets: list[_Target] = []
    try:
        certs = make_certs(workdir / "certs")
        plain = start(workdir / "plaintext", sasl=False)
        servers.append(plain)
        secure = start(workdir / "tls_scram", sasl=True, tls=certs.broker_keys())
        servers.append(secure)
        client_tls = certs.client_keys()
        sasl = {"sasl.mechanism": MECHANISM, "sasl.username": USER, "sasl.password": PASSWORD}
        material = TlsSettings.from_values(client_tls).load(Side.CLIENT)
        targets.append(_Target(plain, {"brokers": plain.address}, BrokerClient(plain.address)))
        secure_client = BrokerClient(
            secure.address,
            tls=material,
            sasl=SaslCredentials(Mechanism.SCRAM_SHA_256, USER, PASSWORD),
        )
        options = {"brokers": secure.address, **client_tls, "security.protocol": "SASL_SSL"}
        targets.append(_Target(secure, {**options, **sasl}, secure_client))
        warm = df.limit(10_000)
        for target in targets:
            target.write(warm, 10_000)
        for round_ in range(repeats):
            for target in targets:
                target.seconds.append(target.write(df, rows))
                print(
                    f"  tls round {round_ + 1} {target.server.name}: "
                    f"{target.seconds[-1]:.2f}s = {rows / target.seconds[-1]:,.0f} rows/s",
                    flush=True,
                )
    finally:
        for target in targets:
            target.client.close()
        for server in servers:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    plain_s, tls_s = (statistics.median(t.seconds) for t in targets)
    ratio = plain_s / tls_s
    print(
        f"\nTLS 1.3 (EC P-256) + {MECHANISM} against plaintext, df.write of {rows} rows "
        f"through 'brokers', median of {repeats} interleaved runs"
    )
    table = [
        (t.server.name, f"{s:.2f}", f"{rows / s:,.0f}", " ".join(f"{x:.2f}" for x in t.seconds))
        for t, s in zip(targets, (plain_s, tls_s), strict=True)
    ]
    print_table(["broker", "seconds", "rows/s", "runs (s)"], table)
    return ratio


def main(argv: Sequence[str] | None = None) -> int:
    """This part alone (``make bench-spark`` runs it between its batch and stream parts)."""

    args = parse_sizes(__doc__, argv)
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="bench-spark-tls-"))
    scratch.mkdir(parents=True, exist_ok=True)
    spark = local_session("bench-spark-tls", cores=2, max_failures=1, quiet=True)
    try:
        ratio = tls_part(spark, source(spark, args.rows), args.rows, args.repeats, scratch)
    finally:
        spark.stop()
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"tls_vs_plaintext_ratio={ratio:.2f}")
    print(f"# {verdict(ratio >= TARGET_TLS_RATIO)} the target tls_vs_plaintext_ratio >= 0.8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
