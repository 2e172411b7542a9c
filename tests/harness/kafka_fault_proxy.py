"""A TCP proxy in front of a broker's Kafka listener that resets and stalls connections
in the middle of a stream of Produce requests: the faults a Kafka producer's retries are
for.

The broker advertises the proxy (``kafka.advertised.listener``), so every connection of
the client goes through it; the proxy's port is known before the broker starts
(:attr:`port`), its target set once the broker is up (:meth:`point_at`). The proxy reads
Kafka's frames both ways (a size, then the request header's api key), so it knows which
answer is a Produce's: responses come in the order of the requests on a connection.
Faults act on Produce answers only, so the client's ApiVersions, Metadata and
InitProducerId always go through and it makes progress: the request is always forwarded
whole (and appended), and then its answer is swallowed by a reset of the client's
connection (an RST: the client cannot tell whether it was written, and retries) or held
back for ``stall_s`` (longer than the client's request timeout: it gives up on the
connection and retries). Every ``reset_every``-th and ``stall_every``-th Produce answer
while :attr:`armed` is hit, counted in :attr:`resets` and :attr:`stalls` so a test
asserts its faults fired.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import struct
import threading
import time

from tests.harness.tcp_proxy import TcpProxy

PRODUCE = 0
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends an RST
_SIZE = struct.Struct(">i")
_API_KEY = struct.Struct(">h")


class KafkaFaultProxy(TcpProxy):
    def __init__(self, *, reset_every: int, stall_every: int, stall_s: float) -> None:
        super().__init__("127.0.0.1:1")  # the real target is set by point_at
        self._reset_every = reset_every
        self._stall_every = stall_every
        self._stall_s = stall_s
        self._produce_answers = 0
        # Per client connection: the api keys of its requests not answered yet, in order.
        self._asked: dict[socket.socket, collections.deque[int]] = {}
        self.resets = 0
        self.stalls = 0
        self.armed = threading.Event()

    def point_at(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))

    def _fault(self, api_key: int) -> str | None:
        with self._lock:
            if api_key != PRODUCE or not self.armed.is_set():
                return None
            self._produce_answers += 1
            if self._produce_answers % self._reset_every == 0:
                self.resets += 1
                return "reset"
            if self._produce_answers % self._stall_every == 0:
                self.stalls += 1
                return "stall"
            return None

    def _asked_of(self, client: socket.socket) -> collections.deque[int]:
        with self._lock:
            return self._asked.setdefault(client, collections.deque())

    def _pump(self, source: socket.socket, sink: socket.socket, to_target: bool) -> None:
        client = source if to_target else sink
        asked = self._asked_of(client)
        buffer = b""
        try:
            while data := source.recv(65536):
                buffer += data
                while len(buffer) >= _SIZE.size:
                    (size,) = _SIZE.unpack_from(buffer)
                    end = _SIZE.size + size
                    if len(buffer) < end:
                        break
                    frame, buffer = buffer[:end], buffer[end:]
                    if to_target:
                        # A request: remember its api key (a deque is safe across threads).
                        asked.append(_API_KEY.unpack_from(frame, _SIZE.size)[0])
                    else:
                        fault = self._fault(asked.popleft() if asked else -1)
                        if fault == "reset":
                            self._reset(client, source)
                            return
                        if fault == "stall":
                            time.sleep(self._stall_s)
                    sink.sendall(frame)
                    with self._lock:
                        if to_target:
                            self.bytes_to_target += len(frame)
                        else:
                            self.bytes_from_target += len(frame)
        except OSError:
            pass  # the other side, a reset or close() ended the link
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    @staticmethod
    def _reset(client: socket.socket, upstream: socket.socket) -> None:
        """The answer dropped, the client's connection reset (RST) and the broker's closed;
        the other direction's pump is woken by the read side shut first."""
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RD)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            client.close()
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_RDWR)
