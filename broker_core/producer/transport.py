"""How the sender talks to brokers: a small ``Transport`` protocol and its Flight version.

The sender needs only: the number of partitions of a topic, a pipelined ``send`` per
partition returning a handle at once (answers per partition come in send order), a way
to drop a partition's stream (broken, timed out, leader moved), and the producer-id and
transaction calls. Tests drive the sender with a scripted fake; a fault proxy can wrap
:class:`FlightTransport` (or sit between it and the broker) without touching the sender.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import pyarrow as pa

from broker_core.client.broker_client import BrokerClient
from broker_core.client.produce_stream import ProduceHandle, ProduceStream
from broker_core.errors import (
    IdemlogError,
    NetworkError,
    NotLeaderOrFollowerError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.requests import ACKS_ALL
from broker_core.protocol.wire import ProduceResponse, SinkAttempt, SinkTxnStatus

from .producer_batch import TopicPartition


class SendHandle(Protocol):
    """The pending answer to one sent batch (``ProduceHandle`` fits)."""

    def done(self) -> bool: ...

    def result(self, timeout: float | None = None) -> ProduceResponse:
        """The broker's answer (may carry an error code); raises the stream's error."""
        ...

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once, as soon as ``done()`` is true (at once if it already
        is), from whichever thread made it so. The sender's wake-up: it must be quick and
        must not raise."""
        ...


class Transport(Protocol):
    def partitions_for(self, topic: str) -> int:
        """The topic's partition count; the first call for a topic also pins its id
        (the producer's session writes to that topic only: a topic recreated under the
        name refuses every later request, UNKNOWN_TOPIC_ID)."""
        ...

    def send(
        self,
        tp: TopicPartition,
        batch: pa.RecordBatch,
        *,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        transactional: bool,
    ) -> SendHandle: ...

    def reset(self, tp: TopicPartition, error: IdemlogError) -> None:
        """Drop the partition's stream: unanswered handles fail with ``error``."""
        ...

    def init_producer_id(
        self, transactional_id: str | None, transaction_timeout_ms: int | None
    ) -> tuple[int, int]: ...

    def init_sink_producer(
        self, transactional_id: str, transaction_timeout_ms: int | None, attempt: SinkAttempt
    ) -> tuple[int, int, SinkTxnStatus]: ...

    def prepare_sink_txn(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        batch_id: int,
        ranges: Sequence[tuple[str, int, int, int]],
    ) -> None: ...

    def add_partitions_to_txn(
        self, transactional_id: str, producer_id: int, epoch: int, tps: Sequence[TopicPartition]
    ) -> None: ...

    def end_txn(
        self, transactional_id: str, producer_id: int, epoch: int, commit: bool
    ) -> tuple[int, int]:
        """The producer id and epoch of the next transaction (KIP-890)."""
        ...

    def within(self, seconds: float) -> AbstractContextManager[None]:
        """Every call above made by this thread inside the block ends within ``seconds``
        (its request timeout and its own retries cut to what is left)."""
        ...

    def close(self) -> None: ...


class FailedHandle:
    """A handle that failed before the batch reached the wire."""

    def __init__(self, error: IdemlogError) -> None:
        self.error = error

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> ProduceResponse:
        raise self.error

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        callback()


class _StreamHandle:
    """A ``ProduceHandle`` that ``reset`` can fail early (request timeout)."""

    def __init__(self, inner: ProduceHandle) -> None:
        self.inner = inner
        self.error: IdemlogError | None = None
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []  # the sender's one wake-up

    def done(self) -> bool:
        return self.error is not None or self.inner.done()

    def result(self, timeout: float | None = None) -> ProduceResponse:
        if self.error is not None and not self.inner.done():
            raise self.error
        return self.inner.result(timeout)

    def fail_early(self, error: IdemlogError) -> None:
        """Done now with ``error`` (the stream was dropped), unless already answered."""
        if self.error is None:
            self.error = error
        self._fire()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._callbacks.append(callback)
        if self.error is not None:
            self._fire()
        else:
            self.inner.add_done_callback(self._fire)

    def _fire(self) -> None:
        # Whichever comes first, the answer or fail_early, calls each callback once.
        with self._lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class FlightTransport:
    """``Transport`` over a ``BrokerClient`` and its raw produce streams.

    Every stream it opens carries ``acks`` (the producer's ``acks`` key, as the wire
    value: -1 all in-sync replicas, the default; 1 the leader): it is a property of the
    producer, not of one batch, so the ``Transport`` seam does not carry it; so is
    ``transactional_id`` (the transactional producer's), which every stream names as
    Kafka's Produce does: the broker refuses a transactional batch without it.
    """

    def __init__(
        self,
        client: BrokerClient,
        *,
        owns_client: bool = True,
        acks: int = ACKS_ALL,
        topic_ids: Mapping[str, str] | None = None,
        transactional_id: str | None = None,
    ) -> None:
        self.client = client
        self.acks = acks
        self.transactional_id = transactional_id
        self._owns_client = owns_client
        self._lock = threading.Lock()
        self._streams: dict[TopicPartition, tuple[ProduceStream, list[_StreamHandle]]] = {}
        self._refreshing = False
        self._refresher: threading.Thread | None = None
        # topic -> the id pinned when this producer first learned the topic (None: a
        # topic stored before ids, unchecked). Sent with every produce stream and
        # transaction request, so this producer's sequences never reach a topic
        # recreated under the name: the broker refuses them (UnknownTopicIdError).
        # ``topic_ids``: pinned by the caller before (the Spark sink's plan).
        self._topic_ids: dict[str, str | None] = dict(topic_ids or {})

    def partitions_for(self, topic: str) -> int:
        view = self.client.metadata()
        leaders = view.topics.get(topic)
        if leaders is None:
            view = self.client.metadata(refresh=True)
            leaders = view.topics.get(topic)
        if not leaders:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        with self._lock:
            self._topic_ids.setdefault(topic, view.topic_ids.get(topic))
        return len(leaders)

    def topic_id(self, topic: str) -> str | None:
        """The id pinned for ``topic`` (learned now if it was not: the first use)."""
        with self._lock:
            if topic in self._topic_ids:
                return self._topic_ids[topic]
        self.partitions_for(topic)
        with self._lock:
            return self._topic_ids[topic]

    def _topic_ids_of(self, topics: Sequence[str]) -> dict[str, str]:
        pinned = {t: self.topic_id(t) for t in dict.fromkeys(topics)}
        return {t: i for t, i in pinned.items() if i is not None}

    def send(
        self,
        tp: TopicPartition,
        batch: pa.RecordBatch,
        *,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        transactional: bool,
    ) -> SendHandle:
        with self._lock:
            entry = self._streams.get(tp)
        failure = entry[0].failure if entry is not None else None
        if failure is not None:
            # The stream broke and the sender may not have seen its failed batches yet:
            # a fresh stream now could put this batch on the wire ahead of their retries.
            self._forget(tp, failure)
            return FailedHandle(failure)
        try:
            if entry is None:
                stream = self.client.produce_stream(
                    tp.topic,
                    tp.partition,
                    acks=self.acks,
                    topic_id=self.topic_id(tp.topic),
                    transactional_id=self.transactional_id,
                )
                entry = (stream, [])
                with self._lock:
                    self._streams[tp] = entry
            stream, handles = entry
            inner = stream.send(
                batch,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                base_sequence=base_sequence,
                transactional=transactional,
            )
        except IdemlogError as exc:
            self._forget(tp, exc)
            return FailedHandle(exc)
        handle = _StreamHandle(inner)
        handles[:] = [h for h in handles if not h.inner.done()]
        handles.append(handle)
        return handle

    def _forget(self, tp: TopicPartition, error: IdemlogError) -> None:
        with self._lock:
            entry = self._streams.pop(tp, None)
        if entry is not None:
            for handle in entry[1]:
                handle.fail_early(error)
            # Closing waits for the broker's status; never block the sender on it.
            threading.Thread(target=_close_stream, args=(entry[0],), daemon=True).start()
        if isinstance(error, NetworkError):
            with contextlib.suppress(IdemlogError):
                address = self.client.leader(tp.topic, tp.partition).address
                self.client.reset_connection(address)  # a fresh channel, no gRPC backoff
        if isinstance(
            error,
            (
                NotLeaderOrFollowerError,
                UnknownTopicOrPartitionError,
                NetworkError,
                UnknownTopicIdError,
            ),
        ):
            # A leader that does not answer may have been replaced by an election: the
            # next attempts go where the fresh metadata says (the same broker until then).
            # A recreated topic: this producer's pin stays (its batches fail), but the next
            # producer on a shared client pins the new id, not the cached old one.
            self._refresh_metadata_soon()

    def _refresh_metadata_soon(self) -> None:
        """Refresh the metadata on a thread of its own, one refresh at a time: asking a
        broker whose host is cut off waits out the request timeout, which must not stall
        the sender (and every other partition's batches) behind it."""
        with self._lock:
            if self._refreshing:
                return
            self._refreshing = True

        def refresh() -> None:
            try:
                with contextlib.suppress(IdemlogError):
                    self.client.refresh_metadata()
            finally:
                with self._lock:
                    self._refreshing = False

        thread = threading.Thread(target=refresh, name="idemlog-metadata-refresh", daemon=True)
        self._refresher = thread
        thread.start()

    def reset(self, tp: TopicPartition, error: IdemlogError) -> None:
        self._forget(tp, error)

    def init_producer_id(
        self, transactional_id: str | None, transaction_timeout_ms: int | None
    ) -> tuple[int, int]:
        return self.client.init_producer_id(transactional_id, transaction_timeout_ms)

    def init_sink_producer(
        self, transactional_id: str, transaction_timeout_ms: int | None, attempt: SinkAttempt
    ) -> tuple[int, int, SinkTxnStatus]:
        return self.client.init_sink_producer(transactional_id, transaction_timeout_ms, attempt)

    def prepare_sink_txn(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        batch_id: int,
        ranges: Sequence[tuple[str, int, int, int]],
    ) -> None:
        topic_ids = self._topic_ids_of([r[0] for r in ranges])
        self.client.prepare_sink_txn(
            transactional_id, producer_id, epoch, batch_id, ranges, topic_ids=topic_ids
        )

    def add_partitions_to_txn(
        self, transactional_id: str, producer_id: int, epoch: int, tps: Sequence[TopicPartition]
    ) -> None:
        self.client.add_partitions_to_txn(
            transactional_id,
            producer_id,
            epoch,
            [(tp.topic, tp.partition) for tp in tps],
            topic_ids=self._topic_ids_of([tp.topic for tp in tps]),
        )

    def end_txn(
        self, transactional_id: str, producer_id: int, epoch: int, commit: bool
    ) -> tuple[int, int]:
        return self.client.end_txn(transactional_id, producer_id, epoch, commit)

    def within(self, seconds: float) -> AbstractContextManager[None]:
        return self.client.deadline(seconds)

    def close(self) -> None:
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream, _handles in streams:
            _close_stream(stream)
        refresher = self._refresher
        if refresher is not None:
            # Its call must end before the client's connections close under it.
            refresher.join(self.client.timeout_s)
        if self._owns_client:
            self.client.close()


def _close_stream(stream: ProduceStream) -> None:
    # A stream that already broke has nothing left to release.
    with contextlib.suppress(Exception):
        stream.close(timeout=5)
