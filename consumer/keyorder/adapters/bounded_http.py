"""An HTTP/1.0 server whose clients cannot hold its threads: the pod's port is reachable by neighbours.

The standard library's ``ThreadingHTTPServer`` starts a thread per connection with no cap, and its
socket timeout counts idle time only, so a client sending a byte every few seconds holds a thread
forever, and a few hundred of them hold a few hundred threads (issue 37, finding 4). Here one I/O
thread reads every connection without blocking, under an overall deadline per request
(``ServerLimits.request_seconds``) and a size limit; only a *complete* request reaches one of a
fixed number of handler threads, and only so many wait for one (past that: 503 at once). Open
connections still being read are capped; a new one past the cap evicts the oldest, so a flood of
slow clients cannot lock out the kubelet. Probes (``probe_paths``) are answered first, on the I/O
thread itself, never queued behind other requests. The listen backlog is ``ServerLimits.backlog``.

Threading: the I/O thread owns the selector and every connection until its request is complete;
then exactly one thread (the I/O thread for a probe or a refusal, else a handler thread) answers
and closes it. ``_queued`` is the only state both sides touch, under ``_lock``.
"""

from __future__ import annotations

import io
import logging
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    """What the server's clients may cost it."""

    max_connections: int = 256
    """Connections being read at once; a new one past this evicts the oldest (a file descriptor and
    a buffer of at most ``max_request_bytes`` each, no thread)."""
    request_seconds: float = 5.0
    """Deadline to receive a whole request from the moment the connection was accepted (408 past it).
    The kubelet, Prometheus and the operator send theirs in one packet."""
    max_request_bytes: int = 16 * 1024
    """Largest request, head and body together (431 or 413 past it)."""
    handler_threads: int = 4
    """Threads answering complete requests (``/metrics``, the admin endpoints)."""
    max_queued: int = 32
    """Complete requests waiting for or held by a handler thread; past this, 503 at once."""
    reply_seconds: float = 5.0
    """Deadline to send one reply (a client that does not read holds a handler thread this long at most)."""
    backlog: int = 128
    """The listen backlog: a burst of connections waits in the kernel rather than dropping probes."""


class RequestRefused(ValueError):
    """A request that is answered with an error status and not handled."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def request_size(received: bytes | bytearray, max_bytes: int) -> int | None:
    """The length of the complete request at the start of ``received`` (head and ``Content-Length``
    body), ``None`` while incomplete; raises ``RequestRefused`` for one over ``max_bytes`` or with a
    bad length. Pure: the I/O loop calls it after each read."""
    end = received.find(b"\r\n\r\n")
    if end < 0:
        if len(received) > max_bytes:
            raise RequestRefused(431, f"request head larger than {max_bytes} bytes")
        return None
    length = 0
    for line in bytes(received[:end]).split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            if not value.strip().isdigit():
                raise RequestRefused(400, "Content-Length must be a number")
            length = int(value)
    total = end + 4 + length
    if total > max_bytes:
        raise RequestRefused(413, f"request larger than {max_bytes} bytes")
    return total if len(received) >= total else None


def error_reply(status: int, reason: str) -> bytes:
    """A complete JSON error reply, built without a handler (the I/O thread sends it)."""
    body = b'{"error": "%s"}\n' % reason.replace('"', "'").encode()
    phrase = _PHRASES.get(status, "Error").encode()
    head = b"HTTP/1.0 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
    return head % (status, phrase, len(body)) + body


_PHRASES = {
    400: "Bad Request",
    408: "Request Timeout",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class BufferedRequestHandler(BaseHTTPRequestHandler):
    """A ``BaseHTTPRequestHandler`` over a request already read whole: it reads the request from
    memory and writes its reply to memory (``reply()``), so it never waits on a client."""

    request: bytes

    def setup(self) -> None:
        self.rfile = io.BytesIO(self.request)
        self.wfile = io.BytesIO()

    def finish(self) -> None:
        """Nothing: the server sends ``reply()`` under its own deadline and closes the connection."""

    def reply(self) -> bytes:
        assert isinstance(self.wfile, io.BytesIO)
        return self.wfile.getvalue()


@dataclass
class _Pending:
    """A connection whose request is still arriving (owned by the I/O thread)."""

    connection: socket.socket
    address: Any
    deadline: float
    received: bytearray


class BoundedHttpServer:
    """Serves ``handler_class`` (a ``BufferedRequestHandler``) on ``(host, port)`` within ``limits``."""

    def __init__(
        self,
        address: tuple[str, int],
        handler_class: type[BufferedRequestHandler],
        *,
        probe_paths: Sequence[str] = (),
        limits: ServerLimits = ServerLimits(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.handler_class = handler_class
        self.limits = limits
        self.clock = clock
        self._probes = tuple(f"GET {path}{end}".encode() for path in probe_paths for end in (" ", "?"))
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._listener = socket.create_server(address, family=family, backlog=limits.backlog)
        self._listener.setblocking(False)
        self.server_address = self._listener.getsockname()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_reader, selectors.EVENT_READ)
        self._pending: OrderedDict[int, _Pending] = OrderedDict()  # oldest first (all share one deadline span)
        self._handlers = ThreadPoolExecutor(limits.handler_threads, thread_name_prefix="keyorder-http-handler")
        self._lock = threading.Lock()
        self._queued = 0
        self._stopping = threading.Event()
        self.refused = {"evicted": 0, "expired": 0, "busy": 0, "invalid": 0}
        """Connections refused by reason, since start (written by the I/O thread only)."""

    # -- the I/O thread -------------------------------------------------------------------------
    def serve_forever(self) -> None:
        try:
            while not self._stopping.is_set():
                oldest = next(iter(self._pending.values()), None)
                wait = None if oldest is None else max(0.0, oldest.deadline - self.clock())
                for key, _ in self._selector.select(wait):
                    try:
                        if key.fileobj is self._listener:
                            self._accept()
                        elif key.fileobj is not self._wake_reader:
                            self._receive(key.fd)
                    except Exception:  # one connection's surprise must not stop the port
                        log.exception("http: serving a connection failed")
                        if (pending := self._pending.get(key.fd)) is not None:
                            self._drop(pending)
                self._expire(self.clock())
        finally:
            for pending in list(self._pending.values()):
                self._drop(pending)

    def _accept(self) -> None:
        for _ in range(self.limits.backlog):  # what is waiting now, not forever
            try:
                connection, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # e.g. out of file descriptors: the backlog keeps the rest
                log.warning("http: cannot accept a connection: %s", error)
                return
            connection.setblocking(False)
            if len(self._pending) >= self.limits.max_connections:
                self._count_refusal("evicted", "connections being read reached the cap")
                self._drop(next(iter(self._pending.values())))
            self._pending[connection.fileno()] = _Pending(
                connection, address, self.clock() + self.limits.request_seconds, bytearray()
            )
            self._selector.register(connection, selectors.EVENT_READ)

    def _receive(self, fd: int) -> None:
        pending = self._pending.get(fd)
        if pending is None:  # dropped earlier in this turn (evicted, expired) after the selector saw it
            return
        try:
            data = pending.connection.recv(8192)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(pending)
            return
        pending.received += data
        try:
            size = request_size(pending.received, self.limits.max_request_bytes)
        except RequestRefused as refusal:
            self._count_refusal("invalid", str(refusal))
            self._drop(pending, error_reply(refusal.status, str(refusal)))
            return
        if size is not None:
            self._forget(pending)
            self._dispatch(pending.connection, bytes(pending.received[:size]), pending.address)

    def _expire(self, now: float) -> None:
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if oldest.deadline > now:
                return
            self._count_refusal("expired", "no complete request within the deadline")
            limit = self.limits.request_seconds
            self._drop(oldest, error_reply(408, f"no complete request within {limit:g} s"))

    def _dispatch(self, connection: socket.socket, request: bytes, address: Any) -> None:
        if request.startswith(self._probes):  # probes first: answered here, never queued
            self._send_now(connection, self._answer(request, address))
            return
        with self._lock:
            busy = self._queued >= self.limits.max_queued
            if not busy:
                self._queued += 1
        if busy:
            self._count_refusal("busy", "every handler thread busy and the queue full")
            self._send_now(connection, error_reply(503, "busy: too many requests at once"))
            return
        self._handlers.submit(self._handle, connection, request, address)

    def _count_refusal(self, reason: str, why: str) -> None:
        """Count a refused connection; log the 1st, 2nd, 4th, 8th... of each reason (a flood stays quiet)."""
        count = self.refused[reason] = self.refused[reason] + 1
        if count & (count - 1) == 0:
            log.warning("http: %d connections refused since start: %s (%s)", count, reason, why)

    def _forget(self, pending: _Pending) -> None:
        del self._pending[pending.connection.fileno()]
        self._selector.unregister(pending.connection)

    def _drop(self, pending: _Pending, reply: bytes = b"") -> None:
        self._forget(pending)
        self._send_now(pending.connection, reply)

    @staticmethod
    def _send_now(connection: socket.socket, reply: bytes) -> None:
        """Send what the socket takes without waiting (a short reply fits a fresh socket's buffer), close."""
        try:
            if reply:
                connection.send(reply)
        except OSError:
            pass  # the client left or does not read: it loses its reply, nobody waits for it
        finally:
            connection.close()

    # -- handler threads --------------------------------------------------------------------------
    def _answer(self, request: bytes, address: Any) -> bytes:
        try:
            handler = self.handler_class(request, address, self)  # type: ignore[arg-type]
        except Exception:
            log.exception("http: the handler failed")
            return error_reply(500, "internal error")
        return handler.reply()

    def _handle(self, connection: socket.socket, request: bytes, address: Any) -> None:
        try:
            reply = self._answer(request, address)
            connection.settimeout(self.limits.reply_seconds)  # bounds the whole sendall (Python >= 3.5)
            connection.sendall(reply)
        except OSError as error:
            log.debug("http: reply to %s not sent: %s", address, error)
        finally:
            connection.close()
            with self._lock:
                self._queued -= 1

    # -- life cycle (any thread) ------------------------------------------------------------------
    def shutdown(self) -> None:
        self._stopping.set()
        self._wake_writer.send(b"x")

    def server_close(self) -> None:
        self._handlers.shutdown(wait=False, cancel_futures=True)
        self._selector.close()
        self._listener.close()
        self._wake_reader.close()
        self._wake_writer.close()
