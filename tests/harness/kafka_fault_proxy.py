"""A TCP proxy in front of a broker's Kafka listener that resets and stalls connections
in the middle of a stream: the faults a Kafka producer's retries are for.

The broker advertises the proxy (``kafka.advertised.listener``), so every connection of
the client goes through it; the proxy's port is known before the broker starts
(:attr:`port`), its target set once the broker is up (:meth:`point_at`). Faults act on
the broker's answers: a request is always forwarded whole, and the answer is then
swallowed by a reset (the client cannot tell whether it was written, and retries) or
held back for ``stall_s`` (longer than the client's request timeout: it gives up on the
connection and retries). Every ``reset_every``-th and ``stall_every``-th answer chunk is
hit, counted in :attr:`resets` and :attr:`stalls` so a test asserts its fault fired.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

from tests.harness.tcp_proxy import TcpProxy

_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends an RST


class KafkaFaultProxy(TcpProxy):
    def __init__(self, *, reset_every: int, stall_every: int, stall_s: float) -> None:
        super().__init__("127.0.0.1:1")  # the real target is set by point_at
        self._reset_every = reset_every
        self._stall_every = stall_every
        self._stall_s = stall_s
        self._answers = 0
        self.resets = 0
        self.stalls = 0
        self.armed = threading.Event()

    def point_at(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))

    def _fault(self) -> str | None:
        with self._lock:
            if not self.armed.is_set():
                return None
            self._answers += 1
            if self._answers % self._reset_every == 0:
                self.resets += 1
                return "reset"
            if self._answers % self._stall_every == 0:
                self.stalls += 1
                return "stall"
            return None

    def _pump(self, source: socket.socket, sink: socket.socket, to_target: bool) -> None:
        if to_target:
            super()._pump(source, sink, to_target)
            return
        try:
            while data := source.recv(65536):
                fault = self._fault()
                if fault == "reset":
                    # The answer is dropped and the client's connection reset (RST); the
                    # other direction's pump is woken by the read side shut first.
                    with contextlib.suppress(OSError):
                        sink.shutdown(socket.SHUT_RD)
                        sink.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
                        sink.close()
                    with contextlib.suppress(OSError):
                        source.shutdown(socket.SHUT_RDWR)
                    return
                if fault == "stall":
                    time.sleep(self._stall_s)
                sink.sendall(data)
                with self._lock:
                    self.bytes_from_target += len(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
