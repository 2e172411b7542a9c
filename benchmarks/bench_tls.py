"""The ``tls`` part of ``make bench-broker``: a broker's ingest under TLS against plaintext.

Two broker processes side by side, the same defaults, one with ``security.protocol=SSL``
(an EC P-256 certificate made for the run, ``tests/harness/tls.py``), the other plaintext;
the same producers and batches as the ``broker`` part (``bench_broker.run_producers``:
idempotent producers pipelining ~1 MB Arrow batches, every answer checked, each run's
log ends verified). Runs alternate between the two, ``--repeat`` times per producer
count; the medians count. ``tls_vs_plaintext_ratio`` is the TLS broker's MB/s over the
plaintext one's at the producer count where TLS does best (goal >= 0.8, docs/security.md).
The TLS handshake happens once per connection (before the timed phase: the admin
client's calls open it), so what is measured is the record encryption of the stream.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from benchmarks.bench_broker import Run, Server, run_producers, start_broker
from benchmarks.common import MB, print_table
from broker_core.security.tls import Side, TlsSettings
from tests.harness.tls import make_certs

TARGET_TLS_RATIO = 0.8


def tls_part(args: argparse.Namespace, batches: Sequence[pa.RecordBatch]) -> float:
    """Print the TLS-versus-plaintext table; the ratio (for the smoke test)."""
    counts = [int(c) for c in args.producers.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix=".bench-tls-", dir=args.dir))
    servers: list[Server] = []
    runs: dict[tuple[str, int], list[Run]] = {}
    try:
        certs = make_certs(workdir / "certs")
        keys = "".join(f"{k}={v}\n" for k, v in certs.broker_keys().items())
        plain = start_broker(workdir / "plain", "broker")
        servers.append(plain)
        tls = start_broker(workdir / "tls", "broker_tls", keys)
        servers.append(tls)
        client = TlsSettings.from_values(certs.client_keys()).load(Side.CLIENT)
        tls = replace(tls, tls=client)
        print()
        print(
            f"TLS (EC P-256, TLS 1.3) against plaintext: {args.mb:g} MB per run; "
            f"{args.repeat} runs each; cores: {os.cpu_count()}"
        )
        for producers in counts:
            for _ in range(args.repeat):
                for server in (plain, tls):
                    run = run_producers(server, producers, batches, args.mb)
                    runs.setdefault((server.name, producers), []).append(run)
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    def median(name: str, producers: int, what: str) -> float:
        values = runs[(name, producers)]
        if what == "mbps":
            return statistics.median(r.mbps for r in values)
        return statistics.median(r.per_gb(r.server_cpu) for r in values)

    best = 0.0
    table = []
    for producers in counts:
        plain_mbps = median("broker", producers, "mbps")
        tls_mbps = median("broker_tls", producers, "mbps")
        ratio = tls_mbps / plain_mbps
        best = max(best, ratio)
        cpu = [f"{median(n, producers, 'cpu'):.2f}" for n in ("broker", "broker_tls")]
        table.append((str(producers), f"{plain_mbps:.0f}", f"{tls_mbps:.0f}", f"{ratio:.2f}", *cpu))
    print_table(
        ["producers", "plain MB/s", "TLS MB/s", "ratio", "plain srv s/GB", "TLS srv s/GB"], table
    )
    verdict = "OK" if best >= TARGET_TLS_RATIO else "MISSED"
    print(f"target tls_vs_plaintext_ratio >= {TARGET_TLS_RATIO}: {verdict}")
    print(f"tls_vs_plaintext_ratio={best:.2f}")
    print(f"tls_batch_mb={batches[0].nbytes / MB:.2f}")
    return best
