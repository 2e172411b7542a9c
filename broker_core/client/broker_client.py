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
    """One fetch received whole (``fetch_once``), shaped as a ``FetchStream`` is.

    Attributes:
        schema: The topic's Arrow schema.
        batches: Each fetched batch with its metadata (offsets, producer), in log order.
        trailer: The next offset to fetch and the partition's watermarks.
    """

    schema: pa.Schema
    batches: list[tuple[FetchBatchMeta, pa.RecordBatch]]
    trailer: FetchTrailer

    def close(self) -> None:
        """Nothing to release: the stream was read to its end."""

    @property
    def num_rows(self) -> int:
        """The rows of every batch of the fetch."""
        return sum(b.num_rows for _m, b in self.batches)


def parse_bootstrap(bootstrap: str) -> list[str]:
    """The addresses of a bootstrap list, checked.

    Args:
        bootstrap: ``"host:port[,host:port]"``; blanks around each address are dropped.

    Returns:
        Each ``host:port``, in the order given.

    Raises:
        InvalidRequestError: The list names no address, or an address is not
            ``host:port`` with a port in 1..65535.
    """
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
    """A thread-safe client of an idemlog cluster that routes each call to the broker
    that can answer it (see the module docstring).

    Nothing connects before the first request. Use it as a context manager or call
    :meth:`close`.

    Routed calls retry the routing errors, all retriable: ``NotLeaderOrFollowerError``,
    ``NotCoordinatorError``, ``CoordinatorNotAvailableError``,
    ``CoordinatorLoadInProgressError`` and ``NetworkError`` (a broken connection, a call
    past ``timeout_s``, no broker reachable), each after a metadata refresh, ``retries``
    more times or until the thread's :meth:`deadline`; the last one is then raised as it
    is. Every other error is raised at once, retriable or not: the client only retries
    what another route can fix. So any call can also raise, not retried:
    ``RequestTimedOutError`` (retriable: a broker still starting, or ZooKeeper away),
    ``SaslAuthenticationFailedError`` or ``SslHandshakeError`` (the connection's
    credentials or TLS files refused), the ACLs' ``TopicAuthorizationFailedError``,
    ``ClusterAuthorizationFailedError`` and ``TransactionalIdAuthorizationFailedError``
    (``broker_core.errors.AUTHORIZATION_ERRORS``), ``UnknownServerError`` for a JSON
    answer that is not an object; a malformed answer (a broker of another protocol
    version) raises what its typed response's ``from_doc`` does, mostly
    ``InvalidRequestError`` naming the field.

    Args:
        bootstrap: ``"host:port[,host:port]"``: where the first metadata is asked.
        timeout_s: The bound of each Flight call, in seconds (each retry gets its own).
        retries: How many more times a call refused by a routing error is tried.
        retry_backoff_s: The wait before the first retry, in seconds, doubled after each
            failure (with jitter).
        connections: A connection cache shared with other clients (one per process in the
            Spark sink, so a reused Python worker keeps its channels from batch to batch),
            with the coordinators they learned; :meth:`close` then leaves it open, for its
            owner to close. None: a cache of this client's own.
        tls: The protocol and files of this client's own connection cache (a shared one
            has its own; docs/security.md). Plaintext by default.
        sasl: The credentials of a SASL listener (docs/security.md): every connection
            authenticates first. With ``connections``, they must be the cache's.

    Attributes:
        timeout_s: As given.
        retries: As given.
        retry_backoff_s: As given.
        producer_tokens: The tokens of the idempotent producer ids this client was issued
            (:meth:`init_producer_id`), which its produce streams send with their batches.
        coordinators: FIND_COORDINATOR's answers, one address per ``__transaction_state``
            partition (shared with the other clients of a shared connection cache and the
            same bootstrap).

    Raises:
        InvalidRequestError: ``bootstrap`` names no ``host:port``.
        InvalidConfigError: ``retries`` or ``retry_backoff_s`` is negative, or ``sasl``
            differs from the credentials of the shared ``connections``.
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
        """Forget the connection to ``address``: the next request opens a new one.

        For a connection that broke: the new one does not wait out the old channel's
        reconnect backoff. On a shared connection cache it is forgotten for every client
        of the cache. Never raises.

        Args:
            address: The broker's ``host:port``.
        """
        self._connections.reset(address)

    def close(self) -> None:
        """Close every connection this client opened (none of a shared cache).

        The client stays usable: a later request opens new connections. Never raises.
        """
        if self._owns_connections:
            self._connections.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def deadline(self, seconds: float) -> Iterator[None]:
        """Every call this thread makes through this client inside the block ends within
        ``seconds`` from now.

        Each Flight call's timeout is cut to what is left, and the routing retries stop
        there (the last error raised as it is). An inner block never extends an outer
        one. A caller's own bound (a producer's ``max.block.ms``) needs it: without it one
        call may take ``timeout_s`` for each of its retries. Other threads' calls are not
        bounded by it, nor are a produce stream's sends (they have no timeout).

        Args:
            seconds: The bound from now, in seconds (a negative one counts as 0: every
                Flight call fails at once, as a timeout).

        Yields:
            None, for the ``with`` block.
        """
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
        """One DoAction on one broker, no retry: its one result's raw bytes.

        For tools and malformed-input tests; :meth:`action` is the typed call.

        Args:
            address: The broker's ``host:port``.
            action_type: The action's name (``protocol.wire.Action`` values), sent as it is.
            body: The request body, sent as it is.

        Returns:
            The body of the action's single result.

        Raises:
            IdemlogError: The broker's typed error (an unknown action or a malformed body
                is ``InvalidRequestError``).
            NetworkError: (retriable) The broker cannot be reached, or the call ran past
                ``timeout_s`` or the :meth:`deadline`; the connection is reset.
            SslHandshakeError: TLS refused the link.
            SaslAuthenticationFailedError: The broker refused this client's credentials.
            UnknownServerError: The broker answered other than one result.
        """
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
        """One DoAction on one broker, no retry: its JSON answer.

        Args:
            address: The broker's ``host:port``.
            action: The action.
            body: The request body, sent as JSON.

        Returns:
            The answer's JSON object.

        Raises:
            IdemlogError: As :meth:`action_raw`: the broker's typed error, ``NetworkError``
                (retriable) if the broker cannot be reached.
            UnknownServerError: The answer is JSON but not an object.
            json.JSONDecodeError: The answer is not JSON at all (a ``ValueError``, not an
                ``IdemlogError``).
        """
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
        """The cluster as the first broker that answers sees it now, cached for routing.

        The known brokers and the bootstrap addresses are asked in turn, those whose last
        metadata call failed last (:meth:`_metadata_order`); no retry beyond that round.

        Returns:
            The live brokers, the controller, each topic's leader per partition and each
            topic's id.

        Raises:
            NoBrokerReachableError: (a ``NetworkError``, retriable) No address answered;
                it names the addresses tried and the last failure.
            IdemlogError: A broker's typed answer other than a connection failure (e.g.
                ``RequestTimedOutError`` from a broker still starting), raised at once.
        """
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
        """The cluster view routing uses: the cached one, fetched first if there is none.

        Args:
            refresh: Fetch it anew even if one is cached.

        Returns:
            The cluster view (:meth:`refresh_metadata`).

        Raises:
            NoBrokerReachableError: As :meth:`refresh_metadata`, when it fetches.
        """
        view = self._view
        return self.refresh_metadata() if refresh or view is None else view

    def topic_id(self, topic: str, refresh: bool = False) -> str:
        """The id of ``topic`` as the metadata names it.

        What a reader or producer pins when it first learns the topic, and sends with its
        requests so that a topic recreated under the name refuses them
        (``UnknownTopicIdError``).

        Args:
            topic: The topic's name.
            refresh: Refresh the metadata first. Without it, it is refreshed once if the
                topic, or its id, is not in the cached view.

        Returns:
            The topic's id (chosen at its creation; a recreated topic has another).

        Raises:
            UnknownTopicOrPartitionError: (retriable, not retried) The topic does not
                exist, or has no id yet (stored before ids, not yet upgraded: ask again).
            NoBrokerReachableError: As :meth:`refresh_metadata`.
        """
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
        """The broker leading the partition, as the metadata says; no request to it.

        For an unknown topic or partition it names any live broker, so that the request
        itself gets the broker's precise error.

        Args:
            topic: The topic's name.
            partition: The partition's number.
            refresh: Refresh the metadata first. Without it, it is refreshed once if the
                topic is not in the cached view.

        Returns:
            The leader's broker id, host and port.

        Raises:
            NetworkError: (retriable, not retried here) The leader is not alive, or the
                cluster reports no live broker.
            NoBrokerReachableError: As :meth:`refresh_metadata`.
        """
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
        """``__transaction_state``'s partition count: asked once, then cached.

        Returns:
            The count (1 for an embedded broker or a broker older than several state
            partitions). A FIND_COORDINATOR answer with another count (the topic
            re-created) replaces it.

        Raises:
            NetworkError, NotLeaderOrFollowerError, CoordinatorNotAvailableError: (retriable)
                The routing error left after the retries of FIND_COORDINATOR (the state
                topic has no live leader, no broker answers).
        """
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
        """A raw pipelined produce stream to the partition's leader, no retries.

        A failed send fails its batch with the broker's typed error, and the caller
        decides (``broker_core.producer`` does). The leader is the one the cached
        metadata names (:meth:`leader`): a stale one refuses the stream with
        ``NotLeaderOrFollowerError``, for the caller to refresh and open another.

        Args:
            topic: The topic's name.
            partition: The partition's number.
            schema: The batches' schema: the stream opens now. None: it opens at the first
                send, with that batch's schema.
            acks: When each batch is answered: -1 (``ACKS_ALL``, the default) once every
                in-sync replica has it; 1 once the leader has. Anything else fails the
                stream with ``InvalidRequiredAcksError``.
            topic_id: The id the caller knows the topic by (:meth:`topic_id`); a topic
                recreated since fails the stream with ``UnknownTopicIdError``. None: not
                checked.
            transactional_id: The transactional producer's id, which its transactional
                batches need (docs/protocol.md); None for an idempotent producer.

        Returns:
            The stream; each ``send`` returns a handle at once, answered later.

        Raises:
            NetworkError: (retriable, not retried) As :meth:`leader`, or the stream could
                not be opened.
            NoBrokerReachableError: As :meth:`refresh_metadata`, if no view is cached.
            IdemlogError: With ``schema``, the broker's typed refusal of the stream, if it
                comes before the first send.
        """
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
        """One fetch from the partition's leader, received whole.

        Routing errors are retried (the whole fetch again), and so is
        ``UnknownTopicOrPartitionError`` while fresh metadata says the partition exists
        (the leader has not seen it yet).

        Args:
            topic: The topic's name.
            partition: The partition's number.
            offset: The first offset wanted.
            isolation: ``"read_committed"`` (the default: up to the last stable offset,
                aborted batches left out) or ``"read_uncommitted"`` (up to the high
                watermark).
            max_bytes: About how many bytes of batches at most; at least one batch is
                sent if there is any.
            max_offset: Stop below this offset. None: no bound but the isolation's.
            topic_id: The id the caller knows the topic by (:meth:`topic_id`). None: not
                checked.

        Returns:
            The schema, the batches from ``offset``, and the trailer with the next offset
            and the partition's watermarks.

        Raises:
            OffsetOutOfRangeError: ``offset`` is outside what the log holds.
            UnknownTopicOrPartitionError: (retriable) The partition does not exist.
            UnknownTopicIdError: ``topic_id`` is not the topic's (it was deleted or
                recreated).
            InvalidRequestError: A bad ``isolation`` or ``max_bytes``.
            NotLeaderOrFollowerError, NetworkError: (retriable) The routing error left after
                the retries.
        """
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
        """:meth:`fetch_once`'s fetch, its batches handed out as they are received.

        Opening it (the request and the broker's first answer) is routed and retried as
        :meth:`fetch_once`; a failure after that is raised from the iteration, typed, not
        retried: the caller knows which batches it has used and fetches again from the
        next.

        Args:
            topic: As :meth:`fetch_once`.
            partition: As :meth:`fetch_once`.
            offset: As :meth:`fetch_once`.
            isolation: As :meth:`fetch_once`.
            max_bytes: As :meth:`fetch_once`.
            max_offset: As :meth:`fetch_once`.
            topic_id: As :meth:`fetch_once`.

        Returns:
            The open stream: its batches, then its trailer; close it if it is not read to
            the end.

        Raises:
            IdemlogError: On opening, as :meth:`fetch_once`; during the iteration, the
                failure typed (``NetworkError`` for a broken stream).
        """
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
        """Every readable batch from ``offset`` to the end as of now, fetch after fetch.

        The end is the last stable offset for read_committed, the high watermark
        otherwise; each fetch is a :meth:`fetch_once`, retried as it is.

        Args:
            topic: The topic's name.
            partition: The partition's number.
            offset: The first offset wanted. None: the log start (:meth:`list_offsets`).
            isolation: As :meth:`fetch_once`.
            max_bytes: Each fetch's bound, as :meth:`fetch_once`.
            topic_id: As :meth:`fetch_once`.

        Yields:
            Each batch with its metadata, in log order.

        Raises:
            IdemlogError: As :meth:`fetch_once` and :meth:`list_offsets`, from the
                iteration.
        """
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
        """The partition's readable rows from its log start, as one table.

        Args:
            topic: The topic's name.
            partition: The partition's number.
            isolation: As :meth:`fetch_once`.
            topic_id: As :meth:`fetch_once`.

        Returns:
            Every batch of :meth:`fetch` in one table; None if there are none.

        Raises:
            IdemlogError: As :meth:`fetch`.
        """
        fetched = self.fetch(topic, partition, isolation=isolation, topic_id=topic_id)
        batches = [b for _m, b in fetched]
        return pa.Table.from_batches(batches) if batches else None
