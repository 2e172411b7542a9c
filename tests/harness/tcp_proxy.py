"""A user-space TCP proxy: what stands between clients and a broker behind NAT, a load
balancer or a container's port mapping, and the way to cut a link where there is no
netem and no iptables (close the proxy, or stop it forwarding).

``TcpProxy(target)`` listens on a free loopback port and forwards every connection to
``target`` (``host:port``), byte for byte, both ways, each connection on threads of its
own. It counts connections and bytes, so a test can assert that traffic really went
through it, and the connections whose client closed its end (``client_hangups``).
``close()`` stops listening and closes every connection (both sides see the link go
down).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class TcpProxy:
    def __init__(self, target: str, *, host: str = "127.0.0.1") -> None:
        target_host, _, target_port = target.rpartition(":")
        self.target = (target_host, int(target_port))
        self._listener = socket.create_server((host, 0))
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.connections = 0
        self.bytes_to_target = 0
        self.bytes_from_target = 0
        self.client_hangups = 0  # connections whose client end was closed (EOF from it)
        accept = threading.Thread(target=self._accept, name="tcp-proxy-accept", daemon=True)
        accept.start()
        self._threads.append(accept)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the target is down: the client sees the link refused
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self.connections += 1
                self._sockets += [client, upstream]
                directions = ((client, upstream, True), (upstream, client, False))
                for source, sink, to_target in directions:
                    pump = threading.Thread(
                        target=self._pump, args=(source, sink, to_target), daemon=True
                    )
                    pump.start()
                    self._threads.append(pump)

    def _pump(self, source: socket.socket, sink: socket.socket, to_target: bool) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
                with self._lock:
                    if to_target:
                        self.bytes_to_target += len(data)
                    else:
                        self.bytes_from_target += len(data)
            if to_target:
                with self._lock:
                    self.client_hangups += 1
        except OSError:
            pass  # the other side or close() ended the link: the pump's job is over
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._listener.close()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
