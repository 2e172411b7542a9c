"""Readers of ``spark.read.format("idemlog")`` and ``spark.readStream.format("idemlog")``.

Why they look like this (docs/design.md §7):

* **Offsets are the log's own.** An input partition is one log partition's offset range
  ``[start, end)``, or a piece of it with ``minPartitions``/``maxRecordsPerPartition``
  (``read_split``: sub-ranges below the same end, tiling it); a stream offset is
  ``{"<partition>": next offset to read, ...}`` (JSON object keys are strings). Offsets
  are per row, and transaction markers take one offset each, so a range counts offsets,
  not rows.
* **Ranges are fixed on the driver, read with** ``max_offset=end`` (exclusive: the broker
  stops below it and slices a batch that straddles it). A rerun task or a replayed
  micro-batch therefore reads exactly the rows it read before, although the log grew.
* **The end is the coordinator's stable cut for read_committed**
  (``BrokerClient.readable_offsets``): at most the last stable offset, below which
  every transaction is decided and the broker
  skips aborted rows, so a range below it reads the same rows forever (exactly-once end
  to end when idemlog is both source and sink); lowered where needed so that each sink
  batch is read whole or not at all. For read_uncommitted it is the high watermark.
* **Arrow all the way**: the fetched batches are yielded as they come (the metadata
  columns are built with numpy), never converted row by row in Python; a receiver
  thread reads ahead by at most 16 MiB while the task yields (``read_prefetch``).
* **Picklable**: the readers hold the parsed options and topic description only; each
  ``read()`` (on an executor) opens its own ``BrokerClient`` (on the process's shared
  connections, ``spark_sink.connections``) and closes it.
* **Lost data fails the read**: a range starting below the log start (retention deleted
  what a checkpoint still points to) raises ``OffsetOutOfRangeError`` naming the topic,
  partition and offsets, like Kafka's OffsetOutOfRange; rows are never skipped silently.
* **Offsets belong to one topic id** (issue 35, docs/spark.md "A recreated topic"): the
  driver pins the id the topic has when the read is planned (or the option ``topicId``),
  every range carries it and every fetch and list_offsets sends it, so a topic deleted
  and recreated under the name refuses them (``UnknownTopicIdError``, one line naming the
  topic). A stream's offsets carry it too (``"topic_id"`` beside the partitions, in the
  checkpoint): a restarted query whose checkpoint names another id fails the same way.
  Offsets without it (a checkpoint written before ids) are adopted: the query goes on
  under the id it finds, and its next offsets carry it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from broker_core.client.broker_client import BrokerClient
from broker_core.client.fetch_stream import FetchedBatches
from broker_core.errors import (
    IdemlogError,
    InvalidConfigError,
    OffsetOutOfRangeError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.wire import FetchTrailer

from .connections import sink_client
from .driver_retry import PLAN_REQUEST_TIMEOUT_S, retrying
from .errors import one_line_errors, one_line_errors_of, topic_recreated
from .options import IdemlogOptions
from .read_offsets import (
    ENDING_OPTION,
    OffsetKind,
    check_batch_range,
    check_range,
    parse_offset_spec,
)
from .read_prefetch import prefetched
from .read_split import OffsetRangePartition, split_ranges
from .schema import spark_schema_for
from .topics import TopicInfo, describe

__all__ = [
    "IdemlogBatchReader",
    "IdemlogStreamReader",
    "OffsetRangePartition",
    "cap_ends",
    "output_schema",
    "split_ranges",
]

READ_COMMITTED = "read_committed"


# The key of a stream offset that names the topic id its positions belong to; every other
# key is a partition number.
TOPIC_ID_KEY = "topic_id"

T = TypeVar("T")


def output_schema(topic: TopicInfo, include_metadata: bool) -> pa.Schema:
    """The Arrow form of the Spark schema the data source declares.

    Derived from the Spark schema rather than from the topic schema directly, so types
    Spark holds differently (nanosecond or zone-less timestamps, large strings) are cast
    to what the JVM expects; for a topic written by the sink the two are the same.
    """
    if topic.schema is None:
        raise UnknownTopicOrPartitionError(f"topic {topic.name!r} has no schema yet")
    # The zone Spark's TIMESTAMP takes (pyspark asserts one): the sink's, UTC.
    return to_arrow_schema(spark_schema_for(topic.schema, include_metadata), timezone="UTC")


def _end_of(offsets: Mapping[str, int], isolation: str) -> int:
    return (
        offsets["last_stable_offset"] if isolation == READ_COMMITTED else offsets["high_watermark"]
    )


def _key(partition: int) -> str:
    return str(partition)


def _positions(offset: Mapping[str, Any]) -> dict[str, int]:
    """A stream offset's positions, ``{"<partition>": next offset}``, without its id."""
    return {str(k): int(v) for k, v in offset.items() if k != TOPIC_ID_KEY}


def _recreated_while_reading(
    topic: str, pinned: str, exc: UnknownTopicIdError, what: str
) -> UnknownTopicIdError:
    """The broker's refusal of a stale id, as the reader's one line: the topic, that it
    was recreated or deleted (the broker's words, with the ids) and what could not be
    read. Not retriable: rows of a new topic are never read as if they followed."""
    return UnknownTopicIdError(
        f"{exc.message} (after this read was planned under id {pinned}): {what}"
    )


# -- reading a range (executors) ----------------------------------------------------------
def _out_of_range(
    client: BrokerClient, topic: str, part: OffsetRangePartition, offset: int, exc: IdemlogError
) -> OffsetOutOfRangeError:
    where = f"topic {topic!r} partition {part.partition}"
    try:
        log = client.list_offsets(topic, part.partition, topic_id=part.topic_id)
    except IdemlogError:
        log = None  # the broker's own message below still names the log's range
    if log is not None and offset < log["log_start_offset"]:
        why = (
            f"offsets {offset}..{log['log_start_offset'] - 1} were deleted (retention "
            f"or a recreated topic) before this query read them; the log now holds "
            f"[{log['log_start_offset']}, {log['log_end_offset']})"
        )
    elif log is not None:
        why = (
            f"the log ends at {log['log_end_offset']}, before offset {offset}: the topic "
            "was recreated or the checkpoint belongs to another topic"
        )
    else:
        why = exc.message
    return OffsetOutOfRangeError(
        f"{where}: cannot read offsets [{part.start}, {part.end}) at {offset}: {why}. "
        "Reading on would lose rows silently (a streaming query accepts the loss only when "
        "restarted from a new checkpoint)"
    )


def _fetch(
    client: BrokerClient,
    options: IdemlogOptions,
    topic: str,
    part: OffsetRangePartition,
    offset: int,
) -> FetchedBatches:
    try:
        return client.fetch_stream(
            topic,
            part.partition,
            offset,
            isolation=options.isolation,
            max_offset=part.end,
            topic_id=part.topic_id,
        )
    except UnknownTopicIdError as exc:
        raise _recreated_while_reading(
            topic,
            part.topic_id or "",
            exc,
            f"partition {part.partition} offsets [{part.start}, {part.end}) cannot be read",
        ) from exc
    except OffsetOutOfRangeError as exc:
        raise _out_of_range(client, topic, part, offset, exc) from exc


READABLE_WAIT_S = 0.2  # between fetches while a new leader's high watermark catches up
READABLE_WAITS = 150  # 30 s in all: a failover's catch-up is far shorter


def _wait_until_readable(
    client: BrokerClient,
    topic: str,
    part: OffsetRangePartition,
    offset: int,
    trailer: FetchTrailer,
    waited: int,
) -> None:
    """Wait a moment before fetching ``offset`` again, if the log still holds it.

    After a failover the new leader's high watermark starts below the old one's and
    catches up as its followers fetch: the planned rows are in its log, not yet
    readable. A log that ends before ``offset`` (recreated) or keeps them unreadable for
    ``READABLE_WAITS`` fetches raises OffsetOutOfRangeError naming the offsets.
    """
    log = client.list_offsets(topic, part.partition, topic_id=part.topic_id)
    if log["log_end_offset"] >= part.end and waited < READABLE_WAITS:
        time.sleep(READABLE_WAIT_S)  # the watermark moves with the followers' fetches
        return
    raise OffsetOutOfRangeError(
        f"topic {topic!r} partition {part.partition}: offsets [{offset}, {part.end}) were "
        f"planned but the log does not make them readable (log start "
        f"{trailer.log_start_offset}, end {log['log_end_offset']}, last stable "
        f"{trailer.last_stable_offset}, high watermark {trailer.high_watermark}, after "
        f"{waited} tries): the topic was recreated?"
    )


def _to_output(
    rows: pa.RecordBatch, schema: pa.Schema, partition: int, first_offset: int, metadata: bool
) -> pa.RecordBatch:
    columns = []
    data_fields = list(schema)[: len(schema) - 2] if metadata else list(schema)
    for column, field in zip(rows.columns, data_fields, strict=True):
        if column.type != field.type:
            # Spark keeps microseconds: nanosecond timestamps are truncated, as Spark's
            # own Arrow conversion does; other casts must be exact.
            column = column.cast(field.type, safe=not pa.types.is_timestamp(field.type))
        columns.append(column)
    if metadata:
        n = rows.num_rows
        columns.append(pa.array(np.full(n, partition, dtype=np.int32)))
        columns.append(pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


FETCH_FAILOVER_S = 30.0  # retriable fetch failures in a row are retried this long
_clock = time.monotonic


def read_range(
    options: IdemlogOptions, topic: str, schema: pa.Schema, part: OffsetRangePartition
) -> Iterator[pa.RecordBatch]:
    """Every readable row of ``part`` once, in offset order, as batches of ``schema``.

    Each fetch is streamed (``BrokerClient.fetch_stream``): a batch is yielded as soon as
    it is received, so the task never holds a whole fetch (up to
    ``DEFAULT_FETCH_MAX_BYTES``) before handing rows on. A fetch that fails with a
    retriable error, when it is opened (after the client's own routed retries) or after
    some of its batches (the leader killed mid-stream, a link broken), is fetched again
    from the first offset not yet yielded, for at most ``FETCH_FAILOVER_S`` seconds of
    failures in a row (a leader election takes about a ZooKeeper session timeout); any
    other error, or one past that bound, is raised, failing the task (Spark retries it
    over the same range). UNKNOWN_TOPIC_OR_PARTITION for a partition that the cluster's
    fresh metadata no longer has (the topic deleted after planning) is raised at once."""
    if part.start >= part.end:
        return
    client = sink_client(options.bootstrap(), options.tls, sasl=options.sasl)
    try:
        offset = part.start
        position = part.start  # the next offset not yet yielded: no row twice
        waited = 0  # fetches in a row that found nothing readable
        failing_since: float | None = None  # when the current run of failed fetches began
        while offset < part.end:
            fetched: FetchedBatches | None = None
            try:
                fetched = _fetch(client, options, topic, part, offset)
                for meta, rows in fetched.batches:
                    # The broker already trims to [offset, end); trimming here too keeps
                    # every row exactly once even if a batch came back whole.
                    first = meta.base_offset
                    skip = max(0, position - first)
                    stop = min(rows.num_rows, part.end - first)
                    if stop <= skip:
                        continue
                    if skip or stop < rows.num_rows:
                        rows = rows.slice(skip, stop - skip)
                    position = first + stop
                    yield _to_output(
                        rows, schema, part.partition, first + skip, options.include_metadata
                    )
                trailer = fetched.trailer
            except IdemlogError as exc:
                if isinstance(exc, UnknownTopicOrPartitionError):
                    _raise_if_deleted(client, topic, part, exc)
                now = _clock()
                failing_since = now if failing_since is None else failing_since
                if not exc.retriable or now - failing_since >= FETCH_FAILOVER_S:
                    raise
                offset = max(offset, position)  # what was yielded is not read again
                continue
            finally:
                if fetched is not None:
                    fetched.close()
            failing_since = None
            next_offset = trailer.next_offset
            if next_offset <= offset:
                # The planned range is not readable now: a new leader's high watermark
                # catching up after a failover (the rows are in its log: wait for them),
                # or a log that no longer has them (looping would never finish).
                _wait_until_readable(client, topic, part, offset, trailer, waited)
                waited += 1
                continue
            waited = 0
            offset = next_offset
    finally:
        client.close()


def _raise_if_deleted(
    client: BrokerClient,
    topic: str,
    part: OffsetRangePartition,
    cause: UnknownTopicOrPartitionError,
) -> None:
    """Raise at once when the cluster's fresh metadata no longer has ``part``'s partition
    of ``topic``: it was deleted after the read was planned, and no failover brings it
    back, so waiting out ``FETCH_FAILOVER_S`` would only delay the task's failure.
    Returns when the metadata still has it (a new leader that has not loaded it yet:
    the caller retries) or when no broker answers (the caller's failover bound decides)."""
    try:
        leaders = client.refresh_metadata().topics.get(topic)
    except IdemlogError:
        return
    if leaders is not None and part.partition < len(leaders):
        return
    raise UnknownTopicOrPartitionError(
        f"{topic}-{part.partition}: the topic was deleted (or lost this partition) after "
        f"the read was planned; offsets [{part.start}, {part.end}) cannot be read "
        f"({cause.message})"
    ) from cause


def _split(
    options: IdemlogOptions, ranges: list[OffsetRangePartition]
) -> list[OffsetRangePartition]:
    return split_ranges(ranges, options.min_partitions, options.max_records_per_partition)


# -- batch reads ---------------------------------------------------------------------------
class IdemlogBatchReader(DataSourceReader):
    """``spark.read.format("idemlog")``: the readable log as of planning, from
    ``startingOffsets`` (default earliest) to ``endingOffsets`` (default latest)."""

    def __init__(self, options: IdemlogOptions, topic: TopicInfo) -> None:
        self.options = options
        self.topic = topic
        self.schema = output_schema(topic, options.include_metadata)
        self.ending = options.ending_offsets or parse_offset_spec(
            ENDING_OPTION, OffsetKind.LATEST.value, topic.name
        )
        check_batch_range(options.starting_offsets, self.ending)

    @one_line_errors
    def partitions(self) -> list[OffsetRangePartition]:
        """On the driver: per log partition ``[start, end)`` as ``startingOffsets`` and
        ``endingOffsets`` name them against the log as of now (earliest: the log start;
        latest: the LSO, or the HW with read_uncommitted), split into sub-ranges below
        the same end as ``minPartitions`` and ``maxRecordsPerPartition`` ask
        (``split_ranges``), each carrying the topic id pinned when the reader was made.
        Raises InvalidConfigError naming the option for a range the log cannot serve
        (``read_offsets.check_range``), UnknownTopicIdError if the topic was recreated
        since."""
        ranges = []
        with sink_client(
            self.options.bootstrap(), self.options.tls, sasl=self.options.sasl
        ) as client:
            pinned = self.topic.pinned_id
            try:
                found = client.readable_offsets(
                    self.topic.name, self.topic.partitions, topic_id=pinned
                )
            except UnknownTopicIdError as exc:
                raise _recreated_while_reading(
                    self.topic.name, self.topic.topic_id, exc, "its offsets cannot be planned"
                ) from exc
        log_starts = {p: o["log_start_offset"] for p, o in found.items()}
        readable = {p: _end_of(o, self.options.isolation) for p, o in found.items()}
        name = self.topic.name
        starts = self.options.starting_offsets.resolve(name, log_starts, readable)
        ends = self.ending.resolve(name, log_starts, readable)
        check_range(name, starts, ends, log_starts, readable)
        for p in sorted(starts):
            if ends[p] > starts[p]:
                ranges.append(OffsetRangePartition(p, starts[p], ends[p], pinned))
        return _split(self.options, ranges)

    def read(self, partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
        """In a task: every readable row of the range once, in offset order (nothing for
        an empty plan), received ahead by a thread of its own (``read_prefetch``: at most
        ``PREFETCH_MAX_BYTES`` not yet yielded). A broker error fails the task, which
        Spark retries."""
        # Spark passes None when partitions() planned nothing (an empty topic).
        if not isinstance(partition, OffsetRangePartition):
            return iter(())
        return one_line_errors_of(
            prefetched(read_range(self.options, self.topic.name, self.schema, partition))
        )


# -- stream reads --------------------------------------------------------------------------
def cap_ends(base: Mapping[str, int], ends: Mapping[str, int], budget: int) -> dict[str, int]:
    """``ends`` advanced at most ``budget`` offsets in total past ``base``.

    The budget is split in proportion to each partition's backlog (largest remainder, so
    exactly ``budget`` offsets are planned when the backlog exceeds it); then every
    partition with a backlog gets at least one offset, taken from the largest share, while
    the budget allows: a small partition is never starved by a large one.
    """
    backlog = {k: max(0, e - base.get(k, 0)) for k, e in ends.items()}
    total = sum(backlog.values())
    if budget <= 0 or total <= budget:
        return dict(ends)
    # budget < total: each floor share is below its backlog, so one more still fits.
    shares = {k: budget * b // total for k, b in backlog.items()}
    leftover = budget - sum(shares.values())
    for k in sorted(ends, key=lambda k: (-(budget * backlog[k] % total), k))[:leftover]:
        shares[k] += 1
    starved = sorted(
        (k for k in ends if backlog[k] and not shares[k]), key=lambda k: (-backlog[k], k)
    )
    for k in starved:
        donor = max(ends, key=lambda d: (shares[d], backlog[d], d))
        if shares[donor] <= 1:
            break
        shares[donor] -= 1
        shares[k] = 1
    return {k: base.get(k, 0) + shares[k] if backlog[k] else e for k, e in ends.items()}


class IdemlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("idemlog")``: micro-batches of log offset ranges.

    Spark calls ``initialOffset`` (cached: Spark asks for it again when it runs the
    first batch), ``latestOffset``, ``partitions`` and ``commit`` on one driver-side
    object. Every latestOffset is given the batch's start (admission control), the base
    of maxOffsetsPerTrigger: a restarted query's is its checkpoint's end.

    Trigger.AvailableNow, as Spark's Kafka source: ``prepareForTriggerAvailableNow``
    records the readable end as the run's target, and every later latestOffset stops
    there, at most maxOffsetsPerTrigger past the batch's start, so the run reads every
    row available at its start in batches of at most the limit, then ends. Spark calls it
    on readers of its SupportsTriggerAvailableNow mixin (pyspark 4.2's
    ``pyspark.sql.streaming.datasource``).
    """

    def __init__(self, options: IdemlogOptions, topic: TopicInfo) -> None:
        if options.ending_offsets is not None:
            raise InvalidConfigError(
                f"option {ENDING_OPTION!r}={options.ending_offsets.text!r} applies to batch "
                "reads only: a streaming query reads on as rows arrive (stop it, or use "
                "spark.read for a range)"
            )
        self.options = options
        self.topic = topic
        self.schema = output_schema(topic, options.include_metadata)
        self._initial: dict[str, int] | None = None
        # Trigger.AvailableNow's target: the readable end when the run was prepared.
        self._target: dict[str, int] | None = None

    def _planning(self, what: str, call: Callable[[BrokerClient], T]) -> T:
        """``call`` on the driver, asked again through a broker restart or a leader
        change within driver.retry.timeout.ms (``driver_retry.retrying``): a running
        query's next offsets wait for the broker instead of ending the query."""
        return retrying(
            self.options,
            f"{what} of the read of topic {self.topic.name!r}",
            call,
            request_timeout_s=PLAN_REQUEST_TIMEOUT_S,
        )

    # -- the topic id ------------------------------------------------------------------------
    def _stamped(self, positions: Mapping[str, int]) -> dict[str, Any]:
        """``positions`` as the offset Spark records: sorted by partition, with the id
        of the topic they belong to (none for a topic stored before ids)."""
        offset: dict[str, Any] = dict(sorted(positions.items(), key=lambda kv: int(kv[0])))
        if self.topic.topic_id:
            offset[TOPIC_ID_KEY] = self.topic.topic_id
        return offset

    def _check_offset(self, offset: Mapping[str, Any], what: str) -> None:
        """Refuse an offset Spark hands back (from the checkpoint, or planned by an
        earlier run of the query) that names another id than the topic has now: its
        positions are in a topic that was deleted since. An offset without an id (a
        checkpoint written before ids) is adopted: nothing can be checked for it, and
        the offsets this reader plans from it carry the id."""
        recorded = offset.get(TOPIC_ID_KEY)
        if recorded is None or recorded == self.topic.topic_id:
            return
        raise topic_recreated(
            self.topic.name,
            str(recorded),
            self.topic.topic_id,
            f"the streaming query {what}",
            "its offsets belong to the old topic. Start the query from a new checkpoint to "
            "read the new topic (startingOffsets)",
        )

    def _recreated(self, exc: UnknownTopicIdError) -> UnknownTopicIdError:
        return _recreated_while_reading(
            self.topic.name,
            self.topic.topic_id,
            exc,
            "the streaming query cannot plan its next offsets. Start it from a new "
            "checkpoint to read the new topic (startingOffsets)",
        )

    def _partition_count(self, client: BrokerClient) -> int:
        # Partitions may be added to a running topic: each trigger looks again.
        info = describe(client, self.topic.name)
        if info is None:
            raise UnknownTopicOrPartitionError(
                f"topic {self.topic.name!r} no longer exists (the streaming query reads it)"
            )
        if self.topic.topic_id and info.topic_id != self.topic.topic_id:
            raise topic_recreated(
                self.topic.name,
                self.topic.topic_id,
                info.topic_id,
                "the streaming query started",
                "the query cannot plan its next offsets. Start it from a new checkpoint to "
                "read the new topic (startingOffsets)",
            )
        return max(info.partitions, self.topic.partitions)

    def _offsets(self, client: BrokerClient) -> dict[str, dict[str, int]]:
        # The id goes with each list_offsets: a topic recreated after the look above is
        # refused by the broker itself.
        try:
            found = client.readable_offsets(
                self.topic.name, self._partition_count(client), topic_id=self.topic.pinned_id
            )
        except UnknownTopicIdError as exc:
            raise self._recreated(exc) from exc
        return {_key(p): doc for p, doc in found.items()}

    def _initial_offsets(self, client: BrokerClient) -> dict[str, int]:
        # Computed once: Spark may ask again (runBatch of a new query) after latestOffset
        # used it, and "latest" must not move in between.
        if self._initial is None:
            offsets = {int(k): o for k, o in self._offsets(client).items()}
            initial = self.options.starting_offsets.resolve(
                self.topic.name,
                {p: o["log_start_offset"] for p, o in offsets.items()},
                {p: _end_of(o, self.options.isolation) for p, o in offsets.items()},
            )
            self._initial = {_key(p): o for p, o in initial.items()}
        return dict(self._initial)

    @one_line_errors
    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts, per partition, as ``startingOffsets`` says: the log
        start (earliest), the readable end (latest) or the JSON form's offsets; computed
        once, so it does not move. With the topic's id (``"topic_id"``)."""
        return self._stamped(self._planning("initial offsets", self._initial_offsets))

    def getDefaultReadLimit(self) -> ReadLimit:
        """Spark's admission control: maxOffsetsPerTrigger as ``ReadMaxRows``, else
        ``ReadAllAvailable``."""
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit > 0 else ReadAllAvailable()

    @one_line_errors
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Where the micro-batch that begins at ``start`` ends, per partition: the last
        stable offset (the high watermark with read_uncommitted), at most ``limit`` rows
        past ``start`` in all; with the topic's id.

        Args:
            start: the batch's start, as Spark has it (the initial offset, or the last
                batch's end, a restarted query's from its checkpoint).
            limit: ``ReadMaxRows`` (from :meth:`getDefaultReadLimit`: maxOffsetsPerTrigger)
                caps the batch; ``ReadAllAvailable`` lifts the cap.

        Raises:
            UnknownTopicIdError: the topic was recreated since the query started.
            OffsetOutOfRangeError: ``start`` lies past the log's end (the topic was
                recreated, or the checkpoint is another topic's).
            DriverRetriesSpentError: the brokers failed retriably for
                driver.retry.timeout.ms."""
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else 0
        self._check_offset(start, "last committed a batch")
        base = _positions(start)
        offsets = self._planning("next offsets", self._offsets)
        current = {k: _end_of(o, self.options.isolation) for k, o in offsets.items()}
        # A new leader's high watermark (and so its readable end) starts below the old
        # leader's and catches up with its followers' fetches: while its log still holds
        # what was planned, the end stays where it was instead of moving back.
        for k, e in current.items():
            if e < base.get(k, 0) <= offsets[k]["log_end_offset"]:
                current[k] = base[k]
        behind = {k: (base[k], e) for k, e in current.items() if e < base.get(k, 0)}
        if behind:
            # Ends never move back by themselves: the log was replaced (a checkpoint of
            # the topic before ids, or of another topic). Planning from here would read
            # rows twice or stall, so say so instead.
            where = ", ".join(
                f"partition {k} at {b} but its log ends at {e}" for k, (b, e) in behind.items()
            )
            raise OffsetOutOfRangeError(
                f"topic {self.topic.name!r}: the query's offsets are past the log ({where}): "
                "the topic was recreated or the checkpoint belongs to another topic"
            )
        if self._target is not None:
            # Trigger.AvailableNow: nothing past the run's target; a partition added
            # since is not read in this run (its rows arrived after the start).
            current = {k: min(e, self._target.get(k, base.get(k, 0))) for k, e in current.items()}
        ends = {**base, **current}
        return self._stamped(cap_ends(base, ends, cap))

    @one_line_errors
    def prepareForTriggerAvailableNow(self) -> None:
        """Spark's SupportsTriggerAvailableNow: record the readable end of
        every partition now as the run's target; latestOffset never passes it, so the
        run reads every row available at its start (in batches of at most
        maxOffsetsPerTrigger) and ends when it gets there. Raises UnknownTopicIdError
        if the topic was recreated since the query started."""
        offsets = self._planning("the AvailableNow target", self._offsets)
        self._target = {k: _end_of(o, self.options.isolation) for k, o in offsets.items()}

    @one_line_errors
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[OffsetRangePartition]:
        """One range per partition that advanced, split as ``minPartitions`` and
        ``maxRecordsPerPartition`` ask (``split_ranges``: sub-ranges below the same end);
        a partition missing from ``start`` (added to the topic after it was planned)
        starts at 0, so none of its rows is skipped. Each range carries the topic id.
        Raises UnknownTopicIdError if ``start`` or ``end`` (the checkpoint's) name
        another id than the topic has now."""
        self._check_offset(start, "last committed a batch")
        self._check_offset(end, "planned this batch")
        planned = _positions(end)
        ranges = []
        first = _positions(start)
        for key in sorted(planned, key=int):
            s, e = first.get(key, 0), planned[key]
            if e > s:
                ranges.append(OffsetRangePartition(int(key), s, e, self.topic.pinned_id))
        return _split(self.options, ranges)

    def read(self, partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
        """In a task: every readable row of the micro-batch's range once, in offset order.
        A broker error fails the task, which Spark retries over the same range."""
        if not isinstance(partition, OffsetRangePartition):
            return iter(())
        return one_line_errors_of(
            prefetched(read_range(self.options, self.topic.name, self.schema, partition))
        )

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the broker's retention decides what the log keeps, and the
        query's progress lives in Spark's checkpoint (the offsets), not in the broker."""

    def stop(self) -> None:
        """Nothing to stop: no connection outlives a call."""
