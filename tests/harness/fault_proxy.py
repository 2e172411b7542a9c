"""A fault-injecting Arrow Flight proxy between a client (the producer) and a REAL broker.

Raw TCP byte shuffling cannot drop one request inside an HTTP/2 stream, so the proxy works
at the Flight level: :class:`FaultProxy` is a ``pyarrow.flight`` server on a free loopback
port that forwards every call to the broker with a ``pyarrow.flight`` client, over real
sockets on both sides:

* ``DoPut`` produce streams are forwarded batch by batch with their metadata (one upstream
  DoPut per client DoPut); a thread forwards the broker's answers back. Each batch passes
  the rule engine first, which may inject one fault:

  - ``DROP_REQUEST``: the batch is not forwarded. The client gets no answer for it: it
    sees the next answers (later correlation ids; the broker answers them
    OUT_OF_ORDER_SEQUENCE) or, if nothing follows, its request times out;
  - ``DROP_RESPONSE``: the batch is forwarded (and appended), its answer swallowed;
  - ``DELAY_REQUEST`` / ``DELAY_RESPONSE``: ``delay_s`` before forwarding the batch / its
    answer (a delayed answer holds back the answers behind it, as on a real stream);
  - ``REORDER``: the answer is held back and released after the next ``window`` answers
    (or when the stream ends), so the client sees answers out of order;
  - ``RESET``: the batch is forwarded, then the client's stream is aborted with a Flight
    UNAVAILABLE error (a connection reset: whether the batch was appended is unknown to
    the client; the proxy waits for the broker's answers before aborting so the outcome
    is settled).

* ``DoGet`` (fetch) and ``DoAction`` are forwarded unchanged (no faults), except that the
  addresses in the answers of ``METADATA`` and ``FIND_COORDINATOR`` are **rewritten to the
  proxy's own host:port**: the producer bootstraps from the proxy and must keep talking to
  it, not to the broker it learns about. One proxy fronts one broker, so every broker in
  the answer is rewritten.

Rules: a :class:`Rule` fires on a predicate over a :class:`ProduceEvent` (topic,
partition, the index of the batch among those the proxy received for that partition --
retries included --, the producer id/epoch/sequence and how many times the same
(pid, epoch, sequence) came before), at most ``times`` times; :func:`nth_batch` builds the
usual "the 3rd batch to partition 1" predicate. When no rule fires, :class:`RandomFaults`
(probabilities per fault, a seed) may: the draw for a batch is seeded by (seed, topic,
partition, index), so it does not depend on how the proxy's threads interleave.

Every injected fault is counted in :attr:`FaultProxy.stats` and logged in
:attr:`FaultProxy.events`; :attr:`FaultProxy.arrivals` records, per forwarded batch, how
many batches of its partition were unanswered at that moment (for "at most one in
flight while retrying" checks).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from broker_core.protocol.wire import (
    Action,
    ProduceRequestMeta,
    ProduceResponse,
    decode_json,
    encode_json,
)

_ERROR_PREFIX = "IDEMLOG_ERROR"


class Fault(StrEnum):
    DROP_REQUEST = "drop_request"
    DROP_RESPONSE = "drop_response"
    DELAY_REQUEST = "delay_request"
    DELAY_RESPONSE = "delay_response"
    REORDER = "reorder"
    RESET = "reset"


@dataclass(frozen=True)
class ProduceEvent:
    """What a rule sees of one batch arriving at the proxy."""

    topic: str
    partition: int
    index: int  # 0-based, among the batches the proxy received for this partition
    producer_id: int
    producer_epoch: int
    base_sequence: int
    attempt: int  # how many times this (pid, epoch, sequence) arrived before
    num_rows: int
    correlation_id: int


Predicate = Callable[[ProduceEvent], bool]


@dataclass
class Rule:
    fault: Fault
    when: Predicate
    times: int | None = 1  # None: every time the predicate holds
    delay_s: float = 0.0
    window: int = 1  # REORDER: released after this many later answers
    fired: int = 0

    def matches(self, event: ProduceEvent) -> bool:
        return (self.times is None or self.fired < self.times) and self.when(event)


def nth_batch(n: int, partition: int = 0, topic: str | None = None) -> Predicate:
    """The ``n``-th batch (1-based, retries included) the proxy receives for the
    partition."""

    def when(event: ProduceEvent) -> bool:
        return (
            event.partition == partition
            and event.index == n - 1
            and (topic is None or event.topic == topic)
        )

    return when


@dataclass(frozen=True)
class RandomFaults:
    """Per batch, at most one fault, each with its probability."""

    seed: int
    drop_request: float = 0.0
    drop_response: float = 0.0
    delay_request: float = 0.0
    delay_response: float = 0.0
    reorder: float = 0.0
    reset: float = 0.0
    max_delay_s: float = 0.05
    max_window: int = 3

    def draw(self, event: ProduceEvent) -> Rule | None:
        rng = random.Random(f"{self.seed}:{event.topic}:{event.partition}:{event.index}")
        x = rng.random()
        for fault, p in (
            (Fault.DROP_REQUEST, self.drop_request),
            (Fault.DROP_RESPONSE, self.drop_response),
            (Fault.DELAY_REQUEST, self.delay_request),
            (Fault.DELAY_RESPONSE, self.delay_response),
            (Fault.REORDER, self.reorder),
            (Fault.RESET, self.reset),
        ):
            if x < p:
                return Rule(
                    fault,
                    lambda _e: True,
                    delay_s=rng.uniform(0, self.max_delay_s),
                    window=rng.randint(1, self.max_window),
                )
            x -= p
        return None


@dataclass(frozen=True)
class Arrival:
    """A batch forwarded to the broker."""

    topic: str
    partition: int
    base_sequence: int
    attempt: int
    unanswered: int  # batches of the partition forwarded and not answered by the broker


@dataclass
class _Partition:
    received: int = 0
    unanswered: int = 0


class _Stream:
    """One forwarded produce stream: client DoPut -> upstream DoPut."""

    def __init__(self, proxy: FaultProxy, topic: str, partition: int) -> None:
        self.proxy = proxy
        self.topic = topic
        self.partition = partition
        self.decisions: dict[int, Rule] = {}  # correlation id -> fault on the answer
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.client_gone = False


class FaultProxy(flight.FlightServerBase):  # type: ignore[misc]
    """Serving starts in the constructor (pyarrow's behaviour); see the module doc."""

    def __init__(
        self,
        upstream: str,
        *,
        rules: list[Rule] | None = None,
        random_faults: RandomFaults | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(f"grpc://{host}:0")
        self.host = host
        self.upstream = upstream
        self.rules: list[Rule] = list(rules or [])
        self.random_faults = random_faults
        self.stats: Counter[str] = Counter()
        self.events: list[tuple[Fault, ProduceEvent]] = []
        self.arrivals: list[Arrival] = []
        self._lock = threading.Lock()
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._attempts: Counter[tuple[str, int, int, int, int]] = Counter()
        self._client: flight.FlightClient | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.shutdown()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_faults(
        self, rules: list[Rule] | None = None, random_faults: RandomFaults | None = None
    ) -> None:
        with self._lock:
            self.rules = list(rules or [])
            self.random_faults = random_faults

    # -- upstream --------------------------------------------------------------------------
    def _upstream(self) -> flight.FlightClient:
        with self._lock:
            if self._client is None:
                self._client = flight.connect(f"grpc://{self.upstream}")
            return self._client

    def _upstream_failed(self, exc: BaseException, what: str) -> flight.FlightError:
        """The error to give the client for an upstream failure: the broker's typed error
        unchanged, anything else UNAVAILABLE (and a fresh upstream channel next time)."""
        text = str(exc)
        if _ERROR_PREFIX in text:
            return flight.FlightServerError(text)
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        return flight.FlightUnavailableError(f"fault proxy: {what} upstream failed: {text}")

    # -- rules -----------------------------------------------------------------------------
    def _decide(self, event: ProduceEvent) -> Rule | None:
        with self._lock:
            rule = next((r for r in self.rules if r.matches(event)), None)
            if rule is not None:
                rule.fired += 1
            elif self.random_faults is not None:
                rule = self.random_faults.draw(event)
            if rule is not None:
                self.stats[rule.fault.value] += 1
                self.events.append((rule.fault, event))
        return rule

    def _event(
        self, topic: str, partition: int, meta: ProduceRequestMeta, rows: int
    ) -> ProduceEvent:
        key = (topic, partition, meta.producer_id, meta.producer_epoch, meta.base_sequence)
        with self._lock:
            state = self._partitions.setdefault((topic, partition), _Partition())
            index = state.received
            state.received += 1
            attempt = self._attempts[key]
            self._attempts[key] += 1
        return ProduceEvent(
            topic,
            partition,
            index,
            meta.producer_id,
            meta.producer_epoch,
            meta.base_sequence,
            attempt,
            rows,
            meta.correlation_id,
        )

    # -- produce ---------------------------------------------------------------------------
    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        request = decode_json(descriptor.command or b"{}", "produce descriptor")
        topic = str(request.get("topic", ""))
        partition = int(request.get("partition", -1))
        try:
            up_writer, up_reader = self._upstream().do_put(descriptor, reader.schema)
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            raise self._upstream_failed(exc, "produce") from exc
        stream = _Stream(self, topic, partition)
        answers = threading.Thread(
            target=self._forward_answers,
            args=(stream, up_reader, writer),
            name=f"fault-proxy-answers-{topic}-{partition}",
            daemon=True,
        )
        answers.start()
        reset: Rule | None = None
        try:
            while reset is None and stream.error is None:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    break
                meta = ProduceRequestMeta.decode(chunk.app_metadata)
                event = self._event(topic, partition, meta, chunk.data.num_rows)
                rule = self._decide(event)
                fault = rule.fault if rule is not None else None
                if fault is Fault.DROP_REQUEST:
                    if meta.base_sequence == 0 and meta.producer_id >= 0:
                        # The first batch of a producer id/epoch: a partition that never saw
                        # the id accepts any sequence (docs/design.md §4), so losing it while later
                        # batches arrive would leave an undetectable gap. On a real stream
                        # that cannot happen (HTTP/2 loses the rest with it): drop the stream.
                        reset = rule
                        break
                    continue
                if fault is Fault.DELAY_REQUEST and rule is not None:
                    time.sleep(rule.delay_s)
                if rule is not None and fault in (
                    Fault.DROP_RESPONSE,
                    Fault.DELAY_RESPONSE,
                    Fault.REORDER,
                ):
                    with stream.lock:
                        stream.decisions[meta.correlation_id] = rule
                with self._lock:
                    state = self._partitions[(topic, partition)]
                    self.arrivals.append(
                        Arrival(
                            topic, partition, meta.base_sequence, event.attempt, state.unanswered
                        )
                    )
                    state.unanswered += 1
                try:
                    up_writer.write_with_metadata(chunk.data, chunk.app_metadata)
                except (flight.FlightError, pa.ArrowException, OSError) as exc:
                    stream.error = exc
                    break
                if fault is Fault.RESET:
                    reset = rule
        finally:
            if reset is not None:
                stream.client_gone = True
            with contextlib.suppress(Exception):
                up_writer.done_writing()
            answers.join(30)
            with contextlib.suppress(Exception):
                up_writer.close()
        if reset is not None:
            raise flight.FlightUnavailableError("fault proxy: connection reset (injected)")
        if stream.error is not None:
            raise self._upstream_failed(stream.error, "produce")

    def _forward_answers(self, stream: _Stream, up_reader: Any, writer: Any) -> None:
        held: list[list[Any]] = []  # [answers still to pass, buffer]

        def deliver(buf: Any) -> None:
            if not stream.client_gone:
                try:
                    writer.write(buf)
                except Exception:  # the client went away: keep draining the broker
                    stream.client_gone = True

        try:
            while True:
                buf = up_reader.read()
                if buf is None:
                    break
                with self._lock:
                    state = self._partitions[(stream.topic, stream.partition)]
                    state.unanswered -= 1
                response = ProduceResponse.decode(buf)
                with stream.lock:
                    rule = stream.decisions.pop(response.correlation_id, None)
                fault = rule.fault if rule is not None else None
                if fault is Fault.DROP_RESPONSE:
                    continue
                if fault is Fault.DELAY_RESPONSE and rule is not None:
                    time.sleep(rule.delay_s)
                if fault is Fault.REORDER and rule is not None:
                    held.append([rule.window, buf])
                    continue
                deliver(buf)
                for entry in held:
                    entry[0] -= 1
                for entry in [e for e in held if e[0] <= 0]:
                    held.remove(entry)
                    deliver(entry[1])
        except Exception as exc:
            if stream.error is None:
                stream.error = exc
        finally:
            for _n, buf in held:
                deliver(buf)

    # -- fetch and actions: forwarded unchanged --------------------------------------------
    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        try:
            reader = self._upstream().do_get(ticket)
            schema = reader.schema
            chunks = []
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    break
                chunks.append((chunk.data, chunk.app_metadata))
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            raise self._upstream_failed(exc, "fetch") from exc
        return flight.GeneratorStream(schema, _chunks(chunks))

    def do_action(
        self, context: flight.ServerCallContext, action: flight.Action
    ) -> Iterator[bytes]:
        body = action.body.to_pybytes() if action.body is not None else b""
        try:
            results = [
                r.body.to_pybytes()
                for r in self._upstream().do_action(flight.Action(action.type, body))
            ]
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            raise self._upstream_failed(exc, f"action {action.type}") from exc
        if action.type in (Action.METADATA.value, Action.FIND_COORDINATOR.value):
            results = [self._rewrite(action.type, r) for r in results]
        return iter(results)

    def _rewrite(self, action_type: str, data: bytes) -> bytes:
        """Point every broker address in the answer at the proxy."""
        doc = decode_json(data, action_type)
        host, port = self.host, int(self.port)
        if action_type == Action.METADATA.value:
            doc["brokers"] = [{**b, "host": host, "port": port} for b in doc.get("brokers", [])]
        elif "host" in doc:
            doc.update(host=host, port=port)
        return encode_json(doc)

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return list(self._upstream().list_actions())


def _chunks(
    chunks: list[tuple[pa.RecordBatch, pa.Buffer | None]],
) -> Iterator[tuple[pa.RecordBatch, pa.Buffer | None] | pa.RecordBatch]:
    for data, meta in chunks:
        yield (data, meta) if meta is not None else data


__all__ = [
    "Arrival",
    "Fault",
    "FaultProxy",
    "ProduceEvent",
    "RandomFaults",
    "Rule",
    "nth_batch",
]
