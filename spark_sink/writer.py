"""The exactly-once write protocol between Spark tasks, the driver and the broker.

docs/design.md ("The sink protocol") has the whole design and its reasons. In short: each
Spark task attempt writes its partition's rows as **one transaction** of the
transactional id ``<sink id>/<spark partition>``, naming its sink, run and batch
(:class:`broker_core.protocol.wire.SinkAttempt`):

1. ``InitProducerId(attempt)``: fences every earlier attempt of the task and aborts what
   it left open -- unless an earlier attempt of the same task *of the same run* already
   prepared this batch (reused, nothing written) or the batch is committed already. It
   runs on a thread of its own while the task pulls and routes its first rows; nothing is
   sent before its answer (docs/design.md, "The init overlaps the task's first rows");
2. the rows, through the idempotent producer, every send's result checked, with
   heartbeats while the task runs so a long batch is never timed out;
3. ``prepare_sink_txn`` with the offsets the rows got: the transaction holds all of the
   task's rows;
4. the commit message goes to the driver.

The driver's ``commit`` (in a Python process of Spark's, the writer built anew each time)
checks the messages and hands them to the coordinator's ``commit_sink_batch``; ``abort``
fences the run's attempts (both in ``spark_sink.commit``). Nothing is visible to
``read_committed`` readers before the driver's commit.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import IdemlogError, UnknownTopicIdError
from broker_core.protocol.txn_inputs import batch_job_sink_id
from broker_core.protocol.wire import SinkAttempt, SinkTxnStatus
from broker_core.security.tls import Side
from spark_sink.commit import (
    IdemlogCommitMessage,
    abort_batch,
    abort_sink_attempts,
    commit_batch,
    query_id_of_checkpoint,
    run_of,
)
from spark_sink.connections import shared_connections
from spark_sink.errors import one_line_errors
from spark_sink.heartbeat import HEARTBEATS
from spark_sink.hooks import NO_HOOKS, Point, SinkHooks
from spark_sink.options import IdemlogOptions
from spark_sink.schema import conform

if TYPE_CHECKING:
    from broker_core.producer.futures import SendResult
    from broker_core.producer.producer import Producer, RoutedRows

log = logging.getLogger("idemlog.sink")

BATCH_JOB_BATCH_ID = 0  # df.write has no batch id: one commit per job
# Spark's task-local properties naming a streaming task's micro-batch and query.
SPARK_BATCH_ID = "streaming.sql.batchId"
SPARK_QUERY_ID = "sql.streaming.queryId"
# A streaming query run sets its job group to its run id (StreamExecution.runStream).
SPARK_RUN_ID = "spark.jobGroup.id"


def transactional_id(sink_id: str, partition_id: int) -> str:
    return f"{sink_id}/{partition_id}"


def new_run_id() -> str:
    """A batch job's run id, made once in the driver-side writer that Spark pickles to
    every task attempt and to commit/abort (streams use Spark's own run id instead)."""
    return uuid.uuid4().hex


# Producers still closing on threads of their own after their task returned: at most this
# many at once; beyond it a task closes its producer itself.
_MAX_CLOSING = 4
_closing = threading.BoundedSemaphore(_MAX_CLOSING)


def _reset_closing() -> None:
    global _closing
    _closing = threading.BoundedSemaphore(_MAX_CLOSING)  # the parent's threads stayed there


os.register_at_fork(after_in_child=_reset_closing)


def _close_later(producer: Producer) -> None:
    """Close a producer whose transaction is prepared (or reused) off the task's path:
    its sender and produce streams end on a thread of their own (about 1 ms of joins and
    stream ends), while Spark already has the task's message. Nothing is pending (the
    rows are acknowledged and prepared), so the close sends nothing and decides nothing:
    the transaction stays open for the driver's commit, or is fenced by the next attempt,
    whether or not the close ran (a process killed before it loses only its sockets).
    Never raises (``Producer.close`` logs)."""
    slots = _closing
    if not slots.acquire(blocking=False):
        producer.close(timeout=0)
        return

    def close() -> None:
        try:
            producer.close(timeout=0)
        finally:
            slots.release()

    threading.Thread(target=close, name="idemlog-producer-close", daemon=True).start()


def write_task(
    options: IdemlogOptions,
    schema: pa.Schema,
    attempt: SinkAttempt,
    batches: Iterator[pa.RecordBatch],
    topic_id: str = "",
    hooks: SinkHooks = NO_HOOKS,
) -> IdemlogCommitMessage:
    """One attempt of one Spark task: its rows as one prepared transaction, every request
    naming the topic by ``topic_id``, the id the driver found when it planned the write
    ("": a topic stored before ids, unchecked). ``hooks``: the write's (the option
    ``hooks``), called at the task's points and steps."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("the idemlog writer runs inside a Spark task (no TaskContext)")
    partition_id = ctx.partitionId()
    with hooks.span("task", batch=attempt.batch_id, partition=partition_id):
        return _write_task(
            options, schema, attempt, batches, ctx.attemptNumber(), partition_id, topic_id, hooks
        )


def _write_task(
    options: IdemlogOptions,
    schema: pa.Schema,
    attempt: SinkAttempt,
    batches: Iterator[pa.RecordBatch],
    attempt_number: int,
    partition_id: int,
    topic_id: str,
    hooks: SinkHooks = NO_HOOKS,
) -> IdemlogCommitMessage:
    batch_id = attempt.batch_id
    started = time.perf_counter()
    hooks.at(Point.BEFORE_WRITE, batch_id, partition_id)
    tid = transactional_id(attempt.sink_id, partition_id)
    wrap_transport = hooks.transport(batch_id, partition_id)
    # Once per task: for the embedded broker each call checks that it answers.
    bootstrap = options.bootstrap()
    with hooks.span("open_producer", batch=batch_id):
        # Here, not at the top: the driver's planning and commit processes import this
        # module too, and need none of the producer.
        from broker_core.producer.producer import Producer
        from broker_core.producer.transport import FlightTransport

        # The plan's id, not one learned now: a topic recreated between the plan and
        # this task refuses the task's first request, before any row is written.
        pinned = {options.topic: topic_id} if topic_id else None
        producer = Producer(
            bootstrap,
            connections=shared_connections(options.tls, options.sasl),
            topic_ids=pinned,
            transport=None
            if wrap_transport is None
            else wrap_transport(
                FlightTransport(
                    BrokerClient(bootstrap, tls=options.tls.load(Side.CLIENT), sasl=options.sasl),
                    topic_ids=pinned,
                    transactional_id=tid,
                ),
            ),
            **{
                "transactional.id": tid,
                "transaction.timeout.ms": options.transaction_timeout_ms,
                **options.producer,
            },
        )
    rows = 0
    try:
        # The init goes out now, on a thread of its own, while this thread pulls and
        # routes the task's first rows from Spark (which waits for the JVM): its answer
        # is needed only before the first send (docs/design.md, "The init overlaps the
        # task's first rows").
        init = _BackgroundInit(producer, attempt, hooks)
        # The run's heartbeats cover the pull too: Spark may take any time to hand over
        # the first rows (the query's own work upstream), and the run's other, prepared
        # transactions must not time out meanwhile (docs/design.md, "Long batches").
        with HEARTBEATS.beating(options, bootstrap, attempt.sink_id, attempt.run_id):
            try:
                head = _pull_head(producer, options, schema, batches, batch_id, hooks)
            except BaseException as exc:
                init.settle(exc)
                raise
            with hooks.span("wait_init", batch=batch_id):
                status = init.result()
            if status is SinkTxnStatus.NEW:
                try:
                    rows = _write_rows(
                        producer, options, schema, head, batches, attempt, partition_id, hooks
                    )
                except IdemlogError as exc:
                    # The broker's refusal reaches the task as the send's or prepare's
                    # error, or as the cause that made the transaction abortable.
                    refused = exc if isinstance(exc, UnknownTopicIdError) else None
                    if refused is None and isinstance(producer.txn.last_error, UnknownTopicIdError):
                        refused = producer.txn.last_error
                    if refused is None:
                        raise
                    raise UnknownTopicIdError(
                        f"{refused.message} (after this write was planned under id "
                        f"{topic_id}): the broker refused the task's rows, none of which "
                        "reach the new topic; run the write again to write to it"
                    ) from exc
            else:
                # Nothing to write: the reused or committed transaction holds the rows.
                # They are counted so the batch's figures add up.
                rows = head.rows + sum(batch.num_rows for batch in batches)
                log.info(
                    "sink %s batch %d partition %d attempt %d: the batch's rows are %s by an "
                    "earlier attempt; nothing written",
                    attempt.sink_id,
                    batch_id,
                    partition_id,
                    attempt_number,
                    "held (prepared)" if status is SinkTxnStatus.PREPARED else "committed",
                )
        metrics = producer.metrics_snapshot()
        pid, epoch = producer.producer_id_and_epoch
    except BaseException:
        # Never commits: the transaction stays open for the driver (or is fenced).
        producer.close(timeout=0)
        raise
    _close_later(producer)
    return IdemlogCommitMessage(
        sink_id=attempt.sink_id,
        run_id=attempt.run_id,
        batch_id=batch_id,
        partition_id=partition_id,
        attempt=attempt_number,
        transactional_id=tid,
        producer_id=pid,
        producer_epoch=epoch,
        status=str(status),
        rows=rows,
        batches=int(metrics["batches_sent"]),
        duplicates=int(metrics["duplicates"]),
        retries=int(metrics["retries"]),
        write_ms=(time.perf_counter() - started) * 1000,
    )


class _BackgroundInit:
    """The task attempt's InitProducerId on a thread of its own, started as soon as the
    producer exists, so that its durable coordinator write overlaps the pull of the
    task's first rows from Spark.

    Guarantees: the producer is touched by nothing else until :meth:`result` or
    :meth:`settle` returned (both join the thread), so its transaction state moves as if
    the init ran inline; the thread ends when the init call ends (its own bound:
    max.block.ms, retriable errors retried meanwhile). One thread per task attempt.
    """

    def __init__(self, producer: Producer, attempt: SinkAttempt, hooks: SinkHooks) -> None:
        self._producer = producer
        self._attempt = attempt
        self._hooks = hooks
        self._status: SinkTxnStatus | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="idemlog-init", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self._hooks.span("init_producer", batch=self._attempt.batch_id):
                self._status = self._producer.init_sink_transaction(self._attempt)
        except BaseException as exc:  # handed to the task's thread by result()
            self._error = exc

    def result(self) -> SinkTxnStatus:
        """Wait for the init's answer: NEW, PREPARED or COMMITTED. Raises the init's error
        as ``init_sink_transaction`` raised it (ProducerFencedError,
        MaxBlockTimeoutError, a non-retriable broker error)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._status is not None
        return self._status

    def settle(self, cause: BaseException) -> None:
        """The task fails with ``cause`` before it needed the answer: wait for the init
        to end anyway, so that a retry of the task (in this same process, perhaps) never
        has its own init overtaken -- and its epoch fenced -- by this one's; the init's
        own error, if any, is noted on ``cause`` (which the task raises). Never raises."""
        self._thread.join()
        if self._error is not None:
            cause.add_note(f"the task's InitProducerId failed too: {self._error!r}")


class _Head:
    """The task's first rows, pulled, conformed and split by partition while its init
    is out: at most one send's worth (batch.size bytes, plus the one Spark batch that
    crossed it), sent first once the init answered NEW."""

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []
        self.nbytes = 0
        self.rows = 0
        self.routed: RoutedRows | None = None


def _pull_head(
    producer: Producer,
    options: IdemlogOptions,
    schema: pa.Schema,
    batches: Iterator[pa.RecordBatch],
    batch_id: int,
    hooks: SinkHooks,
) -> _Head:
    """Pull rows from Spark's iterator until one send's worth is there (or the rows end)
    and split them by partition (the topic's metadata fetched meanwhile): nothing is
    queued, and nothing touches the producer's transaction (its init may be running)."""
    head = _Head()
    with hooks.span("pull_head", batch=batch_id):
        while head.nbytes < producer.config.batch_size:
            batch = next(batches, None)
            if batch is None:
                break
            if batch.num_rows == 0:
                continue
            head.batches.append(conform(batch, schema))
            head.nbytes += batch.nbytes
            head.rows += batch.num_rows
        if head.batches:
            table = pa.Table.from_batches(head.batches)
            head.routed = producer.route(options.topic, table, key=options.key)
    return head


def _write_rows(
    producer: Producer,
    options: IdemlogOptions,
    schema: pa.Schema,
    head: _Head,
    batches: Iterator[pa.RecordBatch],
    attempt: SinkAttempt,
    partition_id: int,
    hooks: SinkHooks,
) -> int:
    """The task's rows (``head``, then the rest of ``batches``) as one transaction,
    prepared once every send succeeded; the rows. Called only after an init that answered
    NEW."""
    batch_id = attempt.batch_id
    producer.begin_transaction()
    sends: list[Future[SendResult]] = []
    # Spark hands over 10k-row batches; sending them merged up to batch.size makes
    # produce batches that size even after the key split, instead of many small ones.
    pending: list[pa.RecordBatch] = []
    pending_bytes, rows = 0, head.rows
    if head.routed is not None:
        sends.append(_send(producer, options, head.routed, hooks, attempt, partition_id))
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(conform(batch, schema))
        pending_bytes += batch.nbytes
        rows += batch.num_rows
        if pending_bytes >= producer.config.batch_size:
            sends.append(_send(producer, options, pending, hooks, attempt, partition_id, sends))
            pending, pending_bytes = [], 0
    if pending:
        sends.append(_send(producer, options, pending, hooks, attempt, partition_id, sends))
    with hooks.span("flush", batch=batch_id):
        producer.flush(producer.config.max_block_ms / 1000)
    # Every send must have succeeded before the transaction may claim the task's rows:
    # result() raises a send's error, and prepare refuses a transaction with a failure.
    ranges = _offset_ranges(options.topic, [f.result(timeout=0) for f in sends])
    with hooks.span("prepare", batch=batch_id):
        producer.prepare_sink_transaction(batch_id, ranges)
    hooks.at(Point.AFTER_PREPARE, batch_id, partition_id)
    return rows


def _offset_ranges(topic: str, results: Sequence[SendResult]) -> list[tuple[str, int, int, int]]:
    """(topic, partition, first, last offset) of the rows the sends put in each partition.

    A retried batch answered DUPLICATE_SEQUENCE carries no offsets; its rows lie inside
    the range of the batches around it, except when it was a partition's first batch.
    """
    spans: dict[int, tuple[int, int]] = {}
    for result in results:
        for meta in result:
            if meta.base_offset < 0:
                continue
            first, last = spans.get(meta.partition, (meta.base_offset, meta.last_offset))
            spans[meta.partition] = (min(first, meta.base_offset), max(last, meta.last_offset))
    return [(topic, p, first, last) for p, (first, last) in sorted(spans.items())]


def _send(
    producer: Producer,
    options: IdemlogOptions,
    rows: list[pa.RecordBatch] | RoutedRows,
    hooks: SinkHooks,
    attempt: SinkAttempt,
    partition_id: int,
    earlier: Sequence[Future[SendResult]] = (),
) -> Future[SendResult]:
    """Send ``rows``; the task's first send (no ``earlier`` ones) is its ``mid_write``
    point, where a hook that acts flushes first, so some rows really are in the log."""
    if isinstance(rows, list):
        sent = producer.send(options.topic, pa.Table.from_batches(rows), key=options.key)
    else:
        sent = producer.send_routed(rows)
    if not earlier:
        hooks.at(Point.MID_WRITE, attempt.batch_id, partition_id, effect=producer.flush)
    return sent


class IdemlogBatchWriter(DataSourceArrowWriter):
    """``df.write.format("idemlog")``: all-or-nothing per job, under a fresh sink id.
    ``topic_id``: the topic's id when the driver planned the write, which every task
    sends (a topic recreated since refuses them). ``hooks``: the write's (the option
    ``hooks``), pickled by name to the tasks and the commit."""

    def __init__(
        self,
        options: IdemlogOptions,
        schema: pa.Schema,
        topic_id: str = "",
        hooks: SinkHooks = NO_HOOKS,
    ) -> None:
        self.options = options
        self.schema = schema
        self.topic_id = topic_id
        self.hooks = hooks
        # Created once on the driver; Spark pickles this writer to the tasks and to the
        # commit process, so all of them agree on them.
        self.run_id = new_run_id()
        # The coordinator knows a job's sink by this form: its record expires with its ids.
        self.sink_id = batch_job_sink_id(self.run_id)

    @one_line_errors
    def write(self, iterator: Iterator[pa.RecordBatch]) -> IdemlogCommitMessage:
        """In a task: the partition's rows as one prepared transaction, readable only once
        the driver commits; a retried attempt fences the earlier ones first."""
        attempt = SinkAttempt(self.sink_id, self.run_id, BATCH_JOB_BATCH_ID)
        return write_task(self.options, self.schema, attempt, iterator, self.topic_id, self.hooks)

    @one_line_errors
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """On the driver: commit every task's transaction, all or none. Retriable broker
        errors are retried for the option driver.retry.timeout.ms; then, or on any
        other error, it raises (RuntimeError for a task without a message) and the
        job's rows are either all committed (a lost answer) or none."""
        commit_batch(
            self.options, self.sink_id, self.run_id, BATCH_JOB_BATCH_ID, messages, self.hooks
        )

    @one_line_errors
    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """On the driver: abort what the job's tasks left open; none of its rows are ever
        readable."""
        abort_batch(self.options, self.run_id, BATCH_JOB_BATCH_ID, messages)


class IdemlogStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("idemlog")``: the sink id is the streaming query id, which a
    query restarted from its checkpoint keeps; commits are idempotent per batch id. The
    run id is Spark's run id of the query: a restart (which may split each batch's rows
    differently) gets a new one. Spark builds this writer anew for the tasks and for each
    commit and abort, so both ids come from the tasks (their messages). ``topic_id``: the
    topic's id when Spark planned this writer, which the tasks send: a topic recreated
    between that plan and a task refuses the task before it writes a row. (Spark plans
    a stream's writer anew for its micro-batches: seen in a test, a batch planned after
    a recreate writes to the new topic.) ``hooks``: as the batch writer's."""

    def __init__(
        self,
        options: IdemlogOptions,
        schema: pa.Schema,
        topic_id: str = "",
        hooks: SinkHooks = NO_HOOKS,
    ) -> None:
        self.options = options
        self.schema = schema
        self.topic_id = topic_id
        self.hooks = hooks

    @one_line_errors
    def write(self, iterator: Iterator[pa.RecordBatch]) -> IdemlogCommitMessage:
        """In a task: the partition's rows of this micro-batch as one prepared
        transaction; nothing if an earlier attempt of the batch already holds or
        committed them. Raises RuntimeError outside a micro-batch streaming task."""
        return write_task(
            self.options, self.schema, stream_attempt(), iterator, self.topic_id, self.hooks
        )

    @one_line_errors
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """On the driver: commit micro-batch ``batchId`` once; a batch committed before
        (a restarted query replaying it) is left as it is. Retriable broker errors are
        retried for the option driver.retry.timeout.ms; then, or on any other error, it
        raises, and the batch's
        rows are either all committed (a lost answer; a rerun of the batch finds it
        committed) or none."""
        run_id = run_of(messages, batchId)
        if run_id is None:
            if messages:  # Spark commits only when every task succeeded: cannot happen
                raise RuntimeError(
                    f"commit of batch {batchId}: none of its {len(messages)} tasks returned "
                    "a message"
                )
            return  # no task ran: nothing to commit
        commit_batch(self.options, None, run_id, batchId, messages, self.hooks, report=True)

    @one_line_errors
    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """On the driver: abort what the batch's tasks left open (found through the
        checkpoint when no task reported); none of their rows are ever readable."""
        run_id = run_of(messages, batchId)
        if run_id is not None:
            abort_batch(self.options, run_id, batchId, messages)
            return
        sink_id = query_id_of_checkpoint(self.options.checkpoint_location)
        if sink_id is None:
            log.warning(
                "abort of batch %d: no task reported and the checkpoint %r names no query; "
                "its open transactions end when the query restarts or after "
                "transaction.timeout.ms=%d",
                batchId,
                self.options.checkpoint_location,
                self.options.transaction_timeout_ms,
            )
            return
        aborted = abort_sink_attempts(self.options, sink_id, batchId)
        log.info("sink %s batch %d: aborted; %d attempts fenced", sink_id, batchId, len(aborted))


def stream_attempt() -> SinkAttempt:
    """The streaming task's attempt, from Spark's task-local properties: the query id
    (the sink), Spark's run id of the query (its job group) and the micro-batch.

    Without them the sink could not be exactly once (batch 0 and a random sink id would
    make every later batch look committed, or never), so it refuses to write.
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("the idemlog stream writer runs inside a Spark task (no TaskContext)")
    found = {
        key: ctx.getLocalProperty(key) for key in (SPARK_BATCH_ID, SPARK_QUERY_ID, SPARK_RUN_ID)
    }
    missing = [key for key, value in found.items() if not value]
    if missing:
        raise RuntimeError(
            f"the Spark task has no {', '.join(missing)} (it has {found}): the idemlog "
            "stream writer needs them to write exactly once (is this a micro-batch "
            "streaming query? continuous mode is not supported)"
        )
    try:
        bid = int(found[SPARK_BATCH_ID] or "")
    except ValueError:
        raise RuntimeError(
            f"the Spark task's {SPARK_BATCH_ID}={found[SPARK_BATCH_ID]!r} is not a number"
        ) from None
    return SinkAttempt(str(found[SPARK_QUERY_ID]), str(found[SPARK_RUN_ID]), bid)
