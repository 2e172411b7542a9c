"""What SASL (SCRAM) costs a client and a broker: ``python -m benchmarks.bench_sasl``.

Two broker processes on loopback, started the same way, one PLAINTEXT and one
SASL_PLAINTEXT (a user with both mechanisms at 4096 iterations): the time of one
handshake per mechanism (a new connection each: SCRAM's PBKDF2 on both sides plus three
round trips), then METADATA calls per second on one connection and pipelined produce
(~1 MB batches, 5 in flight, one idempotent producer) on each broker, interleaved, so the
ratio compares like with like. Prints a table and ``name=value`` lines; asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.broker_process import REPO, TOPIC, Server, build_batches, produce, spawn
from benchmarks.common import MB, metadata_calls_per_s, print_table
from benchmarks.data import SCHEMA
from broker_core.client.broker_client import BrokerClient
from broker_core.client.connections import FlightConnections
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.scram import Mechanism

USER, PASSWORD = "bench", "bench-password"
CLI = [sys.executable, "-m", "broker_core.cli.main"]


def start(directory: Path, sasl: bool, tls: Mapping[str, str] | None = None) -> Server:
    """A broker on ``directory`` with user ``USER`` when ``sasl``; ``tls``: its TLS keys
    (``testkit/tls.py``'s ``broker_keys()``), which make it SSL or SASL_SSL."""
    directory.mkdir(parents=True)
    data = directory / "data"
    data.mkdir()
    lines = ["listener.port=0", f"log.dir={data}"]
    lines += [f"{k}={v}" for k, v in (tls or {}).items() if k != "security.protocol"]
    protocol = {(False, False): "PLAINTEXT", (True, False): "SASL_PLAINTEXT"}
    protocol.update({(False, True): "SSL", (True, True): "SASL_SSL"})
    lines.append(f"security.protocol={protocol[(sasl, tls is not None)]}")
    if sasl:
        subprocess.run(
            [*CLI, "users", "add", USER, "--data-dir", str(data), "--password-file", "-"],
            input=PASSWORD + "\n",
            text=True,
            check=True,
            capture_output=True,
            cwd=REPO,
        )
    config = directory / "broker.properties"
    config.write_text("\n".join(lines) + "\n")
    command = [*CLI, "broker", "start"]
    return spawn(directory.name, [*command, "--config", str(config)], directory / "broker.log")


def handshake_ms(address: str, mechanism: Mechanism, count: int) -> list[float]:
    times = []
    for _ in range(count):
        connections = FlightConnections(sasl=SaslCredentials(mechanism, USER, PASSWORD))
        started = time.perf_counter()
        connections.get(address)
        times.append((time.perf_counter() - started) * 1000)
        connections.close()
    return times


def actions_per_s(address: str, sasl: SaslCredentials | None, seconds: float) -> float:
    with BrokerClient(address, sasl=sasl) as client:
        return metadata_calls_per_s(client, address, seconds)


def produce_mbps(address: str, sasl: SaslCredentials | None, total_mb: float) -> float:
    batches = build_batches()
    count = max(5, round(total_mb * MB / batches[0].nbytes))
    with BrokerClient(address, sasl=sasl) as admin:
        admin.create_topic(TOPIC, 1, schema=SCHEMA)
        pid = admin.init_producer_id()[0]
        connections = FlightConnections(sasl=sasl)
        errors: list[BaseException] = []
        started = time.perf_counter()
        worker = threading.Thread(
            target=produce,
            args=(connections.get(address), 0, pid, batches, count, errors, admin.producer_tokens),
        )
        worker.start()
        worker.join()
        elapsed = time.perf_counter() - started
        connections.close()
        if errors:
            raise SystemExit(f"produce to {address} failed: {errors[0]!r}")
        admin.delete_topic(TOPIC)
    return float(count * batches[0].nbytes / MB / elapsed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handshakes", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=3.0, help="per METADATA run")
    parser.add_argument("--mb", type=float, default=300.0, help="per produce run")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-sasl-", dir=REPO))
    plain = sasl_server = None
    try:
        plain = start(workdir / "plain", sasl=False)
        sasl_server = start(workdir / "sasl", sasl=True)
        creds = SaslCredentials(Mechanism.SCRAM_SHA_512, USER, PASSWORD)
        rows: list[tuple[str, str, str]] = []
        figures: dict[str, float] = {}
        for mechanism in Mechanism:
            times = handshake_ms(sasl_server.address, mechanism, args.handshakes)
            key = mechanism.sasl_name.lower().replace("-", "_")
            figures[f"handshake_{key}_p50_ms"] = statistics.median(times)
            rows.append(
                (f"handshake {mechanism.sasl_name}", "-", f"{statistics.median(times):.1f} ms")
            )
        plain_calls, sasl_calls, plain_mb, sasl_mb = [], [], [], []
        for _ in range(args.repeat):  # interleaved: the machine's load falls on both alike
            plain_calls.append(actions_per_s(plain.address, None, args.seconds))
            sasl_calls.append(actions_per_s(sasl_server.address, creds, args.seconds))
            plain_mb.append(produce_mbps(plain.address, None, args.mb))
            sasl_mb.append(produce_mbps(sasl_server.address, creds, args.mb))
        pc, sc = statistics.median(plain_calls), statistics.median(sasl_calls)
        pm, sm = statistics.median(plain_mb), statistics.median(sasl_mb)
        rows.append(("METADATA calls/s", f"{pc:.0f}", f"{sc:.0f}"))
        rows.append(("produce MB/s (1 producer)", f"{pm:.0f}", f"{sm:.0f}"))
        figures.update(
            {
                "sasl_vs_plaintext_action_ratio": sc / pc,
                "sasl_vs_plaintext_produce_ratio": sm / pm,
            }
        )
        print_table(["", "PLAINTEXT", "SASL_PLAINTEXT"], rows)
        for name, value in figures.items():
            print(f"{name}={value:.3f}")
    finally:
        for server in (plain, sasl_server):
            if server is not None:
                server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
