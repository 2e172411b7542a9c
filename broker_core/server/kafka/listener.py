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
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from typing import Any

from broker_core.errors import IdemlogError, InvalidConfigError
from broker_core.security.tls import is_loopback
from broker_core.server.config.kafka import (
    KAFKA_LISTENER,
    KAFKA_MAX_CONNECTIONS,
    KafkaListenerConfig,
)
from broker_core.server.kafka.apis import API_VERSIONS, KafkaApis
from broker_core.server.kafka.framing import (
    UnsupportedVersion,
    encode_response,
    parse_request,
    read_frame,
)
from broker_core.server.observability.metrics import Metrics

log = logging.getLogger("idemlog.kafka")

REFUSAL_LOG_INTERVAL_S = 10.0


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    block_on_close = False


class KafkaListener:
    """Serves ``apis`` on ``config``'s address. Every request first passes ``gate()``
    (the broker's: waits for the start, refuses while stopping); each one answered or
    refused is counted and timed in ``metrics`` by its API. :meth:`start` binds or
    raises; :meth:`stop` is idempotent and closes the open connections."""

    def __init__(
        self,
        config: KafkaListenerConfig,
        apis: KafkaApis,
        *,
        gate: Callable[[], None],
        max_request_bytes: int,
        metrics: Metrics,
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._apis = apis
        self._gate = gate
        self._max_bytes = max_request_bytes
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        # Bounded by kafka.max.connections: one thread each while it is open.
        self._connections: set[socket.socket] = set()
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
                f"{KAFKA_LISTENER}=PLAINTEXT://{host}:{port}: the address {problem}"
            ) from exc
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(0.1,),  # how often it looks for stop(): a quick shutdown
            name="idemlog-kafka-listener",
            daemon=True,
        )
        self._thread.start()
        log.info("kafka listener: PLAINTEXT://%s:%d", host, self.port)
        if not is_loopback(host):
            # As the Flight listener warns (security/tls.py warn_if_exposed): said once.
            log.warning(
                "%s=PLAINTEXT://%s:%d can be reached from other machines without TLS or "
                "authentication: anyone on the network can list the topics and their "
                "offsets. Bind it to a loopback address, or firewall it",
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
            # Wakes the connection's thread from its read: it sees the end and leaves.
            with contextlib.suppress(OSError):  # the client closed it already
                connection.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(5.0)

    # -- one connection ------------------------------------------------------------------
    def _serve(self, connection: socket.socket, peer: Any) -> None:
        with self._lock:
            full = len(self._connections) >= self._config.max_connections
            if not full:
                self._connections.add(connection)
        if full:
            self._refuse(connection, peer)
            return
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with connection.makefile("rb") as stream:
                while self._serve_one(connection, stream, peer):
                    pass
        except OSError as exc:
            log.debug("kafka: connection from %s ended: %s", peer, exc)
        except Exception:
            # A handler's bug: said with its traceback, and the client connects again.
            log.exception("kafka: serving %s failed; connection closed", peer)
        finally:
            with self._lock:
                self._connections.discard(connection)

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

    def _serve_one(self, connection: socket.socket, stream: Any, peer: Any) -> bool:
        """Answer one request; False when the connection is to be closed."""
        try:
            frame = read_frame(stream, self._max_bytes)
            if frame is None:
                return False
            request = parse_request(frame, self._apis.served)
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
        self._metrics.record_request(kind, time.monotonic() - started, ok=True)
        if response is not None:  # None: a request Kafka never answers (acks=0)
            connection.sendall(encode_response(request.correlation_id, response))
        return True
