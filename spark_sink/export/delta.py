"""Export a topic's committed records into a Delta table, incrementally and idempotently.

    idemlog export delta --topic T (--path STORE | --brokers HOST:PORT[,...])
        --table DELTA_PATH --partition-by COL [--app-id ID]

(``python -m jobs.delta_export`` in a checkout takes the same options; both parse them
with ``broker_core.cli.spark_cmd``.)

Each run exports the offsets after the previous run's and nothing else:

1. **Where the last run ended** is read from the Delta table itself: every export commit
   carries its offset range in the commit's ``userMetadata`` (JSON: app id, topic, the
   topic's id, run number, ``from`` and ``to`` offsets per log partition), found with
   ``DESCRIBE HISTORY``. A partition never exported before starts at its log start. The
   offsets belong to the topic of that id: a topic deleted and recreated under the name
   (another id) is refused in one line naming it, never exported on from the old offsets;
   a commit without an id (written before ids) is adopted, and this run records the id.
2. **Where this run ends** is each partition's last stable offset, taken once: below it
   every transaction is decided, so ``[from, to)`` reads the same committed rows forever.
3. The topic is read with ``spark.read.format("idemlog")``, ``includeMetadata`` and
   ``topicId`` (the plan's id: a topic recreated after the plan fails the read) (the
   batch reader reads each log partition from its start to the last stable offset) and
   filtered to ``from <= _offset < to`` per partition; ``_partition`` and ``_offset`` are
   kept as columns of the table, so every row says where it came from.
4. Rows and offset range go into **one Delta commit**, an append with Delta's idempotent
   write options ``txnAppId`` (the app id) and ``txnVersion`` (the run number): if a run
   is repeated after its commit (a crash before the run finished, or two runs at once),
   Delta sees that version of the app id already committed and writes nothing.

The final line is ``exported rows=<n> from=<offsets> to=<offsets> delta_version=<v>`` or
``nothing new``. A missing topic, a partition column the topic does not have, or a table
partitioned by other columns is refused before anything is written (exit status 2).

Limitation: the resume point lives in the table's history, so the table must keep its
commits (``delta.logRetentionDuration``, 30 days by default) longer than the time between
two exports; a run that cannot find its app id's last commit in a truncated history
refuses to guess.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_core import SPARK_EXTRA
from broker_core.client.broker_client import BrokerClient
from broker_core.errors import IdemlogError
from broker_core.security.tls import Side
from spark_sink.embedded import DEFAULT_PATH
from spark_sink.errors import topic_recreated
from spark_sink.export.job_progress import StageTasks
from spark_sink.options import OFFSET_COLUMN, PARTITION_COLUMN, Scope, parse_options
from spark_sink.session import JARS_DIR, local_session, project_jars
from spark_sink.topics import describe

__all__ = [
    "DEFAULT_PATH",
    "DELTA_EXTENSION",
    "ExportError",
    "ExportPlan",
    "ExportProgress",
    "ExportResult",
    "Source",
    "delta_conf",
    "delta_session",
    "export",
    "plan_export",
    "run_export",
    "write_export",
]

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
# Marks the userMetadata of this job's commits (other writers may commit to the table).
METADATA_KIND = "idemlog.delta_export"

Offsets = dict[int, int]
Log = Callable[[str], None]


def delta_conf() -> dict[str, str]:
    """Session settings Delta needs (static: they must be set when the session starts):
    its extension and catalog, and its jars (``delta_jars_conf``)."""
    return {
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
        **delta_jars_conf(),
    }


def delta_jars_conf() -> dict[str, str]:
    """Where Spark finds Delta's jars. A checkout's ``jars/`` (``make jars``), which
    ``local_session`` always passes, when it holds them: nothing is downloaded. Else (an
    installed wheel) as Spark users get them, and as delta-spark's own
    ``configure_spark_with_delta_pip`` asks: ``spark.jars.packages`` naming the Delta
    release of the installed ``delta-spark`` for pyspark's Spark release and Scala version
    (``delta-spark_4.2_2.13``), resolved by Spark from Maven Central into its Ivy cache
    (``~/.ivy2.5.2``) on first use. Raises ExportError when delta-spark is not installed."""
    if any(Path(jar).name.startswith("delta-spark_") for jar in project_jars()):
        return {}
    try:
        version = importlib.metadata.version("delta-spark")
    except importlib.metadata.PackageNotFoundError:
        raise ExportError(
            f"the Delta export needs delta-spark, which comes with {SPARK_EXTRA} (or put "
            f"Delta's jars in {JARS_DIR})"
        ) from None
    artifact = f"delta-spark_{_spark_binary()}_{_scala_binary()}"
    return {"spark.jars.packages": f"io.delta:{artifact}:{version}"}


def _spark_binary() -> str:
    """pyspark's major.minor (``4.2``): from Delta 4.4 each Spark release has its own
    artifact, as delta-spark's ``configure_spark_with_delta_pip`` names it."""
    import pyspark

    return ".".join(pyspark.__version__.split(".")[:2])


def _scala_binary() -> str:
    """The Scala binary version pyspark's jars were built with (``spark-core_2.13-…``):
    Delta's artifact must match it."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    for jar in jars.glob("spark-core_*.jar"):
        return jar.name.removeprefix("spark-core_").split("-", 1)[0]
    return "2.13"  # every pyspark 4 release


def delta_session(app_name: str = "idemlog-delta-export", *, quiet: bool = False) -> SparkSession:
    """``local_session`` with Delta (``quiet`` as there). Refuses a session already running
    without it (only one SparkContext per process, and Delta's extension cannot be added
    afterwards)."""
    spark = local_session(app_name, conf=delta_conf(), quiet=quiet)
    if DELTA_EXTENSION not in (spark.conf.get("spark.sql.extensions", "") or ""):
        raise ExportError(
            "a SparkSession without Delta is already running in this process: stop it, "
            "or start it with local_session(conf=delta_conf())"
        )
    return spark


class ExportError(Exception):
    """A precondition the export refuses to work around (exit status 2)."""


@dataclass(frozen=True)
class Source:
    """The topic to export and where its brokers are (``brokers``, or the embedded
    broker serving ``path``)."""

    topic: str
    path: str = DEFAULT_PATH
    brokers: str = ""

    def reader_options(self) -> dict[str, str]:
        where = {"brokers": self.brokers} if self.brokers else {"path": self.path}
        return {"topic": self.topic, **where}

    def describe_where(self) -> str:
        return self.brokers or f"the embedded broker at {self.path}"


@dataclass(frozen=True)
class ExportPlan:
    """One run: offsets ``[start, end)`` per log partition, committed as ``txnVersion``
    ``run`` of ``app_id``. A plan is a pure value: writing it twice writes it once."""

    app_id: str
    topic: str
    table: str
    partition_by: str
    run: int
    start: Offsets
    end: Offsets
    previous_delta_version: int | None = None  # the last commit of this app id, if any
    topic_id: str = ""  # the topic's id when planned ("": a topic stored before ids)

    @property
    def empty(self) -> bool:
        return all(self.start[p] >= self.end[p] for p in self.end)

    def user_metadata(self) -> str:
        return json.dumps(
            {
                "kind": METADATA_KIND,
                "app_id": self.app_id,
                "topic": self.topic,
                **({"topic_id": self.topic_id} if self.topic_id else {}),
                "run": self.run,
                "from": _offsets_doc(self.start),
                "to": _offsets_doc(self.end),
            },
            sort_keys=True,
            separators=(",", ":"),
        )


@dataclass(frozen=True)
class ExportResult:
    plan: ExportPlan
    rows: int
    delta_version: int | None  # the commit holding this run (None: nothing new)
    already_committed: bool = False  # Delta skipped the write: this run was committed before

    @property
    def wrote(self) -> bool:
        return self.delta_version is not None and not self.already_committed

    def line(self) -> str:
        if self.plan.empty:
            return "nothing new"
        if self.already_committed:
            return (
                f"nothing new (run {self.plan.run} of app id {self.plan.app_id!r} was already "
                f"committed as delta_version={self.delta_version})"
            )
        return (
            f"exported rows={self.rows} from={format_offsets(self.plan.start)} "
            f"to={format_offsets(self.plan.end)} delta_version={self.delta_version}"
        )


@dataclass(frozen=True)
class _Commit:
    """An export commit found in the table's history."""

    version: int
    run: int
    topic: str
    start: Offsets
    end: Offsets
    rows: int | None
    topic_id: str = ""  # "": exported before topic ids


@dataclass
class _History:
    exists: bool
    earliest: int | None = None
    latest: int | None = None
    commits: list[_Commit] = field(default_factory=list)  # of one app id, oldest first


def _offsets_doc(offsets: Mapping[int, int]) -> dict[str, int]:
    return {str(p): offsets[p] for p in sorted(offsets)}


def format_offsets(offsets: Mapping[int, int]) -> str:
    return json.dumps(_offsets_doc(offsets), separators=(",", ":"))


def default_app_id(topic: str) -> str:
    return f"idemlog-delta-export/{topic}"


def _quote_path(path: str) -> str:
    return "delta.`" + path.replace("`", "``") + "`"


def _parse_offsets(doc: Any) -> Offsets:
    if not isinstance(doc, dict):
        raise ValueError("offsets are not an object")
    return {int(k): int(v) for k, v in doc.items()}


def _read_history(
    spark: SparkSession, table: str, app_id: str, limit: int | None = None
) -> _History:
    """The table's history (the latest ``limit`` commits) with this app id's exports."""
    query = f"DESCRIBE HISTORY {_quote_path(table)}" + ("" if limit is None else f" LIMIT {limit}")
    try:
        rows = spark.sql(query).select("version", "userMetadata", "operationMetrics").collect()
    except AnalysisException as exc:
        condition = exc.getCondition() or ""
        if condition in ("DELTA_TABLE_ONLY_OPERATION", "DELTA_MISSING_DELTA_TABLE"):
            return _History(exists=False)
        raise
    history = _History(exists=True)
    versions = [int(r["version"]) for r in rows]
    history.earliest, history.latest = (min(versions), max(versions)) if versions else (None, None)
    for row in rows:
        raw = row["userMetadata"]
        if not raw:
            continue
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("kind") != METADATA_KIND:
                continue
            if doc.get("app_id") != app_id:
                continue
            metrics = row["operationMetrics"] or {}
            rows_out = metrics.get("numOutputRows")
            history.commits.append(
                _Commit(
                    version=int(row["version"]),
                    run=int(doc["run"]),
                    topic=str(doc["topic"]),
                    start=_parse_offsets(doc["from"]),
                    end=_parse_offsets(doc["to"]),
                    rows=None if rows_out is None else int(rows_out),
                    topic_id=str(doc.get("topic_id") or ""),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue  # someone else's metadata that happens to look like JSON
    history.commits.sort(key=lambda c: c.version)
    return history


def _table_partition_columns(spark: SparkSession, table: str) -> list[str]:
    row = spark.sql(f"DESCRIBE DETAIL {_quote_path(table)}").select("partitionColumns").first()
    return [] if row is None else [str(c) for c in row["partitionColumns"]]


def _log_offsets(source: Source, partition_by: str) -> tuple[Offsets, Offsets, str]:
    """(log start, last stable offset) per partition and the topic's id; checks the
    topic and the column."""
    try:
        options = parse_options(source.reader_options(), Scope.READ)
        with BrokerClient(
            options.bootstrap(), tls=options.tls.load(Side.CLIENT), sasl=options.sasl
        ) as client:
            info = describe(client, source.topic)
            if info is None:
                raise ExportError(
                    f"topic {source.topic!r} does not exist on {source.describe_where()}"
                )
            if info.schema is None:
                raise ExportError(
                    f"topic {source.topic!r} has no schema yet: nothing was ever written to it"
                )
            columns = [*info.schema.names, PARTITION_COLUMN, OFFSET_COLUMN]
            if partition_by not in columns:
                raise ExportError(
                    f"partition column {partition_by!r} is not a column of topic "
                    f"{source.topic!r} (columns: {', '.join(columns)})"
                )
            starts: Offsets = {}
            ends: Offsets = {}
            # The stable cut, not each LSO alone: an export holds every sink batch whole.
            found = client.readable_offsets(source.topic, info.partitions, topic_id=info.pinned_id)
            for p, doc in found.items():
                starts[p] = doc["log_start_offset"]
                ends[p] = doc["last_stable_offset"]
            return starts, ends, info.topic_id
    except IdemlogError as exc:
        raise ExportError(f"topic {source.topic!r}: {exc.message}") from exc


def check_source(source: Source, partition_by: str) -> None:
    """Fail fast, before a SparkSession starts: the topic exists, has the column."""
    _log_offsets(source, partition_by)


def plan_export(
    spark: SparkSession,
    source: Source,
    table: str,
    partition_by: str,
    app_id: str | None = None,
    log: Log = print,
) -> ExportPlan:
    """The next run: from where this app id's last commit ended to the current last
    stable offsets."""
    app = app_id or default_app_id(source.topic)
    log_start, lso, topic_id = _log_offsets(source, partition_by)
    history = _read_history(spark, table, app)
    last = history.commits[-1] if history.commits else None
    if history.exists:
        current = _table_partition_columns(spark, table)
        if current != [partition_by]:
            raise ExportError(
                f"table {table} is partitioned by {current or 'nothing'}, not by "
                f"[{partition_by!r}] (--partition-by)"
            )
        if last is None and history.earliest not in (None, 0):
            raise ExportError(
                f"table {table}: its history starts at version {history.earliest} (older "
                f"commits were removed by log retention) and holds no export of app id "
                f"{app!r}: where that export ended cannot be told. Export into a new table, "
                "and keep delta.logRetentionDuration above the time between exports"
            )
    if last is not None and last.topic != source.topic:
        raise ExportError(
            f"app id {app!r} exported topic {last.topic!r} into table {table}, not "
            f"{source.topic!r}: use another --app-id"
        )
    if last is not None and last.topic_id and last.topic_id != topic_id:
        since = f"run {last.run} of the export into it, delta_version {last.version}"
        raise ExportError(
            topic_recreated(
                source.topic,
                last.topic_id,
                topic_id,
                since,
                f"the offsets in {table} belong to the old topic. Export the new topic "
                "with another --app-id and table",
            ).message
        )
    start: Offsets = {}
    for p, first in log_start.items():
        resume = last.end.get(p) if last is not None else None
        if resume is None:
            start[p] = first  # never exported: from the log start
        elif resume < first:
            raise ExportError(
                f"topic {source.topic!r} partition {p}: offsets {resume}..{first - 1} were "
                "deleted (retention) before they were exported; the log now starts at "
                f"{first}. Exporting on would lose them silently"
            )
        elif resume > lso[p]:
            raise ExportError(
                f"topic {source.topic!r} partition {p}: the last export ended at offset "
                f"{resume}, beyond the log's last stable offset {lso[p]}: the topic was "
                "recreated? Use another --app-id and table"
            )
        else:
            start[p] = resume
    if last is not None and set(last.end) - set(lso):
        lost = sorted(set(last.end) - set(lso))
        raise ExportError(
            f"topic {source.topic!r} has fewer partitions than when last exported "
            f"(partitions {lost} are gone): the topic was recreated?"
        )
    plan = ExportPlan(
        app_id=app,
        topic=source.topic,
        table=table,
        partition_by=partition_by,
        run=1 if last is None else last.run + 1,
        start=start,
        end=dict(lso),
        previous_delta_version=None if last is None else last.version,
        topic_id=topic_id,
    )
    if last is None:
        log(f"delta_export: no earlier export of app id {app!r} in {table}")
    else:
        log(
            f"delta_export: last export: run {last.run} (delta_version={last.version}) "
            f"ended at {format_offsets(last.end)}"
        )
    return plan


def _rows_of(spark: SparkSession, source: Source, plan: ExportPlan) -> DataFrame:
    ranges: list[Column] = [
        (F.col(PARTITION_COLUMN) == p)
        & (F.col(OFFSET_COLUMN) >= plan.start[p])
        & (F.col(OFFSET_COLUMN) < plan.end[p])
        for p in sorted(plan.end)
        if plan.start[p] < plan.end[p]
    ]
    reader = spark.read.format("idemlog").option("includeMetadata", "true")
    if plan.topic_id:  # the read fails if the topic was recreated since the plan
        reader = reader.option("topicId", plan.topic_id)
    for key, value in source.reader_options().items():
        reader = reader.option(key, value)
    return reader.load().where(reduce(lambda a, b: a | b, ranges))


def write_export(
    spark: SparkSession, source: Source, plan: ExportPlan, log: Log = print
) -> ExportResult:
    """Rows ``[start, end)`` and the offset range in one Delta commit, ``txnVersion`` =
    the run: a plan written again (after a crash, or by a twin run) writes nothing."""
    if plan.empty:
        return ExportResult(plan, rows=0, delta_version=None)
    log(
        f"delta_export: run {plan.run}: topic {plan.topic!r} offsets "
        f"{format_offsets(plan.start)} -> {format_offsets(plan.end)} into {plan.table}"
    )
    before = _read_history(spark, plan.table, plan.app_id, limit=1).latest
    (
        _rows_of(spark, source, plan)
        .write.format("delta")
        .mode("append")
        .partitionBy(plan.partition_by)
        .option("txnAppId", plan.app_id)
        .option("txnVersion", str(plan.run))
        .option("userMetadata", plan.user_metadata())
        .save(plan.table)
    )
    history = _read_history(spark, plan.table, plan.app_id)
    mine = [c for c in history.commits if c.run == plan.run]
    if not mine:
        raise ExportError(
            f"table {plan.table}: Delta skipped run {plan.run} of app id {plan.app_id!r} "
            "(a later run is committed) but its history has no commit of that run"
        )
    commit = mine[-1]
    if commit.start != plan.start or commit.end != plan.end:
        raise ExportError(
            f"table {plan.table}: run {plan.run} of app id {plan.app_id!r} was committed "
            f"with offsets {format_offsets(commit.start)} -> {format_offsets(commit.end)}, "
            f"not {format_offsets(plan.start)} -> {format_offsets(plan.end)}"
        )
    already = before is not None and commit.version <= before
    if already:
        log(f"delta_export: run {plan.run} was already committed: Delta skipped the write")
    rows = commit.rows if commit.rows is not None else -1
    return ExportResult(
        plan, rows=0 if already else rows, delta_version=commit.version, already_committed=already
    )


def export(
    spark: SparkSession,
    source: Source,
    table: str,
    partition_by: str,
    app_id: str | None = None,
    log: Log = print,
) -> ExportResult:
    """Plan the next run and write it: the rows after the app id's last commit up to the
    last stable offsets, in one idempotent Delta commit. Raises ExportError for a
    precondition that fails (nothing written)."""
    plan = plan_export(spark, source, table, partition_by, app_id, log)
    return write_export(spark, source, plan, log)


@dataclass(frozen=True)
class ExportProgress:
    """Where a run is, for a progress display: ``stage`` is ``planned`` (``offsets``: how
    many offsets the run reads, over ``partitions`` log partitions), ``writing`` (its Spark
    job's ``tasks_done`` of ``tasks_total``, as they change) or ``written`` (``rows``: the
    rows of its Delta commit)."""

    stage: str
    run: int
    offsets: int = 0
    partitions: int = 0
    rows: int = 0
    tasks_done: int = 0
    tasks_total: int = 0


Progress = Callable[[ExportProgress], None]


def run_export(
    source: Source,
    table: str,
    partition_by: str,
    app_id: str | None = None,
    *,
    log: Log = print,
    progress: Progress | None = None,
) -> ExportResult:
    """One export as a job: the source checked before any JVM starts, a Delta session
    (stopped afterwards unless one was already running), :func:`export`.

    ``progress`` is called once the run is planned, as its Spark job's tasks finish
    (``writing``, from a poller thread: :class:`~spark_sink.export.job_progress.StageTasks`)
    and once it is written (nothing for a run with nothing new). Raises ExportError for a
    precondition that fails (nothing is written); a broker unreachable or Spark failing
    raise their own errors."""
    check_source(source, partition_by)  # before the JVM starts
    owned = SparkSession.getActiveSession() is None
    spark = delta_session(quiet=True)  # the export prints its own progress
    try:
        plan = plan_export(spark, source, table, partition_by, app_id, log)
        if progress is not None and not plan.empty:
            progress(
                ExportProgress(
                    "planned",
                    plan.run,
                    offsets=sum(max(0, plan.end[p] - plan.start[p]) for p in plan.end),
                    partitions=sum(1 for p in plan.end if plan.start[p] < plan.end[p]),
                )
            )
        if progress is None or plan.empty:
            result = write_export(spark, source, plan, log)
        else:
            report = progress

            def tasks(done: int, total: int) -> None:
                report(ExportProgress("writing", plan.run, tasks_done=done, tasks_total=total))

            with StageTasks(spark, tasks, log):
                result = write_export(spark, source, plan, log)
        if progress is not None and result.wrote:
            progress(ExportProgress("written", plan.run, rows=result.rows))
        return result
    finally:
        if owned:
            spark.stop()
