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
    """Coordinator calls, mixed into ``BrokerClient`` (their routing: ``Routes``).

    A call routed to a transaction coordinator that finds its transactional id or sink
    being changed by another request gets ``ConcurrentTransactionsError``: retriable, but
    not a routing error, so it is raised, not retried (the producer and the Spark driver
    retry it; a direct caller must).
    """

    def init_producer_id(
        self: Routes, transactional_id: str | None = None, transaction_timeout_ms: int | None = None
    ) -> tuple[int, int]:
        """A producer id and epoch to write with, its earlier holder fenced.

        Without ``transactional_id``: a fresh idempotent producer from any broker (its
        token is kept in :attr:`producer_tokens`, which this client's produce streams send
        with its batches). With one: from the id's coordinator, which fences the id's
        earlier holder (its epoch is bumped) and aborts its open transaction.

        Args:
            transactional_id: The transactional producer's id. None: an idempotent one.
            transaction_timeout_ms: How long, in milliseconds, a transaction of this id
                may stay open before the coordinator aborts it. None: the coordinator's
                default.

        Returns:
            (producer id, producer epoch); the epoch is 0 for an idempotent producer.

        Raises:
            InvalidTransactionTimeoutError: ``transaction_timeout_ms`` out of the
                coordinator's range.
            InvalidRequestError: An empty, too long or unprintable ``transactional_id``.
            ConcurrentTransactionsError: (retriable, not retried) The id is being changed.
            ProducerIdAllocationError: (retriable, not retried) The broker could not lease
                a block of producer ids.
            ProducerIdSpaceExhaustedError: No producer id is left.
            NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError,
                NetworkError: (retriable) The routing error left after the retries.
        """
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
        """InitProducerId for an attempt of a Spark task (docs/design.md, the sink
        protocol): the id's earlier holders fenced, unless this attempt reuses one.

        Args:
            transactional_id: The task's id, ``<sink id>/...``.
            transaction_timeout_ms: As :meth:`init_producer_id`.
            attempt: The sink, run and batch the attempt writes for.

        Returns:
            (producer id, producer epoch, status): ``NEW`` (write the rows),
            ``PREPARED`` (an earlier attempt of this task, run and batch holds all its
            rows in a transaction still open: reuse it) or ``COMMITTED`` (the sink
            committed the batch already: write nothing).

        Raises:
            InvalidTxnStateError: ``transactional_id`` is not ``<sink id>/...``.
            InvalidRequestError: A bad sink, run or batch id.
            InvalidTransactionTimeoutError: As :meth:`init_producer_id`.
            ConcurrentTransactionsError: (retriable, not retried) The id is being changed.
            UnknownServerError: The answer has no status (a broker without sinks).
            NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError,
                NetworkError: (retriable) The routing error left after the retries.
        """
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
        """Mark the open transaction as holding all of a task's rows of ``batch_id``:
        once this returns, a later attempt of the task reuses it instead of writing again.

        Args:
            transactional_id: The task's id.
            producer_id: The producer id :meth:`init_sink_producer` gave.
            producer_epoch: Its epoch.
            batch_id: The Spark batch the rows belong to.
            ranges: (topic, partition, first offset, last offset) of each partition
                written; each must have been added to the transaction.
            topic_ids: {topic: id} the task knows the topics of ``ranges`` by. None: not
                checked.

        Raises:
            ProducerFencedError: The producer lost its epoch.
            InvalidProducerIdMappingError: The id is unknown or held by another producer id.
            InvalidTxnStateError: The transaction is not open for ``batch_id``, or a range's
                partition was not added to it.
            InvalidRequestError: Bad ``ranges``, or ``topic_ids`` naming a topic that
                ``ranges`` does not.
            UnknownTopicIdError: ``topic_ids`` names a topic by an id that is no longer its
                (deleted or recreated).
            ConcurrentTransactionsError: (retriable, not retried) The id is being changed.
            NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError,
                NetworkError: (retriable) The routing error left after the retries.
        """
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
        """Tell the sink's coordinator that a task of this run is alive: its run's
        transactions are not timed out.

        Args:
            sink_id: The sink's id.
            run_id: The run's id.

        Raises:
            InvalidRequestError: A bad sink or run id.
            NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError,
                NetworkError: (retriable) The routing error left after the retries.
        """
        self._coordinator_action(SinkHeartbeatRequest(sink_id, run_id), sink_id)

    def abort_sink_run(
        self: Routes, run_id: str | None, batch_id: int, *, sink_id: str | None = None
    ) -> list[str]:
        """Fence and abort every attempt of ``run_id`` (or, without one, of any run of
        ``sink_id``) at ``batch_id`` or before that still holds an id.

        With ``sink_id`` it goes to the sink's coordinator; by run alone to every state
        partition's (a run's ids are its sink's, but the run id does not name the sink).
        Under ACLs only the ids the caller may Write are fenced; the others are left as
        they are, without an error.

        Args:
            run_id: The run whose attempts to abort. None: every run of ``sink_id``.
            batch_id: The last batch whose attempts are aborted.
            sink_id: The sink, which routes the call to one coordinator. None: every
                coordinator is asked (``run_id`` is then needed).

        Returns:
            The fenced attempts' transactional ids.

        Raises:
            InvalidRequestError: Neither ``run_id`` nor ``sink_id``, or a bad id.
            CoordinatorNotAvailableError: (retriable) By run alone: a state partition's
                coordinator stayed unavailable through the retries (it is named).
            ConcurrentTransactionsError: (retriable, not retried) An id is being changed.
            NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError,
                NetworkError: (retriable) The routing error left after the retries.
        """
        if sink_id is not None:
            doc = self._coordinator_action(AbortSinkRunRequest(batch_id, run_id, sink_id), sink_id)
            return list(AbortSinkRunResponse.from_doc(doc).aborted)
        answers = self._fan_out(lambda p: AbortSinkRunRequest(batch_id, run_id, None, p))
        return [
            t for p in sorted(answers) for t in AbortSinkRunResponse.from_doc(answers[p]).aborted
        ]

    def stable_ends(self: Routes, topic: str) -> dict[int, int]:
        """Where a read_committed reader of ``topic`` stops so that every sink batch is
        read whole or not at all.

        With one state partition its coordinator cuts; with several the reader combines
        every one's tracked batches (``protocol.stable_cut.cut_across``), never a
        subset's.

        Args:
            topic: The topic's name.

        Returns:
            {partition: end}: each at most the partition's last stable offset.

        Raises:
            UnknownTopicOrPartitionError: The topic does not exist.
            StaleTrackedBatchesError: (retriable, not retried) Each of the cut's
                ``CUT_ATTEMPTS`` tries had to start over.
            CoordinatorNotAvailableError: (retriable) A state partition's coordinator
                stayed unavailable through the retries (with several, it is named).
            NotCoordinatorError, CoordinatorLoadInProgressError, NetworkError: (retriable)
                With one state partition, the routing error left after the retries.
        """
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
        batch of every coordinator in ``coordinators`` whole or not at all
        (``protocol.stable_cut.cut_across``; its module proves no batch slips through).

        Each address is asked without a state partition and without retry, so this
        serves a cluster of one state partition (or single coordinators in tests); with
        several, :meth:`stable_ends` asks every partition's coordinator. The last stable
        offsets are read from the leaders, retried as :meth:`list_offsets`.

        Args:
            topic: The topic's name.
            coordinators: The coordinators' ``host:port``, which must name every
                coordinator that may track a batch written to ``topic``.
            attempts: How many times the cut may start over, >= 1.

        Returns:
            {partition: end}: each at most the partition's last stable offset.

        Raises:
            UnknownTopicOrPartitionError: The topic does not exist.
            InvalidRequestError: No ``coordinators``, ``attempts`` < 1, or a cluster of
                several state partitions (name one: use :meth:`stable_ends`).
            StaleTrackedBatchesError: (retriable, not retried) Every one of ``attempts``
                tries had to start over.
            NotCoordinatorError: (retriable, not retried) The list is out of date.
            IdemlogError: What a coordinator or a leader answers otherwise (e.g.
                ``NetworkError``).
        """
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
        """Each partition's offsets, its ``last_stable_offset`` lowered to the
        coordinators' cut: where a read_committed reader holds every committed sink batch
        whole or not at all.

        Args:
            topic: The topic's name.
            partitions: How many partitions to ask for, from 0.
            topic_id: Sent with each :meth:`list_offsets`. None: not checked.

        Returns:
            {partition: :meth:`list_offsets`' answer, its ``last_stable_offset`` the
            :meth:`stable_ends` cut}.

        Raises:
            IdemlogError: As :meth:`list_offsets` (``UnknownTopicIdError`` if the topic was
                recreated) and :meth:`stable_ends`.
        """
        offsets = {p: self.list_offsets(topic, p, topic_id=topic_id) for p in range(partitions)}
        cut = self.stable_ends(topic)
        for p, doc in offsets.items():
            if p in cut:
                doc["last_stable_offset"] = cut[p]
        return offsets

    def list_transactions(
        self: Routes, min_age_ms: int = 0, *, every_id: bool = False
    ) -> list[TransactionListing]:
        """The open transactions of every state partition's coordinator (``idemlog
        transactions list``); never a subset's.

        Args:
            min_age_ms: Only transactions open at least this long, in milliseconds.
            every_id: Every transactional id the coordinators keep, in any state, with
                its state and last update (``--all``), instead of the open transactions.

        Returns:
            The rows, each naming its ``state_partition``: oldest first, or by id with
            ``every_id``.

        Raises:
            CoordinatorNotAvailableError: (retriable) A state partition's coordinator
                stayed unavailable through the retries (it is named).
            IdemlogError: A coordinator's non-retriable error, as it is.
        """
        answers = self._fan_out(lambda p: ListTransactionsRequest(min_age_ms, every_id, p))
        parts = {
            p: list(ListTransactionsResponse.from_doc(d).transactions) for p, d in answers.items()
        }
        rows = merge_listings(parts, every_id)
        return [TransactionListing.from_doc(row) for row in rows]

    def abort_transaction(self: Routes, transactional_id: str) -> bool:
        """Fence the id's holder and abort its open transaction (``idemlog transactions
        abort``).

        A transaction a decided sink commit holds is committed instead, never aborted.

        Args:
            transactional_id: The transactional id.

        Returns:
            True if a transaction was open and is aborted; False if none was open.

        Raises:
            InvalidProducerIdMappingError: The coordinator does not know the id.
            InvalidRequestError: An empty, too long or unprintable id.
            ConcurrentTransactionsError: (retriable, not retried) The id is being changed.
            NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError,
                NetworkError: (retriable) The routing error left after the retries.
        """
        doc = self._coordinator_action(AbortTransactionRequest(transactional_id), transactional_id)
        return AbortTransactionResponse.from_doc(doc).aborted

    def describe_producers(self: Routes, topic: str, partition: int) -> DescribeProducersResponse:
        """The producers the partition's leader keeps state for (Kafka's
        DescribeProducers).

        Routed and retried as :meth:`list_offsets`.

        Args:
            topic: The topic's name.
            partition: The partition's number.

        Returns:
            Each producer (id, epoch, last sequence and write, its open transaction's
            first offset), and the partition's log end and last stable offset.

        Raises:
            UnknownTopicOrPartitionError: (retriable) The partition does not exist.
            NotLeaderOrFollowerError, NetworkError: (retriable) The routing error left
                after the retries.
        """
        doc = self._leader_action(topic, partition, DescribeProducersRequest(topic, partition))
        return DescribeProducersResponse.from_doc(doc)

    def find_hanging_transactions(
        self: Routes, topic: str | None = None, older_than_ms: int = 0
    ) -> list[HangingTransaction]:
        """Transactions open on a partition that no coordinator knows: none has that
        producer id's transaction open on that partition or ending (PREPARE_*).

        Each partition's leader is asked (:meth:`describe_producers`) after both
        listings of :meth:`list_transactions`. The idle time is this host's clock minus
        the leader's stamp of the producer's last write (clocks apart skew it). Needs
        Describe on the transactional ids: a coordinator's row the caller may not see
        counts as unknown.

        Args:
            topic: The topic to look at. None: every topic but the internal ones.
            older_than_ms: Only producers that wrote nothing for at least this long, in
                milliseconds, >= 0.

        Returns:
            The hanging transactions, the longest idle first (then by topic and
            partition).

        Raises:
            InvalidRequestError: ``older_than_ms`` < 0.
            UnknownTopicOrPartitionError: ``topic`` does not exist.
            IdemlogError: As :meth:`list_transactions` and :meth:`describe_producers`.
        """
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
        """Abort one producer's open transaction on one partition, at its leader: an
        ABORT marker one producer epoch up, so the producer is fenced there.

        Routed and retried as :meth:`list_offsets`. A retry after a connection broke
        under the first attempt may find nothing open: ``InvalidTxnStateError``.

        Args:
            topic: The topic's name.
            partition: The partition's number.
            producer_id: The producer whose transaction to abort. Give it or
                ``start_offset``, not both.
            producer_epoch: With ``producer_id``: only if the producer is still at it.
            start_offset: The transaction's first offset.

        Returns:
            The producer, the transaction's first offset, the marker's offset and epoch,
            and the partition's last stable offset just after the marker.

        Raises:
            InvalidRequestError: Neither or both of ``producer_id`` and ``start_offset``,
                ``producer_epoch`` without ``producer_id``, or a negative value.
            InvalidTxnStateError: Nothing is open there.
            InvalidProducerEpochError: The producer moved to another epoch.
            UnknownTopicOrPartitionError: (retriable) The partition does not exist.
            NotLeaderOrFollowerError, NetworkError: (retriable) The routing error left
                after the retries.
        """
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
        """Add partitions to the id's open transaction, beginning one if none is open:
        the coordinator will write their markers when it ends.

        Durable when it returns; a retried request is a no-op.

        Args:
            transactional_id: The transactional id.
            producer_id: The producer id :meth:`init_producer_id` gave.
            producer_epoch: Its epoch.
            partitions: (topic, partition) pairs, at least one.
            topic_ids: {topic: id} the producer knows the topics by. None: not checked.

        Raises:
            UnknownTopicOrPartitionError: (retriable, not retried) A partition does not
                exist.
            UnknownTopicIdError: ``topic_ids`` names a topic by an id that is no longer its.
            ProducerFencedError: A stale epoch.
            InvalidProducerIdMappingError: The id is unknown or held by another producer id.
            InvalidRequestError: No partitions, or ``topic_ids`` naming a topic that
                ``partitions`` does not.
            ConcurrentTransactionsError: (retriable, not retried) The previous transaction
                is still ending.
            NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError,
                NetworkError: (retriable) The routing error left after the retries.
        """
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
        written (read_committed readers see it, or never will).

        A retry of the call that ended the transaction is answered as that call was, so
        the routing retries are safe; once the decision is stored, the outcome is fixed
        even if this call raises.

        Args:
            transactional_id: The transactional id.
            producer_id: The producer id the transaction was written with.
            producer_epoch: Its epoch.
            commit: True to commit, False to abort.

        Returns:
            The producer id and epoch of the producer's next transaction (each ends at its
            own epoch, KIP-890; a broker from before answers the ones sent).

        Raises:
            ProducerFencedError: A stale epoch.
            InvalidProducerIdMappingError: The id is unknown or held by another producer id.
            InvalidTxnStateError: The transaction cannot end that way (none is open, it
                ended the other way, or it was ended and the producer has gone on).
            ConcurrentTransactionsError: (retriable, not retried) The id is being changed.
            IdemlogError: A marker write's error after the decision was stored (a
                partition's leader down): a retry of the same call finishes it.
            NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError,
                NetworkError: (retriable) The routing error left after the retries.
        """
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
        """Commit a Spark batch's transactions once, at the sink's coordinator.

        Every named transaction must be a prepared attempt of this sink's ``batch_id``,
        else nothing is recorded. Afterwards every other attempt of the sink at this batch
        or an earlier one is fenced and aborted. Once the commit record is stored (even if
        this call then raises) the commit is decided and finished by whoever touches the
        sink or its transactions next.

        Args:
            sink_id: The sink's id.
            batch_id: The Spark batch.
            transactions: (transactional id, producer id, producer epoch) of each task's
                transaction; each id must have the sink's coordinator.
            run_id: Every transaction must have been written by that run of the sink.
                None: any run.

        Returns:
            True: committed now, in every partition. False: the batch was committed
            before, so these transactions were aborted instead (idempotent commit).

        Raises:
            InvalidTxnStateError: A named transaction is not committable (it is named).
            IdemlogError: A marker write's error after the commit record was stored: the
                commit is decided, and finished later.
            ProducerFencedError, InvalidProducerIdMappingError: A transaction's producer
                lost its epoch, or its id is unknown.
            InvalidRequestError: A bad id, or a transactional id whose coordinator is not
                the sink's.
            ConcurrentTransactionsError: (retriable, not retried) The sink or an id is
                being changed.
            NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError,
                NetworkError: (retriable) The routing error left after the retries.
        """
        request = CommitSinkBatchRequest(sink_id, batch_id, tuple(transactions), run_id)
        doc = self._coordinator_action(request, sink_id)
        return bool(SinkBatchResponse.from_doc(doc).committed)

    def abort_sink_batch(
        self: Routes, sink_id: str, batch_id: int, transactions: Sequence[tuple[str, int, int]]
    ) -> None:
        """Abort these transactions of the sink's batch, those still open (a batch the
        driver gives up; one already committed stays so).

        A transaction whose id is unknown, or held at another producer id or epoch (a
        newer holder fenced it), is left as it is, without an error.

        Args:
            sink_id: The sink's id.
            batch_id: The Spark batch.
            transactions: (transactional id, producer id, producer epoch) of each one.

        Raises:
            IdemlogError: A marker write's error (a partition's leader down): the abort
                is decided and finished later.
            InvalidRequestError: A bad id, or a transactional id whose coordinator is not
                the sink's.
            ConcurrentTransactionsError: (retriable, not retried) The sink or an id is
                being changed.
            NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError,
                NetworkError: (retriable) The routing error left after the retries.
        """
        request = AbortSinkBatchRequest(sink_id, batch_id, tuple(transactions))
        self._coordinator_action(request, sink_id)


def _last_stable_offsets(client: Routes, topic: str) -> dict[int, int]:
    """Each partition's last stable offset now (step 2 of ``protocol.stable_cut``)."""
    leaders = client.metadata().topics.get(topic) or client.metadata(True).topics.get(topic)
    if leaders is None:
        raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
    return {p: client.list_offsets(topic, p)["last_stable_offset"] for p in range(len(leaders))}
