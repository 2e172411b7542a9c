"""Every ``make bench-*`` target, ``make demo-store`` and ``make demo-cluster``, run as a
user runs them, at a smoke size: the Makefile's paths, the jar fetches, each benchmark's
checks of what it wrote and its closing ``name=value`` lines all work from a clone.

Sizes are tiny, so the figures mean nothing here: a benchmark's numbers are read from a
real run (benchmarks/README.md), never asserted. What is asserted is that the run
finished, checked its own results (every benchmark exits non-zero when its read-back or
log-end check fails) and printed the lines that report it.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# target -> (make variables, the name=value lines it must print)
SMOKE: dict[str, tuple[list[str], list[str]]] = {
    "bench-store": (
        ["BENCH_ARGS=--gb 0.02 --repeat 1"],
        ["store_vs_raw_ratio", "validator_us_per_batch"],
    ),
    "bench-broker": (
        ["BENCH_ARGS=--mb 20 --repeat 1 --producers 1,4 --failovers 2"],
        [
            "broker_vs_transport_ratio",
            "tls_vs_plaintext_ratio",
            "init_producer_id_per_s",
            "replicated_rf3_vs_rf1_ratio",
            "replicated_rf3_ack_p99_ms",
            "failover_leader_visible_p50_s",
            "failover_writes_resumed_p50_s",
        ],
    ),
    "bench-producer": (["ROWS=100000"], ["producer_vs_bare_ratio"]),
    "bench-task-write": (
        ["BENCH_ARGS=--rows 200000 --repeats 1"],
        ["task_idemlog_cpu_s_per_10m", "task_idemlog_rows_per_s"],
    ),
    "bench-spark": (
        ["ROWS=100000", "BENCH_ARGS=--repeats 1 --stream-batches 2 --stream-rows 10000"],
        [
            "idemlog_vs_discard_ratio",
            "microbatch_idemlog_vs_discard_ratio",
            "tls_vs_plaintext_ratio",
        ],
    ),
    "bench-microbatch": (
        ["BENCH_ARGS=--batches 3 --rows 10000"],
        ["microbatch_idemlog_vs_discard_ratio", "trace_spans", "write_jobs"],
    ),
    "bench-workers": (
        ["BENCH_ARGS=--rows 4000 --runs 1 --rounds 1"],
        ["workers_read_wall_ratio", "workers_write_wall_ratio"],
    ),
    "bench-commit": (
        ["BENCH_ARGS=--tasks 2 --partitions 1,3 --commits 2 --warmup 1"],
        ["commit_p50_ms_2x1", "commit_p95_ms_2x3"],
    ),
    "bench-writeback": (
        ["BENCH_ARGS=--rows 40000 --repeats 1"],
        [
            "writeback_on_vs_off_batch",
            "writeback_on_vs_discard_batch",
            "writeback_commit_ms_on",
            "writeback_commit_ms_off",
        ],
    ),
    "bench-peers": (
        ["BENCH_ARGS=--rows 100000 --repeats 1 --stream-batches 2 --stream-rows 10000"],
        [
            "idemlog_vs_kafka_sink",
            "idemlog_stream_vs_kafka_sink",
            "discard_stream_vs_kafka_sink",
            "idemlog_broker_vs_kafka_broker",
            "idemlog_vs_discard_batch",
            "idemlog_vs_discard_stream",
            "idemlog_read_vs_kafka_source",
            "idemlog_read_vs_delta",
            "idemlog_read_stream_vs_kafka_source",
            "idemlog_read_vs_python_floor",
            "python_floor_read_vs_delta",
            "jvm_columnar_read_vs_delta",
        ],
    ),
    "bench-metrics": (
        ["BENCH_ARGS=--producers 2000 --create-seconds 30 --repeat 3"],
        ["default_doc_size_ratio", "default_doc_time_ratio", "producers_large"],
    ),
    "bench-kafka": (
        ["BENCH_ARGS=--rows 20000 --rounds 1 --partitions 2"],
        ["kafka_produce_vs_kafka_broker", "kafka_consume_vs_kafka_broker"],
    ),
    "bench-kafka-records": (
        ["BENCH_ARGS=--rows 20000 --repeats 1 --peer-rows 2000"],
        [
            "kafka_encode_records_per_s",
            "kafka_decode_records_per_s",
            "kafka_encode_fetch_records_per_s",
            "kafka_decode_requests_records_per_s",
        ],
    ),
    "bench-soak": (
        ["BENCH_ARGS=--batches 40 --jobs 4"],
        [
            "soak_state_bytes_growth",
            "soak_load_s_growth",
            "soak_rss_growth",
            "soak_commit_p50_growth",
        ],
    ),
    "bench-cluster": (
        ["BENCH_ARGS=--rows 40000 --files 4 --repeats 1"],
        ["cluster_1_worker_rows_per_s", "cluster_2_workers_rows_per_s"],
    ),
}


def _make(target: str, variables: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["TMPDIR"] = str(tmp_path)  # scratch directories land here and go with it
    return subprocess.run(
        ["make", "--no-print-directory", target, *variables],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def _values(stdout: str) -> dict[str, float]:
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^([a-z_0-9]+)=([-+0-9.eE]+|nan|inf)$", stdout, re.MULTILINE)
    }


@pytest.mark.slow
@pytest.mark.parametrize("target", list(SMOKE))
def test_benchmark_target_runs_at_smoke_size(target: str, tmp_path: Path) -> None:
    variables, lines = SMOKE[target]
    result = _make(target, variables, tmp_path)
    tail = (result.stdout[-3000:] + "\n--- stderr ---\n" + result.stderr[-3000:]).strip()
    assert result.returncode == 0, f"make {target} failed:\n{tail}"
    values = _values(result.stdout)
    missing = [name for name in lines if name not in values]
    assert not missing, f"make {target} printed no {missing}:\n{tail}"
    assert all(values[name] > 0 for name in lines), {n: values[n] for n in lines}


@pytest.mark.slow
def test_chaos_target_runs_one_seed(tmp_path: Path) -> None:
    """``make chaos`` runs its seeds outside the suite and ends with its one summary line."""
    result = _make("chaos", ["SEEDS=1", f"CHAOS_ARGS=--steps 2 --dir {tmp_path}"], tmp_path)
    tail = (result.stdout[-3000:] + "\n--- stderr ---\n" + result.stderr[-3000:]).strip()
    assert result.returncode == 0, f"make chaos failed:\n{tail}"
    last = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"chaos seeds=1 failed=0 passed=1 seconds=\d+ failed_seeds=-", last), tail
    assert (tmp_path / "seed-1.log").read_text().count(" passed") == 1, tail


@pytest.mark.slow
def test_demo_store_target(tmp_path: Path) -> None:
    result = _make("demo-store", [], tmp_path)
    tail = (result.stdout[-3000:] + "\n--- stderr ---\n" + result.stderr[-3000:]).strip()
    assert result.returncode == 0, f"make demo-store failed:\n{tail}"
    assert "exactly_once=OK" in result.stdout, tail


@pytest.mark.slow
def test_demo_cluster_target(tmp_path: Path) -> None:
    """``make demo-cluster`` at a small size: its faults fired and every row is there once."""
    result = _make("demo-cluster", ["DEMO_ARGS=--files 5 --rows 5000"], tmp_path)
    tail = (result.stdout[-4000:] + "\n--- stderr ---\n" + result.stderr[-3000:]).strip()
    assert result.returncode == 0, f"make demo-cluster failed:\n{tail}"
    assert "exactly_once=OK rows_expected=25000 rows_committed=25000" in result.stdout, tail
    for fault in ("SIGKILL of the executor JVM", "off the network for", "restarting from the"):
        assert fault in result.stdout, f"{fault!r} did not happen:\n{tail}"
