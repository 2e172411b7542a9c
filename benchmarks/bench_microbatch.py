"""Where a streaming micro-batch's time goes: idemlog's parts against Spark's own floor.

    python -m benchmarks.bench_microbatch [--batches 10] [--rows 100000] [--rounds 2]
                                          [--dir DIR]

(``make bench-microbatch``.) One ``local[2,1]`` session, as ``benchmarks.bench_spark``, with
Spark's event log on and the sink's timing spans on (its writes name the hooks
``benchmarks.trace_hooks``; ``IDEMLOG_TRACE`` names a file in the scratch directory,
inherited by every Python process Spark starts). ``--rounds``
interleaved rounds of two queries read the same ``--batches`` parquet files of ``--rows``
rows (``maxFilesPerTrigger=1``, ``availableNow``): one writes ``format("idemlog")``
(embedded broker, ``key="key"``), one the discard writer (``benchmarks.discard_sink``, the
floor of any Python sink); which goes first alternates from round to round. A five-batch
query of each sink before the rounds warms the broker, the Python workers and the JVM,
so neither side pays a first start, or the session's slower first minute, that the other
does not.

For every micro-batch three clocks are read, all wall-clock epoch time, so they line up:

- **Spark's progress** (``query.recentProgress``): the trigger's start and its phases
  (``latestOffset``, ``walCommit``, ``getBatch``, ``queryPlanning``, ``addBatch``,
  ``commitOffsets``); ``addBatch`` is the sink's share;
- **Spark's event log**: the micro-batch's write job (its ``streaming.sql.batchId``
  property), submitted -> done, and its tasks, launched -> finished;
- **the sink's spans** (``benchmarks.trace_hooks``, the writes' option ``hooks``), from
  every Python process: ``plan_writer``
  (``streamWriter()``, in the driver-side process Spark starts to plan the batch's write)
  with its ``topic_check`` round trip (the first time, the embedded broker's start too);
  ``task`` (a task's whole writer) with ``open_producer`` (importing and building the
  producer), ``init_producer`` (InitProducerId), ``flush`` (the rows' produce requests)
  and ``prepare``;
  ``commit`` (``commit()``, in the driver-side process Spark starts to commit) with its
  ``commit_request``. A span's process start and the moment it first imported
  ``spark_sink`` tell whether Spark started a new process for it and what that cost.

``addBatch`` is split into: the driver before the job (the planning process: its
start-up and imports when new, ``plan_writer``, and Spark's own share), the job (the
slowest task's writer and Spark's scheduling around it), and the driver after the job
(the commit process, ``commit``, Spark's share). The table shows the p50 over the
micro-batches after the first of each query (the first pays the query's start: printed on
its own line), over every round, for idemlog and discard, and their difference: what
idemlog adds over the floor, part by part.

**Outliers.** A micro-batch whose ``addBatch`` exceeds its sink's p50 by 25% gets a line:
the parts that grew most over their own p50, the write job's JVM GC time (Spark's task
metrics) and a fourth clock, the cores the rest of the machine and the broker used
meanwhile (``benchmarks.load_sampler``, sampled every 0.2 s); then the p50 of that load
for the outliers and for the others. Last lines::

    microbatch_ms_idemlog_p50, microbatch_ms_discard_p50,
    microbatch_idemlog_vs_discard_ratio (the median over the rounds of idemlog's p50 over
    discard's; target <= 1.05), driver_processes_per_batch
    (new driver-side Python processes per steady micro-batch), trace_spans, write_jobs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks import trace_hooks
from benchmarks.bench_spark import Bench, StreamResult, run_stream, write_stream_files
from benchmarks.common import p50
from benchmarks.discard_sink import DiscardDataSource
from benchmarks.load_sampler import Load, LoadSampler
from spark_sink import local_session
from spark_sink.embedded import broker_pid, stop_broker

TARGET_RATIO = 1.05  # idemlog's micro-batch p50 over discard's (issue 27)
# Both sinks warm up before the rounds: the session's first minute runs slower (the JVM's
# JIT, the Python workers' first imports), and a sink measured in it alone would look
# slower than the other (README, "Where a micro-batch's time goes").
WARMUP_BATCHES = 5
# A steady micro-batch whose addBatch exceeds its sink's p50 by this factor is an outlier:
# its excess is attributed to the parts that grew (print_outliers).
OUTLIER_FACTOR = 1.25


# -- the three clocks -------------------------------------------------------------------------
@dataclass
class Job:
    batch: int
    query: str
    submitted: float
    done: float
    tasks: list[tuple[float, float]]  # (launched, finished) of each task
    gc_ms: float = 0.0  # the JVM's GC time in the job's tasks (Spark's task metrics)


def read_event_log(directory: Path) -> list[Job]:
    """The streaming write jobs in Spark's event log (written uncompressed and not rolled:
    one JSON file per application)."""
    jobs: dict[int, Job] = {}
    stage_job: dict[int, int] = {}
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        with open(path) as f:
            for line in f:
                event = json.loads(line)
                kind = event.get("Event")
                if kind == "SparkListenerJobStart":
                    props = event.get("Properties") or {}
                    batch = props.get("streaming.sql.batchId")
                    if batch is None:
                        continue
                    job = Job(
                        int(batch),
                        props.get("sql.streaming.queryId", ""),
                        event["Submission Time"] / 1000,
                        0.0,
                        [],
                    )
                    jobs[event["Job ID"]] = job
                    for stage in event.get("Stage IDs", []):
                        stage_job[stage] = event["Job ID"]
                elif kind == "SparkListenerJobEnd" and event["Job ID"] in jobs:
                    jobs[event["Job ID"]].done = event["Completion Time"] / 1000
                elif kind == "SparkListenerTaskEnd" and event["Stage ID"] in stage_job:
                    info = event["Task Info"]
                    job = jobs[stage_job[event["Stage ID"]]]
                    job.tasks.append((info["Launch Time"] / 1000, info["Finish Time"] / 1000))
                    metrics = event.get("Task Metrics") or {}
                    job.gc_ms += float(metrics.get("JVM GC Time", 0))
    return list(jobs.values())


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


@dataclass
class Batch:
    """One micro-batch: Spark's phases and the parts it splits into, in ms."""

    batch: int
    phases: dict[str, float]
    parts: dict[str, float]
    new_driver_processes: int
    gc_ms: float = 0.0  # the write job's JVM GC time
    round: int = 0  # the interleaved round (main)
    window: tuple[float, float] = (0.0, 0.0)  # addBatch's start and end, epoch seconds
    load: Load | None = None  # the machine's load during addBatch (main)


# The order of MicroBatchExecution's phases before addBatch within a trigger.
_BEFORE_ADD_BATCH = ("latestOffset", "walCommit", "getBatch", "queryPlanning")


def _spans_in(spans: list[dict[str, Any]], name: str, lo: float, hi: float) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name and lo <= s["start"] and s["end"] <= hi]


def _startup_ms(span: dict[str, Any], lo: float) -> tuple[float, float, bool]:
    """(interpreter + pyspark start-up, our imports up to the span) in ms, and whether the
    process was started within this batch (else it is a reused worker: both 0)."""
    new = span["proc_start"] >= lo - 0.01  # create_time has clock-tick resolution
    if not new or span["imported"] is None:
        return 0.0, 0.0, False
    return (
        (span["imported"] - span["proc_start"]) * 1000,
        (span["start"] - span["imported"]) * 1000,
        True,
    )


@dataclass
class DriverStep:
    """One driver-side step (planning or commit) of a micro-batch, in ms."""

    step: float  # the sink's outer span
    inner: float  # its broker round trip
    python_start: float  # interpreter + pyspark start-up of processes new in this batch
    imports: float  # their import of the sink, up to the span
    new_processes: int


def _driver_step(
    spans: list[dict[str, Any]], names: tuple[str, str], lo: float, hi: float
) -> DriverStep:
    """The ``names`` = (outer, inner) spans between ``lo`` and ``hi`` (epoch seconds)."""
    outer, inner = names
    step = DriverStep(0.0, 0.0, 0.0, 0.0, 0)
    for s in _spans_in(spans, outer, lo, hi):
        step.step += (s["end"] - s["start"]) * 1000
        python_start, imports, new = _startup_ms(s, lo)
        step.python_start += python_start
        step.imports += imports
        step.new_processes += new
    step.inner = sum((s["end"] - s["start"]) * 1000 for s in _spans_in(spans, inner, lo, hi))
    return step


def _driver_parts(
    parts: dict[str, float],
    title: tuple[str, float],
    step: DriverStep,
    labels: tuple[str, str],
    unique: str = "",
) -> None:
    """The rows of one driver-side step under ``title`` (its name and ms). ``unique``
    ends the rows' names that both steps share (the table strips it)."""
    name, total = title
    parts[name] = total
    parts[f"  new process: Python + pyspark start{unique}"] = step.python_start
    parts[f"  new process: sink imports{unique}"] = step.imports
    parts[f"  {labels[0]}"] = step.step
    parts[f"    {labels[1]}"] = step.inner
    parts[f"  Spark's share{unique}"] = total - step.python_start - step.imports - step.step


def breakdown(progress: dict[str, Any], job: Job, spans: list[dict[str, Any]]) -> Batch:
    """Split one micro-batch's ``addBatch`` into its parts (module docstring)."""
    d = {k: float(v) for k, v in progress["durationMs"].items()}
    trigger = _epoch(progress["timestamp"])
    add_start = trigger + sum(d.get(k, 0.0) for k in _BEFORE_ADD_BATCH) / 1000
    add_end = add_start + d["addBatch"] / 1000
    parts: dict[str, float] = {}

    # Before the job: the planning process.
    plan = _driver_step(spans, ("plan_writer", "topic_check"), add_start - 0.05, job.submitted)
    _driver_parts(
        parts,
        ("before the job", (job.submitted - add_start) * 1000),
        plan,
        ("plan_writer (streamWriter)", "topic check (+ embedded broker start)"),
    )

    # The job: the slowest task and the sink's writer in it.
    parts["the job (submitted -> done)"] = (job.done - job.submitted) * 1000
    slowest = max(job.tasks, key=lambda t: t[1] - t[0], default=(job.submitted, job.submitted))
    parts["  slowest task (launched -> finished)"] = (slowest[1] - slowest[0]) * 1000
    tasks = _spans_in(spans, "task", job.submitted, job.done + 0.05)
    writer = max(tasks, key=lambda s: s["end"] - s["start"], default=None)
    if writer is not None:
        w = writer["end"] - writer["start"]
        a, b, _new = _startup_ms(writer, job.submitted)
        parts["    new worker: Python + pyspark start"] = a
        parts["    new worker: sink imports"] = b
        parts["    sink writer (task span)"] = w * 1000
        for name in ("open_producer", "init_producer", "flush", "prepare"):
            inner = [
                s
                for s in _spans_in(spans, name, writer["start"], writer["end"] + 0.001)
                if s["pid"] == writer["pid"]
            ]
            parts[f"      {name}"] = sum((s["end"] - s["start"]) * 1000 for s in inner)

    # After the job: the commit process.
    commit = _driver_step(spans, ("commit", "commit_request"), job.done - 0.05, add_end + 0.05)
    _driver_parts(
        parts,
        ("after the job", (add_end - job.done) * 1000),
        commit,
        ("commit()", "commit request (broker round trip)"),
        unique=" ",
    )
    new_processes = plan.new_processes + commit.new_processes
    return Batch(
        int(progress["batchId"]), d, parts, new_processes, job.gc_ms, window=(add_start, add_end)
    )


def analyse(
    result: StreamResult, jobs: list[Job], spans: list[dict[str, Any]], query_id: str
) -> list[Batch]:
    by_batch = {j.batch: j for j in jobs if j.query == query_id}
    out = []
    for p in result.progress:
        job = by_batch.get(int(p["batchId"]))
        if job is None:
            raise SystemExit(
                f"query {query_id} batch {p['batchId']}: no write job in the event log"
            )
        out.append(breakdown(p, job, spans))
    return out


# -- output -------------------------------------------------------------------------------------


def steady_batches(queries: Sequence[list[Batch]]) -> list[Batch]:
    """The micro-batches of a sink's queries after each query's first (which pays the
    query's start); a query of one batch counts whole."""
    return [b for batches in queries for b in (batches[1:] or batches)]


def print_table(
    steady: dict[str, list[Batch]], firsts: dict[str, list[Batch]], cold: Batch
) -> dict[str, float]:
    """The p50 table of every part over ``steady`` (each sink's micro-batches of every
    round, each query's first left out), with the session's very first micro-batch beside
    it (``cold``: the warm-up query's first, where every Python process is new, so
    start-up and imports show)."""
    names: list[str] = []
    for batches in [*steady.values(), [cold]]:
        for b in batches:
            names += [n for n in b.parts if n not in names]
    sinks = list(steady)
    head = f"{'p50 ms per micro-batch':<44}" + "".join(f"{s:>10}" for s in sinks)
    print(head + f"{'added':>10}{'cold':>10}")
    add = {s: p50([b.phases["addBatch"] for b in steady[s]]) for s in sinks}
    rows: list[tuple[str, dict[str, float]]] = [
        ("addBatch", {**add, "cold": cold.phases["addBatch"]})
    ]
    for n in names:
        values = {s: p50([b.parts.get(n, 0.0) for b in steady[s]]) for s in sinks}
        rows.append((n, {**values, "cold": cold.parts.get(n, 0.0)}))
    for phase in ("latestOffset", "walCommit", "getBatch", "queryPlanning", "commitOffsets"):
        values = {s: p50([b.phases.get(phase, 0.0) for b in steady[s]]) for s in sinks}
        rows.append((f"({phase}, outside addBatch)", {**values, "cold": cold.phases[phase]}))
    for name, values in rows:
        line = f"{name.rstrip():<44}" + "".join(f"{values[s]:>10.0f}" for s in sinks)
        line += f"{values['idemlog'] - values['discard']:>+10.0f}{values['cold']:>10.0f}"
        print(line)
    print(
        "(added: idemlog - discard; cold: the session's first micro-batch, idemlog, "
        f"{cold.new_driver_processes} new driver-side Python processes)"
    )
    for sink, batches in firsts.items():
        print(
            f"first micro-batch of each {sink} query (the query's start): addBatch "
            + ", ".join(f"{b.phases['addBatch']:.0f}" for b in batches)
            + " ms; new driver-side Python processes: "
            + ", ".join(str(b.new_driver_processes) for b in batches)
        )
    return add


# The leaf parts an outlier's excess is attributed to (print_outliers).
_TOP_PARTS = ("before the job", "the job (submitted -> done)", "after the job")


def _leaf_parts(b: Batch) -> dict[str, float]:
    """Every part of ``b`` that no other part contains, with the job's share that is
    Spark's around the slowest task and the task's share outside the sink's writer."""
    p = b.parts
    leaves = {n.strip(): v for n, v in p.items() if n not in _TOP_PARTS}
    for outer in ("plan_writer (streamWriter)", "commit()"):
        leaves.pop(outer, None)  # their broker round trip is a leaf
    job = p.get("the job (submitted -> done)", 0.0)
    task = p.get("  slowest task (launched -> finished)", 0.0)
    writer = p.get("    sink writer (task span)", 0.0)
    spans = sum(
        p.get(f"      {n}", 0.0) for n in ("open_producer", "init_producer", "flush", "prepare")
    )
    leaves["job: Spark's scheduling around the task"] = job - task
    leaves["slowest task (launched -> finished)"] = task - writer
    leaves["sink writer (task span)"] = writer - spans
    return leaves


def print_outliers(steady: dict[str, list[Batch]]) -> dict[str, int]:
    """One line per steady micro-batch whose addBatch exceeds its sink's p50 by
    OUTLIER_FACTOR: the parts that grew most over their own p50, the job's JVM GC time
    and new Python processes. The count of outliers per part that grew most."""
    causes: defaultdict[str, int] = defaultdict(int)
    print(f"\noutliers (addBatch > {OUTLIER_FACTOR:g} x the sink's p50):")
    for sink, batches in steady.items():
        add = p50([b.phases["addBatch"] for b in batches])
        typical = {
            n: p50([_leaf_parts(b).get(n, 0.0) for b in batches]) for n in _leaf_parts(batches[0])
        }
        for b in batches:
            if b.phases["addBatch"] <= OUTLIER_FACTOR * add:
                continue
            grew = sorted(
                ((v - typical.get(n, 0.0), n) for n, v in _leaf_parts(b).items()),
                reverse=True,
            )[:2]
            causes[grew[0][1]] += 1
            load = (
                "load not sampled"
                if b.load is None
                else f"other processes {b.load.others:.2f} cores, broker {b.load.broker:.2f}"
            )
            print(
                f"  {sink} round {b.round} batch {b.batch}: addBatch "
                f"{b.phases['addBatch']:.0f} ms (+{b.phases['addBatch'] - add:.0f}); grew: "
                + ", ".join(f"{n} +{d:.0f}" for d, n in grew)
                + f"; JVM GC {b.gc_ms:.0f} ms; new driver processes {b.new_driver_processes}"
                + f"; {load}"
            )
    if not causes:
        print("  none")
    for sink, batches in steady.items():
        add = p50([b.phases["addBatch"] for b in batches])
        for label, chosen in (
            ("outliers", [b for b in batches if b.phases["addBatch"] > OUTLIER_FACTOR * add]),
            ("the others", [b for b in batches if b.phases["addBatch"] <= OUTLIER_FACTOR * add]),
        ):
            loads = [b.load for b in chosen if b.load is not None]
            if loads:
                print(
                    f"  {sink} {label} ({len(chosen)}): p50 cores used by other processes "
                    f"{p50([x.others for x in loads]):.2f}, by the broker "
                    f"{p50([x.broker for x in loads]):.2f}"
                )
    return dict(causes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=10, help="micro-batches per query")
    parser.add_argument("--rows", type=int, default=100_000, help="rows per micro-batch")
    parser.add_argument(
        "--rounds", type=int, default=2, help="interleaved rounds of one query per sink"
    )
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (kept)")
    args = parser.parse_args(argv)
    if args.batches < 2 or args.rows <= 0 or args.rounds <= 0:
        parser.error("--batches must be at least 2, --rows and --rounds positive")
    directory = Path(args.dir or tempfile.mkdtemp(prefix="bench-microbatch-"))
    directory.mkdir(parents=True, exist_ok=True)
    events = directory / "events"
    events.mkdir(exist_ok=True)
    trace_file = directory / "trace.jsonl"
    # Both inherited by Spark's Python processes: the trace file, and the folder whose
    # sitecustomize notes when each process first imported spark_sink.
    os.environ[trace_hooks.ENV] = str(trace_file)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(trace_hooks.IMPORT_CLOCK), os.environ.get("PYTHONPATH")) if p
    )
    embedded = str(directory / "embedded")
    spark = local_session(
        "bench-microbatch",
        cores=2,
        max_failures=1,
        quiet=True,
        conf={
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": events.as_uri(),
            # Spark 4's default is a rolled, zstd-compressed folder: plain JSON lines here.
            "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false",
        },
    )
    # (sink, round, its query's result)
    runs: list[tuple[str, int, StreamResult]] = []
    sampler = LoadSampler().start()
    try:
        spark.dataSource.register(DiscardDataSource)
        bench = Bench(spark, directory, embedded, {"hooks": trace_hooks.HOOKS})
        print(
            f"bench-microbatch: {args.rounds} round(s) of {args.batches} micro-batches of "
            f"{args.rows} rows per sink, {spark.sparkContext.master}; scratch in {directory}",
            flush=True,
        )
        warm = directory / "warm-source"
        write_stream_files(warm, WARMUP_BATCHES, args.rows)
        warmup = run_stream(bench, "idemlog", warm, WARMUP_BATCHES, args.rows)
        run_stream(bench, "discard", warm, WARMUP_BATCHES, args.rows)
        sampler.other_pid = broker_pid(embedded)
        files = directory / "stream-source"
        write_stream_files(files, args.batches, args.rows)
        for r in range(args.rounds):
            # Which sink goes first alternates, so neither always follows the other.
            for sink in ("discard", "idemlog") if r % 2 == 0 else ("idemlog", "discard"):
                result = run_stream(bench, sink, files, args.batches, args.rows)
                runs.append((sink, r, result))
                print(
                    f"  round {r} {sink}: addBatch ms "
                    + " ".join(f"{t:.0f}" for t in result.add_batch_ms),
                    flush=True,
                )
    finally:
        sampler.stop()
        spark.stop()  # flushes the event log
        stop_broker(embedded)
        os.environ.pop(trace_hooks.ENV, None)
    jobs = read_event_log(events)
    spans = trace_hooks.read(trace_file)
    queries: dict[str, list[list[Batch]]] = {"idemlog": [], "discard": []}
    for sink, r, result in runs:
        analysed = analyse(result, jobs, spans, str(result.progress[0]["id"]))
        for b in analysed:
            b.round = r
            b.load = sampler.window(*b.window)
        queries[sink].append(analysed)
    counts: defaultdict[str, int] = defaultdict(int)
    for s in spans:
        counts[s["name"]] += 1
    print(f"\nspans read: {dict(counts)}; write jobs in the event log: {len(jobs)}\n")
    steady = {sink: steady_batches(qs) for sink, qs in queries.items()}
    firsts = {sink: [q[0] for q in qs] for sink, qs in queries.items()}
    add = print_table(
        steady, firsts, analyse(warmup, jobs, spans, str(warmup.progress[0]["id"]))[0]
    )
    print_outliers(steady)
    if args.dir is None:
        shutil.rmtree(directory, ignore_errors=True)
    # Each round's ratio of the two p50s; the median over rounds is the figure.
    round_ratios = [
        p50([x.phases["addBatch"] for x in steady_batches([i])])
        / p50([x.phases["addBatch"] for x in steady_batches([d])])
        for i, d in zip(queries["idemlog"], queries["discard"], strict=True)
    ]
    ratio = p50(round_ratios)
    procs = p50([b.new_driver_processes for b in steady["idemlog"]])
    print()
    print("per round, idemlog p50 / discard p50: " + " ".join(f"{x:.3f}" for x in round_ratios))

    def others(q: list[Batch]) -> str:
        loads = [b.load.others for b in steady_batches([q]) if b.load is not None]
        return f"{p50(loads):.2f}" if loads else "-"

    print(
        "per round, p50 cores used by other processes during idemlog / discard: "
        + " ".join(
            f"{others(i)}/{others(d)}"
            for i, d in zip(queries["idemlog"], queries["discard"], strict=True)
        )
        + " (a round whose two figures differ much measured the machine, not the sinks)"
    )
    print(f"microbatch_ms_idemlog_p50={add['idemlog']:.0f}")
    print(f"microbatch_ms_discard_p50={add['discard']:.0f}")
    print(f"microbatch_idemlog_vs_discard_ratio={ratio:.3f}")
    print(
        f"# {'meets' if ratio <= TARGET_RATIO else 'misses'} the target "
        f"microbatch_idemlog_vs_discard_ratio <= {TARGET_RATIO} (median of {args.rounds} "
        "interleaved rounds)"
    )
    print(f"driver_processes_per_batch={procs:g}")
    print(f"trace_spans={len(spans)}")
    print(f"write_jobs={len(jobs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
