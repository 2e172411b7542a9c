"""idemlog against its peers: Spark's Kafka and Delta sinks, and Kafka's own producer.

    python -m benchmarks.bench_peers [--rows 20000000] [--repeats 3]
                                     [--stream-batches 20] [--stream-rows 100000] [--dir DIR]
                                     [--parts write,ingest,read]

(``make bench-peers``; a smoke run: ``--rows 200000 --stream-batches 3 --stream-rows 10000
--repeats 1``; ``--parts`` runs some of the parts only.) One process runs four parts on
this machine, with a real Kafka broker
(``benchmarks.kafka_node``: Kafka 4.1's own jars from ``jars/kafka-broker/``, a KRaft node,
broker and controller in one JVM with ``kafka-server-start.sh``'s JVM options, on free
loopback ports, its data in the scratch directory; started before the first part, stopped
with SIGTERM, SIGKILL after 30 s, after the last, also on an error, Ctrl-C or SIGTERM).

**Durability, the same on both sides.** Neither broker fsyncs on its own: Kafka's topics
are created with ``flush.messages`` = ``flush.ms`` = 2^63-1 (its defaults, spelled out, and
so is the broker-wide ``log.flush.interval.*``), idemlog's with the same two keys of the
same values (its defaults too, ``broker_core.log.config``; the topics the Spark sink
creates itself get the defaults). Both acknowledge a write once it is in the page cache of
the one replica; both write-back is the OS's. The values read back from both brokers are
printed. Replication is 1, ``acks=all`` and idempotence on for every Kafka producer.

**1. Spark batch.** As ``benchmarks.bench_spark`` (whose code this reuses): one
``local[2,1]`` session (two task slots, no task retries), here with Delta's session
extension and catalog (``spark_sink.export.delta.delta_conf``) and, besides ``jars/*.jar``,
Spark's Kafka sink from ``jars/spark-kafka/`` (``spark-sql-kafka-0-10`` for the installed
pyspark, with ``spark.jars``). Every sink writes the same uncached DataFrame of ``--rows``
rows, ``spark_workload.source``::

    spark.range(N).selectExpr("id", "cast(id % 1000 as int) key", "concat('value-', id) value")

- ``noop``, ``discard`` (``benchmarks.discard_sink``: the Python data-source
  ceiling), ``idemlog`` (embedded default broker on a fresh ``path``, ``key="key"``, a new
  topic per run with the default 4 partitions, checked and deleted afterwards) and
  ``parquet``: exactly ``bench_spark.Bench.write``;
- ``delta``: ``df.write.format("delta").save(<fresh path>)``; its commit's
  ``numOutputRows`` is checked; the table is deleted afterwards;
- ``kafka``: ``df.selectExpr("cast(key as string) key", "cast(value as binary) value")
  .write.format("kafka")`` to a topic created before the run with idemlog's default
  partition count (4), replication 1, and the flush settings above; producer options
  ``kafka.acks=all``, ``kafka.enable.idempotence=true``, everything else Spark's and
  kafka-clients' defaults. A Kafka record is thus the row's ``key`` as a decimal string and
  its ``value`` string's UTF-8 bytes: the ``id`` column is not sent (idemlog, parquet and
  Delta store it as well: 8 bytes a row more than Kafka gets). The topic's end offsets
  must sum to the rows; the topic is deleted afterwards.

A warm-up write of 100,000 rows per sink first (JIT, Python workers, both brokers' first
writes). Then ``--repeats`` rounds of all six sinks in turn, so drift in this shared
machine's load hits all alike; each sink's **best** (shortest) run counts. CPU seconds
(user + system, ``bench_spark.Cpu``: this process tree -- the JVM, its Python workers, the
Kafka node -- plus the embedded idemlog broker) are shown for the cheapest run.

**2. Spark streaming.** ``--stream-batches`` parquet files of ``--stream-rows`` rows of the
same shape (``bench_spark.write_stream_files``) read with ``maxFilesPerTrigger=1`` and
``trigger(availableNow=True)``: that many micro-batches of that many rows, for ``idemlog``
(``bench_spark.run_stream``), ``delta`` (a fresh table) and ``kafka`` (a fresh 4-partition
topic, the same projection and options as in the batch part), and the discard writer:
``--repeats`` interleaved rounds of one query per sink (the order reversed every other
round), after one uncounted query of each sink over 5 micro-batches (the session's first
streaming query pays Spark's own warm-up, which round 1's first sink paid alone before).
A micro-batch's time is ``durationMs["addBatch"]`` from ``query.recentProgress``:
the sink's write job plus its driver-side commit, without the offset and commit-log
bookkeeping that is the same for every sink. A sink's figure is the median of its rounds'
p50s, with the p95 of all its micro-batches (numpy's linear interpolation) and the median
round's CPU seconds; each round's ``triggerExecution`` p50 is printed too. Row and
micro-batch counts are checked, and so are the rows in the topic or table.

**3. Broker ingest, no Spark.** The same rows for both: ``--rows`` records (rounded up to
whole chunks of 10,000, the Spark Arrow batch size), key = ``str(i % 1000)`` and value =
``"value-<i>"`` as in the Spark source, without ``id``. 50 distinct chunks (rows 0 to
499,999) are built before timing and cycled, so building data is not timed. Into a fresh
4-partition topic each run, with the flush settings above:

- ``idemlog``: ``broker_core.producer.Producer`` (idempotent, default configuration:
  ``batch.size`` 1 MiB, ``linger.ms`` 5, 5 in flight per partition, hash partitioner on
  ``key``) to a broker process (``benchmarks.broker_process.start_broker``: ``idemlog
  broker start``, default configuration), ``send()`` of one Arrow table (``key``,
  ``value``: strings) per chunk, then ``flush()``; every future and the log ends checked;
- ``kafka``: ``confluent_kafka.Producer`` (librdkafka) with ``enable.idempotence=true``,
  ``acks=all``, otherwise its defaults (``linger.ms`` 5, ``batch.size`` 1 MB, default
  partitioner on the key), one ``produce(topic, value, key)`` per record (``poll()`` while
  its queue is full), then ``flush()``; delivery errors counted and the end offsets checked.

Time from the first send to the end of ``flush()``, producer set-up excluded: idemlog's
``Producer()`` returns with its producer id; Kafka's is first made ready the same way (one
record to another topic, flushed, and the topic's metadata fetched). A warm-up run
of 100,000 records each, then ``--repeats`` rounds, best run counts. MB/s counts key and
value bytes (the same for both); in the Spark parts, a row's id (8) + key (4) + value's
UTF-8 bytes, the same for every sink. The idemlog producer sends columns and Kafka's
records: that difference is what this part shows, from Python, where a PySpark user's
producer lives.

**4. Reads** (``benchmarks.peers_read``, whose docstring has the method): the same
``--rows`` rows, written once by each peer's own sink, read back in ``--repeats``
interleaved rounds with ``spark.read.format("idemlog")`` (read_committed), Spark's Kafka
source (decoded to the written columns) and Delta, each materialised with a noop write of
every column (median run); beside them two references on the same rows in local Arrow
files (``benchmarks.arrow_probe``): ``arrowpy``, the floor of any Python data source's
read, and ``arrowjvm``, a JVM DataSource V2 handing Spark the Arrow vectors as columnar
batches (compiled here with ``javac``); and a streaming read of idemlog and of Kafka while
``--stream-batches`` transactions of ``--stream-rows`` rows are appended, one micro-batch
each (``triggerExecution`` p50).

**Output.** The per-round times, then one table: a row per sink and measurement with its
time (batch: the best run; stream: the per-micro-batch p50, p95 beside it; ingest: the best
run), rows/s, MB/s, CPU seconds and ``ratio`` = its time / idemlog's time in the same part
(> 1: idemlog is faster), ``# meets``/``# misses`` lines for the targets (printed, not
asserted), a bar chart of the ratios in ``bench/peers.png``, and as the last lines::

    idemlog_vs_kafka_sink=<Kafka sink batch time / idemlog batch time>   (target >= 1.2)
    idemlog_vs_delta_sink=<Delta batch time / idemlog batch time>
    idemlog_vs_discard_batch=<discard writer batch time / idemlog's>    (target >= 0.9)
    idemlog_stream_vs_kafka_sink=<Kafka sink micro-batch p50 / idemlog's>
    discard_stream_vs_kafka_sink=<Kafka sink micro-batch p50 / the discard writer's>
    idemlog_vs_discard_stream=<discard micro-batch p50 / idemlog's>     (target >= 0.95)
    microbatch_idemlog_vs_discard_ratio=<idemlog micro-batch p50 / discard's>
    idemlog_broker_vs_kafka_broker=<idemlog records/s / Kafka producer records/s> (>= 1.0)
    idemlog_read_vs_kafka_source=<Kafka source read time / idemlog's>  (target >= 1.0)
    idemlog_read_vs_delta=<Delta read time / idemlog's>                (target >= 0.8)
    idemlog_read_stream_vs_kafka_source=<Kafka streaming read p50 / idemlog's>
    idemlog_read_vs_python_floor=<arrowpy read time / idemlog's>
    python_floor_read_vs_delta=<Delta read time / arrowpy's>
    jvm_columnar_read_vs_delta=<Delta read time / arrowjvm's>

(the targets are issue 27's; ``benchmarks.peers_report.RATIOS``; a part that did not run
prints none of its keys).

The streaming part also runs the discard writer (``benchmarks.discard_sink``): no Python
sink can be faster than it, so ``discard_stream_vs_kafka_sink`` is the bound on
``idemlog_stream_vs_kafka_sink`` that Spark's Python data-source path sets (two Python
round trips on the driver per micro-batch, the JVM -> Python Arrow transfer in the task;
``make bench-microbatch`` breaks it down).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import pyspark

# confluent_kafka.admin re-exports its classes without __all__, which mypy --strict takes
# for private names; these are its documented public ones.
from pyspark.sql import DataFrame, SparkSession

from benchmarks.arrow_files_source import ArrowFilesDataSource
from benchmarks.arrow_probe import build_probe
from benchmarks.bench_spark import (
    SINKS as BENCH_SPARK_SINKS,
)
from benchmarks.bench_spark import (
    SOURCE_SCHEMA,
    WARMUP_ROWS,
    Bench,
    Cpu,
    StreamResult,
    finish_stream,
    run_rounds,
    run_stream,
    write_stream_files,
)
from benchmarks.common import percentile
from benchmarks.discard_sink import DiscardDataSource
from benchmarks.kafka_node import KafkaAdmin, fresh, kafka_node
from benchmarks.peers_ingest import ingest_part
from benchmarks.peers_read import read_options_argument, read_part
from benchmarks.peers_report import Row, draw_chart, print_ratios, print_table, with_ratios
from benchmarks.spark_workload import parse_sizes, source
from spark_sink import local_session
from spark_sink.embedded import stop_broker
from spark_sink.export.delta import delta_conf
from spark_sink.session import REPO, project_jars

BATCH_SINKS = (*BENCH_SPARK_SINKS, "delta", "kafka")
STREAM_SINKS = ("idemlog", "discard", "delta", "kafka")
# Each stream sink runs one short query before the rounds, not counted: the session's first
# streaming query pays Spark's warm-up (the JIT of the streaming path, the driver-side
# Python processes' first start), and round 1's first sink would pay it alone.
WARMUP_STREAM_BATCHES = 5
SPARK_KAFKA_JARS = REPO / "jars" / "spark-kafka"
CHART = REPO / "bench" / "peers.png"
PROBE_BUILD = REPO / "build" / "arrow-scan"
KAFKA_COLUMNS = ("cast(key as string) key", "cast(value as binary) value")
# Spark's Kafka producer: what kafka-clients 3.x defaults to anyway, spelled out.
KAFKA_SINK_OPTIONS = {"kafka.acks": "all", "kafka.enable.idempotence": "true"}
SPARK_STOP_TIMEOUT_S = 120.0
PARTS = ("write", "ingest", "read")


def _parts_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help="comma-separated parts to run: write (Spark batch and stream writes), ingest, "
        "read (default: all)",
    )
    read_options_argument(parser)


# -- sizes ------------------------------------------------------------------------------------
def digits_total(stop: int) -> int:
    """Decimal digits of all the integers 0 .. stop-1 together."""
    total, low, width = 0, 0, 1
    while low < stop:
        high = min(stop, 10**width)
        total += (high - low) * width
        low, width = high, width + 1
    return total


def source_bytes(start: int, stop: int) -> int:
    """Bytes of rows start .. stop-1 of ``spark_workload.source``: id 8, key 4, and the UTF-8
    of ``'value-' || id``."""
    rows = stop - start
    return rows * (8 + 4 + len("value-")) + digits_total(stop) - digits_total(start)


# -- part 1: Spark batch ----------------------------------------------------------------------
def spark_kafka_jars() -> list[str]:
    """``jars/spark-kafka/*.jar``, checked against the installed pyspark."""
    jars = sorted(SPARK_KAFKA_JARS.glob("*.jar")) if SPARK_KAFKA_JARS.is_dir() else []
    sink = [p for p in jars if p.name.startswith("spark-sql-kafka-0-10_2.13-")]
    if not sink:
        raise SystemExit(
            f"bench-peers: Spark's Kafka sink is not in {SPARK_KAFKA_JARS}: run `make kafka-jars`"
        )
    wanted = f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar"
    if sink[0].name != wanted:
        raise SystemExit(
            f"bench-peers: {SPARK_KAFKA_JARS} has {sink[0].name}, pyspark is "
            f"{pyspark.__version__}: set SPARK_KAFKA_VERSION in the Makefile to it and run "
            "`make kafka-jars`"
        )
    return [str(p) for p in jars]


@dataclass
class Peers:
    """bench_spark's Bench (noop, discard, idemlog, parquet) plus Delta and Kafka sinks."""

    bench: Bench
    kafka: KafkaAdmin
    runs: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in BATCH_SINKS})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in BATCH_SINKS})

    @property
    def spark(self) -> SparkSession:
        return self.bench.spark

    def write(self, sink: str, df: DataFrame, rows: int) -> float:
        """One timed write of ``df`` (``rows`` rows) to ``sink``, checked, cleaned up."""
        if sink in BENCH_SPARK_SINKS:
            elapsed = self.bench.write(sink, df, rows)
            self.cpu[sink].append(self.bench.cpu[sink][-1].total)
            return elapsed
        if sink == "delta":
            return self._timed(sink, rows, self._delta(df, rows))
        if sink == "kafka":
            return self._timed(sink, rows, self._kafka(df, rows))
        raise ValueError(sink)

    def _timed(self, sink: str, rows: int, steps: tuple[Callable[[], None], ...]) -> float:
        """``steps`` = (prepare, write, check, clean up); only ``write`` is timed."""
        prepare, write, check, clean = steps
        prepare()
        try:
            before = Cpu.now(self.bench.embedded)
            start = time.perf_counter()
            write()
            elapsed = time.perf_counter() - start
            self.cpu[sink].append((Cpu.now(self.bench.embedded) - before).total)
            check()
        finally:
            clean()
        return elapsed

    def _delta(self, df: DataFrame, rows: int) -> tuple[Callable[[], None], ...]:
        table = self.bench.directory / fresh("delta")

        def write() -> None:
            df.write.format("delta").mode("errorifexists").save(str(table))

        def check() -> None:
            history = self.spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").first()
            written = -1 if history is None else int(history["operationMetrics"]["numOutputRows"])
            if written != rows:
                raise SystemExit(f"delta: the commit wrote {written} rows, not {rows}")

        return (lambda: None, write, check, lambda: shutil.rmtree(table, ignore_errors=True))

    def _kafka(self, df: DataFrame, rows: int) -> tuple[Callable[[], None], ...]:
        topic = fresh("kafka")

        def write() -> None:
            writer = df.selectExpr(*KAFKA_COLUMNS).write.format("kafka")
            writer = writer.option("kafka.bootstrap.servers", self.kafka.bootstrap)
            writer.options(**KAFKA_SINK_OPTIONS).option("topic", topic).save()

        return (
            lambda: self.kafka.create(topic),
            write,
            lambda: self.kafka.check("kafka sink", topic, rows),
            lambda: self.kafka.delete(topic),
        )


# -- part 2: Spark streaming ------------------------------------------------------------------
def run_peer_stream(
    peers: Peers, sink: str, files: Path, batches: int, rows: int
) -> tuple[StreamResult, float]:
    """A query writing the stream files to ``sink``: its micro-batch times, and its CPU
    seconds. idemlog's and discard's are bench_spark's run_stream; Delta's and Kafka's are
    the same steps with their sinks."""
    bench = peers.bench
    before = Cpu.now(bench.embedded)
    if sink in ("idemlog", "discard"):
        result = run_stream(bench, sink, files, batches, rows)
        return result, (Cpu.now(bench.embedded) - before).total
    stream = (
        peers.spark.readStream.schema(SOURCE_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(files))
    )
    checkpoint = bench.directory / fresh(f"checkpoint-{sink}")
    target = bench.directory / fresh("delta-stream")
    topic = fresh("kafka-stream")
    if sink == "delta":
        writer = stream.writeStream.format("delta").option("path", str(target))
    elif sink == "kafka":
        peers.kafka.create(topic)
        writer = (
            stream.selectExpr(*KAFKA_COLUMNS)
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", peers.kafka.bootstrap)
            .options(**KAFKA_SINK_OPTIONS)
            .option("topic", topic)
        )
    else:
        raise ValueError(sink)
    query = (
        writer.option("checkpointLocation", str(checkpoint))
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    progress = finish_stream(query, sink, checkpoint)
    cpu = (Cpu.now(bench.embedded) - before).total
    try:
        total = sum(p.numInputRows for p in progress)
        if len(progress) != batches or total != batches * rows:
            raise SystemExit(
                f"{sink} stream: {len(progress)} micro-batches of {total} rows, expected "
                f"{batches} of {rows}"
            )
        if sink == "delta":
            stored = peers.spark.read.format("delta").load(str(target)).count()
            if stored != total:
                raise SystemExit(f"delta stream: the table holds {stored} rows, not {total}")
        else:
            peers.kafka.check("kafka stream", topic, total)
    finally:
        if sink == "kafka":
            peers.kafka.delete(topic)
        shutil.rmtree(target, ignore_errors=True)
    return StreamResult(
        add_batch_ms=[float(p.durationMs["addBatch"]) for p in progress],
        trigger_ms=[float(p.durationMs["triggerExecution"]) for p in progress],
    ), cpu


# -- the run ----------------------------------------------------------------------------------
# The session of the Spark parts while it runs, for the signal handler.
_running: list[SparkSession] = []


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGINT and SIGTERM: stop Spark's work, then unwind, so every ``finally`` stops what
    it started. The handler runs in the main thread, most likely inside a py4j call that
    waits for a Spark job: another call on that thread's connection would be reentrant
    (PySpark's own SIGINT handler fails so), so a helper thread, with a py4j connection of
    its own, stops the streaming queries and cancels the jobs first; the interrupted job
    would otherwise go on writing while its topic or table is cleaned up."""
    for spark in _running:
        helper = threading.Thread(target=_cancel_spark_work, args=(spark,), daemon=True)
        helper.start()
        helper.join(SPARK_STOP_TIMEOUT_S)
    raise KeyboardInterrupt


def _cancel_spark_work(spark: SparkSession) -> None:
    try:
        for query in spark.streams.active:
            query.stop()
        spark.sparkContext.cancelAllJobs()
    except Exception as exc:  # being interrupted is what matters; say why this failed
        print(f"bench-peers: cancelling Spark's jobs: {exc!r}", file=sys.stderr)


def _stop_spark(spark: SparkSession) -> None:
    """``spark.stop()`` from a thread of its own: after an interrupt, the main thread's py4j
    connection still has the interrupted call's answer to read."""
    failed: list[BaseException] = []

    def stop() -> None:
        try:
            spark.stop()
        except Exception as exc:
            failed.append(exc)

    helper = threading.Thread(target=stop, daemon=True)
    helper.start()
    helper.join(SPARK_STOP_TIMEOUT_S)
    if helper.is_alive() or failed:
        reason = repr(failed[0]) if failed else f"not done after {SPARK_STOP_TIMEOUT_S:g} s"
        print(f"bench-peers: stopping Spark: {reason}", file=sys.stderr)


def spark_parts(args: argparse.Namespace, directory: Path, kafka: KafkaAdmin) -> list[Row]:
    embedded = str(directory / "embedded")
    jars = project_jars() + spark_kafka_jars()
    if "read" in args.parts:
        jars.append(str(build_probe(PROBE_BUILD)))
    conf = {**delta_conf(), "spark.jars": ",".join(jars)}
    spark = local_session("bench-peers", cores=2, max_failures=1, conf=conf, quiet=True)
    # The session installed PySpark's SIGINT handler: ours instead (see _interrupt).
    signal.signal(signal.SIGINT, _interrupt)
    _running.append(spark)
    try:
        spark.dataSource.register(DiscardDataSource)
        spark.dataSource.register(ArrowFilesDataSource)
        print(
            f"bench-peers: Spark {spark.version}, {spark.sparkContext.master}, "
            f"{source(spark, 1).rdd.getNumPartitions()} source partitions, Arrow batches of "
            f"{spark.conf.get('spark.sql.execution.arrow.maxRecordsPerBatch')} rows",
            flush=True,
        )
        peers = Peers(Bench(spark, directory, embedded), kafka)
        rows: list[Row] = []
        if "write" in args.parts:
            rows = write_parts(args, peers, directory)
        if "read" in args.parts:
            rows += read_part(args, spark, embedded, kafka, directory, source_bytes)
    finally:
        _running.remove(spark)
        _stop_spark(spark)
        stop_broker(embedded)
    return rows


def write_parts(args: argparse.Namespace, peers: Peers, directory: Path) -> list[Row]:
    """Parts 1 and 2: the Spark batch and streaming writes."""
    spark = peers.spark
    warm = min(WARMUP_ROWS, args.rows)
    for sink in BATCH_SINKS:
        peers.write(sink, source(spark, warm), warm)
    peers.cpu = {s: [] for s in BATCH_SINKS}
    df = source(spark, args.rows)
    run_rounds(peers, BATCH_SINKS, df, args.rows, args.repeats, label="batch ")
    # The best runs make the key; each round's own ratio is printed too, because this
    # machine sometimes runs every Python sink at half speed for a round or two
    # (benchmarks/README.md, "The peer benchmark"): a round's ratio compares like with like.
    per_round = [d / i for d, i in zip(peers.runs["discard"], peers.runs["idemlog"], strict=True)]
    print(
        "  batch rounds, discard's s / idemlog's: "
        + " ".join(f"{r:.3f}" for r in per_round)
        + f" (median {statistics.median(per_round):.3f})",
        flush=True,
    )
    nbytes = source_bytes(0, args.rows)
    rows = [
        Row("batch", s, min(peers.runs[s]), args.rows, nbytes, min(peers.cpu[s]))
        for s in BATCH_SINKS
    ]

    warm_files = directory / fresh("stream-warmup")
    warm_batches = min(WARMUP_STREAM_BATCHES, args.stream_batches)
    write_stream_files(warm_files, warm_batches, args.stream_rows)
    for sink in STREAM_SINKS:
        run_peer_stream(peers, sink, warm_files, warm_batches, args.stream_rows)
    shutil.rmtree(warm_files, ignore_errors=True)
    files = directory / fresh("stream-source")
    write_stream_files(files, args.stream_batches, args.stream_rows)
    total = args.stream_batches * args.stream_rows
    batch_bytes = source_bytes(0, total) // args.stream_batches
    # --repeats interleaved rounds of one query per sink, the order reversed every other
    # round; a sink's figure is the median of its rounds' p50s (load drifting over a
    # round hits every sink alike).
    p50s: dict[str, list[float]] = {s: [] for s in STREAM_SINKS}
    pooled: dict[str, list[float]] = {s: [] for s in STREAM_SINKS}
    cpus: dict[str, list[float]] = {s: [] for s in STREAM_SINKS}
    for r in range(args.repeats):
        for sink in STREAM_SINKS if r % 2 == 0 else STREAM_SINKS[::-1]:
            result, cpu = run_peer_stream(peers, sink, files, args.stream_batches, args.stream_rows)
            add = [t / 1000 for t in result.add_batch_ms]
            p50s[sink].append(percentile(add, 50))
            pooled[sink] += add
            cpus[sink].append(cpu)
            print(
                f"  stream round {r + 1} {sink}: addBatch ms "
                + " ".join(f"{t:.0f}" for t in result.add_batch_ms)
                + f"; p50 {1000 * p50s[sink][-1]:.0f}; triggerExecution p50 "
                f"{statistics.median(result.trigger_ms):.0f} ms",
                flush=True,
            )
    for sink in STREAM_SINKS:
        rows.append(
            Row(
                "stream",
                sink,
                statistics.median(p50s[sink]),
                args.stream_rows,
                batch_bytes,
                statistics.median(cpus[sink]),
                p95=percentile(pooled[sink], 95),
            )
        )
    shutil.rmtree(files, ignore_errors=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_sizes(__doc__, argv, dir_help="scratch directory (kept)", more=_parts_option)
    args.parts = set(args.parts.split(","))
    if not args.parts or not args.parts <= set(PARTS):
        raise SystemExit(
            f"bench-peers: --parts {','.join(sorted(args.parts))}: choose among {','.join(PARTS)}"
        )
    spark_kafka_jars()  # fail before anything starts
    signal.signal(signal.SIGTERM, _interrupt)
    directory = Path(args.dir or tempfile.mkdtemp(prefix="bench-peers-"))
    directory.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        with kafka_node(directory=directory / fresh("kafka")) as node:
            print(
                f"bench-peers: {args.rows} rows x {args.repeats} repeat(s); streams of "
                f"{args.stream_batches} x {args.stream_rows} rows; Kafka node {node.bootstrap} "
                f"(pid {node.pid}); scratch in {directory}",
                flush=True,
            )
            kafka = KafkaAdmin(node.bootstrap)
            try:
                rows = spark_parts(args, directory, kafka)
                if "ingest" in args.parts:
                    rows += ingest_part(args, directory, kafka)
            finally:
                kafka.close()
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)

    rows = with_ratios(rows)
    print_table(rows)
    draw_chart(rows, CHART)
    print(f"chart: {CHART}; {time.perf_counter() - started:.0f} s in all")
    print_ratios(rows)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
