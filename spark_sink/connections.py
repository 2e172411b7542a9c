"""One Flight connection cache per process for every broker client of the sink.

Spark keeps its Python workers between tasks and micro-batches (``spark.python.worker.
reuse``, on by default), the driver-side planning and commit processes too. Each task, plan
and commit makes its own :class:`BrokerClient` (its own metadata view, its own retry
state), but they all share this process's connections, so a worker opens a channel to a
broker once instead of once per task or batch. A broken channel is reset by the client
that saw it break, so the next request opens a fresh one. A forked child gets a cache of
its own (a gRPC channel must not cross a fork). Each pair of TLS settings and SASL
credentials (the ``security.protocol``, ``ssl.*`` and ``sasl.*`` options) has a cache of
its own: a channel carries the session of the user whose handshake opened it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from broker_core.client.broker_client import BrokerClient
from broker_core.client.connections import FlightConnections
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.tls import PLAINTEXT, Side, TlsSettings

_lock = threading.Lock()
# One cache per (TLS settings, credentials) (None: no SASL), a query's options; a process
# runs few queries' tasks, so a few: the owning pid, and the caches by their key.
_cache: tuple[int, dict[tuple[TlsSettings, SaslCredentials | None], FlightConnections]] | None = (
    None
)


def shared_connections(
    tls: TlsSettings = PLAINTEXT, sasl: SaslCredentials | None = None
) -> FlightConnections:
    """This process's connection cache for links under ``tls`` authenticated as ``sasl``'s
    user (None: unauthenticated). The TLS files are read and checked when the cache is
    made: a bad one raises InvalidConfigError naming it."""
    global _cache
    with _lock:
        if _cache is None or _cache[0] != os.getpid():
            _cache = (os.getpid(), {})
        caches = _cache[1]
        key = (tls, sasl)
        if key not in caches:
            caches[key] = FlightConnections(tls.load(Side.CLIENT), sasl=sasl)
        return caches[key]


def sink_client(
    bootstrap: str,
    tls: TlsSettings = PLAINTEXT,
    *,
    sasl: SaslCredentials | None = None,
    **options: Any,
) -> BrokerClient:
    """A :class:`BrokerClient` of ``bootstrap`` on this process's shared connections
    under ``tls`` and ``sasl`` (``options``: BrokerClient's keyword arguments). Closing it
    leaves them open."""
    return BrokerClient(bootstrap, connections=shared_connections(tls, sasl), **options)
