"""What ZooKeeper ACLs cost (docs/security.md, Authentication and node ACLs): node creation
with and without ``zookeeper.set.acl``, and ``idemlog zookeeper set-acl`` over a tree.

On a real ZooKeeper (the tests' server: Debian's package, a free loopback port), through
the product's own code: ``zk_acl.create_async`` (one request in flight at a time, as a
broker creates a node) and ``zk_cmd.set_acls`` (the migration's walk). Prints a table and
the ``name=value`` lines; asserts nothing about time.

    python -m benchmarks.bench_zk_acl --nodes 2000 --repeat 4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from broker_core.cli.zk_cmd import set_acls
from broker_core.security import zk_acl
from broker_core.security.zk_acl import ZkAuth
from testkit.zookeeper import ZooKeeperServer

IDENTITY = {
    "zookeeper.auth.digest.username": "bench-brokers",
    "zookeeper.auth.digest.password": "bench-password",
}
PAYLOAD = b"x" * 300  # about a topic node of a few partitions


def _client(address: str, auth: ZkAuth, *, set_acl: bool) -> Any:
    client = KazooClient(hosts=address, timeout=10, **auth.kazoo_arguments(set_acl=set_acl))
    client.start(timeout=20)
    return client


def _create(client: Any, top: str, nodes: int) -> float:
    """Seconds to create ``nodes`` nodes under ``top`` one after the other."""
    zk_acl.ensure_path(client, top)
    started = time.perf_counter()
    for i in range(nodes):
        zk_acl.create_async(client, f"{top}/n{i:06d}", PAYLOAD).get(timeout=10)
    return time.perf_counter() - started


def _walk(client: Any, top: str) -> tuple[float, int, int]:
    started = time.perf_counter()
    result = set_acls(client, top, progress=lambda _line: None)
    return time.perf_counter() - started, result.walked, result.changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000, help="nodes per tree")
    parser.add_argument("--repeat", type=int, default=4, help="runs; the medians are shown")
    args = parser.parse_args()
    auth = ZkAuth.from_values(IDENTITY)
    rows: dict[str, list[float]] = {}

    def record(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    with tempfile.TemporaryDirectory(prefix="bench-zk-acl-") as tmp:
        server = ZooKeeperServer(Path(tmp) / "zk")
        server.start()
        try:
            for run in range(args.repeat):
                open_client = _client(server.address, auth, set_acl=False)
                secure_client = _client(server.address, auth, set_acl=True)
                try:
                    # Alternate which goes first: the server warms up during the first.
                    order = [("open ACL", open_client, "open"), ("set.acl", secure_client, "acl")]
                    for label, client, name in order[:: 1 if run % 2 == 0 else -1]:
                        record(f"create, {label}", _create(client, f"/{name}{run}", args.nodes))
                    seconds, walked, changed = _walk(secure_client, f"/open{run}")
                    assert changed == walked == args.nodes + 1, (walked, changed)
                    record("set-acl --secure (every node changed)", seconds)
                    seconds, walked, changed = _walk(secure_client, f"/open{run}")
                    assert changed == 0 and walked == args.nodes + 1, (walked, changed)
                    record("set-acl --secure again (none changed)", seconds)
                    seconds, _, changed = _walk(open_client, f"/open{run}")
                    assert changed == args.nodes + 1, changed
                    record("set-acl --unsecure", seconds)
                finally:
                    for client in (open_client, secure_client):
                        client.stop()
                        client.close()
        finally:
            server.stop()

    count = args.nodes
    print(f"{count} nodes of {len(PAYLOAD)} B, medians of {args.repeat} runs")
    print(f"| {'operation':<40} | {'s':>7} | {'nodes/s':>8} | {'ms/node':>7} |")
    print(f"|{'-' * 42}|{'-' * 9}|{'-' * 10}|{'-' * 9}|")
    for name, values in rows.items():
        median = statistics.median(values)
        print(
            f"| {name:<40} | {median:7.2f} | {count / median:8.0f} | {1000 * median / count:7.3f} |"
        )
    open_s = statistics.median(rows["create, open ACL"])
    acl_s = statistics.median(rows["create, set.acl"])
    print(f"zk_acl_create_ratio={acl_s / open_s:.2f}")
    secure_s = statistics.median(rows["set-acl --secure (every node changed)"])
    print(f"zk_set_acl_nodes_per_s={count / secure_s:.0f}")


if __name__ == "__main__":
    main()
