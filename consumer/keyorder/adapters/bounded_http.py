"""An HTTP/1.0 server whose clients cannot hold its threads: the pod's port is reachable by neighbours.

The standard library's ``ThreadingHTTPServer`` starts a thread per connection with no cap, and its
socket timeout counts idle time only, so a client sending a byte every few seconds holds a thread
forever, and a few hundred of them hold a few hundred threads (issue 37, finding 4). Here one I/O
thread reads every connection without blocking, under an overall deadline per request
(``ServerLimits.request_seconds``) and a size limit; only a *complete* request reaches one of a
fixed number of handler threads, and only so many wait for one (past that: 503 at once). Open
connections are capped; a new one past the cap evicts the oldest being read, so a flood of slow
clients cannot lock out the kubelet. Probes (``probe_paths``) are answered first, on the I/O thread
itself, never queued behind other requests. Requests the ``priority`` test picks (the operator's
authenticated admin calls) have their own handler thread and queue, so a queue full of ``/metrics``
cannot refuse them. The listen backlog is ``ServerLimits.backlog``.

Handler threads only compute replies: the I/O thread writes every reply without blocking, under a
deadline (``ServerLimits.reply_seconds``), and drops a client that does not read it in time; a
client that does not read holds a queue place that long, never a thread. After a reply the server
shuts down its side and reads what the client still sends for a moment (``linger_seconds``) before
closing: closing with unread input sends a reset, which can destroy the reply (a 413 or 431 above
all, whose request was not read to its end) before the client read it.

Threading: the I/O thread owns the selector, every connection (except while a handler thread
computes its reply from a copy of its request) and the queue counts. A handler thread hands its
reply back through ``_replies`` (a deque) and wakes the I/O thread through a socket pair.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import selectors
import socket
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    """What the server's clients may cost it."""

    max_connections: int = 256
    """Connections the I/O thread holds at once (being read, having their reply written, lingering
    after it; a file descriptor and a buffer each, no thread); a new one past this closes a lingering
    one, else evicts the oldest being read (closed at once when every one is having its reply written)."""
    request_seconds: float = 5.0
    """Deadline to receive a whole request from the moment the connection was accepted (408 past it).
    The kubelet, Prometheus and the operator send theirs in one packet."""
    max_request_bytes: int = 16 * 1024
    """Largest request, head and body together (431 or 413 past it)."""
    handler_threads: int = 4
    """Threads computing the replies to complete requests (``/metrics``, the admin endpoints)."""
    max_queued: int = 32
    """Complete requests waiting for a handler thread, being answered, or whose reply is being sent;
    past this, 503 at once."""
    priority_threads: int = 1
    """Threads computing the replies to the requests ``priority`` picks (the operator's admin calls)."""
    max_priority_queued: int = 4
    """Like ``max_queued``, for the requests ``priority`` picks: their own places, never taken by others."""
    reply_seconds: float = 5.0
    """Deadline to send one reply, from when it is ready; a client that has not read it by then is
    dropped (it holds a queue place this long at most, and no thread)."""
    linger_seconds: float = 1.0
    """After a reply, how long the server reads (and discards) what the client still sends before it
    closes, so that the close does not reset the connection before the client read the reply."""
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


_REQUEST_LINE = re.compile(rb"([A-Z]+) ([^ \r\n]+)")


def request_target(request: bytes) -> tuple[str, str]:
    """(method, path without the query) of a request, ``("", "")`` when its first line is not one."""
    found = _REQUEST_LINE.match(request)
    if found is None:
        return "", ""
    return found[1].decode("ascii"), found[2].decode("latin-1").split("?", 1)[0]


def header_value(request: bytes, name: str) -> str | None:
    """The value of the first header ``name`` (any case) in a request's head, ``None`` without one."""
    head = request.split(b"\r\n\r\n", 1)[0]
    wanted = name.lower().encode("ascii")
    for line in head.split(b"\r\n")[1:]:
        field, _, value = line.partition(b":")
        if field.strip().lower() == wanted:
            return value.strip().decode("latin-1")
    return None


@dataclass
class _Pending:
    """A connection whose request is still arriving (owned by the I/O thread)."""

    connection: socket.socket
    address: Any
    deadline: float
    received: bytearray


@dataclass
class _Sending:
    """A connection whose reply is being written, or that lingers after it (owned by the I/O thread)."""

    connection: socket.socket
    address: Any
    deadline: float
    reply: memoryview
    lane: str | None
    """The queue whose place the reply holds (``"handlers"``, ``"priority"``), ``None`` for none."""


class BoundedHttpServer:
    """Serves ``handler_class`` (a ``BufferedRequestHandler``) on ``(host, port)`` within ``limits``.

    ``priority(request)`` (called on the I/O thread with a complete request; it must be quick) picks
    the requests served by their own threads and queue (``priority_threads``, ``max_priority_queued``)."""

    def __init__(
        self,
        address: tuple[str, int],
        handler_class: type[BufferedRequestHandler],
        *,
        probe_paths: Sequence[str] = (),
        priority: Callable[[bytes], bool] | None = None,
        limits: ServerLimits = ServerLimits(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.handler_class = handler_class
        self.limits = limits
        self.clock = clock
        self._probes = tuple(f"GET {path}{end}".encode() for path in probe_paths for end in (" ", "?"))
        self._priority = priority
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._listener = socket.create_server(address, family=family, backlog=limits.backlog)
        self._listener.setblocking(False)
        self.server_address = self._listener.getsockname()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_reader, selectors.EVENT_READ)
        # each oldest first, so deadline order: all of one kind share one deadline span
        self._reading: OrderedDict[int, _Pending] = OrderedDict()
        self._writing: OrderedDict[int, _Sending] = OrderedDict()
        self._lingering: OrderedDict[int, _Sending] = OrderedDict()
        self._lanes = {
            "handlers": (
                ThreadPoolExecutor(limits.handler_threads, thread_name_prefix="keyorder-http-handler"),
                limits.max_queued,
            ),
            "priority": (
                ThreadPoolExecutor(limits.priority_threads, thread_name_prefix="keyorder-http-priority"),
                limits.max_priority_queued,
            ),
        }
        self._queued = {"handlers": 0, "priority": 0}
        """Requests holding a place of each lane (I/O thread only): from dispatch to the reply's end."""
        self._replies: deque[tuple[socket.socket, Any, bytes, str]] = deque()
        self._replies_closed = False
        """Set when the I/O thread has stopped: a reply computed after it is closed by its handler thread."""
        self._replies_lock = threading.Lock()
        """Replies computed by the handler threads, for the I/O thread to send (thread-safe appends)."""
        self._stopping = threading.Event()
        self.refused = {"evicted": 0, "expired": 0, "busy": 0, "invalid": 0, "not_reading": 0}
        """Connections refused by reason, since start (written by the I/O thread only)."""

    @property
    def connections(self) -> int:
        """Connections the I/O thread holds (being read, written to, or lingering)."""
        return len(self._reading) + len(self._writing) + len(self._lingering)

    # -- the I/O thread -------------------------------------------------------------------------
    def serve_forever(self) -> None:
        try:
            while not self._stopping.is_set():
                for key, _ in self._selector.select(self._next_wait()):
                    try:
                        if key.fileobj is self._listener:
                            self._accept()
                        elif key.fileobj is self._wake_reader:
                            self._woken()
                        else:
                            self._ready(key.fd)
                    except Exception:  # one connection's surprise must not stop the port
                        log.exception("http: serving a connection failed")
                        self._close_fd(key.fd)
                self._take_replies()
                self._expire(self.clock())
        finally:
            for fd in [*self._reading, *self._writing, *self._lingering]:
                self._close_fd(fd)
            with self._replies_lock:  # computed while stopping: nobody sends them
                self._replies_closed = True
                while self._replies:
                    self._replies.popleft()[0].close()

    def _next_wait(self) -> float | None:
        deadlines = [next(iter(pending.values())).deadline for pending in (self._reading,) if pending] + [
            next(iter(sending.values())).deadline for sending in (self._writing, self._lingering) if sending
        ]
        return None if not deadlines else max(0.0, min(deadlines) - self.clock())

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
            if self.connections >= self.limits.max_connections and not self._make_room():
                self._count_refusal("busy", "every connection is being answered")
                connection.close()
                continue
            self._reading[connection.fileno()] = _Pending(
                connection, address, self.clock() + self.limits.request_seconds, bytearray()
            )
            self._selector.register(connection, selectors.EVENT_READ)

    def _make_room(self) -> bool:
        """Close one connection for a new one: a lingering one (answered already), else the oldest being
        read; False when every connection is having its reply written."""
        if self._lingering:
            self._close_fd(next(iter(self._lingering)))
            return True
        if self._reading:
            self._count_refusal("evicted", "connections reached the cap")
            self._close_fd(next(iter(self._reading)))
            return True
        return False

    def _ready(self, fd: int) -> None:
        if fd in self._reading:
            self._receive(self._reading[fd])
        elif fd in self._writing:
            self._write(self._writing[fd])
        elif fd in self._lingering:
            self._linger(self._lingering[fd])
        # else: closed earlier in this turn (evicted, expired) after the selector saw it

    def _receive(self, pending: _Pending) -> None:
        try:
            data = pending.connection.recv(8192)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close_fd(pending.connection.fileno())
            return
        pending.received += data
        try:
            size = request_size(pending.received, self.limits.max_request_bytes)
        except RequestRefused as refusal:
            self._count_refusal("invalid", str(refusal))
            self._answer_now(pending, error_reply(refusal.status, str(refusal)))
            return
        if size is not None:
            self._dispatch(pending, bytes(pending.received[:size]))

    def _dispatch(self, pending: _Pending, request: bytes) -> None:
        if request.startswith(self._probes):  # probes first: answered here, never queued
            self._answer_now(pending, self._answer(request, pending.address))
            return
        lane = "priority" if self._priority is not None and self._priority(request) else "handlers"
        executor, places = self._lanes[lane]
        if self._queued[lane] >= places:
            self._count_refusal("busy", f"every place of the {lane} queue taken")
            self._answer_now(pending, error_reply(503, "busy: too many requests at once"))
            return
        self._queued[lane] += 1
        fd = pending.connection.fileno()
        del self._reading[fd]
        self._selector.unregister(pending.connection)  # the connection waits for its reply, unwatched
        queued = executor.submit(self._handle, pending.connection, request, pending.address, lane)
        queued.add_done_callback(partial(_close_if_cancelled, pending.connection))

    def _answer_now(self, pending: _Pending, reply: bytes) -> None:
        """Send ``reply`` to a connection being read (a probe's answer, a refusal)."""
        del self._reading[pending.connection.fileno()]
        self._selector.unregister(pending.connection)
        self._start_sending(pending.connection, pending.address, reply, None)

    def _start_sending(self, connection: socket.socket, address: Any, reply: bytes, lane: str | None) -> None:
        sending = _Sending(connection, address, self.clock() + self.limits.reply_seconds, memoryview(reply), lane)
        self._writing[connection.fileno()] = sending
        self._selector.register(connection, selectors.EVENT_WRITE)
        self._write(sending)  # most replies fit the socket's buffer: sent at once

    def _write(self, sending: _Sending) -> None:
        try:
            sent = sending.connection.send(sending.reply)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:  # the client left: it loses its reply, nobody waits for it
            log.debug("http: reply to %s not sent: %s", sending.address, error)
            self._close_fd(sending.connection.fileno())
            return
        sending.reply = sending.reply[sent:]
        if sending.reply:
            return
        fd = sending.connection.fileno()
        del self._writing[fd]
        self._release(sending)
        try:
            sending.connection.shutdown(socket.SHUT_WR)  # the client sees the end of the reply
        except OSError:
            self._selector.unregister(sending.connection)
            sending.connection.close()
            return
        sending.deadline = self.clock() + self.limits.linger_seconds
        self._lingering[fd] = sending
        self._selector.modify(sending.connection, selectors.EVENT_READ)

    def _linger(self, sending: _Sending) -> None:
        """Read and discard what the client still sends; close at its end."""
        try:
            data = sending.connection.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close_fd(sending.connection.fileno())

    def _woken(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _take_replies(self) -> None:
        while self._replies:
            connection, address, reply, lane = self._replies.popleft()
            self._start_sending(connection, address, reply, lane)

    def _expire(self, now: float) -> None:
        while self._reading and (oldest := next(iter(self._reading.values()))).deadline <= now:
            self._count_refusal("expired", "no complete request within the deadline")
            limit = self.limits.request_seconds
            self._answer_now(oldest, error_reply(408, f"no complete request within {limit:g} s"))
        while self._writing and (sending := next(iter(self._writing.values()))).deadline <= now:
            self._count_refusal("not_reading", "a reply not read within the deadline")
            self._close_fd(sending.connection.fileno())
        while self._lingering and next(iter(self._lingering.values())).deadline <= now:
            self._close_fd(next(iter(self._lingering)))

    def _release(self, sending: _Sending) -> None:
        if sending.lane is not None:
            self._queued[sending.lane] -= 1
            sending.lane = None

    def _close_fd(self, fd: int) -> None:
        """Close the connection on ``fd`` whatever its state (releasing its queue place)."""
        held: _Pending | _Sending | None = self._reading.pop(fd, None)
        if held is None:
            held = self._writing.pop(fd, None) or self._lingering.pop(fd, None)
        if held is None:
            return
        if isinstance(held, _Sending):
            self._release(held)
        with contextlib.suppress(KeyError, ValueError):  # not registered (or closed already)
            self._selector.unregister(held.connection)
        held.connection.close()

    def _count_refusal(self, reason: str, why: str) -> None:
        """Count a refused connection; log the 1st, 2nd, 4th, 8th... of each reason (a flood stays quiet)."""
        count = self.refused[reason] = self.refused[reason] + 1
        if count & (count - 1) == 0:
            log.warning("http: %d connections refused since start: %s (%s)", count, reason, why)

    # -- handler threads --------------------------------------------------------------------------
    def _answer(self, request: bytes, address: Any) -> bytes:
        try:
            handler = self.handler_class(request, address, self)  # type: ignore[arg-type]
        except Exception:
            log.exception("http: the handler failed")
            return error_reply(500, "internal error")
        return handler.reply()

    def _handle(self, connection: socket.socket, request: bytes, address: Any, lane: str) -> None:
        """Compute the reply; the I/O thread sends it (a client that does not read holds no thread)."""
        reply = self._answer(request, address)
        with self._replies_lock:
            if self._replies_closed:  # the I/O thread stopped while this reply was computed
                connection.close()
                return
            self._replies.append((connection, address, reply, lane))
        try:
            self._wake_writer.send(b"x")
        except BlockingIOError:
            pass  # the pair's buffer is full of wake-ups already: the I/O thread will look
        except OSError:
            log.debug("http: reply to %s dropped: the server is stopping", address)

    # -- life cycle (any thread) ------------------------------------------------------------------
    def shutdown(self) -> None:
        self._stopping.set()
        with contextlib.suppress(BlockingIOError, OSError):  # OSError: closed already (a second stop)
            self._wake_writer.send(b"x")

    def server_close(self) -> None:
        for executor, _ in self._lanes.values():
            executor.shutdown(wait=False, cancel_futures=True)  # a queued request's connection: closed on cancel
        self._selector.close()
        self._listener.close()
        self._wake_reader.close()
        self._wake_writer.close()


def _close_if_cancelled(connection: socket.socket, queued: Future[None]) -> None:
    """A request still queued when the server stops is cancelled (``server_close``); its connection waits for a
    reply nobody will compute, so it is closed here rather than left to the garbage collector."""
    if queued.cancelled():
        connection.close()
