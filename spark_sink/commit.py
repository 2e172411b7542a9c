"""The driver's side of the sink protocol: the tasks' commit messages, and the commit or
abort of a batch (docs/design.md, "The sink protocol").

Spark calls the writer's ``commit``/``abort`` (``spark_sink.writer``) on the driver, in a
Python process of its own, with the messages its tasks returned. Here they are checked to
belong to the batch and run, then handed to the coordinator: ``commit_sink_batch`` (all of
the batch's transactions, once) or ``abort_sink_run`` (every attempt of the run at the
batch, fenced). Both are idempotent, so a broker that fails mid-request is asked again
until the deadline.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.datasource import WriterCommitMessage

from broker_core.client.broker_client import BrokerClient
from broker_core.errors import InvalidProducerIdMappingError
from broker_core.protocol.wire import SinkTxnStatus
from broker_core.security.tls import Side
from spark_sink import progress_spool
from spark_sink.driver_retry import retrying
from spark_sink.errors import SinkStateLostError
from spark_sink.hooks import NO_HOOKS, Point, SinkHooks
from spark_sink.options import IdemlogOptions

log = logging.getLogger("idemlog.sink")

# Each commit or abort request may take _REQUEST_TIMEOUT_S: longer than the coordinator's
# worst case with the broker's defaults, a marker retry started just before its deadline
# (transaction.marker.retry.deadline.ms, 90 s) that then runs a whole marker call (70 s),
# so the driver never gives up on a commit the coordinator is still completing. A request
# that failed retriably (a timeout included) is tried again for the option
# driver.retry.timeout.ms counted from that failure (spark_sink.driver_retry), then the
# batch fails. docs/failure-model.md, "Timeouts on the commit path".
_REQUEST_TIMEOUT_S = 180.0


@dataclass
class IdemlogCommitMessage(WriterCommitMessage):
    """What a successful task attempt tells the driver (pickled by Spark)."""

    sink_id: str
    run_id: str
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


def _messages(
    run_id: str, batch_id: int, messages: Sequence[WriterCommitMessage | None]
) -> list[IdemlogCommitMessage]:
    """The tasks' messages, each checked to belong to this run's ``batch_id``.

    Spark hands the driver one message per task; one that names another batch or run
    would commit rows this batch did not plan (or leave its own out), so it fails loudly.
    """
    ours: list[IdemlogCommitMessage] = []
    for index, m in enumerate(messages):
        if m is None:
            continue
        if not isinstance(m, IdemlogCommitMessage):
            raise RuntimeError(
                f"batch {batch_id}: task {index} returned {type(m).__name__}, not an idemlog "
                "commit message"
            )
        if (m.run_id, m.batch_id) != (run_id, batch_id):
            raise RuntimeError(
                f"batch {batch_id} of run {run_id}: task {index} reported batch {m.batch_id} "
                f"of run {m.run_id}; refusing to commit rows another batch planned"
            )
        ours.append(m)
    sinks = {m.sink_id for m in ours}
    if len(sinks) > 1:
        raise RuntimeError(f"batch {batch_id}: tasks report different sinks {sorted(sinks)}")
    return ours


def commit_batch(
    options: IdemlogOptions,
    sink_id: str | None,
    run_id: str,
    batch_id: int,
    messages: Sequence[WriterCommitMessage | None],
    hooks: SinkHooks = NO_HOOKS,
    *,
    report: bool = False,
) -> bool:
    """The driver's commit of one Spark batch; False if it was committed before.

    ``hooks``: the write's, called at the commit's points and around its steps.
    ``report``: spool the batch's figures for the query's progress (``spark_sink.progress``).
    """
    ours = _messages(run_id, batch_id, messages)
    if len(ours) != len(messages):
        missing = [i for i, m in enumerate(messages) if m is None]
        raise RuntimeError(f"commit of batch {batch_id}: tasks {missing} returned no message")
    if sink_id is None:
        if not ours:
            return False  # no task ran: nothing to commit
        sink_id = ours[0].sink_id
    elif ours and ours[0].sink_id != sink_id:
        raise RuntimeError(
            f"commit of batch {batch_id} of sink {sink_id}: tasks wrote for {ours[0].sink_id}"
        )
    with hooks.span("commit", batch=batch_id):
        return _commit(options, sink_id, run_id, batch_id, ours, report, hooks)


def _commit(
    options: IdemlogOptions,
    sink_id: str,
    run_id: str,
    batch_id: int,
    ours: list[IdemlogCommitMessage],
    report: bool,
    hooks: SinkHooks,
) -> bool:
    hooks.at(Point.BEFORE_COMMIT, batch_id)
    txns = [m.transaction for m in ours if m.status != SinkTxnStatus.COMMITTED]
    sid = sink_id

    def send_request() -> None:
        # For a hook that acts inside the commit: the request leaves on a client and a
        # thread of its own, and the hook disturbs the driver while it is in flight (the
        # broker may or may not record it). Idempotent: the request below may follow.
        client = BrokerClient(
            options.bootstrap(), tls=options.tls.load(Side.CLIENT), sasl=options.sasl
        )
        threading.Thread(
            target=client.commit_sink_batch, args=(sid, batch_id, txns, run_id), daemon=True
        ).start()

    hooks.at(Point.INSIDE_COMMIT, batch_id, effect=send_request)
    started = time.perf_counter()
    with hooks.span("commit_request", batch=batch_id):
        try:
            committed: bool = retrying(
                options,
                f"commit of batch {batch_id}",
                lambda c: c.commit_sink_batch(sid, batch_id, txns, run_id),
                request_timeout_s=_REQUEST_TIMEOUT_S,
            )
        except InvalidProducerIdMappingError as exc:
            _raise_if_stranded(options, sid, batch_id, txns, exc)
            raise
    if report:
        _report(sid, batch_id, ours, committed, (time.perf_counter() - started) * 1000)
    hooks.at(Point.AFTER_COMMIT, batch_id)
    log.info(
        "sink %s batch %d: %s (%d transactions, %d rows)",
        sink_id,
        batch_id,
        "committed" if committed else "already committed; this run's transactions aborted",
        len(txns),
        sum(m.rows for m in ours),
    )
    return committed


def _raise_if_stranded(
    options: IdemlogOptions,
    sink_id: str,
    batch_id: int,
    txns: Sequence[tuple[str, int, int]],
    cause: InvalidProducerIdMappingError,
) -> None:
    """Raise ``SinkStateLostError`` if the coordinator, which no longer maps the batch's
    transactional ids (``cause``), left its transactions open on the topic: its state
    is gone, and those transactions hold the partitions' readers until an operator
    aborts them. Else return (an id expired, nothing left open: ``cause`` stands)."""
    pids = {pid for _, pid, _ in txns}

    def open_ones(client: BrokerClient) -> list[tuple[int, int, int]]:
        leaders = client.metadata(True).topics.get(options.topic, [])
        found = []
        for partition in range(len(leaders)):
            for p in client.describe_producers(options.topic, partition).producers:
                if p.producer_id in pids and p.has_open_transaction:
                    found.append((partition, p.producer_id, p.txn_start_offset))
        return found

    stranded = retrying(
        options,
        f"open transactions of batch {batch_id}",
        open_ones,
        request_timeout_s=_REQUEST_TIMEOUT_S,
    )
    if not stranded:
        return
    where = ", ".join(
        f"{options.topic}-{partition} producer id {pid} from offset {first}"
        for partition, pid, first in stranded
    )
    raise SinkStateLostError(
        f"sink {sink_id} batch {batch_id}: the transaction coordinator lost this batch's state "
        f"({cause.message}) while its prepared transactions are still open ({where}); they "
        "hold the partitions' readers and no coordinator will end them, so the batch is not "
        "run again on top of them. Find them with 'idemlog transactions find-hanging "
        f"--bootstrap ... --topic {options.topic} --older-than-ms 0', abort each with "
        "'idemlog transactions "
        "abort --topic T --partition P --producer-id ID', then restart the query "
        "(docs/operations.md, Hanging transactions)"
    ) from cause


def _report(
    sink_id: str,
    batch_id: int,
    ours: Sequence[IdemlogCommitMessage],
    committed: bool,
    commit_ms: float,
) -> None:
    figures = progress_spool.SinkProgress(
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
        progress_spool.record(figures)
    except OSError as exc:
        # The batch is committed; failing it now over a progress file would only make
        # Spark re-run it. The figures of this one batch are missing from its progress.
        log.warning("sink %s batch %d: progress figures not recorded: %s", sink_id, batch_id, exc)


def abort_batch(
    options: IdemlogOptions,
    run_id: str,
    batch_id: int,
    messages: Sequence[WriterCommitMessage | None],
) -> None:
    """Fence every task attempt of this run at this batch (or before) that still holds a
    transactional id: whatever is open is aborted at once, and an attempt still writing
    is refused as fenced at its next request.

    Works from the run id alone, so a batch whose tasks all failed (every message None)
    is aborted too; an attempt that starts after this is ended by the transaction
    timeout once its task is gone.
    """
    ours = _messages(run_id, batch_id, messages)
    aborted: list[str] = retrying(
        options,
        f"abort of batch {batch_id}",
        lambda c: c.abort_sink_run(run_id, batch_id),
        request_timeout_s=_REQUEST_TIMEOUT_S,
    )
    log.info(
        "batch %d of run %s: aborted (%d task transactions fenced, %d tasks reported)",
        batch_id,
        run_id,
        len(aborted),
        len(ours),
    )


def abort_sink_attempts(options: IdemlogOptions, sink_id: str, batch_id: int) -> list[str]:
    """Fence every attempt of any run of ``sink_id`` at ``batch_id`` or before (an abort
    no task reported for); their transactional ids."""
    aborted: list[str] = retrying(
        options,
        f"abort of batch {batch_id}",
        lambda c: c.abort_sink_run(None, batch_id, sink_id=sink_id),
        request_timeout_s=_REQUEST_TIMEOUT_S,
    )
    return aborted


def run_of(messages: Sequence[WriterCommitMessage | None], batch_id: int) -> str | None:
    """The run the tasks' messages name (they must agree), or None without messages."""
    runs = {m.run_id for m in messages if isinstance(m, IdemlogCommitMessage)}
    if len(runs) > 1:
        raise RuntimeError(f"batch {batch_id}: the tasks report different runs {sorted(runs)}")
    return next(iter(runs), None)


def query_id_of_checkpoint(checkpoint: str) -> str | None:
    """The streaming query id in ``<checkpoint>/metadata`` (Spark's JSON ``{"id": ..}``),
    if the checkpoint is a local path and readable."""
    if not checkpoint:
        return None
    path = Path(checkpoint.removeprefix("file:")) / "metadata"
    try:
        first = path.read_text().splitlines()[0]
        query_id = json.loads(first)["id"]
    except (OSError, IndexError, ValueError, KeyError, TypeError):
        return None
    return query_id if isinstance(query_id, str) and query_id else None
