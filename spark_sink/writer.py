"""The exactly-once write protocol between Spark tasks, the driver and the broker (DESIGN §6).

Each Spark task writes its partition's Arrow batches as **one transaction** of the
transactional id ``<sink id>/<spark partition>``:

1. ``InitProducerId(id, batch)``: fences every earlier attempt of the task and aborts
   what it left open -- unless an earlier attempt already *prepared* this batch (all its
   rows acknowledged), in which case that transaction is reused and nothing is written.
   So a speculative twin or a retry after a late failure never aborts a finished
   attempt, and never writes the rows twice.
2. the rows, through the idempotent producer (retries are deduplicated by sequence);
3. ``prepare_sink_txn``: the transaction holds all of the task's rows;
4. the commit message (transactional id, producer id, epoch) goes to the driver.

The driver's ``commit`` (a fresh Python process each time) hands all messages to the
coordinator's ``commit_sink_batch(sink id, batch id)``: recorded durably, then COMMIT
markers; a batch id at or below the sink's last committed one aborts the transactions
instead (Spark re-runs and re-commits the last batch after a driver restart). ``abort``
fences every task's transactional id (InitProducerId), which aborts what is open.

Nothing is visible to ``read_committed`` readers before the driver's commit.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from broker_core.client import BrokerClient
from broker_core.errors import IdemlogError
from broker_core.protocol import SinkTxnStatus
from spark_sink import failpoints, progress
from spark_sink.options import IdemlogOptions
from spark_sink.producer import Producer
from spark_sink.producer.transport import FlightTransport
from spark_sink.schema import conform

log = logging.getLogger("idemlog.sink")

BATCH_JOB_BATCH_ID = 0  # df.write has no batch id: one commit per job
# The driver retries a commit or abort that failed retriably for this long, then fails
# the batch; each request may take _REQUEST_TIMEOUT_S.
_COMMIT_TIMEOUT_S = 120.0
_REQUEST_TIMEOUT_S = 60.0
T = TypeVar("T")


@dataclass
class IdemlogCommitMessage(WriterCommitMessage):
    """What a successful task attempt tells the driver (pickled by Spark)."""

    sink_id: str
    batch_id: int
    partition_id: int
    attempt: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    status: str  # a SinkTxnStatus value: NEW (written now), PREPARED/COMMITTED (reused)
    rows: int
    batches: int  # produce batches the broker acknowledged (after the per-partition split)
    duplicates: int  # batches the broker answered as already written (retries)
    retries: int
    write_ms: float

    @property
    def transaction(self) -> tuple[str, int, int]:
        return self.transactional_id, self.producer_id, self.producer_epoch


def transactional_id(sink_id: str, partition_id: int) -> str:
    return f"{sink_id}/{partition_id}"


def write_task(
    options: IdemlogOptions,
    schema: pa.Schema,
    sink_id: str,
    batch_id: int,
    batches: Iterator[pa.RecordBatch],
) -> IdemlogCommitMessage:
    """One attempt of one Spark task: its rows as one prepared transaction."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition_id = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    started = time.perf_counter()
    failpoints.hit("before_write", batch_id, partition_id)
    tid = transactional_id(sink_id, partition_id)
    lost_ack = failpoints.claim("lost_ack", batch_id, partition_id)
    producer = Producer(
        options.bootstrap(),
        transport=None
        if lost_ack is None
        else failpoints.losing_acks(lost_ack, FlightTransport(BrokerClient(options.bootstrap()))),
        **{
            "transactional.id": tid,
            "transaction.timeout.ms": options.transaction_timeout_ms,
            **options.producer,
        },
    )
    rows = count = 0
    try:
        status = producer.init_sink_transaction(batch_id)
        if status is SinkTxnStatus.NEW:
            producer.begin_transaction()
            # Spark hands over 10k-row batches; sending them merged up to batch.size makes
            # produce batches that size even after the key split, instead of many small ones.
            pending: list[pa.RecordBatch] = []
            pending_bytes = 0
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                pending.append(conform(batch, schema))
                pending_bytes += batch.nbytes
                rows += batch.num_rows
                if pending_bytes >= producer.config.batch_size:
                    _send(producer, options, pending, batch_id, partition_id, first=count == 0)
                    count += 1
                    pending, pending_bytes = [], 0
            if pending:
                _send(producer, options, pending, batch_id, partition_id, first=count == 0)
                count += 1
            producer.prepare_sink_transaction(batch_id)
            failpoints.hit("after_prepare", batch_id, partition_id)
        else:
            # The rows are in the reused transaction; counted so the batch's figures add up.
            rows = sum(batch.num_rows for batch in batches)
            log.info(
                "sink %s batch %d partition %d attempt %d: reusing the %s transaction of an "
                "earlier attempt",
                sink_id,
                batch_id,
                partition_id,
                attempt,
                status,
            )
        metrics = producer.metrics_snapshot()
        pid, epoch = producer.producer_id_and_epoch
    finally:
        # Never commits: the transaction stays open for the driver (or is fenced).
        producer.close(timeout=0)
    return IdemlogCommitMessage(
        sink_id=sink_id,
        batch_id=batch_id,
        partition_id=partition_id,
        attempt=attempt,
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


def _retrying(options: IdemlogOptions, what: str, call: Callable[[BrokerClient], T]) -> T:
    """``call`` until it succeeds or fails for good. Commit and abort are idempotent, so a
    broker that died mid-request (retriable errors) is simply asked again -- the embedded
    broker is restarted by ``options.bootstrap()`` -- until the deadline."""
    deadline = time.monotonic() + _COMMIT_TIMEOUT_S
    backoff = 0.1
    while True:
        try:
            with BrokerClient(options.bootstrap(), timeout_s=_REQUEST_TIMEOUT_S) as client:
                return call(client)
        except IdemlogError as exc:
            if not exc.retriable or time.monotonic() + backoff > deadline:
                raise
            log.warning("%s: %s; retrying", what, exc)
            time.sleep(backoff)  # back off before asking a recovering broker again
            backoff = min(backoff * 2, 2.0)


def _send(
    producer: Producer,
    options: IdemlogOptions,
    batches: list[pa.RecordBatch],
    batch_id: int,
    partition_id: int,
    *,
    first: bool,
) -> None:
    producer.send(options.topic, pa.Table.from_batches(batches), key=options.key)
    if first and (entry := failpoints.claim("mid_write", batch_id, partition_id)):
        producer.flush()  # some rows really are in the log when it fires
        failpoints.act(entry)


def _messages(messages: Sequence[WriterCommitMessage | None]) -> list[IdemlogCommitMessage]:
    return [m for m in messages if isinstance(m, IdemlogCommitMessage)]


def commit_batch(
    options: IdemlogOptions,
    sink_id: str | None,
    batch_id: int,
    messages: Sequence[WriterCommitMessage | None],
    *,
    report: bool = False,
) -> bool:
    """The driver's commit of one Spark batch; False if it was committed before.

    ``report``: spool the batch's figures for the query's progress (``spark_sink.progress``).
    """
    ours = _messages(messages)
    if len(ours) != len(messages):
        missing = [i for i, m in enumerate(messages) if not isinstance(m, IdemlogCommitMessage)]
        raise RuntimeError(f"commit of batch {batch_id}: tasks {missing} returned no message")
    if sink_id is None:
        if not ours:
            return False  # no task ran: nothing to commit
        sink_id = ours[0].sink_id
    failpoints.hit("before_commit", batch_id)
    txns = [m.transaction for m in ours if m.status != SinkTxnStatus.COMMITTED]
    inside = failpoints.claim("inside_commit", batch_id)
    if inside is not None:
        # The request leaves, and the driver dies while it is in flight: the broker may
        # or may not have recorded the commit.
        client = BrokerClient(options.bootstrap())
        sender = threading.Thread(
            target=client.commit_sink_batch, args=(sink_id, batch_id, txns), daemon=True
        )
        sender.start()
        failpoints.act(inside)
    sid = sink_id
    started = time.perf_counter()
    committed: bool = _retrying(
        options, f"commit of batch {batch_id}", lambda c: c.commit_sink_batch(sid, batch_id, txns)
    )
    if report:
        _report(sid, batch_id, ours, committed, (time.perf_counter() - started) * 1000)
    failpoints.hit("after_commit", batch_id)
    log.info(
        "sink %s batch %d: %s (%d transactions, %d rows)",
        sink_id,
        batch_id,
        "committed" if committed else "already committed; this run's transactions aborted",
        len(txns),
        sum(m.rows for m in ours),
    )
    return committed


def _report(
    sink_id: str,
    batch_id: int,
    ours: Sequence[IdemlogCommitMessage],
    committed: bool,
    commit_ms: float,
) -> None:
    figures = progress.SinkBatchFigures(
        query_id=sink_id,
        batch_id=batch_id,
        committed=committed,
        tasks=len(ours),
        tasks_reused=sum(m.status != SinkTxnStatus.NEW for m in ours),
        rows=sum(m.rows for m in ours),
        producer_batches=sum(m.batches for m in ours),
        duplicates_acked=sum(m.duplicates for m in ours),
        producer_retries=sum(m.retries for m in ours),
        write_ms_max=max((m.write_ms for m in ours), default=0.0),
        commit_ms=commit_ms,
        committed_at_ms=int(time.time() * 1000),
    )
    try:
        progress.record(figures)
    except OSError as exc:
        # The batch is committed; failing it now over a progress file would only make
        # Spark re-run it. The figures of this one batch are missing from its progress.
        log.warning("sink %s batch %d: progress figures not recorded: %s", sink_id, batch_id, exc)


def abort_batch(
    options: IdemlogOptions,
    sink_id: str | None,
    batch_id: int,
    messages: Sequence[WriterCommitMessage | None],
) -> None:
    """Fence every task's transactional id of the batch: whatever is open is aborted.

    Failed tasks appear as None; their id is still ``<sink id>/<index>``. Without any
    message a streaming sink's id is unknown here: the batch's rerun fences them, and the
    broker aborts them after ``transaction.timeout.ms`` otherwise.
    """
    ours = _messages(messages)
    if sink_id is None:
        if not ours:
            log.warning(
                "abort of batch %d: no task reported, open transactions are aborted when "
                "the batch reruns or after transaction.timeout.ms",
                batch_id,
            )
            return
        sink_id = ours[0].sink_id
    ids = [transactional_id(sink_id, index) for index in range(len(messages))]

    def fence(client: BrokerClient) -> None:
        for tid in ids:  # InitProducerId is idempotent in effect: a repeat fences again
            client.init_producer_id(tid)

    _retrying(options, f"abort of batch {batch_id}", fence)
    log.info("sink %s batch %d: aborted %d task transactions", sink_id, batch_id, len(messages))


class IdemlogBatchWriter(DataSourceArrowWriter):
    """``df.write.format("idemlog")``: all-or-nothing per job, under a fresh sink id."""

    def __init__(self, options: IdemlogOptions, schema: pa.Schema) -> None:
        self.options = options
        self.schema = schema
        # Created once on the driver; Spark pickles this writer to the tasks and to the
        # commit process, so all of them agree on it.
        self.sink_id = f"batch-{uuid.uuid4()}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> IdemlogCommitMessage:
        return write_task(self.options, self.schema, self.sink_id, BATCH_JOB_BATCH_ID, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_batch(self.options, self.sink_id, BATCH_JOB_BATCH_ID, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_batch(self.options, self.sink_id, BATCH_JOB_BATCH_ID, messages)


class IdemlogStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("idemlog")``: the sink id is the streaming query id, which a
    query restarted from its checkpoint keeps; commits are idempotent per batch id."""

    def __init__(self, options: IdemlogOptions, schema: pa.Schema) -> None:
        self.options = options
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> IdemlogCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None, "write() runs in a Spark task"
        batch_id = int(ctx.getLocalProperty("streaming.sql.batchId") or BATCH_JOB_BATCH_ID)
        sink_id = ctx.getLocalProperty("sql.streaming.queryId") or f"query-{uuid.uuid4()}"
        return write_task(self.options, self.schema, sink_id, batch_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_batch(self.options, None, batchId, messages, report=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        abort_batch(self.options, None, batchId, messages)
