"""``Producer``: the facade users (and the Spark sink) call; usable without Spark.

    config = ProducerConfig(linger_ms=10)
    with Producer(bootstrap="host:port", config=config) as producer:
        future = producer.send("payments", table, key="account")
        producer.flush()
        future.result()   # [RecordMetadata(partition, base_offset, last_offset, rows), ...]

The settings are a typed :class:`~broker_core.producer.config.ProducerConfig`; the
Kafka-style keys work too, as keyword arguments with dots (``**{"batch.size": 1 << 20}``,
as a ``.properties`` file or the Spark sink's options have them) or underscores
(``batch_size=1 << 20``), checked the same way. Idempotence is on by default.

Transactions: ``init_transactions(id)`` once (fences every older producer of that id),
then ``begin_transaction()``, sends, ``commit_transaction()`` or ``abort_transaction()``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import pyarrow as pa

from broker_core.client.broker_client import BrokerClient
from broker_core.client.connections import FlightConnections
from broker_core.errors import (
    IdemlogError,
    InvalidConfigError,
    InvalidRequestError,
    InvalidTxnStateError,
    ProducerFencedError,
)
from broker_core.protocol.wire import SinkAttempt, SinkTxnStatus
from broker_core.retry import RetryPolicy
from broker_core.security.tls import Side

from .config import ProducerConfig
from .errors import (
    AbortableTransactionError,
    MaxBlockTimeoutError,
    ProducerClosedError,
    TransactionAbortedError,
)
from .futures import SendCollector, SendResult
from .message_accumulator import MessageAccumulator
from .metrics import ProducerMetrics
from .partitioner import Partitioner, PartitionSlice
from .producer_batch import TopicPartition
from .sender import Sender
from .transaction_manager import TransactionManager, TxnState
from .transport import FlightTransport, Transport

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("idemlog.producer")

Data: TypeAlias = "pa.Table | pa.RecordBatch | pd.DataFrame"
T = TypeVar("T")


@dataclass(frozen=True)
class RoutedRows:
    """Rows of one send split by partition (:meth:`Producer.route`), not queued yet."""

    topic: str
    parts: list[PartitionSlice]


def _to_table(data: Data) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    # A DataFrame exists only once its caller imported pandas: never imported here.
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(data, pandas.DataFrame):
        return pa.Table.from_pandas(data, preserve_index=False)
    raise InvalidRequestError(
        f"send() takes a pyarrow Table or RecordBatch or a pandas DataFrame, not "
        f"{type(data).__name__}"
    )


def _settings(
    bootstrap: str | None, config: ProducerConfig | None, keys: Mapping[str, object]
) -> ProducerConfig:
    """The producer's settings from what its constructor was given (see there)."""
    if config is not None and keys:
        raise InvalidConfigError(
            f"Producer(config=..., {', '.join(sorted(keys))}=...): pass the settings either as "
            "config or as keys, not both"
        )
    if config is None:
        values: dict[str, object] = {k.replace("_", "."): v for k, v in keys.items()}
        if bootstrap is not None:
            values["bootstrap.servers"] = bootstrap
        return ProducerConfig.from_mapping(values)
    if bootstrap is None:
        return config
    if config.bootstrap_servers not in ("", bootstrap):
        raise InvalidConfigError(
            f"Producer({bootstrap!r}, config=...) with bootstrap.servers="
            f"{config.bootstrap_servers!r} in the config: give the brokers once"
        )
    return replace(config, bootstrap_servers=bootstrap)


class Producer:
    """Kafka's idempotent and transactional producer for Arrow rows, over Flight.

    Guarantees, per partition: rows sent are appended in send order, at most once each
    even when a request is retried (idempotence: producer id, epoch and sequence numbers
    checked by the broker), or lost loudly (the send's future fails). In a transaction,
    the rows of every partition become readable (read_committed) all together at
    commit, or never.
    """

    def __init__(
        self,
        bootstrap: str | None = None,
        *,
        config: ProducerConfig | None = None,
        transport: Transport | None = None,
        connections: FlightConnections | None = None,
        clock: Callable[[], float] = time.monotonic,
        topic_ids: Mapping[str, str] | None = None,
        **keys: object,
    ) -> None:
        """Start a producer: its background sender, and for an idempotent producer
        without a transactional id its producer id (blocking up to max.block.ms).

        Args:
            bootstrap: ``host:port[,host:port]``, the brokers to start from (the
                bootstrap.servers key; with ``config``, it replaces the config's).
            config: the typed settings; default: every key's default.
            transport: a transport instead of the Flight connection (tests; it sends
                with its own acks, not the config's).
            connections: a Flight connection cache to share (the Spark sink's, one per
                process, whose TLS files then apply instead of the config's); left open
                by :meth:`close`.
            clock: monotonic seconds, for linger and timeouts (tests pass a manual one).
            topic_ids: ids ({topic: id}) pinned before the producer learns them itself
                (the Spark sink's driver pins them when it plans the write); every
                request for those topics goes out with them.
            **keys: config keys instead of ``config``, dotted (``**{"linger.ms": 10}``)
                or with underscores (``linger_ms=10``), read by
                :meth:`ProducerConfig.from_mapping`.

        Raises:
            InvalidConfigError: naming the key for an unknown key or a bad value, for
                ``config`` and ``keys`` both given, and when no bootstrap server is given.
            MaxBlockTimeoutError: the producer id could not be had within max.block.ms.
            IdemlogError: a non-retriable broker error, as it is.
        """
        self.config = _settings(bootstrap, config, keys)
        if transport is None:
            if not self.config.bootstrap_servers:
                raise InvalidConfigError("bootstrap.servers is required (host:port[,host:port])")
            timeout_s = self.config.request_timeout_ms / 1000
            transport = FlightTransport(
                BrokerClient(
                    self.config.bootstrap_servers,
                    timeout_s=timeout_s,
                    connections=connections,
                    # Read and checked here: a bad file fails the constructor, naming it.
                    tls=self.config.tls.load(Side.CLIENT),
                    sasl=self.config.sasl,
                ),
                acks=self.config.acks,
                topic_ids=topic_ids,
                transactional_id=self.config.transactional_id,
            )
        self.transport = transport
        self.metrics = ProducerMetrics()
        self.partitioner = Partitioner(self.config.partitioner)
        self.accumulator = MessageAccumulator.from_config(self.config, clock)
        self.txn = TransactionManager(
            self.config.transactional_id, idempotent=self.config.enable_idempotence
        )
        self.sender = Sender(
            self.accumulator, self.txn, self.transport, self.config, self.metrics, clock=clock
        )
        self._closed = False
        self._partition_counts: dict[str, int] = {}
        if self.config.enable_idempotence and self.config.transactional_id is None:
            self._init_producer_id(None)
        self.sender.start()

    # -- sending -------------------------------------------------------------------------
    def send(self, topic: str, data: Data, key: str | None = None) -> Future[SendResult]:
        """Queue the rows of ``data`` for ``topic``. Blocks while the topic's metadata is
        fetched (retriable errors retried) and while buffer.memory is full, each at most
        max.block.ms.

        Args:
            topic: the topic to append to.
            data: a pyarrow Table or RecordBatch, or a pandas DataFrame.
            key: the column whose hash picks each row's partition (default: the
                key.column config); without one, the whole send goes to the next
                partition, round-robin.

        Returns:
            A future of the rows' offsets, one ``RecordMetadata`` per partition
            (``broker_core.producer.futures``). Delivery errors fail it; they are not
            raised here.

        Raises:
            ProducerClosedError: after ``close``, or if the sender died.
            InvalidTxnStateError: a transactional producer outside a transaction.
            InvalidRequestError: ``data`` is not a Table, RecordBatch or DataFrame.
            MaxBlockTimeoutError: the metadata not had within max.block.ms.
            BufferExhaustedError: buffer.memory still full after max.block.ms.
            IdemlogError: a non-retriable metadata error (an unknown topic), as it is.
        """
        self._require_sendable()
        return self._enqueue(self.route(topic, data, key))

    def route(self, topic: str, data: Data, key: str | None = None) -> RoutedRows:
        """Split ``data``'s rows by partition of ``topic`` as :meth:`send` would, queued
        nowhere: :meth:`send_routed` sends them. Needs no producer id and no transaction
        (the Spark sink routes a task's first rows while its InitProducerId is out).

        Args:
            topic, data, key: as :meth:`send`.

        Returns:
            The rows by partition, for :meth:`send_routed`.

        Raises:
            ProducerClosedError: after ``close``.
            InvalidRequestError, MaxBlockTimeoutError, IdemlogError: as :meth:`send`
                raises them for the data and the topic's metadata.
        """
        if self._closed:
            raise ProducerClosedError("route() on a closed producer")
        table = _to_table(data)
        key = key if key is not None else self.config.key_column
        parts = self.partitioner.split(table, key, self._num_partitions(topic))
        return RoutedRows(topic, parts)

    def send_routed(self, routed: RoutedRows) -> Future[SendResult]:
        """Queue rows :meth:`route` split (each :class:`RoutedRows` once).

        Returns:
            A future of their offsets, as :meth:`send`'s.

        Raises:
            ProducerClosedError, InvalidTxnStateError, BufferExhaustedError: as
                :meth:`send`.
        """
        self._require_sendable()
        return self._enqueue(routed)

    def _enqueue(self, routed: RoutedRows) -> Future[SendResult]:
        topic = routed.topic
        collector = SendCollector(topic)
        tps: list[TopicPartition] = []
        for part in routed.parts:
            tp = TopicPartition(topic, part.partition)
            self.accumulator.append(tp, part.batch, collector)
            tps.append(tp)
        if self.txn.is_transactional and self.txn.announce(tps):
            # The transaction's first send: the sender registers its partitions now
            # (AddPartitionsToTxn), not when a batch is ready, so the durable write is off
            # the flush's path; later partitions join the registration made then.
            self.accumulator.wake()
        collector.seal()
        return collector.future

    def _require_sendable(self) -> None:
        if self._closed:
            raise ProducerClosedError("send() on a closed producer")
        if self.txn.is_transactional:
            self.txn.require(TxnState.IN_TRANSACTION, action="send()")
        if self.sender.fatal is not None:
            raise ProducerClosedError(f"the producer's sender died: {self.sender.fatal!r}")

    def _num_partitions(self, topic: str) -> int:
        count = self._partition_counts.get(topic)
        if count is None:
            count = self._partition_counts[topic] = self._blocking_call(
                f"metadata of topic {topic!r}", lambda: self.transport.partitions_for(topic)
            )
        return count

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now and wait until every batch is done: acknowledged,
        or failed (a failure shows in its send's future, not here).

        Args:
            timeout: seconds to wait; default: delivery.timeout.ms.

        Raises:
            TimeoutError: naming how many batches are still pending when ``timeout``
                runs out; they stay queued.
        """
        self.accumulator.begin_flush()
        try:
            limit = timeout if timeout is not None else self.config.delivery_timeout_ms / 1000
            if not self.accumulator.await_complete(limit):
                raise TimeoutError(
                    f"flush: {self.accumulator.incomplete()} batches still pending after {limit}s"
                )
        finally:
            self.accumulator.end_flush()

    def close(self, timeout: float | None = None) -> None:
        """Flush, stop the sender, close the connections (not shared ``connections``).
        An open transaction is not committed: the coordinator aborts it at its timeout,
        or the next init_transactions on the id does. Calling it again does nothing.

        Args:
            timeout: seconds the flush may take (default: delivery.timeout.ms); 0: no
                flush. Batches still pending after it fail with ProducerClosedError.

        Raises:
            Nothing for a flush that timed out (it is logged).
        """
        if self._closed:
            return
        self._closed = True
        try:
            if timeout != 0:
                try:
                    self.flush(timeout)
                except TimeoutError as exc:
                    log.warning("close: %s", exc)
        finally:
            self.sender.stop()
            # Whatever is still pending fails (never silently dropped).
            self.sender.fail_pending(ProducerClosedError("the producer was closed"))
            self.transport.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def metrics_snapshot(self) -> dict[str, Any]:
        """The producer's metrics now.

        Returns:
            A new JSON-serialisable dict: the counters of ``broker_core.producer.metrics``
            (records sent, retries, duplicates, latency percentiles, ...) with
            ``buffer_bytes_used``, ``producer_id`` and ``producer_epoch``.
        """
        doc = self.metrics.snapshot()
        doc["buffer_bytes_used"] = self.accumulator.used_bytes()
        doc["producer_id"] = self.txn.producer_id
        doc["producer_epoch"] = self.txn.producer_epoch
        return doc

    # -- producer id and transactions ----------------------------------------------------
    def _blocking_call(self, what: str, call: Callable[[], T]) -> T:
        """``call``, retrying retriable errors (retry.backoff.ms apart) for up to
        max.block.ms. Raises a non-retriable error as it is; a retriable one never reaches
        the caller: after max.block.ms it becomes MaxBlockTimeoutError (cause: the last)."""
        # Backoff between retries of a retriable error, never past the deadline (one last
        # attempt is made at it); constant, as Kafka's retry.backoff.ms.
        backoff = max(self.config.retry_backoff_ms / 1000, 0.01)
        policy = RetryPolicy(
            deadline_s=self.config.max_block_ms / 1000,
            backoff_s=backoff,
            max_backoff_s=backoff,
            jitter=0.0,
        )

        def log_retry(exc: BaseException, attempts: int) -> None:
            log.info("%s: %s; retrying", what, exc)

        def timed_out(exc: BaseException, attempts: int) -> BaseException:
            return MaxBlockTimeoutError(
                f"{what}: not done within max.block.ms={self.config.max_block_ms} "
                f"({attempts} attempts; last error: {exc})"
            )

        # Each attempt too: its request timeout and the client's own routing retries
        # would otherwise run on past max.block.ms.
        deadline = time.monotonic() + self.config.max_block_ms / 1000

        def bounded() -> T:
            with self.transport.within(deadline - time.monotonic()):
                return call()

        return policy.call(bounded, before_retry=log_retry, give_up=timed_out)

    def _init_producer_id(
        self, transactional_id: str | None, attempt: SinkAttempt | None = None
    ) -> SinkTxnStatus:
        timeout = self.config.transaction_timeout_ms if transactional_id is not None else None
        status = SinkTxnStatus.NEW
        if attempt is not None:
            assert transactional_id is not None
            pid, epoch, status = self._blocking_call(
                "InitProducerId",
                lambda: self.transport.init_sink_producer(transactional_id, timeout, attempt),
            )
        else:
            pid, epoch = self._blocking_call(
                "InitProducerId", lambda: self.transport.init_producer_id(transactional_id, timeout)
            )
        self.txn.set_producer_id(pid, epoch)
        for batch in self.accumulator.queued():
            batch.reset_sequence()
        return status

    def init_transactions(self, transactional_id: str | None = None) -> None:
        """Get the producer id and epoch of a transactional id, once, before the first
        transaction. Fences every older producer of that id and aborts what it left
        open; blocks up to max.block.ms.

        Args:
            transactional_id: default: the transactional.id config.

        Raises:
            InvalidConfigError: without a transactional id, with idempotence off, or for
                an id other than the configured one.
            MaxBlockTimeoutError: the coordinator did not answer in time (the call may
                be repeated).
            ProducerFencedError: a newer producer of the id fenced this one (fatal:
                close it).
        """
        self._initialize(transactional_id, None)

    def init_sink_transaction(
        self, attempt: SinkAttempt, transactional_id: str | None = None
    ) -> SinkTxnStatus:
        """:meth:`init_transactions` for one attempt of a Spark task (docs/design.md, the
        sink protocol).

        Args:
            attempt: the sink, run and batch the attempt writes.
            transactional_id: default: the transactional.id config.

        Returns:
            NEW: older attempts are fenced; write the rows in a transaction and
            :meth:`prepare_sink_transaction` it. PREPARED: an earlier attempt of this
            task of the same run holds all its rows, still open. COMMITTED: the batch is
            committed already. With PREPARED or COMMITTED this producer must write
            nothing.

        Raises:
            As :meth:`init_transactions`.
        """
        return self._initialize(transactional_id, attempt)

    def _initialize(
        self, transactional_id: str | None, attempt: SinkAttempt | None
    ) -> SinkTxnStatus:
        tid = transactional_id or self.config.transactional_id
        if tid is None:
            raise InvalidConfigError(
                "init_transactions needs a transactional id (transactional.id)"
            )
        if not self.config.enable_idempotence:
            raise InvalidConfigError("transactions require enable.idempotence=true")
        if self.txn.transactional_id not in (None, tid):
            raise InvalidConfigError(
                f"transactional.id is {self.txn.transactional_id!r}, not {tid!r}"
            )
        self.txn.transactional_id = tid
        self.txn.transition(TxnState.INITIALIZING)
        try:
            status = self._init_producer_id(tid, attempt)
        except ProducerFencedError as exc:
            self.txn.fail_fatal(exc)
            raise
        except IdemlogError:
            self.txn.state = TxnState.UNINITIALIZED  # nothing happened; may be called again
            raise
        self.txn.transition(TxnState.READY)
        return status

    def prepare_sink_transaction(
        self, batch_id: int, ranges: Sequence[tuple[str, int, int, int]] = ()
    ) -> None:
        """Flush, then tell the coordinator the open transaction holds all of this task's
        rows of a batch; it stays open for the Spark driver's commit.

        Args:
            batch_id: the Spark batch.
            ranges: (topic, partition, first offset, last offset) per partition written.

        Raises:
            IdemlogError: the transaction's error if a batch failed (the error of the
                first batch that failed for good).
            InvalidTxnStateError: not transactional, or no transaction open.
            MaxBlockTimeoutError: the coordinator did not answer within max.block.ms.
            ProducerFencedError: a newer producer of the id fenced this one (fatal).
        """
        self._require_transactional()
        if self.txn.has_error:
            raise self._txn_error()
        self.txn.require(TxnState.IN_TRANSACTION, action="prepare_sink_transaction()")
        self.flush(self.config.max_block_ms / 1000)
        if self.txn.has_error:
            raise self._txn_error()
        tid, (pid, epoch) = self.txn.transactional_id, self.producer_id_and_epoch
        assert tid is not None
        try:
            self._blocking_call(
                "PrepareSinkTxn",
                lambda: self.transport.prepare_sink_txn(tid, pid, epoch, batch_id, ranges),
            )
        except ProducerFencedError as exc:
            self.txn.fail_fatal(exc)
            raise

    def begin_transaction(self) -> None:
        """Start a transaction: the sends until commit or abort belong to it. Local only
        (nothing is sent until the first batch).

        Raises:
            InvalidTxnStateError: unless ``init_transactions`` was called and no
                transaction is open.
        """
        self.txn.require(TxnState.READY, action="begin_transaction()")
        self.txn.transition(TxnState.IN_TRANSACTION)

    def commit_transaction(self) -> None:
        """Flush, then commit: every partition's rows of the transaction become readable
        (read_committed) together.

        Raises:
            IdemlogError: the transaction's error, that of the first batch that failed for
                good, if one did; the transaction is then abortable: call
                :meth:`abort_transaction`.
            MaxBlockTimeoutError: batches or the coordinator not done within
                max.block.ms; the call may be made again.
            ProducerFencedError: a newer producer of the id fenced this one (fatal).
            InvalidTxnStateError: not transactional, or no transaction open.
        """
        self._require_transactional()
        if self.txn.has_error:
            raise self._txn_error()
        self.txn.require(
            TxnState.IN_TRANSACTION, TxnState.COMMITTING_TRANSACTION, action="commit_transaction()"
        )
        if self.txn.state is TxnState.IN_TRANSACTION:
            self.txn.transition(TxnState.COMMITTING_TRANSACTION)
        try:
            self.flush(self.config.max_block_ms / 1000)
        except TimeoutError as exc:
            raise MaxBlockTimeoutError(
                f"commit_transaction: batches still pending after "
                f"max.block.ms={self.config.max_block_ms}"
            ) from exc
        if self.txn.has_error:
            raise self._txn_error()
        self._end_txn(commit=True)

    def abort_transaction(self) -> None:
        """Fail what is still queued, wait for what is in flight, abort; after an error
        that left sequences in doubt, re-initialise (bumps the epoch). None of the
        transaction's rows become readable (read_committed).

        Raises:
            TimeoutError: batches still in flight after max.block.ms.
            MaxBlockTimeoutError: the coordinator did not answer within max.block.ms;
                the call may be made again, as :meth:`commit_transaction`.
            InvalidTxnStateError: not transactional, or no open or failed transaction.
            IdemlogError: the coordinator's error if the abort cannot be sent (the
                producer is then unusable: close it).
        """
        self._require_transactional()
        self.txn.require(
            TxnState.IN_TRANSACTION,
            TxnState.ABORTABLE_ERROR,
            TxnState.ABORTING_TRANSACTION,
            action="abort_transaction()",
        )
        if self.txn.state is TxnState.ABORTING_TRANSACTION:
            self._end_txn(commit=False)  # the EndTxn of an earlier call, again
            return
        needs_new_epoch = self.txn.state is TxnState.ABORTABLE_ERROR
        self.txn.transition(TxnState.ABORTING_TRANSACTION)
        aborted = TransactionAbortedError("the transaction was aborted")
        for batch in self.accumulator.remove_all(lambda _b: True):
            # A queued retry already had a sequence: dropping it leaves a gap, so the
            # sequences restart under a new epoch.
            needs_new_epoch = needs_new_epoch or batch.has_sequence
            batch.fail(aborted)
            self.accumulator.deallocate(batch)
        if not self.accumulator.await_complete(self.config.max_block_ms / 1000):
            raise TimeoutError("abort_transaction: batches still in flight after max.block.ms")
        if needs_new_epoch:
            # InitProducerId on the same id aborts the open transaction and bumps the epoch.
            assert self.txn.transactional_id is not None
            self.txn.transition(TxnState.INITIALIZING)
            self.txn.transaction_ended()
            try:
                self._init_producer_id(self.txn.transactional_id)
            except IdemlogError as exc:
                self.txn.fail_fatal(exc)
                raise
            self.txn.transition(TxnState.READY)
            return
        self._end_txn(commit=False)

    def _end_txn(self, commit: bool) -> None:
        txn = self.txn
        assert txn.transactional_id is not None
        tid, pid, epoch = txn.transactional_id, txn.producer_id, txn.producer_epoch
        if txn.txn_partitions:  # nothing was added: the coordinator has nothing to end
            try:
                next_pid, next_epoch = self._blocking_call(
                    "EndTxn", lambda: self.transport.end_txn(tid, pid, epoch, commit)
                )
            except ProducerFencedError as exc:
                txn.fail_fatal(exc)
                raise
            except IdemlogError as exc:
                # After a timeout the commit stays COMMITTING (the abort ABORTING): a retry
                # of EndTxn is answered as the first was, so the call may simply be made
                # again.
                if isinstance(exc, MaxBlockTimeoutError):
                    raise
                if not commit:
                    txn.fail_fatal(exc)
                else:
                    txn.fail_abortable(exc)
                raise
            if (next_pid, next_epoch) != (pid, epoch):
                # The transaction ended at its own epoch: the next one writes at the new
                # epoch, every partition's sequences from 0 (KIP-890).
                txn.set_producer_id(next_pid, next_epoch)
        txn.transaction_ended()
        txn.transition(TxnState.READY)

    def _txn_error(self) -> IdemlogError:
        """What commit / prepare refuse with: the error that failed the transaction (a
        batch's, unchanged, so the caller sees why its rows are missing)."""
        error = self.txn.last_error
        if error is None:
            return AbortableTransactionError("the transaction cannot be committed: abort it")
        return error

    def _require_transactional(self) -> None:
        if not self.txn.is_transactional:
            raise InvalidTxnStateError("not a transactional producer: call init_transactions()")

    @property
    def producer_id_and_epoch(self) -> tuple[int, int]:
        """The producer id and epoch in use now; (-1, -1) before one was assigned."""
        return self.txn.producer_id, self.txn.producer_epoch
