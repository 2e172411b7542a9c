"""The layers of docs/architecture.md hold: imports flow one way and no module cycles.

The layer order itself is declared once, as import-linter contracts in pyproject.toml;
this test runs them, and separately looks for any import cycle between modules, inside
a layer too (a layers contract alone allows those)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker_core", "spark_sink", "jobs", "benchmarks", "testkit")


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles_between_modules() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert len(graph.modules) > 80, "the graph should cover the project's modules"
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for name in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(name)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.x")
    graph.add_import(importer="a.z", imported="a.x")
    assert _cycles(graph) == [["a.x", "a.y"]]


def test_layer_contracts_hold() -> None:
    assert importlib.util.find_spec("importlinter") is not None
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "Contracts:" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 0, result.stdout[-4000:]


_WITHOUT = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)")
        return None
sys.meta_path.insert(0, Block())
{body}
"""


def _run_without(blocked: set[str], body: str) -> subprocess.CompletedProcess[str]:
    code = _WITHOUT.format(blocked=blocked, body=body)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_the_producer_and_the_broker_import_without_spark_delta_or_matplotlib() -> None:
    body = (
        "import broker_core.producer, broker_core.server.process.broker, broker_core.cli.main\n"
        "from broker_core.producer import Producer\n"
        "print('imported', Producer.__name__)"
    )
    result = _run_without({"pyspark", "delta", "deltalake", "matplotlib"}, body)
    assert result.returncode == 0, result.stderr
    assert "imported Producer" in result.stdout


def test_the_blocker_blocks() -> None:
    result = _run_without({"pyspark"}, "import spark_sink.datasource")
    assert result.returncode != 0
    assert "blocked by the test" in result.stderr


def test_the_driver_side_paths_import_no_pandas_and_no_producer() -> None:
    """Spark runs the sink's planning and commit in Python processes on the driver
    (docs/spark.md): they import the data source and the writer, which must not drag in
    pandas, the producer or the .properties parser, none of which they use."""
    body = (
        "import sys\n"
        "import spark_sink.datasource, spark_sink.writer\n"
        "heavy = ('pandas', 'javaproperties', 'broker_core.producer.producer',\n"
        "         'broker_core.producer.sender', 'broker_core.producer.partitioner')\n"
        "print('loaded', [m for m in heavy if m in sys.modules])"
    )
    result = _run_without(set(), body)
    assert result.returncode == 0, result.stderr
    assert "loaded []" in result.stdout


def test_numeric_keys_are_routed_without_pandas() -> None:
    body = (
        "import numpy as np, pyarrow as pa\n"
        "from broker_core.producer import Producer\n"
        "from broker_core.producer.partitioner import Partitioner\n"
        "table = pa.table({'key': np.arange(1000) % 7, 'v': np.arange(1000)})\n"
        "parts = Partitioner().split(table, 'key', 4)\n"
        "print('rows', sum(p.batch.num_rows for p in parts))\n"
        "try:\n"
        "    Partitioner().split(pa.table({'key': ['a']}), 'key', 4)\n"
        "except Exception as exc:\n"
        "    print('strings:', type(exc).__name__, exc)\n"
    )
    result = _run_without({"pandas"}, body)
    assert result.returncode == 0, result.stderr
    assert "rows 1000" in result.stdout
    assert "strings: InvalidRequestError" in result.stdout and "pandas" in result.stdout
