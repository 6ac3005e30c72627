"""A TCP proxy the fault tests own, placed between the pods and the broker, to break the network.

Tansu keeps everything in memory, so a fault test never kills the broker: it breaks the
*connections* instead. The broker advertises this proxy's address, so every client connection
(bootstrap, partition leader, group coordinator) goes through it, and the test can:

* ``cut()`` every open connection at once (both sides closed mid-stream, as a broker restart or a
  dropped NAT entry does); new connections are accepted as usual;
* ``black_hole()``: a silent partition. Connections stay open and new ones are accepted, but no
  byte is forwarded in either direction; what was sent waits, like unacknowledged TCP segments,
  and is delivered intact by ``heal()`` (as TCP retransmission would after the partition);
* ``refuse()``: the broker is down. Open connections are cut and the listening socket is closed,
  so connecting fails with "connection refused" until ``heal()`` listens again on the same port.

One thread accepts; each connection has one thread per direction. Counters (``accepted``,
``cut_connections``, ``forwarded_bytes``) let a test check that the proxy really carried and broke
the traffic.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from types import TracebackType

_TICK = 0.05
"""Seconds between checks of the proxy's state in every blocking wait (bounds reaction time)."""


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = threading.Event()
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
        for side in (self.client, self.upstream):
            with contextlib.suppress(OSError):  # already closed by the peer
                side.shutdown(socket.SHUT_RDWR)  # wakes the pump blocked on it
            side.close()


class FaultProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream`` until told to break. Use as a context manager."""

    def __init__(self, upstream_port: int, port: int = 0) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self._listener: socket.socket | None = self._listen(port)
        self.port: int = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._gate = threading.Lock()  # held while a pump reads, so black_hole() takes effect at once
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._threads: list[threading.Thread] = []
        self.accepted = 0
        """Client connections accepted so far."""
        self.cut_connections = 0
        """Connections closed by ``cut`` or ``refuse``."""
        self.forwarded_bytes = 0
        """Bytes forwarded in both directions."""
        self._acceptor = threading.Thread(target=self._accept_loop, name="fault-proxy-accept", daemon=True)

    @staticmethod
    def _listen(port: int) -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        return listener

    # -- faults -------------------------------------------------------------------------------------
    def cut(self) -> int:
        """Close every open connection (both sides); returns how many were cut."""
        with self._lock:
            links, self._links = self._links, set()
            self.cut_connections += len(links)
        for link in links:
            link.close()
        return len(links)

    def black_hole(self) -> None:
        """Forward nothing (connections stay open, new ones are accepted) until ``heal``."""
        with self._gate:
            self._forwarding.clear()

    def refuse(self) -> int:
        """Cut every connection and stop listening (connections are refused) until ``heal``."""
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                # at once, even while the acceptor's select() still holds the socket
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        return self.cut()

    def heal(self) -> None:
        """Listen again if refusing, and forward again (what waited in a black hole is delivered)."""
        with self._lock:
            if self._listener is None:
                self._listener = self._listen(self.port)
        self._forwarding.set()

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._links)

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._acceptor.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._forwarding.set()
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        self.cut()
        self._acceptor.join(5)
        for thread in list(self._threads):
            thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    # -- forwarding ---------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            listener = self._listener
            if listener is None:  # refusing
                self._stopped.wait(_TICK)
                continue
            try:
                ready, _, _ = select.select([listener], [], [], _TICK)
                if not ready:
                    continue
                client, _address = listener.accept()
            except (OSError, ValueError):  # closed by refuse() or stop() meanwhile
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            link = _Link(client, upstream)
            with self._lock:
                self.accepted += 1
                self._links.add(link)
                self._threads = [thread for thread in self._threads if thread.is_alive()]
                for source, target in ((client, upstream), (upstream, client)):
                    thread = threading.Thread(target=self._pump, args=(link, source, target), daemon=True)
                    self._threads.append(thread)
                    thread.start()

    def _pump(self, link: _Link, source: socket.socket, target: socket.socket) -> None:
        """Copy ``source`` to ``target`` while forwarding; hold everything while black-holed."""
        try:
            while not link.closed.is_set() and not self._stopped.is_set():
                if not self._forwarding.wait(_TICK):
                    continue  # black hole: leave the bytes in the kernel's buffers
                ready, _, _ = select.select([source], [], [], _TICK)
                if not ready:
                    continue
                with self._gate:  # no byte is taken in once black_hole() has returned
                    if not self._forwarding.is_set():
                        continue
                    data = source.recv(65536)
                if not data:
                    break
                target.sendall(data)
                with self._lock:
                    self.forwarded_bytes += len(data)
        except (OSError, ValueError):  # the link was cut under this thread
            pass
        finally:
            with self._lock:
                self._links.discard(link)
            link.close()
