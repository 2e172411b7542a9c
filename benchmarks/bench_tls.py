"""The ``tls`` part of ``make bench-broker``: a broker's ingest under TLS against plaintext.

Two broker processes side by side, the same defaults, one with ``security.protocol=SSL``
(an EC P-256 certificate made for the run, ``testkit/tls.py``), the other plaintext;
the same producers and batches as the ``broker`` part (``broker_process.run_producers``:
idempotent producers pipelining ~1 MB Arrow batches, every answer checked, each run's
log ends verified). Runs alternate between the two, ``--repeat`` times per producer
count; the medians count. ``tls_vs_plaintext_ratio`` is the TLS broker's MB/s over the
plaintext one's at the producer count where TLS does best (goal >= 0.8, docs/security.md).
The TLS handshake happens once per connection (before the timed phase: the admin
client's calls open it), so what is measured is the record encryption of the stream.

On a shared machine MB/s swings from run to run; CPU seconds per GB do much less, so the
part also prints two ratios of CPU cost (plaintext's over TLS's, at the same producer
count): ``tls_cpu_ratio`` (broker and producers together: the ceiling of the MB/s ratio
when both share the cores, as here) and ``tls_broker_cpu_ratio`` (the broker alone: the
ceiling when producers run on other hosts and the broker is CPU-bound).

The suite each TLS broker negotiates is printed (``tls_suite``), as a client of the same
OpenSSL defaults gets it (Python's ``ssl``: TLS 1.3's suite order is OpenSSL's default,
AES-256-GCM first, the order the Flight client offers too; the broker takes the client's
first suite it supports). ``--suites aes128,chacha20`` adds one TLS broker per named
suite, each limited to it by an OpenSSL configuration file in its environment
(``OPENSSL_CONF``, the ``Ciphersuites`` command of its ``system_default`` section, which
the OpenSSL built into pyarrow's gRPC reads): a benchmark-only way to compare suites,
since neither Flight nor gRPC offers a TLS 1.3 suite option (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import ssl
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from benchmarks.broker_process import Run, Server, run_producers, start_broker
from benchmarks.common import MB, print_table
from broker_core.security.tls import Side, TlsSettings, split_address
from testkit.tls import make_certs

TARGET_TLS_RATIO = 0.8
PLAIN = "broker"
DEFAULT_TLS = "broker_tls"
# --suites names -> the TLS 1.3 suite a broker is limited to
SUITES = {
    "aes128": "TLS_AES_128_GCM_SHA256",
    "aes256": "TLS_AES_256_GCM_SHA384",
    "chacha20": "TLS_CHACHA20_POLY1305_SHA256",
}
_OPENSSL_CONF = """openssl_conf = openssl_init
[openssl_init]
ssl_conf = ssl_section
[ssl_section]
system_default = system_default_section
[system_default_section]
Ciphersuites = {suite}
"""


def negotiated(address: str, ca: Path) -> str:
    """The TLS version and suite a client with OpenSSL's default order gets from
    ``address`` (ALPN h2, as gRPC), e.g. ``TLSv1.3/TLS_AES_256_GCM_SHA384``."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    host, port = split_address(address)
    with (
        socket.create_connection((host, port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as link,
    ):
        cipher = link.cipher()
        assert cipher is not None  # a finished handshake always has one
        return f"{link.version()}/{cipher[0]}"


def suite_env(workdir: Path, name: str) -> dict[str, str]:
    """The environment of a broker limited to the TLS 1.3 suite ``SUITES[name]``."""
    if name not in SUITES:
        raise SystemExit(f"--suites: {name!r} is not one of {', '.join(SUITES)}")
    conf = workdir / f"openssl-{name}.cnf"
    conf.write_text(_OPENSSL_CONF.format(suite=SUITES[name]))
    return {**os.environ, "OPENSSL_CONF": str(conf)}


def tls_part(args: argparse.Namespace, batches: Sequence[pa.RecordBatch]) -> float:
    """Print the TLS-versus-plaintext table; the ratio (for the smoke test)."""
    counts = [int(c) for c in args.producers.split(",")]
    suites = [s for s in args.suites.split(",") if s]
    workdir = Path(tempfile.mkdtemp(prefix=".bench-tls-", dir=args.dir))
    servers: list[Server] = []
    runs: dict[tuple[str, int], list[Run]] = {}
    suite_of: dict[str, str] = {}
    try:
        certs = make_certs(workdir / "certs")
        keys = "".join(f"{k}={v}\n" for k, v in certs.broker_keys().items())
        client = TlsSettings.from_values(certs.client_keys()).load(Side.CLIENT)
        servers.append(start_broker(workdir / "plain", PLAIN))
        wanted = {DEFAULT_TLS: None, **{f"tls_{s}": s for s in suites}}
        for name, suite in wanted.items():
            env = suite_env(workdir, suite) if suite else None
            server = start_broker(workdir / name, name, keys, env)
            servers.append(replace(server, tls=client))
            suite_of[name] = negotiated(server.address, certs.ca)
            if suite and not suite_of[name].endswith(SUITES[suite]):
                raise SystemExit(f"{name} negotiated {suite_of[name]}, not {SUITES[suite]}")
        print()
        print(
            f"TLS (EC P-256) against plaintext: {args.mb:g} MB per run; "
            f"{args.repeat} runs each; cores: {os.cpu_count()}; "
            + "; ".join(f"{n}: {s}" for n, s in suite_of.items())
        )
        for producers in counts:
            for _ in range(args.repeat):
                for server in servers:
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
        if what == "server":
            return statistics.median(r.per_gb(r.server_cpu) for r in values)
        if what == "client":
            return statistics.median(r.per_gb(r.client_cpu) for r in values)
        return statistics.median(r.per_gb(r.server_cpu + r.client_cpu) for r in values)

    best, best_count = 0.0, counts[0]
    table = []
    for producers in counts:
        plain_mbps = median(PLAIN, producers, "mbps")
        for server in servers:
            mbps = median(server.name, producers, "mbps")
            ratio = mbps / plain_mbps
            if server.name == DEFAULT_TLS and ratio > best:
                best, best_count = ratio, producers
            table.append(
                (
                    f"{producers} {server.name}",
                    f"{mbps:.0f}",
                    f"{ratio:.2f}",
                    *(f"{median(server.name, producers, w):.2f}" for w in ("server", "client")),
                    f"{median(server.name, producers, 'both'):.2f}",
                )
            )
    print_table(
        ["producers server", "MB/s", "vs plain", "srv s/GB", "client s/GB", "both s/GB"], table
    )
    verdict = "OK" if best >= TARGET_TLS_RATIO else "MISSED"
    cpu_ratio = median(PLAIN, best_count, "both") / median(DEFAULT_TLS, best_count, "both")
    broker_ratio = median(PLAIN, best_count, "server") / median(DEFAULT_TLS, best_count, "server")
    print(f"target tls_vs_plaintext_ratio >= {TARGET_TLS_RATIO}: {verdict}")
    print(f"tls_vs_plaintext_ratio={best:.2f}")
    print(f"tls_cpu_ratio={cpu_ratio:.2f}")
    print(f"tls_broker_cpu_ratio={broker_ratio:.2f}")
    print(f"tls_suite={suite_of[DEFAULT_TLS]}")
    print(f"tls_batch_mb={batches[0].nbytes / MB:.2f}")
    return best
