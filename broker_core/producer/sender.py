"""The sender: a background thread that drains the accumulator and handles the answers.

Each step (:meth:`Sender.run_once`, also called directly by deterministic tests):

1. take every answered batch (any order) and decide: success, DUPLICATE_SEQUENCE (a
   success with unknown offsets), retry, or failure for good;
2. drop the streams of batches unanswered for ``request.timeout.ms`` (they fail
   retriably), expire queued batches past ``delivery.timeout.ms``;
3. bump the epoch when a partition's sequence is unresolved and nothing is in flight;
4. drain ready partitions: the producer id, epoch and base sequence are assigned here,
   at drain time, and kept by every retry.

Ordering rules (docs/design.md §8, §9 items 13-15):

* up to ``max.in.flight.requests.per.connection`` batches per partition in flight; while a
  partition retries (a failed batch is queued again) at most **one**, and a batch that
  never had a sequence waits until every retried batch of its partition is acknowledged;
* a failed batch goes back into its queue in sequence order (``reenqueue``);
* OUT_OF_ORDER_SEQUENCE for a batch that is not the next the broker expects is the
  consequence of an earlier failure: resent, not counted as a retry;
  OUT_OF_ORDER for the batch the broker should expect, UNKNOWN_PRODUCER_ID,
  INVALID_PRODUCER_ID_MAPPING (an idempotent-only producer's token refused: the
  cluster's key was replaced), or a batch with a sequence failing for good leaves the
  partition *unresolved* → epoch bump (idempotent-only producer), see
  ``transaction_manager``;
* a transactional producer's batch that fails for good for any reason (with or without a
  sequence: a definite error, retries exhausted, delivery.timeout.ms) puts the
  transaction in ABORTABLE_ERROR with that batch's error, which commit / prepare raise;
* UNKNOWN_TOPIC_ID (the topic was deleted or recreated since the producer pinned its id,
  ``transport``) fails the batch and every batch queued for that topic, at once;
* retriable errors (the error's ``retriable`` flag) are retried with the same producer
  id, epoch and sequence after ``retry.backoff.ms``, up to ``retries`` times and within
  ``delivery.timeout.ms``; anything else fails the batch's future with the broker's error.
  No batch is ever dropped silently.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from broker_core.errors import (
    DuplicateSequenceError,
    IdemlogError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    NetworkError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    RequestTimedOutError,
    UnknownProducerIdError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
)

from .config import ProducerConfig
from .errors import AbortableTransactionError, DeliveryTimeoutError
from .message_accumulator import MessageAccumulator
from .metrics import ProducerMetrics
from .producer_batch import ProducerBatch, TopicPartition, Written
from .transaction_manager import TransactionManager, TxnState
from .transport import SendHandle, Transport

log = logging.getLogger("idemlog.producer")

# The longest wait between two steps. Answers, new or filled batches, requeues, flushes and
# close wake the sender at once (``MessageAccumulator.wake``/``notify``; a linger deadline
# bounds the wait itself); this bound only paces what
# has no event: request.timeout.ms, a retried epoch bump or AddPartitionsToTxn, and the
# facade's transaction state (a producer id, a new transaction) becoming sendable.
IDLE_S = 0.1
# Errors after which the partition's stream is dropped (a recreated topic's too: its call
# failed as a whole, and dropping it refreshes the shared client's metadata).
_STREAM_ERRORS = (
    NetworkError,
    NotLeaderOrFollowerError,
    UnknownTopicOrPartitionError,
    UnknownTopicIdError,
)


class Sender:
    def __init__(
        self,
        accumulator: MessageAccumulator,
        txn: TransactionManager,
        transport: Transport,
        config: ProducerConfig,
        metrics: ProducerMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        idle_s: float | None = None,
    ) -> None:
        """``idle_s``: the longest wait between two steps (default :data:`IDLE_S`, read
        when the sender is built); every answer, append and close wakes it sooner."""
        self.idle_s = IDLE_S if idle_s is None else idle_s
        self.accumulator = accumulator
        self.txn = txn
        self.transport = transport
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.in_flight: dict[TopicPartition, list[tuple[ProducerBatch, SendHandle]]] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._bump_retry_at = 0.0
        self._add_retry_at = 0.0
        self._add_error: IdemlogError | None = None  # last AddPartitionsToTxn failure
        self.fatal: BaseException | None = None

    # -- thread --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="idemlog-producer-sender", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self.run_once()
            except Exception as exc:  # a bug must not hang every future: fail them all
                log.exception("producer sender crashed")
                self.fatal = exc
                self._fail_everything(IdemlogError(f"the producer's sender crashed: {exc!r}"))
                return
            # No polling while batches are in flight: each handle wakes the wait when its
            # answer (or its stream's failure) arrives (_send registers the callback).
            self.accumulator.wait(min(wait, self.idle_s))

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        self.accumulator.close()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- one step ------------------------------------------------------------------------
    def run_once(self) -> float:
        """Handle answers, timeouts, an epoch bump, then send what is ready; returns the
        seconds until something may become ready."""
        now = self.clock()
        self._handle_answers(now)
        self._check_request_timeouts(now)
        self._expire(now)
        self._maybe_bump_epoch(now)
        return self._send_ready(now)

    # -- answers -------------------------------------------------------------------------
    def _handle_answers(self, now: float) -> None:
        reset: set[TopicPartition] = set()
        for tp, entries in list(self.in_flight.items()):
            pending: list[tuple[ProducerBatch, SendHandle]] = []
            answered: list[tuple[ProducerBatch, SendHandle]] = []
            for entry in entries:
                (answered if entry[1].done() else pending).append(entry)
            self.in_flight[tp] = pending
            for batch, handle in answered:
                self.txn.add_in_flight(tp, -1)
                self.metrics.answered()
                try:
                    response = handle.result(0)
                except IdemlogError as exc:
                    error: IdemlogError | None = exc
                    base, duplicate = -1, False
                else:
                    error = response.error()
                    base, duplicate = response.base_offset, response.duplicate
                if error is None:
                    self._succeeded(batch, base, duplicate, now)
                elif isinstance(error, DuplicateSequenceError):
                    self._succeeded(batch, -1, True, now)
                else:
                    if isinstance(error, _STREAM_ERRORS) and tp not in reset:
                        reset.add(tp)
                        self.transport.reset(tp, error)
                    self._failed(batch, error, now)

    def _succeeded(self, batch: ProducerBatch, base: int, duplicate: bool, now: float) -> None:
        tp = batch.tp
        if self.config.enable_idempotence and batch.producer_id == self.txn.producer_id:
            self.txn.acked(tp, batch.last_sequence, batch.ordinal)
        batch.complete(base, duplicate or base < 0)
        self.accumulator.deallocate(batch)
        self.metrics.acked(
            batch.num_rows, batch.size_bytes, (now - batch.sent_at) * 1000, duplicate or base < 0
        )
        self._maybe_end_retrying(tp)

    def _maybe_end_retrying(self, tp: TopicPartition) -> None:
        state = self.txn.partition(tp)
        if (
            state.retrying
            and state.in_flight == 0
            and not any(b.requeued for b in self.accumulator.queued(tp))
        ):
            state.retrying = False

    def _failed(self, batch: ProducerBatch, error: IdemlogError, now: float) -> None:
        tp = batch.tp
        batch.last_error = error
        idempotent = self.config.enable_idempotence
        if idempotent and batch.producer_id != self.txn.producer_id:
            # Sent under an id/epoch that was bumped since: not written under the new one.
            batch.reset_sequence()
            self._requeue(batch, now, counted=False)
            return
        if idempotent and isinstance(error, OutOfOrderSequenceError):
            batch.written = Written.NO
            state = self.txn.partition(tp)
            if state.unresolved or not self.txn.is_next_in_line(tp, batch.base_sequence):
                self._requeue(batch, now, counted=False)  # an earlier batch failed first
            else:
                self._unresolved(batch, error, now, retry=True)
            return
        if idempotent and isinstance(error, UnknownProducerIdError):
            batch.written = Written.NO
            self._unresolved(batch, error, now, retry=True)
            return
        if (
            idempotent
            and not self.txn.is_transactional
            and isinstance(error, InvalidProducerIdMappingError)
        ):
            # The broker refused the batch's producer token before reading anything else
            # of it (the cluster's token key was replaced): nothing written; the epoch
            # bump's new producer id comes with a new token.
            batch.written = Written.NO
            self._unresolved(batch, error, now, retry=True)
            return
        if isinstance(error, (InvalidProducerEpochError, ProducerFencedError)):
            batch.written = Written.NO
            if self.txn.is_transactional:
                fenced = ProducerFencedError(f"{tp}: {error.message}")
                self.txn.fail_fatal(fenced)
                self._fail_batch(batch, fenced)
                self._fail_queued(fenced)
            else:
                self._unresolved(batch, error, now, retry=True)
            return
        if isinstance(error, UnknownTopicIdError):
            # The topic was deleted (and maybe recreated) since this producer learned it:
            # nothing of it was written, and nothing this session queued for it may be,
            # in the new topic under the old sequences. Every batch for it fails now.
            batch.written = Written.NO
            self._fail_batch(batch, error)
            for queued in self.accumulator.remove_all(lambda b: b.tp.topic == tp.topic):
                self._fail_batch(queued, error)
            return
        if error.retriable:
            batch.written = Written.MAYBE
            expired = now - batch.created >= self.config.delivery_timeout_ms / 1000
            if batch.retries < self.config.retries and not expired:
                batch.retries += 1
                self._requeue(batch, now, counted=True)
            else:
                self._failed_for_good(batch, error)
            return
        batch.written = Written.NO  # a definite answer: the batch is not in the log
        self._failed_for_good(batch, error)

    def _requeue(self, batch: ProducerBatch, now: float, *, counted: bool) -> None:
        if self.txn.is_transactional and self.txn.has_error:
            self._fail_batch(batch, self._abortable_error())
            return
        self.metrics.retried(out_of_order=not counted)
        batch.requeued = True
        batch.retry_after = now + self.config.retry_backoff_ms / 1000
        if batch.has_sequence:
            self.txn.partition(batch.tp).retrying = True
        self.accumulator.reenqueue(batch)
        log.debug("requeued %r after %s", batch, batch.last_error)

    def _failed_for_good(self, batch: ProducerBatch, error: IdemlogError) -> None:
        # A transactional batch fails its transaction in _fail_batch, sequence or not.
        if batch.has_sequence and self.config.enable_idempotence and not self.txn.is_transactional:
            self.txn.mark_unresolved(batch.tp, batch.ordinal)
        self._fail_batch(batch, error)

    def _unresolved(
        self, batch: ProducerBatch, error: IdemlogError, now: float, *, retry: bool
    ) -> None:
        if self.txn.is_transactional:
            self.txn.fail_abortable(error)
            self._fail_batch(batch, error)
            self._fail_queued(self._abortable_error())
            return
        self.txn.mark_unresolved(batch.tp, batch.ordinal)
        if retry:
            self._requeue(batch, now, counted=False)
        else:
            self._fail_batch(batch, error)

    def _fail_batch(self, batch: ProducerBatch, error: IdemlogError) -> None:
        if self.txn.is_transactional:
            # Kafka's rule: ANY batch of a transaction failing for good -- a definite
            # error, retries exhausted, or expired before it ever got a sequence -- makes
            # the transaction abortable; committing without its rows would lose them
            # silently. The first such error is kept and commit / prepare raise it.
            self.txn.fail_abortable(error)
        log.warning("batch %r failed: %s", batch, error)
        batch.fail(error)
        self.accumulator.deallocate(batch)
        self.metrics.failed(batch.num_rows)
        self._maybe_end_retrying(batch.tp)

    def _fail_queued(self, error: IdemlogError) -> None:
        for batch in self.accumulator.remove_all(lambda _b: True):
            self._fail_batch(batch, error)

    def _abortable_error(self) -> AbortableTransactionError:
        return AbortableTransactionError(
            f"the transaction must be aborted: {self.txn.last_error or 'an earlier batch failed'}"
        )

    def _fail_everything(self, error: IdemlogError) -> None:
        for tp, entries in list(self.in_flight.items()):
            self.in_flight[tp] = []
            for batch, _handle in entries:
                self._fail_batch(batch, error)
        self._fail_queued(error)

    # -- timeouts ------------------------------------------------------------------------
    def _check_request_timeouts(self, now: float) -> None:
        limit = self.config.request_timeout_ms / 1000
        for tp, entries in self.in_flight.items():
            if entries and any(now - b.sent_at > limit for b, h in entries if not h.done()):
                self.transport.reset(
                    tp, RequestTimedOutError(f"{tp}: no answer within request.timeout.ms")
                )

    def _expire(self, now: float) -> None:
        limit = self.config.delivery_timeout_ms / 1000
        expired = self.accumulator.remove_all(lambda b: now - b.created >= limit)
        for batch in expired:
            last = batch.last_error
            if last is None and batch.tp not in self.txn.txn_partitions:
                last = self._add_error  # held back by AddPartitionsToTxn, never sent
            cause = f" (last error: {last})" if last else ""
            error = DeliveryTimeoutError(
                f"{batch.tp}: {batch.num_rows} rows not acknowledged within "
                f"delivery.timeout.ms={self.config.delivery_timeout_ms}{cause}"
            )
            self._failed_for_good(batch, error)

    # -- epoch bump (idempotent-only producer) -------------------------------------------
    def _maybe_bump_epoch(self, now: float) -> None:
        if self.txn.is_transactional or not self.config.enable_idempotence:
            return
        unresolved = self.txn.unresolved_partitions()
        self.txn.bump_requested = bool(unresolved)
        if not unresolved or now < self._bump_retry_at:
            return
        if self.txn.in_flight_total() > 0:
            return  # wait for every answer first
        queued = self.accumulator.queued()
        if any(b.has_sequence and b.written is Written.MAYBE for b in queued):
            return  # batches that may be in the log retry at the old epoch first
        try:
            pid, epoch = self.transport.init_producer_id(None, None)
        except IdemlogError as exc:
            log.warning("epoch bump failed, retrying: %s", exc)
            self._bump_retry_at = now + max(self.config.retry_backoff_ms / 1000, 0.01)
            return
        log.info(
            "producer id %d epoch %d -> %d epoch %d (unresolved sequences on %s)",
            self.txn.producer_id,
            self.txn.producer_epoch,
            pid,
            epoch,
            ", ".join(str(tp) for tp in unresolved),
        )
        self.txn.set_producer_id(pid, epoch)
        for batch in queued:
            batch.reset_sequence()
        self.metrics.bumped()

    # -- sending -------------------------------------------------------------------------
    def _sendable(self, tp: TopicPartition, head: ProducerBatch) -> bool:
        txn = self.txn
        if txn.is_transactional and txn.has_error:
            return True  # drained only to be failed
        if self.config.enable_idempotence and not txn.has_producer_id:
            return False
        if any(handle.done() for _b, handle in self.in_flight.get(tp, ())):
            return False  # answers (or a reset) to handle first: never send past them
        state = txn.partition(tp)
        if txn.bump_requested:
            return head.has_sequence and head.written is Written.MAYBE and state.in_flight == 0
        limit = (
            1
            if (state.retrying or head.requeued)
            else self.config.max_in_flight_requests_per_connection
        )
        return state.in_flight < limit

    def _send_ready(self, now: float) -> float:
        """Drain and send until no partition has a sendable batch left."""
        backoff = max(self.config.retry_backoff_ms / 1000, 0.01)
        while True:
            candidates, wait = self.accumulator.ready(now, self._sendable)
            ready = candidates
            registering = self.txn.is_transactional and not self.txn.has_error
            if registering and (ready or self.txn.announced_unregistered()):
                # Also with nothing ready yet, once the transaction's first send() queued
                # its rows (the facade announces its partitions): they are registered
                # while their batches still fill or linger, so the durable write is off
                # the flush's path; one request covers every partition queued then.
                ready = self._add_partitions(candidates, now)
            if not ready:
                if candidates:
                    return backoff  # held back by AddPartitionsToTxn: look again after it
                if registering and self.txn.announced_unregistered():
                    return min(wait, backoff)  # a registration to retry
                return wait
            for tp in ready:
                self._drain_one(tp, now)

    def _drain_one(self, tp: TopicPartition, now: float) -> None:
        batch = self.accumulator.drain(tp)
        if batch is None:
            return
        if self.txn.is_transactional and self.txn.has_error:
            error = self.txn.last_error
            if not isinstance(error, ProducerFencedError):
                error = self._abortable_error()
            self._fail_batch(batch, error)
            return
        if not batch.has_sequence:
            seq, ordinal = self.txn.next_sequence(tp, batch.num_rows)
            if self.config.enable_idempotence:
                batch.assign(self.txn.producer_id, self.txn.producer_epoch, seq, ordinal)
            else:
                batch.ordinal = ordinal
        self._send(batch, now)

    def _add_partitions(self, ready: list[TopicPartition], now: float) -> list[TopicPartition]:
        """Register partitions new to the open transaction before their first batch."""
        txn = self.txn
        # Every partition with a batch queued, not only the ready ones: their batches
        # belong to this transaction too, and one request for all saves a partition that
        # becomes ready a moment later a round trip of its own (a Spark task's rows reach
        # every partition within milliseconds; README, "Where a micro-batch's time goes").
        new = txn.partitions_to_add(list(dict.fromkeys([*ready, *self.accumulator.partitions()])))
        if not new:
            return ready
        sendable = txn.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING_TRANSACTION)
        if not sendable or not txn.has_producer_id or now < self._add_retry_at:
            return [tp for tp in ready if tp not in new]
        assert txn.transactional_id is not None
        try:
            self.transport.add_partitions_to_txn(
                txn.transactional_id, txn.producer_id, txn.producer_epoch, new
            )
        except IdemlogError as exc:
            self._add_error = exc
            if isinstance(exc, (ProducerFencedError, InvalidProducerEpochError)):
                txn.fail_fatal(ProducerFencedError(exc.message))
            elif exc.retriable:
                self._add_retry_at = now + max(self.config.retry_backoff_ms / 1000, 0.01)
            else:
                txn.fail_abortable(exc)
            return [tp for tp in ready if tp not in new]
        txn.partitions_added(new)
        return ready

    def _send(self, batch: ProducerBatch, now: float) -> None:
        record_batch = batch.freeze()
        handle = self.transport.send(
            batch.tp,
            record_batch,
            producer_id=batch.producer_id,
            producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence,
            transactional=self.txn.is_transactional,
        )
        batch.attempts += 1
        batch.sent_at = now
        batch.written = Written.MAYBE
        self.txn.add_in_flight(batch.tp, 1)
        self.metrics.sent()
        self.in_flight.setdefault(batch.tp, []).append((batch, handle))
        # After the batch is recorded: an answer already in wakes the next wait at once.
        handle.add_done_callback(self.accumulator.wake)

    # -- for the facade ------------------------------------------------------------------
    def fail_pending(self, error: IdemlogError) -> None:
        """After stop(): fail every batch in flight or queued."""
        self._fail_everything(error)
