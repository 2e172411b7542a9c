"""One Flight connection cache per process for every broker client of the sink.

Spark keeps its Python workers between tasks and micro-batches (``spark.python.worker.
reuse``, on by default), the driver-side planning and commit processes too. Each task, plan
and commit makes its own :class:`BrokerClient` (its own metadata view, its own retry
state), but they all share this process's connections, so a worker opens a channel to a
broker once instead of once per task or batch. A broken channel is reset by the client
that saw it break, so the next request opens a fresh one. A forked child gets a cache of
its own (a gRPC channel must not cross a fork). Clients with SASL credentials
(``sasl.*`` options) share a cache of their own per credentials: a channel carries the
session of the user whose handshake opened it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from broker_core.client.broker_client import BrokerClient
from broker_core.client.connections import FlightConnections
from broker_core.security.flight_auth import SaslCredentials

_lock = threading.Lock()
# One cache per credentials (None: PLAINTEXT); as many as a process's jobs use, a few.
_cache: tuple[int, dict[SaslCredentials | None, FlightConnections]] | None = None


def shared_connections(sasl: SaslCredentials | None = None) -> FlightConnections:
    """This process's connection cache for ``sasl``'s user (None: unauthenticated)."""
    global _cache
    with _lock:
        if _cache is None or _cache[0] != os.getpid():
            _cache = (os.getpid(), {})
        caches = _cache[1]
        if sasl not in caches:
            caches[sasl] = FlightConnections(sasl=sasl)
        return caches[sasl]


def sink_client(
    bootstrap: str, *, sasl: SaslCredentials | None = None, **options: Any
) -> BrokerClient:
    """A :class:`BrokerClient` of ``bootstrap`` on this process's shared connections for
    ``sasl`` (``options``: BrokerClient's keyword arguments). Closing it leaves them open."""
    return BrokerClient(bootstrap, connections=shared_connections(sasl), **options)
