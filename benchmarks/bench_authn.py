"""What the certificate handshake and the embedded token cost: ``python -m
benchmarks.bench_authn``.

Four broker processes on loopback, started alike: ``SSL`` without client certificates and
``SSL`` with ``ssl.client.auth=required`` (every connection then runs the certificate
handshake, docs/security.md "Principals from certificates"); ``PLAINTEXT`` without and
with ``listener.token.file`` (the embedded broker's per-start token, checked on every
call). Measured: a new connection's first METADATA call (TLS set-up, plus the handshake
under mutual TLS) and METADATA calls per second on one connection, interleaved so the
ratios compare like with like. Prints a table and ``name=value`` lines; asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.broker_process import REPO, Server, spawn
from benchmarks.common import metadata_calls_per_s
from broker_core.client.broker_client import BrokerClient
from broker_core.client.connections import FlightConnections
from broker_core.protocol.wire import Action
from broker_core.security.local_token import register
from broker_core.security.tls import Side, TlsMaterial, TlsSettings
from testkit.tls import TlsCerts, make_certs

CLI = [sys.executable, "-m", "broker_core.cli.main"]


def start(directory: Path, name: str, keys: dict[str, str]) -> Server:
    directory.mkdir(parents=True)
    data = directory / "data"
    lines = ["listener.port=0", f"log.dir={data}", *(f"{k}={v}" for k, v in keys.items())]
    config = directory / "broker.properties"
    config.write_text("\n".join(lines) + "\n")
    return spawn(name, [*CLI, "broker", "start", "--config", str(config)], directory / "log")


def connect_ms(address: str, tls: TlsMaterial, count: int) -> list[float]:
    """A new connection's first METADATA call, ``count`` times."""
    times = []
    for _ in range(count):
        connections = FlightConnections(tls)
        started = time.perf_counter()
        connections.action(address, Action.METADATA.value, b"{}", 10.0, "metadata")
        times.append((time.perf_counter() - started) * 1000)
        connections.close()
    return times


def actions_per_s(address: str, tls: TlsMaterial, seconds: float) -> float:
    with BrokerClient(address, tls=tls) as client:
        return metadata_calls_per_s(client, address, seconds)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=3.0, help="per METADATA run")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-authn-", dir=REPO))
    servers: dict[str, Server] = {}
    try:
        certs: TlsCerts = make_certs(workdir / "certs")
        token = workdir / "broker.token"
        servers["SSL"] = start(workdir / "ssl", "ssl", certs.broker_keys())
        servers["mTLS"] = start(workdir / "mtls", "mtls", certs.broker_keys(client_auth="required"))
        servers["PLAINTEXT"] = start(workdir / "plain", "plain", {})
        servers["token"] = start(workdir / "token", "token", {"listener.token.file": str(token)})
        register(servers["token"].address, str(token))
        client = TlsSettings.from_values(certs.client_keys(with_cert=True)).load(Side.CLIENT)
        plain = TlsSettings().load(Side.CLIENT)
        tls = {"SSL": client, "mTLS": client, "PLAINTEXT": plain, "token": plain}
        connect: dict[str, list[float]] = {name: [] for name in servers}
        calls: dict[str, list[float]] = {name: [] for name in servers}
        for _ in range(args.repeat):  # interleaved: the machine's load falls on all alike
            for name, server in servers.items():
                connect[name].extend(connect_ms(server.address, tls[name], args.connections))
                calls[name].append(actions_per_s(server.address, tls[name], args.seconds))
        connect_p50 = {n: statistics.median(t) for n, t in connect.items()}
        calls_p50 = {n: statistics.median(c) for n, c in calls.items()}
        print(f"{'':30} {'first call p50 (ms)':>20} {'METADATA calls/s':>18}")
        for name in servers:
            print(f"{name:30} {connect_p50[name]:>20.2f} {calls_p50[name]:>18.0f}")
        figures = {
            "mtls_connect_p50_ms": connect_p50["mTLS"],
            "ssl_connect_p50_ms": connect_p50["SSL"],
            "mtls_vs_ssl_action_ratio": calls_p50["mTLS"] / calls_p50["SSL"],
            "token_vs_plaintext_action_ratio": calls_p50["token"] / calls_p50["PLAINTEXT"],
        }
        for name, value in figures.items():
            print(f"{name}={value:.3f}")
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
