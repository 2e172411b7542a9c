"""``BrokerClient``'s transaction and sink calls, all routed to the transaction
coordinator: producer ids, a transaction's partitions and end, a sink's prepare,
heartbeat, batch commit and aborts, the operators' listing and abort, and the readers'
cut (the routing they use: ``client.routes``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker_core.client.routes import Routes
from broker_core.errors import (
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.admin_requests import (
    AbortTransactionRequest,
    ListTransactionsRequest,
)
from broker_core.protocol.stable_cut import (
    CUT_ATTEMPTS,
    TrackedBatches,
    TrackedBatchesRequest,
    cut_across,
)
from broker_core.protocol.txn_requests import (
    AbortSinkBatchRequest,
    AbortSinkRunRequest,
    AddPartitionsToTxnRequest,
    CommitSinkBatchRequest,
    EndTxnRequest,
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
        producer from any broker. With one: from the coordinator, which fences the id's
        earlier holder (its epoch is bumped) and aborts its open transaction. Raises
        ``InvalidTransactionTimeoutError``, ``InvalidRequestError``, or the routing error
        left after the retries."""
        request = InitProducerIdRequest(transactional_id, transaction_timeout_ms)
        if transactional_id is None:
            doc = self._any_broker(request)
        else:
            doc = self._coordinator_action(request)
        answer = InitProducerIdResponse.from_doc(doc)
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
        answer = InitProducerIdResponse.from_doc(self._coordinator_action(request))
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
    ) -> None:
        """The open transaction holds all of a task's rows of ``batch_id``, at ``ranges``
        ((topic, partition, first offset, last offset) for each partition written): once
        this returns, a later attempt of the task reuses it instead of writing again.
        Raises ``ProducerFencedError`` if the producer lost its epoch, and the coordinator's
        ``InvalidRequestError`` for bad ranges."""
        self._coordinator_action(
            PrepareSinkTxnRequest(
                transactional_id, producer_id, producer_epoch, batch_id, tuple(ranges)
            )
        )

    def sink_heartbeat(self: Routes, sink_id: str, run_id: str) -> None:
        """A task of this run is alive: the coordinator keeps its transactions open.
        Raises ``InvalidRequestError`` for a bad id, or the routing error left after the
        retries."""
        self._coordinator_action(SinkHeartbeatRequest(sink_id, run_id))

    def abort_sink_run(
        self: Routes, run_id: str | None, batch_id: int, *, sink_id: str | None = None
    ) -> list[str]:
        """Fence and abort every attempt of ``run_id`` (or, without one, of any run of
        ``sink_id``) at ``batch_id`` or before; their transactional ids."""
        doc = self._coordinator_action(AbortSinkRunRequest(batch_id, run_id, sink_id))
        return [str(t) for t in doc["aborted"]]

    def stable_ends(self: Routes, topic: str) -> dict[int, int]:
        """Where a read_committed reader of ``topic`` stops: at most each partition's last
        stable offset, lowered so that every sink batch is read whole or not at all."""
        return StableEndsResponse.from_doc(self._coordinator_action(StableEndsRequest(topic))).ends

    def stable_ends_across(
        self: Routes, topic: str, coordinators: Sequence[str], *, attempts: int = CUT_ATTEMPTS
    ) -> dict[int, int]:
        """Where a read_committed reader of ``topic`` stops so that it holds every sink
        batch of every coordinator in ``coordinators`` (addresses, which must name every
        coordinator that may track a batch written to ``topic``) whole or not at all
        (``protocol.stable_cut.cut_across``; its module proves no batch slips through).

        Raises UnknownTopicOrPartitionError, InvalidRequestError for no coordinators,
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

    def readable_offsets(self: Routes, topic: str, partitions: int) -> dict[int, dict[str, int]]:
        """Each partition's ``list_offsets``, its ``last_stable_offset`` replaced by the
        coordinator's cut (:meth:`stable_ends`): ends at which a read_committed reader
        holds every committed sink batch whole or not at all."""
        offsets = {p: self.list_offsets(topic, p) for p in range(partitions)}
        cut = self.stable_ends(topic)
        for p, doc in offsets.items():
            if p in cut:
                doc["last_stable_offset"] = cut[p]
        return offsets

    def list_transactions(
        self: Routes, min_age_ms: int = 0, *, every_id: bool = False
    ) -> list[dict[str, Any]]:
        """Open transactions, oldest first (``idemlog transactions list``); ``every_id``:
        every transactional id the coordinator keeps, with its state (``--all``)."""
        doc = self._coordinator_action(ListTransactionsRequest(min_age_ms, every_id))
        return list(doc["transactions"])

    def abort_transaction(self: Routes, transactional_id: str) -> bool:
        """Fence the id's holder and abort its open transaction; False if none was open."""
        doc = self._coordinator_action(AbortTransactionRequest(transactional_id))
        return bool(doc["aborted"])

    def add_partitions_to_txn(
        self: Routes,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[tuple[str, int]],
    ) -> None:
        """Add partitions to the id's open transaction (beginning one if none is open):
        the coordinator will write their markers when it ends. Raises
        ``UnknownTopicOrPartitionError`` for a partition that does not exist,
        ``ProducerFencedError`` for a stale epoch, ``ConcurrentTransactionsError``
        (retriable, not retried here) while the previous transaction is still ending."""
        self._coordinator_action(
            AddPartitionsToTxnRequest(
                transactional_id, producer_id, producer_epoch, tuple(partitions)
            )
        )

    def end_txn(
        self: Routes, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        """Commit or abort the id's open transaction; when this returns, its markers are
        written (read_committed readers see it, or never will). Raises
        ``ProducerFencedError`` for a stale epoch, ``InvalidTxnStateError`` if the
        transaction cannot end that way, ``ConcurrentTransactionsError`` (retriable, not
        retried here)."""
        self._coordinator_action(
            EndTxnRequest(transactional_id, producer_id, producer_epoch, commit)
        )

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
        return bool(SinkBatchResponse.from_doc(self._coordinator_action(request)).committed)

    def abort_sink_batch(
        self: Routes, sink_id: str, batch_id: int, transactions: Sequence[tuple[str, int, int]]
    ) -> None:
        """Abort these transactions of the sink's batch (a batch the driver gives up);
        raises the coordinator's error if one of them cannot be aborted."""
        self._coordinator_action(AbortSinkBatchRequest(sink_id, batch_id, tuple(transactions)))
