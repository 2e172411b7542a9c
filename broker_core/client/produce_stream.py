"""A raw, pipelined produce stream to one partition (one Flight DoPut).

``send`` writes a batch with its ``ProduceRequestMeta`` and returns at once with a
:class:`ProduceHandle`; a reader thread takes the broker's answers, which arrive in the
order the batches were sent, and completes the handles in that order. No retries and no
sequence bookkeeping: the caller chooses producer id, epoch and sequences (the real
producer, with its retry state machine, is built on top of this).

A stream-level failure (unknown topic, schema mismatch, garbage metadata, a dead broker)
fails every unanswered handle with the typed error; later sends raise it.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from broker_core.client.producer_tokens import ProducerTokenBook
from broker_core.errors import (
    IdemlogError,
    InvalidRequestError,
    NetworkError,
    SaslAuthenticationFailedError,
)
from broker_core.protocol.data_requests import ProduceDescriptor
from broker_core.protocol.requests import ACKS_ALL
from broker_core.protocol.wire import (
    ProduceRequestMeta,
    ProduceResponse,
    encode_json,
    parse_error_message,
)
from broker_core.record.batch import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE
from broker_core.security.sessions import EARLIER_RUN

log = logging.getLogger("idemlog.client")


def typed_flight_error(exc: BaseException, what: str) -> IdemlogError:
    """The broker's typed error inside a Flight/Arrow exception, else a NETWORK_EXCEPTION.
    A session token of the broker's earlier run (it restarted under the channel) is a
    NETWORK_EXCEPTION too: the caller resets the channel, whose next handshake succeeds."""
    if isinstance(exc, IdemlogError):
        return exc
    typed = parse_error_message(str(exc))
    if isinstance(typed, SaslAuthenticationFailedError) and EARLIER_RUN in typed.message:
        return NetworkError(f"{what}: the broker restarted since this connection authenticated")
    if typed is not None:
        return typed
    return NetworkError(f"{what}: {type(exc).__name__}: {exc}")


class ProduceHandle:
    """The answer to one sent batch, once the broker has given it."""

    def __init__(self, correlation_id: int, num_rows: int) -> None:
        self.correlation_id = correlation_id
        self.num_rows = num_rows
        self._done = threading.Event()
        self._response: ProduceResponse | None = None
        self._error: IdemlogError | None = None
        # Bounded by the callers: the producer's sender registers one per handle.
        self._callbacks: list[Callable[[], None]] = []
        self._callbacks_lock = threading.Lock()

    def _complete(self, response: ProduceResponse) -> None:
        self._response = response
        self._settle()

    def _fail(self, error: IdemlogError) -> None:
        self._error = error
        self._settle()

    def _settle(self) -> None:
        with self._callbacks_lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once when the handle is answered or failed: on the thread
        that answers it, or at once on this one if that already happened. The callback
        must be quick and must not raise (it runs on the stream's reader thread)."""
        with self._callbacks_lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> ProduceResponse:
        """The broker's response (which may carry a per-batch error code).

        Raises the stream's error if the stream failed before this batch was answered,
        and ``TimeoutError`` if no answer came within ``timeout`` seconds.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(
                f"no produce response for correlation id {self.correlation_id} within {timeout}s"
            )
        if self._error is not None:
            raise self._error
        assert self._response is not None
        return self._response

    def offsets(self, timeout: float | None = None) -> tuple[int, int]:
        """(base, last) offset of an acknowledged batch; raises the batch's error if any."""
        response = self.result(timeout)
        error = response.error()
        if error is not None:
            raise error
        return response.base_offset, response.last_offset


class ProduceStream:
    """Pipelined batches to ``topic``/``partition`` on one DoPut; not thread-safe to send.

    ``acks`` goes in the stream's descriptor and holds for every batch of the stream: -1
    (``ACKS_ALL``, the default) has each batch answered once every in-sync replica has it,
    1 (``ACKS_LEADER``) once the leader has written it. It is not checked here (the stream
    is raw): the broker refuses any other value, failing the stream with
    ``InvalidRequiredAcksError`` (INVALID_REQUIRED_ACKS) at the first send.
    ``transactional_id`` goes in the descriptor too: the transactional producer's, which
    its transactional batches need (the broker checks Write on it and verifies each
    transaction with its coordinator). ``tokens``: the producer tokens the client was
    issued; a non-transactional batch with a producer id carries its id's (the broker
    refuses it without: docs/security.md).
    """

    def __init__(
        self,
        client: flight.FlightClient,
        topic: str,
        partition: int,
        schema: pa.Schema | None = None,
        *,
        address: str = "",
        acks: int = ACKS_ALL,
        topic_id: str | None = None,
        transactional_id: str | None = None,
        tokens: ProducerTokenBook | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.transactional_id = transactional_id
        self.address = address
        self.acks = acks
        self._client = client
        self._tokens = tokens or ProducerTokenBook()
        self._schema = schema
        self._writer: Any = None
        self._reader_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # Serialises writes with the close that ends the call (never held while the
        # pending queue is locked, so an answer can always be taken off the queue).
        self._write_lock = threading.Lock()
        self._call_ended = False
        self._status: IdemlogError | None = None  # the call's final error, if it failed
        self._pending: deque[ProduceHandle] = deque()
        self._failure: IdemlogError | None = None
        self._closed = False
        self._correlation = itertools.count()
        if schema is not None:
            self._open(schema)

    @property
    def what(self) -> str:
        return f"produce to {self.topic}-{self.partition} at {self.address or 'broker'}"

    def _open(self, schema: pa.Schema) -> None:
        descriptor = flight.FlightDescriptor.for_command(
            encode_json(
                ProduceDescriptor(
                    self.topic, self.partition, self.acks, self.topic_id, self.transactional_id
                ).to_doc()
            )
        )
        try:
            writer, metadata_reader = self._client.do_put(descriptor, schema)
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            raise typed_flight_error(exc, self.what) from exc
        self._schema = schema
        self._writer = writer
        self._reader_thread = threading.Thread(
            target=self._read_responses,
            args=(metadata_reader,),
            name=f"idemlog-produce-{self.topic}-{self.partition}",
            daemon=True,
        )
        self._reader_thread.start()

    def send(
        self,
        batch: pa.RecordBatch,
        *,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
        transactional: bool = False,
    ) -> ProduceHandle:
        correlation_id = next(self._correlation)
        idempotent = producer_id >= 0 and not transactional
        token = self._tokens.token_for(producer_id) if idempotent else b""
        meta = ProduceRequestMeta(
            producer_id, producer_epoch, base_sequence, transactional, correlation_id, token
        )
        return self.send_raw(batch, meta.encode(), correlation_id)

    def send_raw(
        self, batch: pa.RecordBatch, metadata: bytes, correlation_id: int | None = None
    ) -> ProduceHandle:
        """Send ``batch`` with arbitrary metadata bytes (tests of malformed requests)."""
        if self._closed:
            raise InvalidRequestError(f"{self.what}: the stream is closed")
        if self._writer is None:
            self._open(batch.schema)
        handle = ProduceHandle(
            next(self._correlation) if correlation_id is None else correlation_id, batch.num_rows
        )
        with self._lock:
            if self._failure is not None:
                raise self._failure
            self._pending.append(handle)
        try:
            with self._write_lock:
                if self._call_ended:
                    raise NetworkError(f"{self.what}: the stream has ended")
                self._writer.write_with_metadata(batch, pa.py_buffer(metadata))
        except (flight.FlightError, pa.ArrowException, OSError, NetworkError) as exc:
            self._end_call(typed_flight_error(exc, self.what))
            assert self._failure is not None
            raise self._failure from exc
        return handle

    def _read_responses(self, metadata_reader: Any) -> None:
        try:
            while True:
                buf = metadata_reader.read()
                if buf is None:
                    break
                response = ProduceResponse.decode(buf)
                corr = response.correlation_id
                # Answers come in send order, so an answer for a later correlation id
                # means the earlier ones were lost (request or answer dropped on the
                # way): they fail retriably (the retry is deduplicated by the broker).
                # An answer nobody waits for (late, after its batch was given up) is
                # ignored: its batch already failed retriably.
                with self._lock:
                    lost: list[ProduceHandle] = []
                    while self._pending and self._pending[0].correlation_id < corr:
                        lost.append(self._pending.popleft())
                    handle = None
                    if self._pending and self._pending[0].correlation_id == corr:
                        handle = self._pending.popleft()
                for skipped in lost:
                    skipped._fail(
                        NetworkError(
                            f"{self.what}: no answer for correlation id "
                            f"{skipped.correlation_id} (the answer for {corr} came first)"
                        )
                    )
                if handle is None:
                    log.warning("%s: ignored an answer for correlation id %d", self.what, corr)
                    continue
                handle._complete(response)
        except Exception as exc:
            self._end_call(typed_flight_error(exc, self.what))
            return
        self._end_call(None)

    def _end_call(self, seen: IdemlogError | None) -> None:
        """The call is over: close it to learn its status, fail every unanswered batch.

        A server that ends the stream with an error shows it as a plain end of the answers
        (or a broken write); only closing the call reveals the broker's typed error, which
        is preferred over a generic transport error.
        """
        with self._write_lock:
            if not self._call_ended:
                self._call_ended = True
                try:
                    self._writer.close()
                except (flight.FlightError, pa.ArrowException, OSError) as exc:
                    self._status = typed_flight_error(exc, self.what)
        candidates = [e for e in (self._status, seen) if e is not None]
        typed = [e for e in candidates if not isinstance(e, NetworkError)]
        ended = NetworkError(f"{self.what}: the stream ended before every answer")
        self._fail_all((typed or candidates or [ended])[0])

    def _fail_all(self, error: IdemlogError) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = error
            pending, self._pending = list(self._pending), deque()
        for handle in pending:
            handle._fail(error)

    @property
    def failure(self) -> IdemlogError | None:
        return self._failure

    def in_flight(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self, timeout: float | None = 30.0) -> None:
        """Finish the stream: wait for every answer, then close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._writer is None:
            return
        failed: IdemlogError | None = None
        # Under the write lock: the reader thread may be closing the call (_end_call) right
        # now, and Flight aborts the process when done_writing() and close() run at once.
        with self._write_lock:
            if not self._call_ended:
                try:
                    self._writer.done_writing()
                except (flight.FlightError, pa.ArrowException, OSError) as exc:
                    failed = typed_flight_error(exc, self.what)
        if failed is not None:
            self._fail_all(failed)
        if self._reader_thread is not None:
            self._reader_thread.join(timeout)
        self._end_call(None)  # normally done by the reader already; then a no-op

    def __enter__(self) -> ProduceStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
