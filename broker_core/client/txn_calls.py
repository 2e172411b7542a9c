"""``BrokerClient``'s transaction and sink calls, routed to the transaction coordinator
of their key's state partition: producer ids, a transaction's partitions and end, a
sink's prepare, heartbeat, batch commit and aborts, the operators' abort; and the
key-less ones fanned out to every state partition's coordinator: the operators' listing,
a run's abort, the readers' cut (the routing they use: ``client.routes``)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from broker_core.client.answers import HangingTransaction
from broker_core.client.routes import Routes
from broker_core.errors import (
    CoordinatorNotAvailableError,
    IdemlogError,
    InvalidRequestError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.admin_requests import (
    AbortHangingTransactionRequest,
    AbortHangingTransactionResponse,
    AbortTransactionRequest,
    AbortTransactionResponse,
    DescribeProducersRequest,
    DescribeProducersResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
    TransactionListing,
    merge_listings,
)
from broker_core.protocol.coordinator_keys import TXN_STATE_TOPIC
from broker_core.protocol.stable_cut import (
    CUT_ATTEMPTS,
    TrackedBatches,
    TrackedBatchesRequest,
    cut_across,
)
from broker_core.protocol.txn_requests import (
    AbortSinkBatchRequest,
    AbortSinkRunRequest,
    AbortSinkRunResponse,
    AddPartitionsToTxnRequest,
    CommitSinkBatchRequest,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    PrepareSinkTxnRequest,
    SinkBatchResponse,
    SinkHeartbeatRequest,
    StableEndsRequest,
    StableEndsResponse,
)
from broker_core.protocol.wire import (
    SinkAttempt,
    SinkTxnStatus,
)


class TransactionCalls:
    """Coordinator calls, mixed into ``BrokerClient`` (their routing: ``Routes``)."""

    def init_producer_id(
        self: Routes, transactional_id: str | None = None, transaction_timeout_ms: int | None = None
    ) -> tuple[int, int]:
        """A producer id and epoch. Without ``transactional_id``: a fresh idempotent
        producer from any broker (its token is kept in :attr:`producer_tokens`, which
        this client's produce streams send with its batches). With one: from the
        coordinator, which fences the id's earlier holder (its epoch is bumped) and
        aborts its open transaction. Raises
        ``InvalidTransactionTimeoutError``, ``InvalidRequestError``, or the routing error
        left after the retries."""
        request = InitProducerIdRequest(transactional_id, transaction_timeout_ms)
        if transactional_id is None:
            doc = self._any_broker(request)
        else:
            doc = self._coordinator_action(request, transactional_id)
        answer = InitProducerIdResponse.from_doc(doc)
        if answer.producer_token is not None:
            self.producer_tokens.remember(answer.producer_id, answer.producer_token)
        return answer.producer_id, answer.producer_epoch

    def init_sink_producer(
        self: Routes,
        transactional_id: str,
        transaction_timeout_ms: int | None,
        attempt: SinkAttempt,
    ) -> tuple[int, int, SinkTxnStatus]:
        """InitProducerId for an attempt of a Spark task (docs/design.md): (producer id,
        epoch, whether an earlier attempt's transaction of the batch is reused). Raises
        as :meth:`init_producer_id`, and ``InvalidRequestError`` for a bad attempt."""
        request = InitProducerIdRequest(transactional_id, transaction_timeout_ms, attempt)
        doc = self._coordinator_action(request, transactional_id)
        answer = InitProducerIdResponse.from_doc(doc)
        if answer.sink_status is None:
            raise UnknownServerError(
                f"init_producer_id of {transactional_id!r} answered no sink_status"
            )
        return answer.producer_id, answer.producer_epoch, answer.sink_status

    def prepare_sink_txn(
        self: Routes,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        batch_id: int,
        ranges: Sequence[tuple[str, int, int, int]] = (),
        *,
        topic_ids: Mapping[str, str] | None = None,
    ) -> None:
        """The open transaction holds all of a task's rows of ``batch_id``, at ``ranges``
        ((topic, partition, first offset, last offset) for each partition written): once
        this returns, a later attempt of the task reuses it instead of writing again.
        Raises ``ProducerFencedError`` if the producer lost its epoch, the coordinator's
        ``InvalidRequestError`` for bad ranges, ``UnknownTopicIdError`` if ``topic_ids``
        ({topic: id}) names a topic by an id that is no longer its (recreated)."""
        request = PrepareSinkTxnRequest(
            transactional_id,
            producer_id,
            producer_epoch,
            batch_id,
            tuple(ranges),
            dict(topic_ids or {}),
        )
        self._coordinator_action(request, transactional_id)

    def sink_heartbeat(self: Routes, sink_id: str, run_id: str) -> None:
        """A task of this run is alive: the coordinator keeps its transactions open.
        Raises ``InvalidRequestError`` for a bad id, or the routing error left after the
        retries."""
        self._coordinator_action(SinkHeartbeatRequest(sink_id, run_id), sink_id)

    def abort_sink_run(
        self: Routes, run_id: str | None, batch_id: int, *, sink_id: str | None = None
    ) -> list[str]:
        """Fence and abort every attempt of ``run_id`` (or, without one, of any run of
        ``sink_id``) at ``batch_id`` or before; their transactional ids. With ``sink_id``
        it goes to the sink's coordinator; by run alone to every state partition's (a
        run's ids are its sink's, but the run id does not name the sink)."""
        if sink_id is not None:
            doc = self._coordinator_action(AbortSinkRunRequest(batch_id, run_id, sink_id), sink_id)
            return list(AbortSinkRunResponse.from_doc(doc).aborted)
        answers = self._fan_out(lambda p: AbortSinkRunRequest(batch_id, run_id, None, p))
        return [
            t for p in sorted(answers) for t in AbortSinkRunResponse.from_doc(answers[p]).aborted
        ]

    def stable_ends(self: Routes, topic: str) -> dict[int, int]:
        """Where a read_committed reader of ``topic`` stops: at most each partition's last
        stable offset, lowered so that every sink batch is read whole or not at all. With
        one state partition its coordinator cuts; with several the reader combines every
        one's tracked batches (``protocol.stable_cut.cut_across``), never a subset's
        (a partition's coordinator unavailable: a retriable error naming it)."""
        count = self.state_partition_count()
        if count == 1:
            doc = self._state_partition_action(0, StableEndsRequest(topic, 0))
            return StableEndsResponse.from_doc(doc).ends

        def ask(partition: str, since: int) -> TrackedBatches:
            p = int(partition)
            try:
                doc = self._state_partition_action(p, TrackedBatchesRequest(topic, since, p))
            except IdemlogError as exc:
                if not exc.retriable:
                    raise
                raise CoordinatorNotAvailableError(
                    f"the coordinator of {TXN_STATE_TOPIC}-{p} did not answer: {exc.message}"
                ) from exc
            return TrackedBatches.from_doc(doc)

        return cut_across(
            [str(p) for p in range(count)], ask, lambda: _last_stable_offsets(self, topic)
        )

    def stable_ends_across(
        self: Routes, topic: str, coordinators: Sequence[str], *, attempts: int = CUT_ATTEMPTS
    ) -> dict[int, int]:
        """Where a read_committed reader of ``topic`` stops so that it holds every sink
        batch of every coordinator in ``coordinators`` (addresses, which must name every
        coordinator that may track a batch written to ``topic``) whole or not at all
        (``protocol.stable_cut.cut_across``; its module proves no batch slips through).

        Each address is asked without a state partition, so this serves a cluster of one
        state partition (or single coordinators in tests); with several, :meth:`stable_ends`
        asks every partition's coordinator. Raises UnknownTopicOrPartitionError,
        InvalidRequestError for no coordinators,
        StaleTrackedBatchesError when every one of ``attempts`` tries had to start over,
        and what a coordinator or a leader answers (NotCoordinatorError: the list is out
        of date)."""
        leaders = self.metadata().topics.get(topic) or self.metadata(True).topics.get(topic)
        if leaders is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")

        def ask(address: str, since: int) -> TrackedBatches:
            doc = self._send(address, TrackedBatchesRequest(topic, since))
            return TrackedBatches.from_doc(doc)

        def read_lsos() -> dict[int, int]:
            return {
                p: self.list_offsets(topic, p)["last_stable_offset"] for p in range(len(leaders))
            }

        return cut_across(coordinators, ask, read_lsos, attempts)

    def readable_offsets(
        self: Routes, topic: str, partitions: int, *, topic_id: str | None = None
    ) -> dict[int, dict[str, int]]:
        """Each partition's ``list_offsets``, its ``last_stable_offset`` replaced by the
        coordinator's cut (:meth:`stable_ends`): ends at which a read_committed reader
        holds every committed sink batch whole or not at all. ``topic_id``: sent with
        each list_offsets (``UnknownTopicIdError`` if the topic was recreated)."""
        offsets = {p: self.list_offsets(topic, p, topic_id=topic_id) for p in range(partitions)}
        cut = self.stable_ends(topic)
        for p, doc in offsets.items():
            if p in cut:
                doc["last_stable_offset"] = cut[p]
        return offsets

    def list_transactions(
        self: Routes, min_age_ms: int = 0, *, every_id: bool = False
    ) -> list[TransactionListing]:
        """Open transactions, oldest first (``idemlog transactions list``); ``every_id``:
        every transactional id the coordinators keep, with its state (``--all``). Every
        state partition's coordinator is asked; each row names its ``state_partition``."""
        answers = self._fan_out(lambda p: ListTransactionsRequest(min_age_ms, every_id, p))
        parts = {
            p: list(ListTransactionsResponse.from_doc(d).transactions) for p, d in answers.items()
        }
        rows = merge_listings(parts, every_id)
        return [TransactionListing.from_doc(row) for row in rows]

    def abort_transaction(self: Routes, transactional_id: str) -> bool:
        """Fence the id's holder and abort its open transaction; False if none was open."""
        doc = self._coordinator_action(AbortTransactionRequest(transactional_id), transactional_id)
        return AbortTransactionResponse.from_doc(doc).aborted

    def describe_producers(self: Routes, topic: str, partition: int) -> DescribeProducersResponse:
        """The producers the partition's leader keeps state for, with their open
        transactions' first offsets (Kafka's DescribeProducers). Raises
        ``UnknownTopicOrPartitionError``, or the routing error left after the retries."""
        doc = self._leader_action(topic, partition, DescribeProducersRequest(topic, partition))
        return DescribeProducersResponse.from_doc(doc)

    def find_hanging_transactions(
        self: Routes, topic: str | None = None, older_than_ms: int = 0
    ) -> list[HangingTransaction]:
        """Transactions open on a partition of ``topic`` (every topic but the internal
        ones without it) whose producer wrote nothing for ``older_than_ms`` and that no
        coordinator knows: none has that producer id's transaction open on that partition
        or ending (PREPARE_*). Oldest first. The idle time is this host's clock minus the
        leader's stamp of the producer's last write (clocks apart skew it). Needs Describe
        on the transactional ids: a coordinator's row the caller may not see counts as
        unknown."""
        if older_than_ms < 0:
            raise InvalidRequestError(f"older_than_ms must be >= 0, got {older_than_ms}")
        leaders = self.metadata(True).topics
        if topic is not None and topic not in leaders:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        names = [topic] if topic is not None else sorted(t for t in leaders if t[:2] != "__")
        open_on: set[tuple[int, str, int]] = set()  # (producer id, topic, partition)
        for row in TransactionCalls.list_transactions(self):
            open_on.update((row.producer_id, t, p) for t, p in row.partitions)
        ending = {
            row.producer_id
            for row in TransactionCalls.list_transactions(self, every_id=True)
            if row.state.startswith("PREPARE")
        }
        found: list[HangingTransaction] = []
        for name in names:
            for partition in range(len(leaders[name])):
                answer = TransactionCalls.describe_producers(self, name, partition)
                now_ms = int(time.time() * 1000)
                for p in answer.producers:
                    idle_ms = now_ms - p.last_timestamp
                    known = (p.producer_id, name, partition) in open_on
                    if not p.has_open_transaction or known or p.producer_id in ending:
                        continue
                    if idle_ms < older_than_ms:
                        continue
                    found.append(
                        HangingTransaction(
                            name,
                            partition,
                            p.producer_id,
                            p.producer_epoch,
                            p.coordinator_epoch,
                            p.txn_start_offset,
                            idle_ms,
                            answer.last_stable_offset,
                            answer.log_end_offset,
                        )
                    )
        return sorted(found, key=lambda h: (-h.idle_ms, h.topic, h.partition))

    def abort_hanging_transaction(
        self: Routes,
        topic: str,
        partition: int,
        *,
        producer_id: int | None = None,
        producer_epoch: int | None = None,
        start_offset: int | None = None,
    ) -> AbortHangingTransactionResponse:
        """Abort one producer's open transaction on one partition, at its leader (an ABORT
        marker one producer epoch up: the producer is fenced there). Name it by
        ``producer_id`` (``producer_epoch``: only if still at it) or ``start_offset``.
        Raises ``InvalidTxnStateError`` if nothing is open there,
        ``InvalidProducerEpochError`` if the producer moved to another epoch."""
        request = AbortHangingTransactionRequest(
            topic, partition, producer_id, producer_epoch, start_offset
        )
        doc = self._leader_action(topic, partition, request)
        return AbortHangingTransactionResponse.from_doc(doc)

    def add_partitions_to_txn(
        self: Routes,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[tuple[str, int]],
        *,
        topic_ids: Mapping[str, str] | None = None,
    ) -> None:
        """Add partitions to the id's open transaction (beginning one if none is open):
        the coordinator will write their markers when it ends. Raises
        ``UnknownTopicOrPartitionError`` for a partition that does not exist,
        ``UnknownTopicIdError`` when ``topic_ids`` ({topic: id}) names a topic by an id
        that is no longer its, ``ProducerFencedError`` for a stale epoch,
        ``ConcurrentTransactionsError`` (retriable, not retried here) while the previous
        transaction is still ending."""
        request = AddPartitionsToTxnRequest(
            transactional_id,
            producer_id,
            producer_epoch,
            tuple(partitions),
            dict(topic_ids or {}),
        )
        self._coordinator_action(request, transactional_id)

    def end_txn(
        self: Routes, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> tuple[int, int]:
        """Commit or abort the id's open transaction; when this returns, its markers are
        written (read_committed readers see it, or never will). Returns the producer id
        and epoch of the producer's next transaction (each ends at its own epoch,
        KIP-890; a broker from before answers the ones sent). Raises
        ``ProducerFencedError`` for a stale epoch, ``InvalidTxnStateError`` if the
        transaction cannot end that way (or was ended and the producer has gone on),
        ``ConcurrentTransactionsError`` (retriable, not retried here)."""
        doc = self._coordinator_action(
            EndTxnRequest(transactional_id, producer_id, producer_epoch, commit), transactional_id
        )
        answer = EndTxnResponse.from_doc(doc)
        if answer.producer_id is None or answer.producer_epoch is None:
            return producer_id, producer_epoch
        return answer.producer_id, answer.producer_epoch

    def commit_sink_batch(
        self: Routes,
        sink_id: str,
        batch_id: int,
        transactions: Sequence[tuple[str, int, int]],
        run_id: str | None = None,
    ) -> bool:
        """True: committed now; False: the batch was committed before, so these
        transactions were aborted instead (idempotent commit). ``run_id``: every
        transaction must have been written by that run of the sink."""
        request = CommitSinkBatchRequest(sink_id, batch_id, tuple(transactions), run_id)
        doc = self._coordinator_action(request, sink_id)
        return bool(SinkBatchResponse.from_doc(doc).committed)

    def abort_sink_batch(
        self: Routes, sink_id: str, batch_id: int, transactions: Sequence[tuple[str, int, int]]
    ) -> None:
        """Abort these transactions of the sink's batch (a batch the driver gives up);
        raises the coordinator's error if one of them cannot be aborted."""
        request = AbortSinkBatchRequest(sink_id, batch_id, tuple(transactions))
        self._coordinator_action(request, sink_id)


def _last_stable_offsets(client: Routes, topic: str) -> dict[int, int]:
    """Each partition's last stable offset now (step 2 of ``protocol.stable_cut``)."""
    leaders = client.metadata().topics.get(topic) or client.metadata(True).topics.get(topic)
    if leaders is None:
        raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
    return {p: client.list_offsets(topic, p)["last_stable_offset"] for p in range(len(leaders))}
