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
        """Create a topic; returns the leader broker id of each partition.

        Raises ``TopicAlreadyExistsError``, ``InvalidTopicError`` (bad or reserved name),
        ``InvalidPartitionsError``, ``InvalidConfigError`` (a bad ``config`` entry), or the
        routing error left after the retries."""
        ipc = None if schema is None else schema.serialize().to_pybytes()
        doc = self._any_broker(CreateTopicRequest(name, partitions, ipc, config or {}))
        self._view = None  # the new topic's leaders are in the next metadata
        return list(CreateTopicResponse.from_doc(doc).leaders)

    def delete_topic(self: Routes, name: str) -> None:
        """Delete a topic and its data on every broker. Raises
        ``UnknownTopicOrPartitionError`` if it does not exist."""
        self._any_broker(DeleteTopicRequest(name))
        self._view = None

    def describe_topics(
        self: Routes, names: Sequence[str] | None = None, *, offsets: bool = False
    ) -> list[TopicDescription]:
        """Each topic's partitions (leader, replicas, ISR, leader epoch), schema and
        config, sorted by name; all topics without ``names``. ``offsets``: each
        partition's offsets too, asked of its leader; a partition whose leader does not
        answer gets ``offline`` (the error's text) instead, and the others are still
        described. Raises ``UnknownTopicOrPartitionError`` for a name that does not exist."""
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
        """The partition's ``partition``, ``log_start_offset``, ``log_end_offset``,
        ``high_watermark`` and ``last_stable_offset``, from its leader. Raises
        ``UnknownTopicOrPartitionError`` if the partition does not exist,
        ``UnknownTopicIdError`` if ``topic_id`` is not the topic's (recreated)."""
        request = ListOffsetsRequest(topic, partition, topic_id)
        doc = self._leader_action(topic, partition, request)
        return {k: int(v) for k, v in doc.items() if k not in ("topic",)}

    def ping(self: Routes, address: str | None = None) -> dict[str, Any]:
        """``{broker_id, version}`` of the broker at ``address`` (default: the first
        bootstrap address); no retry. Raises ``NetworkError`` if it does not answer."""
        return self._send(address or self._bootstrap[0], PingRequest())

    def metrics_per_broker(self: Routes, top: int = DEFAULT_TOP) -> list[dict[str, Any]]:
        """Every live broker's default metrics document with its ``top`` producers by
        duplicates (no retry: a broker that went away raises ``NetworkError``)."""
        view = self.refresh_metadata()
        request = MetricsRequest(top=top)
        return [self._send(b.address, request) for b in view.brokers.values()]

    def metrics(self: Routes, top: int = DEFAULT_TOP) -> dict[str, Any]:
        """The cluster's metrics: every live broker's document merged (its size bounded by
        the partitions and ``top``, whatever the number of producers); raises as
        :meth:`metrics_per_broker`."""
        return merge_documents(self.metrics_per_broker(top))

    def producer_pages(self: Routes, page_size: int = DEFAULT_PAGE_SIZE) -> Iterator[ProducerPage]:
        """Every live broker's per-producer counters, page by page (``page_size`` rows at
        most each, by producer id, broker after broker). Raises ``NetworkError`` if a
        broker goes away during the walk, ``InvalidRequestError`` for a size outside
        1..MAX_PAGE_SIZE."""
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
        """Every producer's counters across the cluster, one row per producer id (all the
        pages of :meth:`producer_pages`, merged); raises as it does."""
        pages = AdminCalls.producer_pages(self, page_size)
        return merge_producer_pages(p.to_doc() for p in pages)

    def elect_leaders(
        self: Routes, topics: Sequence[str] | None = None
    ) -> dict[str, dict[int, int]]:
        """The preferred-leader rebalance on the controller (``idemlog topics
        elect-leaders``): every partition whose first replica is live and in sync but not
        leading gets it back as leader. Returns {topic: {partition: new leader}}."""
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
