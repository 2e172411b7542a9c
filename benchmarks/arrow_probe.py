"""bench-peers' two read references on local Arrow files: the floor of a Python data
source's read and a JVM-side columnar scan (``peers_read``'s ``arrowpy`` and ``arrowjvm``).

Spark 4.1 runs a Python data source's batch read as a row-based scan: every Arrow batch a
Python worker yields is turned into rows in the JVM one value at a time (benchmarks/README.md,
"Reads"). To tell what idemlog's reader costs from what being a Python data source costs,
the read part also reads the same rows from Arrow IPC stream files on local disk two ways:

- ``arrowpy``: ``benchmarks.arrow_files_source`` (``format("arrowfiles")``), a Python data
  source whose tasks yield the files' batches: no broker, no network, no filtering;
- ``arrowjvm``: ``benchmarks/jvm/ArrowScan.java``, a DataSource V2 compiled here by
  ``javac`` against the installed pyspark's jars, whose readers hand Spark the Arrow vectors
  as ``ColumnarBatch``es: what a JVM-side reader of idemlog's Arrow batches could read at,
  its fetches aside.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pyarrow as pa

from benchmarks.data import iter_peers_batches

PROBE_SOURCE = Path(__file__).with_name("jvm") / "ArrowScan.java"
PROBE_CLASS = "idemlog.bench.ArrowScan"
# As many files as idemlog's topic has partitions: one Spark task each on both sides.
FILES = 4
# Spark's own Arrow batch size (spark.sql.execution.arrow.maxRecordsPerBatch).
BATCH_ROWS = 10_000


def build_probe(build: Path) -> Path:
    """``ArrowScan.java`` compiled against the installed pyspark's jars, as
    ``build/arrow-scan.jar``. Exits if there is no ``javac``; raises
    ``CalledProcessError`` if it fails."""
    import pyspark

    if shutil.which("javac") is None:
        raise SystemExit(f"{PROBE_SOURCE.name} needs javac (a JDK 17) on the PATH")
    classes = build / "classes"
    shutil.rmtree(classes, ignore_errors=True)
    classes.mkdir(parents=True)
    spark_jars = Path(pyspark.__file__).parent / "jars"
    subprocess.run(
        ["javac", "-nowarn", "-cp", str(spark_jars / "*"), "-d", str(classes), str(PROBE_SOURCE)],
        check=True,
        timeout=300,
    )
    jar = build / "arrow-scan.jar"
    with zipfile.ZipFile(jar, "w") as archive:
        for path in sorted(classes.rglob("*.class")):
            archive.write(path, str(path.relative_to(classes)))
    return jar


def write_arrow_files(directory: Path, rows: int) -> None:
    """bench-peers' first ``rows`` rows (``id bigint, key int, value string``, nullable
    like the other readers' columns) as :data:`FILES` Arrow IPC stream files of
    :data:`BATCH_ROWS`-row batches, dealt round-robin."""
    directory.mkdir(parents=True)
    schema: pa.Schema | None = None
    writers: list[pa.RecordBatchStreamWriter] = []
    try:
        for i, batch in enumerate(iter_peers_batches(rows, BATCH_ROWS)):
            if schema is None:
                schema = pa.schema([f.with_nullable(True) for f in batch.schema])
                writers = [
                    pa.ipc.new_stream(str(directory / f"part-{n:03d}.arrows"), schema)
                    for n in range(FILES)
                ]
            writers[i % FILES].write_batch(batch.cast(schema))
    finally:
        for writer in writers:
            writer.close()
