"""``BrokerClient``: the Python client of the broker service (the CLI and the tests use it).

It bootstraps from any broker (``"host:port[,host:port]"``), learns the live brokers, the
controller and every partition's leader from the METADATA action, and routes each request:
partition requests to the leader, transactional ones to the coordinator of their key
(a transactional or sink id) that FIND_COORDINATOR names (the leader of the key's
``__transaction_state`` partition; cached per partition, ``routes.CoordinatorCache``),
key-less ones (the transaction listing, a run's abort, a reader's cut) to the coordinator
of every state partition, admin ones to any broker. A request refused with a retriable
routing error (``NOT_LEADER_OR_FOLLOWER``, ``NOT_COORDINATOR``,
``COORDINATOR_NOT_AVAILABLE``, ``COORDINATOR_LOAD_IN_PROGRESS``) or a broken connection
is retried after a metadata refresh (and a new FIND_COORDINATOR for that partition only),
a few times with backoff; an any-broker request broken off by its connection is retried
on the next known broker in turn, the controller first (``_any_broker``).
Produce streams are raw: no retries (see ``broker_core.client.produce_stream``).
This module holds the connections, the routing and the produce and fetch calls; the topic
and operators' calls are ``client.admin_calls``, the coordinator's ``client.txn_calls``.

Errors come back as the typed ``IdemlogError`` the broker raised (``retriable`` intact);
a connection that fails is ``NetworkError`` (``NETWORK_EXCEPTION``, retriable).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from broker_core.client.admin_calls import AdminCalls
from broker_core.client.connections import FlightConnections
from broker_core.client.fetch_stream import FetchStream
from broker_core.client.produce_stream import ProduceStream
from broker_core.client.producer_tokens import ProducerTokenBook
from broker_core.client.routes import ClusterView, CoordinatorCache
from broker_core.client.txn_calls import TransactionCalls
from broker_core.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    IdemlogError,
    InvalidConfigError,
    InvalidRequestError,
    NetworkError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from broker_core.protocol.admin_requests import (
    BrokerAddress,
    FindCoordinatorRequest,
    MetadataRequest,
    MetadataResponse,
)
from broker_core.protocol.coordinator_keys import TXN_STATE_TOPIC, CoordinatorAddress
from broker_core.protocol.data_requests import FetchRequest
from broker_core.protocol.requests import ACKS_ALL, Request
from broker_core.protocol.wire import (
    DEFAULT_FETCH_MAX_BYTES,
    Action,
    FetchBatchMeta,
    FetchTrailer,
    encode_json,
)
from broker_core.retry import RetryPolicy
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.tls import PLAINTEXT_MATERIAL, TlsMaterial

T = TypeVar("T")
# A call's timeout inside a spent deadline: it fails at once, as a timeout, not as a
# call without any timeout (gRPC's reading of 0).
_MIN_CALL_S = 0.001

_ROUTING_ERRORS = (
    NotLeaderOrFollowerError,
    NotCoordinatorError,
    CoordinatorNotAvailableError,
    CoordinatorLoadInProgressError,
    NetworkError,
)


@dataclass(frozen=True)
class FetchResponse:
    """One fetch received whole (``fetch_once``); a ``FetchedBatches`` as a
    ``FetchStream`` is."""

    schema: pa.Schema
    batches: list[tuple[FetchBatchMeta, pa.RecordBatch]]
    trailer: FetchTrailer

    def close(self) -> None:
        """Nothing to release: the stream was read to its end."""

    @property
    def num_rows(self) -> int:
        return sum(b.num_rows for _m, b in self.batches)


def parse_bootstrap(bootstrap: str) -> list[str]:
    addresses = [a.strip() for a in bootstrap.split(",") if a.strip()]
    if not addresses:
        raise InvalidRequestError(f"bootstrap={bootstrap!r} names no host:port")
    for a in addresses:
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidRequestError(f"bootstrap address {a!r} is not host:port")
    return addresses


class NoBrokerReachableError(NetworkError):
    """No known or bootstrap broker answered a metadata request: ``addresses`` are those
    tried, ``cause`` the last one's failure (its message, without the wire code), so the
    CLI can say both once (docs/broker.md, "Failures and exit codes"). Retriable, as
    every ``NetworkError``; raised by the client, never sent on the wire (so it lives
    here, not in ``broker_core.errors``, whose classes each own a wire code)."""

    def __init__(self, addresses: tuple[str, ...], cause: str) -> None:
        super().__init__(f"no broker reachable among {', '.join(addresses)}: {cause}")
        self.addresses = addresses
        self.cause = cause

    def __reduce__(self) -> tuple[type[NoBrokerReachableError], tuple[tuple[str, ...], str]]:
        return type(self), (self.addresses, self.cause)  # its own arguments, not the message


class BrokerClient(AdminCalls, TransactionCalls):
    """A thread-safe client of an idemlog cluster (see the module docstring).

    ``timeout_s`` bounds each Flight call; a request refused by a routing error or a broken
    connection is tried ``retries`` more times, waiting ``retry_backoff_s`` doubled after
    each failure (with jitter). Raises ``InvalidRequestError`` for a bootstrap that names
    no ``host:port`` and ``InvalidConfigError`` for a negative ``retries`` or backoff;
    nothing connects before the first request. Use it as a context manager or call
    :meth:`close`. ``connections``: a connection cache shared with other clients (one per
    process in the Spark sink, so a reused Python worker keeps its channels from batch to
    batch); :meth:`close` then leaves it open, for its owner to close. ``tls`` and
    ``sasl``: the protocol and files, and the credentials of a SASL listener
    (docs/security.md), of a connection cache of its own (a shared one has its own); with
    ``sasl`` every connection authenticates first, and a refusal is
    ``SaslAuthenticationFailedError`` (not retried).
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        timeout_s: float = 30.0,
        retries: int = 5,
        retry_backoff_s: float = 0.05,
        connections: FlightConnections | None = None,
        tls: TlsMaterial = PLAINTEXT_MATERIAL,
        sasl: SaslCredentials | None = None,
    ) -> None:
        self._bootstrap = parse_bootstrap(bootstrap)
        if retries < 0 or retry_backoff_s < 0:
            raise InvalidConfigError(
                f"BrokerClient retries={retries} and retry_backoff_s={retry_backoff_s} "
                "must both be >= 0"
            )
        self.timeout_s = timeout_s
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        # retries + 1 attempts, the wait doubling from retry_backoff_s and never capped
        # below the last one (the limits of the loop this policy replaced).
        self._retry = RetryPolicy(
            max_attempts=retries + 1,
            backoff_s=retry_backoff_s,
            max_backoff_s=retry_backoff_s * 2 ** max(retries - 1, 0),
        )
        self._owns_connections = connections is None
        if connections is None:
            connections = FlightConnections(tls, sasl=sasl)
        elif sasl is not None and connections.sasl != sasl:
            raise InvalidConfigError(
                "BrokerClient: the shared connections authenticate with other credentials"
            )
        self._connections = connections
        self._view: ClusterView | None = None
        # The idempotent producers' tokens this client was issued (its streams send them).
        self.producer_tokens = ProducerTokenBook()
        self._deadlines = threading.local()  # .at: this thread's deadline (monotonic s)
        # Addresses whose last METADATA failed, oldest failure first: asked last.
        self._metadata_failed: dict[str, None] = {}
        # FIND_COORDINATOR's answers: on shared connections, shared with their other
        # clients of the same bootstrap (a Spark task's producer, heartbeat and the
        # driver's commit do not each ask again).
        self.coordinators = (
            CoordinatorCache()
            if self._owns_connections
            else connections.coordinators(self._bootstrap)
        )

    # -- connections ---------------------------------------------------------------------
    def _connection(self, address: str) -> flight.FlightClient:
        return self._connections.get(address)

    def reset_connection(self, address: str) -> None:
        """Forget the connection to ``address`` (it broke): the next request opens a new
        one instead of waiting out the old channel's reconnect backoff. Never raises."""
        self._connections.reset(address)

    def close(self) -> None:
        """Close every connection this client opened (none of a shared cache). Never
        raises; the client stays usable (a later request opens new connections)."""
        if self._owns_connections:
            self._connections.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def deadline(self, seconds: float) -> Iterator[None]:
        """Every call this thread makes through this client inside the block ends within
        ``seconds`` from now: each Flight call's timeout is cut to what is left, and the
        routing retries stop there (the last error raised as it is). An inner block never
        extends an outer one. A caller's own bound (a producer's ``max.block.ms``) needs
        it: without it one call may take ``timeout_s`` for each of its retries."""
        previous: float | None = getattr(self._deadlines, "at", None)
        at = time.monotonic() + max(seconds, 0.0)
        self._deadlines.at = at if previous is None else min(previous, at)
        try:
            yield
        finally:
            self._deadlines.at = previous

    def _time_left(self) -> float | None:
        """Seconds to this thread's :meth:`deadline` (>= 0), or None outside one."""
        at: float | None = getattr(self._deadlines, "at", None)
        return None if at is None else max(at - time.monotonic(), 0.0)

    def _options(self) -> flight.FlightCallOptions:
        left = self._time_left()
        if left is None:
            return flight.FlightCallOptions(timeout=self.timeout_s)
        return flight.FlightCallOptions(timeout=max(min(self.timeout_s, left), _MIN_CALL_S))

    # -- raw actions ---------------------------------------------------------------------
    def action_raw(self, address: str, action_type: str, body: bytes) -> bytes:
        """One DoAction on one broker, errors typed; for tools and malformed-input tests."""
        try:
            results = self._connections.call_action(
                address, flight.Action(action_type, body), self._options()
            )
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            raise self._connections.failure(address, exc, f"action {action_type}") from exc
        if len(results) != 1:
            raise UnknownServerError(
                f"action {action_type} at {address} returned {len(results)} results, not 1"
            )
        return bytes(results[0].body.to_pybytes())

    def action(self, address: str, action: Action, body: dict[str, Any]) -> dict[str, Any]:
        """One DoAction on one broker, no retry: its JSON answer. Raises the broker's typed
        error, ``NetworkError`` if it cannot be reached, ``UnknownServerError`` for an
        answer that is not one JSON object."""
        data = self.action_raw(address, action.value, encode_json(body))
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise UnknownServerError(f"action {action.value} at {address} answered {doc!r}")
        return doc

    # -- metadata and routing ------------------------------------------------------------
    def _known_addresses(self) -> list[str]:
        view = self._view
        known = [b.address for b in view.brokers.values()] if view else []
        return list(dict.fromkeys(known + self._bootstrap))

    def _metadata_order(self) -> list[str]:
        """Where a metadata refresh asks, in turn: :meth:`_known_addresses`, those whose
        last refresh call failed last. A broker that accepts and never answers (paused, a
        cut link) costs one call timeout, not one per refresh; it is asked again when the
        others fail. Bound: the addresses known now."""
        known = self._known_addresses()
        failed = [a for a in list(self._metadata_failed) if a in known]
        self._metadata_failed = dict.fromkeys(failed)
        return [a for a in known if a not in self._metadata_failed] + failed

    def refresh_metadata(self) -> ClusterView:
        """The cluster as the first broker of :meth:`_metadata_order` that answers sees
        it now (cached for routing). Raises ``NoBrokerReachableError`` (a ``NetworkError``)
        naming the addresses tried and the last failure if none answers."""
        last: IdemlogError | None = None
        for address in self._metadata_order():
            try:
                doc = self._send(address, MetadataRequest())
            except NetworkError as exc:
                last = exc
                self._metadata_failed.pop(address, None)
                self._metadata_failed[address] = None
                continue
            self._metadata_failed.pop(address, None)
            answer = MetadataResponse.from_doc(doc)
            view = ClusterView(
                {b.broker_id: b for b in answer.brokers},
                answer.controller,
                {name: list(leaders) for name, leaders in answer.topics.items()},
                answer.topic_ids,
            )
            self._view = view
            return view
        raise NoBrokerReachableError(
            tuple(self._known_addresses()), last.message if last else "no address to try"
        )

    def metadata(self, refresh: bool = False) -> ClusterView:
        """The cached cluster view (fetched first if there is none, or ``refresh``);
        raises as :meth:`refresh_metadata`."""
        view = self._view
        return self.refresh_metadata() if refresh or view is None else view

    def topic_id(self, topic: str, refresh: bool = False) -> str:
        """The id of ``topic`` as the metadata names it (refreshed once if the topic, or
        its id, is not known; or first, with ``refresh``): what a reader or producer pins
        when it first learns the topic, and sends with its requests so that a topic
        recreated under the name refuses them (``UnknownTopicIdError``). Raises
        ``UnknownTopicOrPartitionError`` if the topic does not exist or has no id yet
        (stored before ids, not yet upgraded: ask again), ``NetworkError`` as
        :meth:`refresh_metadata`."""
        view = self.metadata(refresh)
        topic_id = view.topic_ids.get(topic)
        if topic_id is None and not refresh:
            return self.topic_id(topic, refresh=True)
        if topic_id is None:
            if topic in view.topics:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} has no id yet (stored before topic ids; its store "
                    "writes one at the next controller start): ask again"
                )
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        return topic_id

    def leader(self, topic: str, partition: int, refresh: bool = False) -> BrokerAddress:
        """The broker leading the partition (metadata refreshed once if the topic is not
        known). For an unknown topic or partition it names any live broker, so that the
        request itself gets the broker's precise error. Raises ``NetworkError`` if the
        leader is not alive or no broker is."""
        view = self.metadata(refresh)
        leaders = view.topics.get(topic)
        if leaders is None and not refresh:
            return self.leader(topic, partition, refresh=True)
        if leaders is None or not 0 <= partition < len(leaders):
            # Let a broker phrase the error (unknown topic vs partition out of range).
            if not view.brokers:
                raise NetworkError("the cluster reports no live broker")
            return next(iter(view.brokers.values()))
        broker = view.brokers.get(leaders[partition])
        if broker is None:
            raise NetworkError(f"leader {leaders[partition]} of {topic}-{partition} is not alive")
        return broker

    def _find_coordinator(self, request: FindCoordinatorRequest) -> str:
        """Ask any broker for a coordinator (of a key, or of a state partition) and cache
        the answer in its partition's entry; the address."""
        answer = CoordinatorAddress.from_doc(self._any_broker(request))
        self.coordinators.learn(answer)
        return answer.address

    def _key_coordinator(self, key: str, refresh: bool) -> str:
        """The coordinator of ``key``'s state partition, from the cache unless ``refresh``
        (an earlier attempt failed, e.g. NOT_COORDINATOR after that partition's leadership
        moved: only that partition's entry is asked again)."""
        partition = self.coordinators.partition_of(key)
        cached = None if partition is None else self.coordinators.address(partition)
        if cached is not None and not refresh:
            return cached
        return self._find_coordinator(FindCoordinatorRequest(key))

    def _partition_coordinator(self, state_partition: int, refresh: bool) -> str:
        """The coordinator of ``state_partition``, from the cache unless ``refresh``."""
        cached = self.coordinators.address(state_partition)
        if cached is not None and not refresh:
            return cached
        return self._find_coordinator(FindCoordinatorRequest(state_partition=state_partition))

    def state_partition_count(self) -> int:
        """``__transaction_state``'s partition count (asked once, then cached; 1 for an
        embedded broker or a broker older than several state partitions)."""
        count = self.coordinators.partition_count
        if count is None:
            self._find_coordinator(FindCoordinatorRequest())
            count = self.coordinators.partition_count
            assert count is not None
        return count

    def _routed(
        self,
        pick: Callable[[bool], str],
        call: Callable[[str], T],
        partition: tuple[str, int] | None = None,
    ) -> T:
        """``call`` on the broker ``pick`` names; routing errors refresh and retry.

        ``pick(retry)`` is told whether an earlier attempt failed (the metadata was
        refreshed since). With ``partition``, an unknown-topic answer is retried too
        while the cluster metadata says the partition exists: the broker asked has not
        seen it yet. Other errors, retriable or not, are the caller's: the client only
        retries what another route can fix.
        """
        retried = False

        def attempt() -> T:
            return call(pick(retried))

        def retriable(error: BaseException) -> bool:
            if isinstance(error, _ROUTING_ERRORS):
                return True
            if partition is None or not isinstance(error, UnknownTopicOrPartitionError):
                return False
            # Decided on fresh metadata, before any wait: a topic that really does not
            # exist fails at once.
            leaders = self.refresh_metadata().topics.get(partition[0], [])
            return 0 <= partition[1] < len(leaders)

        def before_retry(error: BaseException, _attempts: int) -> None:
            nonlocal retried
            retried = True
            if isinstance(error, UnknownTopicOrPartitionError):
                return  # ``retriable`` has just refreshed the metadata
            with contextlib.suppress(NetworkError):
                # No broker answers right now: the next attempt fails (and retries) on
                # the old view's addresses.
                self.refresh_metadata()

        left = self._time_left()
        policy = self._retry if left is None else dataclasses.replace(self._retry, deadline_s=left)
        return policy.call(attempt, retriable=retriable, before_retry=before_retry)

    def _any_broker(self, request: Request) -> dict[str, Any]:
        """``request`` to any broker (an admin call, FIND_COORDINATOR, a producer id
        without a transactional id), retried as :meth:`_routed` does.

        The first attempt goes to the first known broker. A retry after a broken
        connection goes to the address after the one that failed in
        :meth:`_any_broker_order`, a retry after any other routing error to the first of
        that order (the controller). A SIGKILLed broker stays in the metadata, as the
        controller too if it was one, until its ZooKeeper session expires: a retry that
        went back to it would spend every attempt there. Going round the order, rather
        than leaving out for the rest of the call every address that failed once, comes
        back to a broker whose failure was brief (a restart, a cut link).
        """
        failed: str | None = None  # the last attempt's address, if its connection failed

        def pick(retry: bool) -> str:
            if not retry:
                return self._known_addresses()[0]
            order = self._any_broker_order()
            if failed is None or failed not in order:
                return order[0]
            return order[(order.index(failed) + 1) % len(order)]

        def call(address: str) -> dict[str, Any]:
            nonlocal failed
            failed = None
            try:
                return self._send(address, request)
            except NetworkError:
                failed = address
                raise

        return self._routed(pick, call)

    def _any_broker_order(self) -> list[str]:
        """Where an any-broker request is retried, in turn: the controller first (it
        elects the leaders, so its view is the newest), then the other live brokers and
        the bootstrap addresses (:meth:`_known_addresses`); never empty."""
        view = self.metadata()
        known = self._known_addresses()
        controller = None if view.controller is None else view.brokers.get(view.controller)
        if controller is None:
            return known
        return [controller.address] + [a for a in known if a != controller.address]

    def _send(self, address: str, request: Request) -> dict[str, Any]:
        return self.action(address, request.ACTION, request.to_doc())

    def _leader_action(self, topic: str, partition: int, request: Request) -> dict[str, Any]:
        return self._routed(
            lambda _retry: self.leader(topic, partition).address,
            lambda address: self._send(address, request),
            (topic, partition),
        )

    def _controller_action(self, request: Request) -> dict[str, Any]:
        """``request`` to the controller (from the metadata), retried on routing errors."""
        return self._routed(
            lambda retry: self._controller_address(retry),
            lambda address: self._send(address, request),
        )

    def _controller_address(self, refresh: bool) -> str:
        view = self.metadata(refresh)
        if view.controller is None or view.controller not in view.brokers:
            raise CoordinatorNotAvailableError("the cluster has no controller right now")
        return view.brokers[view.controller].address

    def _coordinator_action(self, request: Request, key: str) -> dict[str, Any]:
        """``request`` to the coordinator of ``key`` (a transactional or sink id)."""
        return self._routed(
            lambda retry: self._key_coordinator(key, retry),
            lambda address: self._send(address, request),
        )

    def _state_partition_action(self, state_partition: int, request: Request) -> dict[str, Any]:
        """``request`` to the coordinator of ``state_partition``."""
        return self._routed(
            lambda retry: self._partition_coordinator(state_partition, retry),
            lambda address: self._send(address, request),
        )

    def _fan_out(self, request_of: Callable[[int], Request]) -> dict[int, dict[str, Any]]:
        """A key-less call: ``request_of(p)`` to the coordinator of every state partition
        ``p``, each retried on its own; every answer, by partition. A partition whose
        coordinator stays unavailable fails the whole call, retriably and naming the
        partition (an answer from a subset of coordinators, e.g. a reader's cut, would be
        wrong); a non-retriable error is raised as it is."""
        answers: dict[int, dict[str, Any]] = {}
        for partition in range(self.state_partition_count()):
            try:
                answers[partition] = self._state_partition_action(partition, request_of(partition))
            except IdemlogError as exc:
                if not exc.retriable:
                    raise
                raise CoordinatorNotAvailableError(
                    f"the coordinator of {TXN_STATE_TOPIC}-{partition} did not answer: "
                    f"{exc.message}"
                ) from exc
        return answers

    # -- produce and fetch ---------------------------------------------------------------
    def produce_stream(
        self,
        topic: str,
        partition: int,
        schema: pa.Schema | None = None,
        *,
        acks: int = ACKS_ALL,
        topic_id: str | None = None,
        transactional_id: str | None = None,
    ) -> ProduceStream:
        """A raw pipelined stream to the partition's leader (opened at the first send if
        no schema is given), its batches answered as ``acks`` says (-1: once every in-sync
        replica has them, the default; 1: once the leader has; anything else fails the
        stream with ``InvalidRequiredAcksError``). No retries: a failed send fails its
        batch with the broker's typed error, and the caller decides
        (``broker_core.producer`` does). ``topic_id``: the id the caller knows the topic
        by (:meth:`topic_id`); a topic recreated since fails the stream with
        ``UnknownTopicIdError``. ``transactional_id``: the transactional producer's, which
        its transactional batches need (docs/protocol.md). Raises ``NetworkError`` as
        :meth:`leader`."""
        broker = self.leader(topic, partition)
        return ProduceStream(
            self._connection(broker.address),
            topic,
            partition,
            schema,
            address=broker.address,
            acks=acks,
            topic_id=topic_id,
            transactional_id=transactional_id,
            tokens=self.producer_tokens,
        )

    def fetch_once(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        isolation: str = "read_committed",
        max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
        max_offset: int | None = None,
        topic_id: str | None = None,
    ) -> FetchResponse:
        """One fetch from the partition's leader: batches from ``offset`` (at most about
        ``max_bytes``, at least one batch if any), then the trailer with the next offset
        and the partition's watermarks, received whole. Routing errors are retried (the
        whole fetch again). Raises ``OffsetOutOfRangeError``,
        ``UnknownTopicOrPartitionError``, ``UnknownTopicIdError`` when ``topic_id`` is
        not the topic's (recreated), or ``InvalidRequestError`` for a bad
        ``isolation``/``max_bytes``."""
        request = FetchRequest(topic, partition, offset, max_bytes, isolation, max_offset, topic_id)

        def collect(address: str) -> FetchResponse:
            stream = self._open_fetch(address, request)
            batches = list(stream.batches)
            return FetchResponse(stream.schema, batches, stream.trailer)

        return self._routed(
            lambda _retry: self.leader(topic, partition).address, collect, (topic, partition)
        )

    def fetch_stream(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        isolation: str = "read_committed",
        max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
        max_offset: int | None = None,
        topic_id: str | None = None,
    ) -> FetchStream:
        """:meth:`fetch_once`'s fetch, its batches handed out as they are received
        (``FetchStream``: the batches, then the trailer; close it if not read to the
        end). Opening it (the request and the broker's first answer) is routed and retried
        as :meth:`fetch_once`; a failure after that is raised from the iteration, typed,
        not retried: the caller knows which batches it has used and fetches again from
        the next. Raises as :meth:`fetch_once`."""
        request = FetchRequest(topic, partition, offset, max_bytes, isolation, max_offset, topic_id)
        return self._routed(
            lambda _retry: self.leader(topic, partition).address,
            lambda address: self._open_fetch(address, request),
            (topic, partition),
        )

    def _open_fetch(self, address: str, request: FetchRequest) -> FetchStream:
        what = f"fetch {request.topic}-{request.partition} at {address}"

        def failure(exc: BaseException) -> IdemlogError:
            return self._connections.failure(address, exc, what)

        try:
            reader = self._connection(address).do_get(
                flight.Ticket(encode_json(request.to_doc())), self._options()
            )
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            raise failure(exc) from exc
        return FetchStream.open(reader, what, failure)

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int | None = None,
        *,
        isolation: str = "read_committed",
        max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
        topic_id: str | None = None,
    ) -> Iterator[tuple[FetchBatchMeta, pa.RecordBatch]]:
        """Every readable batch from ``offset`` (default: the log start) to the end as of
        now: the last stable offset for read_committed, the log end otherwise."""
        if offset is None:
            offset = self.list_offsets(topic, partition, topic_id=topic_id)["log_start_offset"]
        while True:
            response = self.fetch_once(
                topic,
                partition,
                offset,
                isolation=isolation,
                max_bytes=max_bytes,
                topic_id=topic_id,
            )
            yield from response.batches
            if response.trailer.next_offset <= offset:
                return
            offset = response.trailer.next_offset

    def read_table(
        self,
        topic: str,
        partition: int,
        *,
        isolation: str = "read_committed",
        topic_id: str | None = None,
    ) -> pa.Table | None:
        """The partition's readable rows as one table (None if there are none); raises as
        :meth:`fetch_once`."""
        fetched = self.fetch(topic, partition, isolation=isolation, topic_id=topic_id)
        batches = [b for _m, b in fetched]
        return pa.Table.from_batches(batches) if batches else None
