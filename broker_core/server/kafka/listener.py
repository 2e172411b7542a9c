"""The Kafka listener: a TCP server on ``kafka.listener``, a thread per connection.

The broker's other servers (Flight, the metrics endpoint) run on threads, and so does
this one: each connection's thread reads a request, answers it and only then reads the
next, which gives Kafka's rule (responses in the order of the requests on a connection)
without a queue. A client pipelining requests waits for each answer in turn, which is
what Kafka's own broker does per connection too (it mutes a connection while one
request is in flight).

A connection is closed, as Kafka closes it, on a request that does not decode, one for
an API or version not served (but ApiVersions, answered so the client can pick), one
larger than ``max.request.bytes``, and when the broker's gate refuses a request (a start
not finished within its wait, or the broker stopping): the client connects again, here
or to another broker.

Bound: at most ``kafka.max.connections`` connections (and so threads) at once; one past
it is closed as soon as it is accepted.

Security (docs/security.md, "The Kafka listener"): under SSL and SASL_SSL a connection's
thread first runs the TLS handshake (``ssl_context``: the broker's ``ssl.*`` files); with
client certificates required, the verified certificate's subject mapped by
``ssl.principal.mapping.rules`` is the connection's principal. Under SASL_PLAINTEXT and
SASL_SSL a connection is answered ApiVersions, SaslHandshake and SaslAuthenticate only
until it authenticated (``connection.py``, ``sasl.py``); any other request closes it, as
Kafka closes it, and so does a failed authentication, once its answer is sent. A user
whose credential changes or goes has its connections closed (:meth:`KafkaListener.end_sessions_of`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from broker_core.errors import IdemlogError, InvalidConfigError
from broker_core.security.cert_auth import certificate_principal
from broker_core.security.principal import ANONYMOUS, Principal
from broker_core.security.principal_mapping import PrincipalMapper
from broker_core.security.tls import SecurityProtocol, is_loopback
from broker_core.server.config.kafka import (
    KAFKA_LISTENER,
    KAFKA_MAX_CONNECTIONS,
    KafkaListenerConfig,
)
from broker_core.server.kafka.apis import API_VERSIONS, KafkaApis
from broker_core.server.kafka.connection import KafkaConnection
from broker_core.server.kafka.framing import (
    UnsupportedVersion,
    encode_response,
    parse_request,
    read_frame,
)
from broker_core.server.observability.metrics import Metrics

log = logging.getLogger("idemlog.kafka")

REFUSAL_LOG_INTERVAL_S = 10.0
TLS_HANDSHAKE_TIMEOUT_S = 10.0  # a client that connects and says nothing holds no thread
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36  # sasl.py's: Kafka's keys, fixed by Kafka
# What a SASL listener answers before the connection authenticated (Kafka's rule).
BEFORE_AUTHENTICATION = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    block_on_close = False


class KafkaListener:
    """Serves ``apis`` on ``config``'s address. Every request first passes ``gate()``
    (the broker's: waits for the start, refuses while stopping); each one answered or
    refused is counted and timed in ``metrics`` by its API. :meth:`start` binds or
    raises; :meth:`stop` is idempotent and closes the open connections.
    ``ssl_context``: the TLS of an SSL or SASL_SSL listener (required then);
    ``principal_mapper``: with client certificates required, their subjects' mapping."""

    def __init__(
        self,
        config: KafkaListenerConfig,
        apis: KafkaApis,
        *,
        gate: Callable[[], None],
        max_request_bytes: int,
        metrics: Metrics,
        ssl_context: ssl.SSLContext | None = None,
        principal_mapper: PrincipalMapper | None = None,
    ) -> None:
        if config.encrypted != (ssl_context is not None):
            raise ValueError(f"{KAFKA_LISTENER}={config.protocol.value}: ssl_context mismatch")
        self._config = config
        self._metrics = metrics
        self._apis = apis
        self._gate = gate
        self._max_bytes = max_request_bytes
        self._ssl = ssl_context
        self._mapper = principal_mapper
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        # Bounded by kafka.max.connections: one thread each while it is open; its state
        # once its TLS handshake is done (None before).
        self._connections: dict[socket.socket, KafkaConnection | None] = {}
        self._lock = threading.Lock()
        self._refused = 0  # connections closed past the bound since the last log line
        self._refused_logged_at = -math.inf
        self.port: int | None = None

    def start(self) -> int:
        """Bind and serve; returns the bound port. InvalidConfigError naming
        ``kafka.listener`` when the address cannot be bound."""
        host, port = self._config.host, self._config.port
        listener = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                listener._serve(self.request, self.client_address)

        try:
            self._server = _Server((host, port), Handler)
        except OSError as exc:
            problem = (
                "is already in use; stop the process holding it or choose another port "
                "(0: any free one)"
                if exc.errno == errno.EADDRINUSE
                else f"cannot be bound: {exc.strerror}"
            )
            raise InvalidConfigError(
                f"{KAFKA_LISTENER}={self._config.protocol.value}://{host}:{port}: the address "
                f"{problem}"
            ) from exc
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(0.1,),  # how often it looks for stop(): a quick shutdown
            name="idemlog-kafka-listener",
            daemon=True,
        )
        self._thread.start()
        protocol = self._config.protocol
        log.info("kafka listener: %s://%s:%d", protocol.value, host, self.port)
        if protocol is SecurityProtocol.PLAINTEXT and not is_loopback(host):
            # As the Flight listener warns (security/tls.py warn_if_exposed): said once.
            log.warning(
                "%s=PLAINTEXT://%s:%d can be reached from other machines without TLS or "
                "authentication: anyone on the network can list the topics and their "
                "offsets. Use SASL_SSL://, bind it to a loopback address, or firewall it",
                KAFKA_LISTENER,
                host,
                self.port,
            )
        return self.port

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()  # no new connection from here on
        server.server_close()
        with self._lock:
            open_now = list(self._connections)
        for connection in open_now:
            _wake(connection)
        if self._thread is not None:
            self._thread.join(5.0)

    def end_sessions_of(self, principal: Principal) -> int:
        """Close every connection authenticated as ``principal`` (its user changed or
        went: it authenticates again, or is refused); how many."""
        with self._lock:
            ending = [
                sock
                for sock, state in self._connections.items()
                if state is not None and state.authenticated and state.principal == principal
            ]
        for sock in ending:
            _wake(sock)
        return len(ending)

    # -- one connection ------------------------------------------------------------------
    def _serve(self, connection: socket.socket, peer: Any) -> None:
        with self._lock:
            full = len(self._connections) >= self._config.max_connections
            if not full:
                self._connections[connection] = None
        if full:
            self._refuse(connection, peer)
            return
        sock = connection
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            opened = self._open(connection, peer)
            if opened is None:
                return
            sock, state = opened
            with sock.makefile("rb") as stream:
                while self._serve_one(sock, stream, peer, state):
                    pass
        except OSError as exc:
            log.debug("kafka: connection from %s ended: %s", peer, exc)
        except Exception:
            # A handler's bug: said with its traceback, and the client connects again.
            log.exception("kafka: serving %s failed; connection closed", peer)
        finally:
            with self._lock:
                self._connections.pop(connection, None)
                self._connections.pop(sock, None)
            if sock is not connection:
                with contextlib.suppress(OSError):
                    sock.close()

    def _open(
        self, connection: socket.socket, peer: Any
    ) -> tuple[socket.socket, KafkaConnection] | None:
        """The connection's TLS (SSL, SASL_SSL) and its state; None when its TLS
        handshake failed or its certificate maps to no principal (it is closed)."""
        host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        sock: socket.socket = connection
        principal = ANONYMOUS
        if self._ssl is not None:
            connection.settimeout(TLS_HANDSHAKE_TIMEOUT_S)
            try:
                sock = self._ssl.wrap_socket(connection, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                # A client speaking plaintext to a TLS port, an unknown CA, no certificate.
                log.info("kafka: TLS handshake with %s failed; closed: %s", peer, exc)
                return None
            sock.settimeout(None)
            der = sock.getpeercert(binary_form=True) if self._mapper is not None else None
            if der:
                assert self._mapper is not None
                try:
                    principal = certificate_principal(der, self._mapper)
                except IdemlogError as exc:
                    log.info("kafka: %s refused: %s", peer, exc)
                    with contextlib.suppress(OSError):
                        sock.close()
                    return None
                log.info("kafka: %s from %s authenticated (certificate)", principal, host)
        state = KafkaConnection(host, sasl=self._config.sasl, principal=principal)
        with self._lock:
            self._connections.pop(connection, None)
            self._connections[sock] = state
        return sock, state

    def _refuse(self, connection: socket.socket, peer: Any) -> None:
        """Close a connection past kafka.max.connections at once (the client retries, as
        on a Kafka broker at its max.connections); said at most every 10 s."""
        with contextlib.suppress(OSError):
            connection.close()
        now = time.monotonic()
        with self._lock:
            self._refused += 1
            if now - self._refused_logged_at < REFUSAL_LOG_INTERVAL_S:
                return
            refused, self._refused, self._refused_logged_at = self._refused, 0, now
        log.warning(
            "kafka: %d connection(s) closed at once (the last from %s): %s=%d are open",
            refused,
            peer,
            KAFKA_MAX_CONNECTIONS,
            self._config.max_connections,
        )

    def _serve_one(
        self, connection: socket.socket, stream: Any, peer: Any, state: KafkaConnection
    ) -> bool:
        """Answer one request; False when the connection is to be closed."""
        try:
            frame = read_frame(stream, self._max_bytes)
            if frame is None:
                return False
            request = parse_request(frame, self._apis.served, state)
        except UnsupportedVersion as refused:
            if refused.api_key != API_VERSIONS:
                log.warning("kafka: %s from %s; closing the connection", refused, peer)
                return False
            response = self._apis.unsupported_api_versions(refused)
            connection.sendall(encode_response(refused.correlation_id, response))
            return True
        except IdemlogError as exc:
            log.warning("kafka: bad request from %s; closing the connection: %s", peer, exc)
            return False
        if not state.authenticated and request.api_key not in BEFORE_AUTHENTICATION:
            log.info(
                "kafka: api key %d from %s before it authenticated (%s); closing the connection",
                request.api_key,
                peer,
                state.state.value,
            )
            return False
        started = time.monotonic()
        kind = self._apis.kind(request.api_key)
        try:
            self._gate()
            response = self._apis.handle(request)
        except IdemlogError as exc:
            self._metrics.record_request(kind, time.monotonic() - started, ok=False)
            log.info(
                "kafka: api key %d from %s not answered; closing the connection: %s",
                request.api_key,
                peer,
                exc,
            )
            return False
        # A refused authentication is answered, counted an error, then the connection closed.
        self._metrics.record_request(kind, time.monotonic() - started, ok=not state.closing)
        if response is not None:  # None: a request Kafka never answers (acks=0)
            connection.sendall(encode_response(request.correlation_id, response))
        return not state.closing


def _wake(connection: socket.socket) -> None:
    """Wake the connection's thread from its read: it sees the end and leaves."""
    with contextlib.suppress(OSError):  # the client closed it already
        connection.shutdown(socket.SHUT_RDWR)
