"""The broker's Arrow Flight service: produce (DoPut), fetch (DoGet), everything else (DoAction).

The wire contract is ``broker_core.protocol.wire``. Errors that fail a whole request leave as
``FlightServerError`` carrying ``protocol.error_message``; an error of one produced batch
is that batch's ``ProduceResponse`` and the stream goes on. An exception that is not an
``IdemlogError`` is a bug: it is logged with its traceback and answered as
``UNKNOWN_SERVER_ERROR``, never swallowed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from broker_core.errors import (
    IdemlogError,
    InvalidRequestError,
    MessageTooLargeError,
    SchemaMismatchError,
    UnknownServerError,
)
from broker_core.log.partition_log import AppendResult, IsolationLevel, PartitionLog
from broker_core.log.producer_state import VerificationGuard
from broker_core.log.store import LogStore, describe_schema_difference
from broker_core.protocol.data_requests import FetchRequest, ProduceDescriptor
from broker_core.protocol.metrics import AppendOutcome
from broker_core.protocol.requests import ACKS_ALL
from broker_core.protocol.wire import (
    Action,
    FetchBatchMeta,
    FetchTrailer,
    ProduceRequestMeta,
    ProduceResponse,
    decode_json,
    encode_json,
    error_message,
)
from broker_core.record.batch import validate_rows
from broker_core.security.principal import principal_of
from broker_core.security.producer_token import ProducerTokens
from broker_core.security.tls import PLAINTEXT_MATERIAL, TlsMaterial, server_arguments
from broker_core.server.access.authorization import (
    FETCH,
    IDEMPOTENT_PRODUCE,
    PRODUCE,
    Caller,
    Permit,
    RequestAuthorizer,
    host_of_peer,
)
from broker_core.server.coordination.txn_verifier import TxnVerifier
from broker_core.server.hooks import NO_HOOKS, BrokerHooks
from broker_core.server.observability.metrics import Metrics, outcome_of
from broker_core.server.replication.partition import Partition
from broker_core.server.requests.handlers import ActionHandlers

log = logging.getLogger("idemlog.flight")

T = TypeVar("T")
EMPTY_SCHEMA = pa.schema([])
SHUTDOWN_JOIN_S = 5.0  # a produce stream's reading thread, after its last answer


def _flight_error(error: IdemlogError) -> flight.FlightServerError:
    return flight.FlightServerError(error_message(error))


class LeaderLogs(Protocol):
    """The partition logs this broker leads (``LocalTopics``)."""

    def leader_log(
        self, topic: str, partition: int, topic_id: str | None = None
    ) -> PartitionLog: ...

    def partition(self, topic: str, partition: int) -> Partition: ...


class IdemlogFlightServer(flight.FlightServerBase):  # type: ignore[misc]
    """Serving starts in the constructor (pyarrow's behaviour); ``port`` is the bound one.

    ``gate()`` runs first in every request (it waits for the broker's start and raises to
    refuse the request); ``actions`` answers DoAction; ``topics`` gives the leader's log
    of a partition (raising the routing error otherwise); ``store()`` is the broker's
    store, None before it is open (then topics have no schema); ``max_request_bytes``
    bounds a produced batch and an action body; ``tls``: the listener's protocol and
    checked files (``broker_core.security.tls.server_arguments``), plaintext by default;
    ``auth_handler``: SASL's or mutual TLS's (``broker_core.server.access.authentication``);
    ``middleware``: checks before every call (the embedded broker's token);
    ``authorizer``: the ACL check every request passes before it touches state
    (``broker_core.server.access.authorization``), None with ``authorizer.enable=false``;
    ``verifier``: asks a transactional batch's coordinator before its first append
    (``broker_core.server.coordination.txn_verifier``); ``producer_tokens``: checks that a
    non-transactional batch's producer id was issued to the stream's principal
    (``broker_core.security.producer_token``); ``hooks``: the test hooks (the product's
    answers unless started for them).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: TlsMaterial = PLAINTEXT_MATERIAL,
        actions: ActionHandlers,
        gate: Callable[[], None],
        topics: LeaderLogs,
        store: Callable[[], LogStore | None],
        metrics: Metrics,
        max_request_bytes: int,
        ack_timeout_s: float = 60.0,
        auth_handler: flight.ServerAuthHandler | None = None,
        middleware: Mapping[str, flight.ServerMiddlewareFactory] | None = None,
        authorizer: RequestAuthorizer | None = None,
        verifier: TxnVerifier,
        producer_tokens: ProducerTokens,
        hooks: BrokerHooks = NO_HOOKS,
    ) -> None:
        # auth_handler (SASL, broker_core.server.access.authentication): every call but the
        # handshake carries a valid session token, or Flight refuses it before any handler.
        # middleware: the embedded broker's per-start token check (security/local_token.py).
        location, arguments = server_arguments(
            host, port, tls, auth_handler=auth_handler, middleware=middleware
        )
        super().__init__(location, **arguments)
        self._actions = actions
        self._gate = gate
        self._topics = topics
        self._store = store
        self._metrics = metrics
        self._max_request_bytes = max_request_bytes
        self._ack_timeout_s = ack_timeout_s
        self._authorizer = authorizer
        self._verifier = verifier
        self._producer_tokens = producer_tokens
        self._hooks = hooks

    # -- common --------------------------------------------------------------------------
    def _permit(
        self, context: flight.ServerCallContext, request: str, doc: dict[str, Any]
    ) -> Permit:
        """The ACL check of one request (before it touches any state): raises its typed
        refusal; without an authorizer, a permit that allows everything and names the
        caller (InitProducerId binds an idempotent producer id to it)."""
        if self._authorizer is None:
            return Permit(None, _caller(context))
        return self._authorizer.check(_caller(context), request, doc)

    def _guard(self, what: str, body: Callable[[], T]) -> T:
        """Run a request: typed errors to the wire, bugs logged and sent as unknown."""
        try:
            self._gate()
            return body()
        except IdemlogError as exc:
            log.debug("%s failed: %s", what, exc)
            raise _flight_error(exc) from exc
        except flight.FlightError:
            raise  # already a Flight status (e.g. the client went away)
        except Exception as exc:
            log.exception("%s failed unexpectedly", what)
            raise _flight_error(UnknownServerError(f"{what}: {type(exc).__name__}: {exc}")) from exc

    # -- produce -------------------------------------------------------------------------
    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        self._guard("produce", lambda: self._produce(context, descriptor, reader, writer))

    def _produce(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        what = "produce descriptor"
        if descriptor.descriptor_type != flight.DescriptorType.CMD or not descriptor.command:
            raise InvalidRequestError(f"{what}: must be a command holding a JSON object")
        doc = decode_json(descriptor.command, what)
        request = ProduceDescriptor.from_doc(doc)
        self._permit(context, PRODUCE, doc)
        authorizer = self._authorizer
        caller = _caller(context)  # the stream's, once
        principal = str(caller.principal)
        topic, partition, txn_id = request.topic, request.partition, request.transactional_id
        tokens, where = self._producer_tokens, f"produce to {topic}-{partition}"

        def authorized(meta: ProduceRequestMeta) -> None:
            # Asked again at each batch: a principal that loses its ACL mid-stream is
            # refused from its next batch on (the cached, indexed ACLs: a look-up, no I/O
            # on a cluster; one stat of the embedded file).
            if authorizer is not None:
                authorizer.check(caller, PRODUCE, doc)
            if meta.producer_id >= 0 and not meta.transactional:
                if authorizer is not None:
                    authorizer.require(caller, IDEMPOTENT_PRODUCE, PRODUCE)
                # With or without an authorizer (then everyone is ANONYMOUS), and before
                # the validator: a refusal never shows the id's epoch or sequence.
                tokens.check(meta.producer_id, principal, meta.producer_token, where)

        # Routing errors and a stale topic id before the stream starts. A stream opened on
        # a copy that is deleted later fails its next append (the log is abandoned).
        self._topics.leader_log(topic, partition, request.topic_id)
        replica = self._topics.partition(topic, partition)
        store = self._store()
        expected = store.topic(topic).schema if store else None
        if expected is not None and not expected.equals(reader.schema, check_metadata=False):
            raise SchemaMismatchError(
                f"produce to {topic}-{partition}: stream schema does not match the topic: "
                f"{describe_schema_difference(expected, reader.schema)}"
            )
        acks_all = request.acks == ACKS_ALL
        chunks = self._chunks(reader, topic, partition)
        if not (acks_all and replica.replicated):
            # Answered as soon as the leader has written it (the log end is the high
            # watermark of a single replica).
            for meta, batch in chunks:
                response, _end, _epoch = self._append(
                    replica, topic, partition, txn_id, meta, batch, acks_all, authorized
                )
                writer.write(response.encode())
            return
        self._produce_replicated(replica, topic, partition, txn_id, chunks, writer, authorized)

    def _chunks(
        self, reader: flight.MetadataRecordBatchReader, topic: str, partition: int
    ) -> Iterator[tuple[ProduceRequestMeta, pa.RecordBatch]]:
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return
            except (pa.ArrowInvalid, OSError) as exc:
                # Arrow reports an IPC message cut short or not a flatbuffer as an I/O
                # error (OSError): the client's bytes, not the broker, so its code is 42.
                raise InvalidRequestError(
                    f"produce to {topic}-{partition}: unreadable message ({exc})"
                ) from exc
            meta = ProduceRequestMeta.decode(chunk.app_metadata)
            if chunk.data is None:
                raise InvalidRequestError(
                    f"produce to {topic}-{partition}: correlation id {meta.correlation_id} "
                    "carries metadata but no record batch"
                )
            yield meta, chunk.data

    def _produce_replicated(
        self,
        replica: Partition,
        topic: str,
        partition: int,
        txn_id: str | None,
        chunks: Iterator[tuple[ProduceRequestMeta, pa.RecordBatch]],
        writer: flight.FlightMetadataWriter,
        authorized: Callable[[ProduceRequestMeta], None],
    ) -> None:
        """acks=all on a replicated partition: batches are read and appended on one thread
        while this one answers each, in order, once the high watermark passed it; so a
        producer's pipeline keeps flowing while the followers copy."""
        Answer = tuple[tuple[ProduceResponse, int | None, int], float]
        answers: queue.Queue[Answer | BaseException | None] = queue.Queue()

        def read_and_append() -> None:
            try:
                for meta, batch in chunks:
                    appended = self._append(
                        replica, topic, partition, txn_id, meta, batch, True, authorized
                    )
                    # The answer's deadline counts from the append, not from when the
                    # answering thread reaches it behind the batches before it.
                    answers.put((appended, time.monotonic() + self._ack_timeout_s))
                answers.put(None)
            except BaseException as exc:  # handed to the answering thread, raised there
                answers.put(exc)

        appender = threading.Thread(
            target=read_and_append, name=f"idemlog-produce-{topic}-{partition}", daemon=True
        )
        appender.start()
        try:
            while (item := answers.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                (response, end, epoch), deadline = item
                if end is not None:
                    try:
                        remaining = max(0.0, deadline - time.monotonic())
                        replica.wait_replicated(end, remaining, epoch)
                    except IdemlogError as exc:
                        response = ProduceResponse.failure(response.correlation_id, exc)
                try:
                    writer.write(response.encode())
                except OSError as exc:
                    # The client went away while its batches were being replicated: they
                    # stay written, and its retry is answered as a duplicate. Not a bug.
                    log.info(
                        "produce to %s-%d: client gone before its answer (%s)",
                        topic,
                        partition,
                        exc,
                    )
                    return
        finally:
            appender.join(SHUTDOWN_JOIN_S)

    def _append(
        self,
        replica: Partition,
        topic: str,
        partition: int,
        txn_id: str | None,
        meta: ProduceRequestMeta,
        batch: pa.RecordBatch,
        acks_all: bool,
        authorized: Callable[[ProduceRequestMeta], None],
    ) -> tuple[ProduceResponse, int | None, int]:
        """Append one batch while this broker leads; its answer, the offset the high
        watermark must reach before it is sent (None: an error, answered at once), and
        the leader epoch it was written at (the answer waits within that leadership).
        A transactional batch's transaction is verified with its coordinator first, once
        per transaction here (:meth:`_verification`)."""
        metrics = self._metrics
        nbytes = batch.nbytes
        limit = self._max_request_bytes
        epoch = replica.leader_epoch
        guard: VerificationGuard | None = None

        def write(log_: PartitionLog) -> AppendResult:
            nonlocal epoch
            epoch = replica.leader_epoch  # under the role lock: the epoch that writes it
            return log_.append(
                batch,
                producer_id=meta.producer_id,
                producer_epoch=meta.producer_epoch,
                base_sequence=meta.base_sequence,
                transactional=meta.transactional,
                transactional_id=txn_id,
                verification=guard,
            )

        started = time.perf_counter()  # the produce latency metric: the leader's append
        try:
            authorized(meta)  # a refusal is this batch's answer, and nothing is written
            if nbytes > limit:
                raise MessageTooLargeError(
                    f"produce to {topic}-{partition}: batch of {batch.num_rows} rows is "
                    f"{nbytes} bytes, over max.request.bytes={limit}"
                )
            # Outside the partition's lock: the check reads every buffer once.
            validate_rows(batch, f"produce to {topic}-{partition}")
            if meta.transactional:
                guard = self._verification(topic, partition, txn_id, meta)
            result = replica.append_as_leader(write, acks_all)
        except IdemlogError as exc:
            metrics.record_append(topic, partition, meta.producer_id, outcome_of(exc))
            metrics.record_request("produce", time.perf_counter() - started, False)
            return ProduceResponse.failure(meta.correlation_id, exc), None, epoch
        except Exception as exc:
            log.exception("produce to %s-%d failed unexpectedly", topic, partition)
            metrics.record_append(topic, partition, meta.producer_id, AppendOutcome.REJECTED)
            metrics.record_request("produce", time.perf_counter() - started, False)
            error = UnknownServerError(f"produce: {type(exc).__name__}: {exc}")
            return ProduceResponse.failure(meta.correlation_id, error), None, epoch
        outcome = AppendOutcome.DUPLICATE if result.duplicate else AppendOutcome.APPENDED
        metrics.record_append(topic, partition, meta.producer_id, outcome, batch.num_rows, nbytes)
        metrics.record_request("produce", time.perf_counter() - started, True)
        response = ProduceResponse(
            meta.correlation_id,
            0,
            result.base_offset,
            result.last_offset,
            result.log_append_time,
            result.duplicate,
        )
        return response, result.last_offset + 1, epoch

    def _verification(
        self, topic: str, partition: int, txn_id: str | None, meta: ProduceRequestMeta
    ) -> VerificationGuard | None:
        """The guard a transactional batch is appended under: None when its transaction
        here was verified already (the steady path: one look-up), else a new one the
        coordinator confirmed (KIP-890). Raises INVALID_REQUEST without a transactional
        id, and the verifier's error, nothing written: a refusal drops the guard, a
        retriable error keeps it for the retry (or a concurrent ask of the same producer)."""
        if txn_id is None:
            if self._hooks.append_unverified():
                return None  # the test hook: appended as before issue 36, unverified
            raise InvalidRequestError(
                f"produce to {topic}-{partition}: a transactional batch (producer id "
                f"{meta.producer_id}) on a stream whose descriptor names no transactional_id"
            )
        log_ = self._topics.leader_log(topic, partition)
        guard = log_.verification_needed(meta.producer_id, meta.producer_epoch, txn_id)
        if guard is None:
            return None
        try:
            self._verifier.verify(txn_id, meta.producer_id, meta.producer_epoch, topic, partition)
        except IdemlogError as exc:
            if not exc.retriable:
                log_.drop_verification(meta.producer_id, guard)
            raise
        return guard

    # -- fetch ---------------------------------------------------------------------------
    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        return self._guard("fetch", lambda: self._timed_fetch(context, ticket))

    def _timed_fetch(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        # The fetch latency metric: reading the batches, not sending them (the client's pace).
        started, ok = time.perf_counter(), False
        try:
            answer = self._fetch(context, ticket)
            ok = True
            return answer
        finally:
            self._metrics.record_request("fetch", time.perf_counter() - started, ok)

    def _fetch(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        doc = decode_json(ticket.ticket, "fetch ticket")
        request = FetchRequest.from_doc(doc)
        self._permit(context, FETCH, doc)
        topic, partition = request.topic, request.partition
        log_ = self._topics.leader_log(topic, partition, request.topic_id)
        replica = self._topics.partition(topic, partition)
        store = self._store()
        schema = (store.topic(topic).schema if store else None) or EMPTY_SCHEMA
        result = log_.read(
            request.offset,
            max_bytes=request.max_bytes,
            isolation=IsolationLevel(request.isolation),
            max_offset=request.max_offset,
        )
        trailer = FetchTrailer(
            result.next_offset,
            result.high_watermark,
            result.last_stable_offset,
            result.log_start_offset,
        )
        # The rows point into the log's memory map until sent: a truncation below the
        # high watermark (after an unclean election) waits for this stream first.
        replica.reader_started()

        def stream() -> Iterator[tuple[pa.RecordBatch, pa.Buffer]]:
            try:
                for b in result.batches:
                    meta = FetchBatchMeta(
                        b.base_offset,
                        b.producer_id,
                        b.producer_epoch,
                        b.base_sequence,
                        b.is_transactional,
                        b.timestamp,
                    )
                    records = b.records
                    if not records.schema.equals(schema):
                        records = pa.RecordBatch.from_arrays(records.columns, schema=schema)
                    yield records, pa.py_buffer(meta.encode())
                yield _empty_batch(schema), pa.py_buffer(trailer.encode())
            finally:
                replica.reader_done()

        return flight.GeneratorStream(schema, stream())

    # -- actions -------------------------------------------------------------------------
    def do_action(
        self, context: flight.ServerCallContext, action: flight.Action
    ) -> Iterator[bytes]:
        action_type = action.type
        result = self._guard(f"action {action_type}", lambda: self._action(context, action))
        return iter([result])

    def _action(self, context: flight.ServerCallContext, action: flight.Action) -> bytes:
        body_buf = action.body
        size = 0 if body_buf is None else body_buf.size
        limit = self._max_request_bytes
        if size > limit:
            raise MessageTooLargeError(
                f"action {action.type}: body of {size} bytes is over max.request.bytes={limit}"
            )
        data = b"{}" if body_buf is None or size == 0 else body_buf.to_pybytes()
        body = decode_json(data, f"action {action.type}")
        action_type = self._actions.known(action.type)
        permit = self._permit(context, action_type, body)
        answer = self._actions.handle(action_type, body, permit)
        if isinstance(answer, bytes):
            return answer
        return encode_json(permit.filter_answer(action_type, answer))

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return [(a.value, _ACTION_DOCS.get(a, "")) for a in Action]


def _caller(context: flight.ServerCallContext) -> Caller:
    """Who made the call: its authenticated principal and the peer's IP address."""
    return Caller(principal_of(context), host_of_peer(context.peer()))


def _empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)


_ACTION_DOCS: dict[Action, str] = {
    Action.CREATE_TOPIC: "create a topic: {name, partitions, schema?, config?}",
    Action.DELETE_TOPIC: "delete a topic: {name}",
    Action.DESCRIBE_TOPICS: "describe topics: {names?}",
    Action.LIST_OFFSETS: "offsets of a partition: {topic, partition}",
    Action.METADATA: "brokers, controller, partition leaders: {topics?}",
    Action.FIND_COORDINATOR: "the transaction coordinator's address",
    Action.INIT_PRODUCER_ID: "a producer id and epoch: {transactional_id?, timeout?}",
    Action.ADD_PARTITIONS_TO_TXN: "add partitions to the open transaction",
    Action.END_TXN: "commit or abort the open transaction",
    Action.WRITE_TXN_MARKERS: "broker to broker: markers for local partitions",
    Action.COMMIT_SINK_BATCH: "commit a sink's batch of transactions (idempotent)",
    Action.ABORT_SINK_BATCH: "abort a sink's batch of transactions",
    Action.DESCRIBE_PRODUCERS: "a partition's producers, at its leader: {topic, partition}",
    Action.ABORT_HANGING_TRANSACTION: "abort a hanging transaction on a partition (fencing)",
    Action.METRICS: "this broker's metrics document",
    Action.PING: "liveness: {broker_id, version}",
    Action.REPLICA_FETCH: "broker to broker: a follower's fetch (binary answer)",
    Action.OFFSETS_FOR_LEADER_EPOCH: "broker to broker: where an epoch ended (KIP-279)",
    Action.REPLICA_LOG_START: "broker to broker: a follower below the log start (binary)",
    Action.ELECT_LEADERS: "preferred-leader rebalance, on the controller: {topics?}",
}
