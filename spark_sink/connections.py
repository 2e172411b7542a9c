"""One Flight connection cache per process for every broker client of the sink.

Spark keeps its Python workers between tasks and micro-batches (``spark.python.worker.
reuse``, on by default), the driver-side planning and commit processes too. Each task, plan
and commit makes its own :class:`BrokerClient` (its own metadata view, its own retry
state), but they all share this process's connections, so a worker opens a channel to a
broker once instead of once per task or batch. A broken channel is reset by the client
that saw it break, so the next request opens a fresh one. A forked child gets a cache of
its own (a gRPC channel must not cross a fork).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from broker_core.client.broker_client import BrokerClient
from broker_core.client.connections import FlightConnections
from broker_core.security.tls import PLAINTEXT, Side, TlsSettings

_lock = threading.Lock()
# One cache per TLS settings (a query's options; a process runs few queries' tasks): the
# owning pid, and the caches by settings.
_cache: tuple[int, dict[TlsSettings, FlightConnections]] | None = None


def shared_connections(tls: TlsSettings = PLAINTEXT) -> FlightConnections:
    """This process's connection cache for links under ``tls`` (its files are read and
    checked when the cache is made: a bad one raises InvalidConfigError naming it)."""
    global _cache
    with _lock:
        if _cache is None or _cache[0] != os.getpid():
            _cache = (os.getpid(), {})
        caches = _cache[1]
        if tls not in caches:
            caches[tls] = FlightConnections(tls.load(Side.CLIENT))
        return caches[tls]


def sink_client(bootstrap: str, tls: TlsSettings = PLAINTEXT, **options: Any) -> BrokerClient:
    """A :class:`BrokerClient` of ``bootstrap`` on this process's shared connections
    under ``tls`` (``options``: BrokerClient's keyword arguments). Closing it leaves
    them open."""
    return BrokerClient(bootstrap, connections=shared_connections(tls), **options)
