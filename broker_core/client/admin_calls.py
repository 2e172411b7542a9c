"""``BrokerClient``'s topic and operators' calls: create, delete and describe topics,
offsets, ping, metrics and the preferred-leader election (the routing they use:
``client.routes``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa

from broker_core.client.routes import ClusterView, Routes
from broker_core.errors import IdemlogError
from broker_core.protocol.admin_requests import (
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteTopicRequest,
    DescribeTopicsRequest,
    DescribeTopicsResponse,
    ListOffsetsRequest,
    MetricsRequest,
    PartitionInfo,
    PartitionOffsets,
    PingRequest,
    TopicDescription,
)
from broker_core.protocol.metrics import (
    DEFAULT_PAGE_SIZE,
    DEFAULT_TOP,
    DETAIL_PRODUCERS,
    ProducerPage,
    merge_documents,
    merge_producer_pages,
)
from broker_core.protocol.replica import ElectLeadersRequest, ElectLeadersResponse


class AdminCalls:
    """Topic and cluster calls, mixed into ``BrokerClient`` (their routing: ``Routes``)."""

    _view: ClusterView | None  # set by BrokerClient; forgotten when topics change

    def create_topic(
        self: Routes,
        name: str,
        partitions: int = 1,
        *,
        schema: pa.Schema | None = None,
        config: dict[str, Any] | None = None,
    ) -> list[int]:
        """Create a topic, its partitions' replicas assigned over the live brokers.

        Sent to any broker, retried on routing errors. A retry after a connection broke
        under the first attempt may find the topic that attempt created:
        ``TopicAlreadyExistsError``.

        Args:
            name: The topic's name (Kafka's rules; not ``__``-prefixed, those are internal).
            partitions: How many partitions, 1..10000.
            schema: The rows' Arrow schema, which every batch must have. None: the first
                append fixes it.
            config: Topic configuration overrides (``replication.factor``,
                ``cleanup.policy``, ...; docs/configuration.md). None: the defaults.

        Returns:
            The leader broker id of each partition, in partition order.

        Raises:
            TopicAlreadyExistsError: A topic of that name exists.
            InvalidTopicError: A bad or reserved name.
            InvalidPartitionsError: ``partitions`` outside 1..10000.
            InvalidConfigError: A bad ``config`` entry, named, or a compacted topic whose
                ``schema`` lacks a key column; its subclass
                ``InvalidReplicationFactorError`` for a replication factor the live
                brokers cannot hold.
            RequestTimedOutError: (retriable, not retried) ZooKeeper is unavailable.
            NetworkError, NotLeaderOrFollowerError: (retriable) The routing error left
                after the retries.
        """
        ipc = None if schema is None else schema.serialize().to_pybytes()
        doc = self._any_broker(CreateTopicRequest(name, partitions, ipc, config or {}))
        self._view = None  # the new topic's leaders are in the next metadata
        return list(CreateTopicResponse.from_doc(doc).leaders)

    def delete_topic(self: Routes, name: str) -> None:
        """Delete a topic and its data on every broker.

        Sent to any broker, retried on routing errors. A retry after a connection broke
        under the first attempt may find the topic that attempt deleted gone:
        ``UnknownTopicOrPartitionError``.

        Args:
            name: The topic's name.

        Raises:
            UnknownTopicOrPartitionError: (retriable, not retried) The topic does not exist.
            RequestTimedOutError: (retriable, not retried) ZooKeeper is unavailable.
            NetworkError, NotLeaderOrFollowerError: (retriable) The routing error left
                after the retries.
        """
        self._any_broker(DeleteTopicRequest(name))
        self._view = None

    def describe_topics(
        self: Routes, names: Sequence[str] | None = None, *, offsets: bool = False
    ) -> list[TopicDescription]:
        """Each topic's partitions, schema and config as the cluster records them.

        Args:
            names: The topics to describe. None: every topic.
            offsets: Ask each partition's leader for its offsets too (retried as
                :meth:`list_offsets`). A partition whose leader does not answer gets
                ``offline`` (the error's text) instead, and the others are still described.

        Returns:
            The topics sorted by name, each with its id, schema (None: any), config
            overrides and partitions (leader, replicas, ISR, leader epoch; with
            ``offsets``, their ``offsets`` or ``offline``).

        Raises:
            UnknownTopicOrPartitionError: (retriable, not retried) A name that does not
                exist.
            NetworkError, NotLeaderOrFollowerError: (retriable) The routing error left
                after the retries.
        """
        request = DescribeTopicsRequest(None if names is None else tuple(names))
        topics = list(DescribeTopicsResponse.from_doc(self._any_broker(request)).topics)
        if not offsets:
            return topics
        return [
            replace(
                t,
                partitions=tuple(_with_offsets(self, t.name, p) for p in t.partitions),
            )
            for t in topics
        ]

    def list_offsets(
        self: Routes, topic: str, partition: int, *, topic_id: str | None = None
    ) -> dict[str, int]:
        """The partition's offsets, as its leader has them now.

        Routed to the leader and retried on routing errors, and on
        ``UnknownTopicOrPartitionError`` while fresh metadata says the partition exists.

        Args:
            topic: The topic's name.
            partition: The partition's number.
            topic_id: The id the caller knows the topic by (:meth:`topic_id`). None: not
                checked.

        Returns:
            ``partition``, ``log_start_offset``, ``log_end_offset``, ``high_watermark`` and
            ``last_stable_offset``, by name.

        Raises:
            UnknownTopicOrPartitionError: (retriable) The partition does not exist.
            UnknownTopicIdError: ``topic_id`` is not the topic's (deleted or recreated).
            NotLeaderOrFollowerError, NetworkError: (retriable) The routing error left
                after the retries.
        """
        request = ListOffsetsRequest(topic, partition, topic_id)
        doc = self._leader_action(topic, partition, request)
        return {k: int(v) for k, v in doc.items() if k not in ("topic",)}

    def ping(self: Routes, address: str | None = None) -> dict[str, Any]:
        """Whether one broker answers: its id and protocol version. No retry.

        Args:
            address: The broker's ``host:port``. None: the first bootstrap address.

        Returns:
            ``{"broker_id": ..., "version": ...}``.

        Raises:
            NetworkError: (retriable, not retried) The broker does not answer.
            NotLeaderOrFollowerError: (retriable, not retried) The broker is shutting down.
        """
        return self._send(address or self._bootstrap[0], PingRequest())

    def metrics_per_broker(self: Routes, top: int = DEFAULT_TOP) -> list[dict[str, Any]]:
        """Every live broker's default metrics document, after a metadata refresh.

        No retry: one broker that does not answer fails the whole call.

        Args:
            top: How many producers by duplicates each document lists, 0..100.

        Returns:
            One document per live broker, by broker id.

        Raises:
            InvalidRequestError: ``top`` outside 0..100 (before any request).
            NetworkError: (retriable, not retried) A broker went away; or
                ``NoBrokerReachableError`` from the refresh.
        """
        view = self.refresh_metadata()
        request = MetricsRequest(top=top)
        return [self._send(b.address, request) for b in view.brokers.values()]

    def metrics(self: Routes, top: int = DEFAULT_TOP) -> dict[str, Any]:
        """The cluster's metrics: every live broker's document merged.

        Args:
            top: As :meth:`metrics_per_broker`.

        Returns:
            One document, its size bounded by the partitions and ``top``, whatever the
            number of producers.

        Raises:
            IdemlogError: As :meth:`metrics_per_broker`.
        """
        return merge_documents(self.metrics_per_broker(top))

    def producer_pages(self: Routes, page_size: int = DEFAULT_PAGE_SIZE) -> Iterator[ProducerPage]:
        """Every live broker's per-producer counters, page by page, broker after broker.

        A generator: the metadata refresh and every request happen during the iteration,
        and so do their errors. No retry.

        Args:
            page_size: The most rows a page holds, 1..``MAX_PAGE_SIZE`` (1000).

        Yields:
            Each broker's pages in producer id order, the last with no
            ``next_page_token``.

        Raises:
            InvalidRequestError: ``page_size`` outside 1..1000 (before any request).
            NetworkError: (retriable, not retried) A broker went away during the walk; or
                ``NoBrokerReachableError`` from the refresh.
        """
        view = self.refresh_metadata()
        for broker in view.brokers.values():
            token: str | None = None
            while True:
                request = MetricsRequest(DETAIL_PRODUCERS, token, page_size)
                page = ProducerPage.from_doc(self._send(broker.address, request))
                yield page
                token = page.next_page_token
                if token is None:
                    break

    def producer_metrics(self: Routes, page_size: int = DEFAULT_PAGE_SIZE) -> list[dict[str, Any]]:
        """Every producer's counters across the cluster, one row per producer id.

        Args:
            page_size: As :meth:`producer_pages`, whose pages are merged.

        Returns:
            One row per producer id, by id, its counters summed over the brokers.

        Raises:
            IdemlogError: As :meth:`producer_pages`.
        """
        pages = AdminCalls.producer_pages(self, page_size)
        return merge_producer_pages(p.to_doc() for p in pages)

    def elect_leaders(
        self: Routes, topics: Sequence[str] | None = None
    ) -> dict[str, dict[int, int]]:
        """The preferred-leader rebalance, on the controller (``idemlog topics
        elect-leaders``).

        Every partition whose first replica is live and in sync but not leading gets it
        back as leader (leader epoch + 1). An embedded broker leads everything: nothing
        moves.

        Args:
            topics: The topics to rebalance. None: every topic.

        Returns:
            ``{topic: {partition: new leader}}`` of the partitions moved (topics with none
            left out).

        Raises:
            UnknownTopicOrPartitionError: A named topic does not exist.
            InvalidRequestError: The broker stopped being the controller during the call.
            RequestTimedOutError: (retriable, not retried) ZooKeeper is unavailable.
            NotCoordinatorError, CoordinatorNotAvailableError, NetworkError: (retriable)
                The routing error left after the retries (the broker asked is not the
                controller; no controller is elected).
        """
        request = ElectLeadersRequest(None if topics is None else tuple(topics))
        return ElectLeadersResponse.from_doc(self._controller_action(request)).moved


def _with_offsets(client: Routes, topic: str, part: PartitionInfo) -> PartitionInfo:
    """``part`` with its leader's offsets, or ``offline`` naming why its leader did not
    answer (no in-sync replica left to elect: the other partitions are still served)."""
    try:
        doc = client._leader_action(
            topic, part.partition, ListOffsetsRequest(topic, part.partition)
        )
    except IdemlogError as exc:
        return replace(part, offline=str(exc))
    return replace(part, offsets=PartitionOffsets.from_doc(doc))
