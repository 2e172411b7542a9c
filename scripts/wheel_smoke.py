"""The wheel smoke: build the wheel, install it with ``[spark]`` into a fresh virtualenv in a
temporary directory outside the checkout, and use it as a user would.

    python scripts/wheel_smoke.py [--wheel DIST/idemlog-*.whl] [--keep] [--notebook-out FILE]

(``make wheel-smoke``; ``tests/packaging/test_wheel.py`` runs it inside ``make test``.) Only the
standard library is used here; everything idemlog runs inside the new virtualenv, from the
temporary directory, with ``PYTHONPATH`` unset, so nothing can be imported from the checkout
(step 2 checks where the modules come from). Steps, each logged with its duration:

1. ``python -m build`` (unless ``--wheel`` names a wheel);
2. ``python -m venv`` and ``pip install --no-compile <wheel>[spark]`` (pip's cache may
   serve the downloads); ``broker_core``, ``spark_sink`` and ``pyspark`` import from the venv and no
   top-level ``jobs`` is installed;
3. ``idemlog --version`` prints the wheel's version;
4. ``idemlog broker start`` (embedded mode: a ``log.dir``, no ZooKeeper) until its
   ``LISTENING`` line; ``idemlog topics create``;
5. rows produced with ``broker_core.producer.Producer``, read back with ``idemlog consume``
   (``--from-beginning --timeout-ms``: every record, then exit);
6. the broker stopped with SIGTERM (exit 0);
7. one Spark ``df.write.format("idemlog")`` through the embedded default broker
   (``~/.idemlog/embedded`` under a temporary ``HOME``) and the rows read back;
8. ``idemlog export delta`` of those rows into a Delta table (Delta's jars through
   ``spark.jars.packages``, as an installed wheel has no ``jars/``), read back with
   ``deltalake`` (no JVM);
9. the notebook (``notebooks/dedup_metrics.ipynb``, copied out of the checkout as a user
   downloads it) with ``[notebook]`` installed, run headless on the venv's Jupyter kernel
   (nbclient) from an empty directory: its stream, exactly-once check, metrics table and
   five plots import only what the wheel installed (``--notebook-out`` writes it executed,
   for ``tests/packaging/test_wheel.py`` to check its figures and that no cell shows a
   stack trace).

Exit status 0 when every step passed, 1 (with the failing step and its output) otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEP_TIMEOUT_S = 600.0  # the install may download pyspark (300+ MB) without a cache
BROKER_START_S = 60.0
ROWS = 1000
SPARK_ROWS = 200
NOTEBOOK = REPO / "notebooks" / "dedup_metrics.ipynb"
NOTEBOOK_IMAGES = 5  # the notebook's plots


class SmokeFailed(Exception):
    """A step's check failed; the message names the step and what was seen."""


def log(line: str) -> None:
    print(f"wheel-smoke {time.strftime('%H:%M:%S')} {line}", flush=True)


class Smoke:
    def __init__(self, work: Path, python: str) -> None:
        self.work = work
        self.python = python
        self.venv = work / "venv"
        self.bin = self.venv / "bin"
        # The user's environment minus anything pointing into the checkout.
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self.env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    def run(
        self, what: str, args: Sequence[str], *, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``args`` in the work directory; raise SmokeFailed unless it exits 0."""
        started = time.monotonic()
        done = subprocess.run(
            list(args),
            cwd=self.work,
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_S,
            check=False,
        )
        log(f"{what}: exit {done.returncode} in {time.monotonic() - started:.1f} s")
        if done.returncode != 0:
            raise SmokeFailed(
                f"{what}: exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n"
                f"{done.stderr}"
            )
        return done

    def py(self, what: str, code: str, *args: str, env: dict[str, str] | None = None) -> str:
        return self.run(what, [str(self.bin / "python"), "-c", code, *args], env=env).stdout

    # -- steps ----------------------------------------------------------------------------
    def build(self) -> Path:
        out = self.work / "dist"
        self.run("build", [self.python, "-m", "build", "--outdir", str(out), str(REPO)])
        (wheel,) = out.glob("idemlog-*-py3-none-any.whl")
        return wheel

    def install(self, wheel: Path) -> None:
        self.run("venv", [self.python, "-m", "venv", str(self.venv)])
        # --no-compile: byte-compiling pyspark, pyarrow, pandas and numpy whole (about 12 s
        # of CPU) is not what is checked; what the steps import is compiled as they do.
        install = [str(self.bin / "pip"), "install", "-q", "--no-compile", f"{wheel}[spark]"]
        self.run("pip install", install)
        where = json.loads(
            self.py(
                "imports",
                "import json, importlib.util, broker_core, spark_sink, pyspark\n"
                "print(json.dumps({'broker_core': broker_core.__file__,"
                " 'spark_sink': spark_sink.__file__, 'pyspark': pyspark.__file__,"
                " 'jobs': importlib.util.find_spec('jobs') is not None}))",
            )
        )
        log(f"imported from {where}")
        for name in ("broker_core", "spark_sink", "pyspark"):
            if not Path(where[name]).resolve().is_relative_to(self.venv.resolve()):
                raise SmokeFailed(f"{name} was imported from {where[name]}, not from the venv")
        if where["jobs"]:
            raise SmokeFailed("a top-level package `jobs` is importable in the fresh venv")

    def version(self, wheel: Path) -> None:
        out = self.run("idemlog --version", [str(self.bin / "idemlog"), "--version"]).stdout
        expected = wheel.name.split("-")[1]
        if out.strip() != f"idemlog {expected}":
            raise SmokeFailed(f"idemlog --version printed {out.strip()!r}, not idemlog {expected}")

    def broker(self) -> subprocess.Popen[str]:
        config = self.work / "broker.properties"
        config.write_text(
            "broker.id=0\nlistener.host=127.0.0.1\nlistener.port=0\n"
            f"log.dir={self.work / 'broker-data'}\nzookeeper.connect=\n",
            encoding="utf-8",
        )
        return subprocess.Popen(
            [str(self.bin / "idemlog"), "broker", "start", "--config", str(config)],
            cwd=self.work,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def produce_consume(self, address: str) -> None:
        idemlog = str(self.bin / "idemlog")
        topic = ["--topic", "smoke", "--partitions", "2"]
        self.run("topics create", [idemlog, "topics", "create", "--bootstrap", address, *topic])
        self.py(
            "produce",
            "import sys, pyarrow as pa\n"
            "from broker_core.producer import Producer\n"
            "with Producer(sys.argv[1]) as producer:\n"
            f"    future = producer.send('smoke', pa.table({{'id': list(range({ROWS}))}}))\n"
            "    producer.flush()\n"
            f"    assert sum(r.num_rows for r in future.result(60)) == {ROWS}\n",
            address,
        )
        # Every committed record, then exit once none arrived for 5 s (consume follows).
        read = ["--topic", "smoke", "--from-beginning", "--timeout-ms", "5000", "--json"]
        out = self.run("consume", [idemlog, "consume", "--bootstrap", address, *read]).stdout
        records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        ids = sorted(record["value"]["id"] for record in records)
        if ids != list(range(ROWS)):
            raise SmokeFailed(f"consume read {len(ids)} rows, not ids 0..{ROWS - 1} once each")
        log(f"consume: {len(ids)} rows, each once")

    def spark(self) -> None:
        home = self.work / "home"  # the embedded default, ~/.idemlog/embedded, lives here
        home.mkdir()
        env = {**self.env, "HOME": str(home)}
        out = self.py(
            "spark write and read",
            "from spark_sink import local_session\n"
            "from spark_sink.embedded import DEFAULT_PATH, stop_broker\n"
            "spark = local_session('idemlog-wheel-smoke')\n"
            "try:\n"
            f"    df = spark.range(0, {SPARK_ROWS}).selectExpr('id', 'id % 7 AS k')\n"
            "    df.write.format('idemlog').option('topic', 'spark_smoke').mode('append').save()\n"
            "    back = spark.read.format('idemlog').option('topic', 'spark_smoke').load()\n"
            "    ids = sorted(r.id for r in back.collect())\n"
            "finally:\n"
            "    spark.stop()\n"
            "    stop_broker(DEFAULT_PATH)\n"
            f"assert ids == list(range({SPARK_ROWS})), ids[:10]\n"
            "print(f'spark rows={len(ids)} path={DEFAULT_PATH}')\n",
            env=env,
        )
        line = out.strip().splitlines()[-1]
        if not line.startswith(f"spark rows={SPARK_ROWS} path={home}"):
            raise SmokeFailed(f"the Spark step printed {out!r}")
        log(line)
        self.export(env, line.split("path=", 1)[1])

    def export(self, env: dict[str, str], store: str) -> None:
        table = self.work / "delta" / "spark_smoke"
        args = ["export", "delta", "--topic", "spark_smoke", "--path", store]
        args += ["--table", str(table), "--partition-by", "k"]
        try:
            out = self.run("export delta", [str(self.bin / "idemlog"), *args], env=env).stdout
        finally:
            self.py(
                "embedded broker stop",
                "import sys\nfrom spark_sink.embedded import stop_broker\nstop_broker(sys.argv[1])",
                store,
                env=env,
            )
        if f"exported rows={SPARK_ROWS} " not in out:
            raise SmokeFailed(f"idemlog export delta printed {out!r}")
        # Exits without the interpreter's teardown: deltalake's runtime threads can abort
        # it ("terminate called without an active exception", SIGABRT) after the count was
        # printed; what is checked is the read, not deltalake's shutdown.
        rows = self.py(
            "delta read",
            "import os, sys\nfrom deltalake import DeltaTable\n"
            "print(DeltaTable(sys.argv[1]).to_pyarrow_table().num_rows, flush=True)\n"
            "os._exit(0)",
            str(table),
            env=env,
        )
        if rows.strip() != str(SPARK_ROWS):
            raise SmokeFailed(f"the Delta table holds {rows.strip()} rows, not {SPARK_ROWS}")
        log(f"export delta rows={SPARK_ROWS} read back with deltalake")

    def notebook(self, wheel: Path, executed: Path | None) -> None:
        """The notebook with the ``[notebook]`` extra, headless, from a copy outside the
        checkout: every cell runs (nbclient raises on an error), its summary line says
        exactly once and its metrics table exists. ``executed``: where to write the
        notebook with its outputs (the test reads them)."""
        self.run(
            "pip install [notebook]", [str(self.bin / "pip"), "install", "-q", f"{wheel}[notebook]"]
        )
        home = self.work / "home"  # the Spark step's HOME: its Ivy cache holds Delta's jars
        home.mkdir(exist_ok=True)
        copy = self.work / "notebook" / NOTEBOOK.name
        copy.parent.mkdir()
        shutil.copyfile(NOTEBOOK, copy)
        env = {**self.env, "HOME": str(home), "IDEMLOG_NOTEBOOK_DIR": str(copy.parent / "work")}
        out = self.py(
            "notebook",
            "import sys, nbformat\n"
            "from nbclient import NotebookClient\n"
            "nb = nbformat.read(sys.argv[1], as_version=4)\n"
            "NotebookClient(nb, timeout=600, kernel_name='python3',"
            " resources={'metadata': {'path': sys.argv[2]}}).execute()\n"
            "outs = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs]\n"
            "text = ''.join(o.get('text', '') for o in outs if o.output_type == 'stream')\n"
            "images = sum('image/png' in o.get('data', {}) for o in outs)\n"
            "summary = [l for l in text.splitlines() if l.startswith('exactly_once=')][-1:]\n"
            "print(f'notebook images={images} {\"\".join(summary)}')\n"
            "if len(sys.argv) > 3:\n"
            "    nbformat.write(nb, sys.argv[3])\n",
            str(copy),
            str(copy.parent),
            *([str(executed)] if executed else []),
            env=env,
        )
        line = out.strip().splitlines()[-1]
        if not line.startswith(f"notebook images={NOTEBOOK_IMAGES} exactly_once=OK "):
            raise SmokeFailed(f"the notebook step printed {out!r}")
        metrics = copy.parent / "work" / "metrics" / "_delta_log"
        if not metrics.is_dir():
            raise SmokeFailed(f"the notebook recorded no metrics table: no {metrics}")
        log(line)


def _wait_listening(broker: subprocess.Popen[str]) -> str:
    assert broker.stdout is not None
    deadline = time.monotonic() + BROKER_START_S
    seen: list[str] = []
    # Its stdout is a pipe that ends with the process: a line or EOF always comes.
    for line in broker.stdout:
        seen.append(line)
        if line.startswith("LISTENING "):
            return line.split()[1]
        if time.monotonic() > deadline:
            break
    broker.kill()
    raise SmokeFailed("the broker did not print LISTENING:\n" + "".join(seen))


def smoke(work: Path, wheel: Path | None, python: str, executed: Path | None) -> None:
    s = Smoke(work, python)
    wheel = wheel or s.build()
    log(f"wheel {wheel.name}")
    s.install(wheel)
    s.version(wheel)
    broker = s.broker()
    try:
        address = _wait_listening(broker)
        log(f"broker start: listening at {address}")
        s.produce_consume(address)
    finally:
        if broker.poll() is None:
            broker.send_signal(signal.SIGTERM)
        rest, _ = broker.communicate(timeout=60)
    if broker.returncode != 0:
        raise SmokeFailed(f"the broker exited {broker.returncode} after SIGTERM:\n{rest}")
    log("broker stop: exit 0 after SIGTERM")
    s.spark()
    s.notebook(wheel, executed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--wheel", type=Path, help="a built wheel (default: build one)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--python", default=sys.executable, help="the interpreter that builds and makes the venv"
    )
    parser.add_argument(
        "--notebook-out", type=Path, help="write the executed notebook, with its outputs, here"
    )
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="idemlog-wheel-smoke-"))
    if work.resolve().is_relative_to(REPO):
        parser.error(f"the temporary directory {work} is inside the checkout")
    started = time.monotonic()
    try:
        wheel = args.wheel.resolve() if args.wheel else None
        smoke(work, wheel, args.python, args.notebook_out.resolve() if args.notebook_out else None)
    except (SmokeFailed, subprocess.TimeoutExpired) as exc:
        log(f"FAILED: {exc}")
        return 1
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    log(f"passed in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
