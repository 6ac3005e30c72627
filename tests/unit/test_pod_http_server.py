"""The pod's HTTP port under clients that do not play fair (issue 37, findings 4 and 6): slow or many
connections hold no threads and cannot starve the probes, and a rotated admin token replaces the old
one the moment the token file changes. Real sockets against the real server; the runtime is a stand-in."""

from __future__ import annotations

import functools
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import CollectorRegistry

from keyorder.adapters.bounded_http import RequestRefused, ServerLimits, request_size
from keyorder.adapters.http_server import PodHttpServer
from keyorder.config import RunConfig, read_admin_token
from keyorder.engine.poll_loop import RuntimeSnapshot

OLD_TOKEN = "old-token-" + "a" * 20
NEW_TOKEN = "new-token-" + "b" * 20


class _Runtime:
    """What the endpoints read of a ConsumerRuntime: readiness, health and the worker target."""

    def __init__(self) -> None:
        self.snapshot = RuntimeSnapshot(broker_reachable=True, assigned_partitions=2)
        self.started = threading.Event()
        self.started.set()
        self.stopping = False
        self.workers = 2
        self.last_iteration = time.monotonic()
        self.clock = time.monotonic
        self.pool = type("Pool", (), {"health": type("Health", (), {"crashed": None})()})()

    def request_resize(self, workers: int) -> int:
        previous, self.workers = self.workers, workers
        return previous


class _HeldScrape:
    """A collector whose scrape waits until released: handler threads that stay busy."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.entered.release()
        self.release.wait(30)
        yield GaugeMetricFamily("keyorder_test_held", "a scrape held by the test", value=1)


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[PodHttpServer] = []

    def start(registry: CollectorRegistry | None = None, token: Any = None, **limits: Any) -> PodHttpServer:
        extra = {"limits": ServerLimits(**limits)} if limits else {}
        server = PodHttpServer(_Runtime(), registry or CollectorRegistry(), "127.0.0.1", 0, token, **extra)  # type: ignore[arg-type]
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def _put_workers(port: int, token: str, workers: int) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/admin/workers",
        data=json.dumps({"workers": workers}).encode(),
        method="PUT",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        error.close()
        return error.code


def _slow_client(port: int) -> socket.socket:
    """A slowloris client: the start of a request, the rest never (or a byte now and then)."""
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    client.sendall(b"GET /metrics HTTP/1.1\r\nHost: pod\r\nX-Slow: ")
    return client


def test_300_slow_connections_hold_no_threads_and_the_probes_still_answer(serve: Any) -> None:
    server = serve()
    before = threading.active_count()
    clients = [_slow_client(server.port) for _ in range(300)]
    try:
        # answered after every slow connection was accepted (one listener, accepted in order)
        assert _get(server.port, "/readyz") == (200, {"status": "ready", "partitions": 2})
        assert _get(server.port, "/healthz") == (200, {"status": "ok"})
        threads = threading.active_count() - before
        assert threads <= ServerLimits().handler_threads, f"{threads} threads for 300 slow clients"
        # past the cap of connections being read, the oldest were let go (and the newest kept)
        for client in clients[: 300 - ServerLimits().max_connections] + clients[-1:]:
            client.settimeout(5)
        evicted = clients[: 300 - ServerLimits().max_connections]
        assert [client.recv(100) for client in evicted] == [b""] * len(evicted)
        with pytest.raises(TimeoutError):
            clients[-1].settimeout(0.2)
            clients[-1].recv(100)
    finally:
        for client in clients:
            client.close()


def test_a_request_dripping_a_byte_at_a_time_ends_at_its_deadline(serve: Any) -> None:
    """The old 10 s timeout counted idle time: a byte every 5 s renewed it forever."""
    server = serve(request_seconds=1.0)
    client = _slow_client(server.port)
    started = time.monotonic()
    answer = b""
    client.settimeout(0.2)
    while time.monotonic() - started < 10:  # a byte every 0.2 s, until the server hangs up
        try:
            chunk = client.recv(1000)
        except TimeoutError:
            client.send(b"x")
            continue
        if not chunk:
            break
        answer += chunk
    elapsed = time.monotonic() - started
    client.close()
    assert answer.startswith(b"HTTP/1.0 408 "), answer
    assert b"no complete request within 1 s" in answer
    assert elapsed < 5  # hang guard: the deadline is 1 s


def test_probes_are_answered_while_every_handler_thread_is_busy_and_excess_requests_get_503(serve: Any) -> None:
    held = _HeldScrape()
    registry = CollectorRegistry()
    registry.register(held)  # type: ignore[arg-type]
    server = serve(registry, handler_threads=1, max_queued=2)
    scrapes = [threading.Thread(target=_get_text, args=(server.port, "/metrics")) for _ in range(2)]
    try:
        for scrape in scrapes:
            scrape.start()
        assert held.entered.acquire(timeout=10), "the first scrape never reached the collector"  # hang guard
        assert _get(server.port, "/readyz")[0] == 200
        assert _get(server.port, "/healthz")[0] == 200
        status, body = _get(server.port, "/admin/workers")  # a third non-probe request: nobody can take it
        assert (status, body) == (503, {"error": "busy: too many requests at once"})
    finally:
        held.release.set()
        for scrape in scrapes:
            scrape.join(10)
    assert _get(server.port, "/admin/workers") == (200, {"workers": 2})


def _get_text(port: int, path: str) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
        response.read()


def test_an_oversized_request_is_refused(serve: Any) -> None:
    server = serve()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
        client.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"x" * 20000)
        answer = client.recv(1000)
    assert answer.startswith(b"HTTP/1.0 431 ")


@pytest.mark.parametrize(
    ("received", "size"),
    [
        (b"GET / HTTP/1.1\r\nHost: pod\r\n", None),
        (b"GET / HTTP/1.1\r\nHost: pod\r\n\r\n", 29),
        (b"GET / HTTP/1.1\r\n\r\nextra", 18),
        (b"PUT /a HTTP/1.1\r\ncontent-length: 5\r\n\r\n{}", None),
        (b'PUT /a HTTP/1.1\r\nContent-Length: 5\r\n\r\n{"a":', 43),
    ],
)
def test_request_size(received: bytes, size: int | None) -> None:
    assert request_size(received, 100) == size


@pytest.mark.parametrize(
    ("received", "status"),
    [
        (b"GET / HTTP/1.1\r\nX: " + b"x" * 200, 431),
        (b"PUT /a HTTP/1.1\r\nContent-Length: 99\r\n\r\n", 413),
        (b"PUT /a HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
    ],
)
def test_request_size_refuses(received: bytes, status: int) -> None:
    with pytest.raises(RequestRefused) as refused:
        request_size(received, 100)
    assert refused.value.status == status


# -- the admin token (finding 6) ------------------------------------------------------------------
def _token_reader(path: Path) -> functools.partial[str | None]:
    config = RunConfig(topics=["t"], group_id="g", handler="h:h", admin_token_file=path)
    return functools.partial(read_admin_token, config)


def test_the_old_token_is_refused_as_soon_as_the_token_file_changed(serve: Any, tmp_path: Path) -> None:
    """No request with the new token comes first: the file alone decides."""
    token_file = tmp_path / "token"
    token_file.write_text(OLD_TOKEN)
    server = serve(token=_token_reader(token_file))
    assert _put_workers(server.port, OLD_TOKEN, 3) == 200
    token_file.write_text(NEW_TOKEN + "\n")
    assert _put_workers(server.port, OLD_TOKEN, 4) == 401
    assert _put_workers(server.port, NEW_TOKEN, 5) == 200
    assert _get(server.port, "/admin/workers") == (200, {"workers": 5})


def test_a_secret_volume_swap_rotates_the_token(serve: Any, tmp_path: Path) -> None:
    """How the kubelet updates a mounted Secret: a new timestamped directory, then ``..data`` renamed
    onto a symlink to it; ``token`` is a symlink through ``..data``."""
    mount = tmp_path / "secret"
    mount.mkdir()

    def publish(version: str, token: str) -> None:
        (mount / version).mkdir()
        (mount / version / "token").write_text(token)
        os.symlink(version, mount / "..data_tmp")
        os.replace(mount / "..data_tmp", mount / "..data")

    publish("..2026_11_27_23_00_00.1", OLD_TOKEN)
    os.symlink("..data/token", mount / "token")
    server = serve(token=_token_reader(mount / "token"))
    assert _put_workers(server.port, OLD_TOKEN, 3) == 200
    publish("..2026_11_27_23_05_00.2", NEW_TOKEN)
    assert _put_workers(server.port, OLD_TOKEN, 4) == 401
    assert _put_workers(server.port, NEW_TOKEN, 5) == 200


def test_an_unreadable_token_file_refuses_every_token(serve: Any, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(OLD_TOKEN)
    server = serve(token=_token_reader(token_file))
    token_file.unlink()
    assert _put_workers(server.port, OLD_TOKEN, 4) == 503
    token_file.write_text("short")  # a token must be at least 16 characters
    assert _put_workers(server.port, OLD_TOKEN, 4) == 503
    assert _get(server.port, "/admin/workers") == (200, {"workers": 2})


# -- clients that do not read their replies (issue 37 review) -------------------------------------
class _LargeMetrics:
    """A collector whose scrape is 8 MiB (one sample with a long label: quick to format): more than a
    client's receive buffer and the server's send buffer hold (loopback's grows to 4 MiB), so a
    client that does not read leaves some of it unsent."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("keyorder_test_large", "a large scrape", labels=["series"])
        family.add_metric(["x" * (8 * 1024 * 1024)], 1)
        yield family


def _not_reading(port: int, path: str = "/metrics") -> socket.socket:
    """A client that sends a whole request and never reads the reply (a 4 KiB receive buffer)."""
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.settimeout(10)
    client.connect(("127.0.0.1", port))
    client.sendall(f"GET {path} HTTP/1.1\r\nHost: pod\r\n\r\n".encode())
    return client


def _wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"  # hang guard
        time.sleep(0.01)


def test_clients_that_do_not_read_a_large_metrics_reply_hold_no_handler_thread(serve: Any) -> None:
    """One handler thread, three clients that never read an 8 MiB scrape: the next request is answered.
    Before, the thread stayed in a blocking send for ``reply_seconds`` (60 s here) per such client."""
    registry = CollectorRegistry()
    registry.register(_LargeMetrics())  # type: ignore[arg-type]
    server = serve(registry, handler_threads=1, reply_seconds=60.0)
    clients = [_not_reading(server.port) for _ in range(3)]
    try:
        # the open GET /admin/workers takes the one handler thread after the three scrapes
        assert _get(server.port, "/admin/workers") == (200, {"workers": 2})  # urlopen's 10 s: hang guard
    finally:
        for client in clients:
            client.close()


def test_an_operator_admin_request_is_served_while_non_reading_scrapes_fill_the_queue(
    serve: Any, tmp_path: Path
) -> None:
    """The review's reproduction, scaled down: every queue place and handler thread taken by scrapes
    whose clients do not read; the operator's authenticated PUT /admin/workers still gets 200 (before:
    503 at once), while an anonymous request gets 503 (the queue was full)."""
    token_file = tmp_path / "token"
    token_file.write_text(OLD_TOKEN)
    registry = CollectorRegistry()
    registry.register(_LargeMetrics())  # type: ignore[arg-type]
    server = serve(registry, token=_token_reader(token_file), handler_threads=2, max_queued=4)
    httpd = server._httpd
    clients = [_not_reading(server.port) for _ in range(6)]
    try:
        _wait_for(lambda: httpd.refused["busy"] >= 2, "the two scrapes past the queue refused")
        assert _get(server.port, "/admin/workers")[0] == 503
        assert _put_workers(server.port, OLD_TOKEN, 7) == 200
        assert _put_workers(server.port, "not-the-token-" + "x" * 16, 8) == 503  # no priority without the token
    finally:
        for client in clients:
            client.close()
    assert server.runtime.workers == 7


def test_a_client_that_does_not_read_its_reply_is_dropped_at_the_reply_deadline(serve: Any) -> None:
    registry = CollectorRegistry()
    registry.register(_LargeMetrics())  # type: ignore[arg-type]
    server = serve(registry, reply_seconds=0.5, max_queued=1)
    httpd = server._httpd
    client = _not_reading(server.port)
    try:
        _wait_for(lambda: httpd.refused["not_reading"] == 1, "the client that does not read dropped")
        assert _get(server.port, "/admin/workers") == (200, {"workers": 2})  # its queue place is free again
        assert httpd.connections <= 1  # at most this request's lingering connection
    finally:
        client.close()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        pytest.param(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"x" * 40000, b"431", id="head-too-large"),
        pytest.param(b"PUT /admin/workers HTTP/1.1\r\nContent-Length: 99999\r\n\r\n" + b"{" * 40000, b"413", id="body"),
    ],
)
def test_a_refused_request_gets_its_reply_and_a_clean_end_not_a_reset(
    serve: Any, request_bytes: bytes, status: bytes
) -> None:
    """The client goes on sending after the server refused it: the server shuts its side and reads the
    rest for a moment, so the client reads the whole reply and then the end (before: reset)."""
    server = serve()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
        client.sendall(request_bytes)
        answer = b""
        while b"\r\n\r\n" not in answer:  # the reply's head: the server has refused the request
            chunk = client.recv(1000)
            assert chunk, answer
            answer += chunk
        client.sendall(b"x" * 8192)  # what a client still uploading sends meanwhile
        time.sleep(0.1)  # event order: let the server close (before: with this input unread)
        while chunk := client.recv(1000):  # before: ConnectionResetError here
            answer += chunk
    assert answer.startswith(b"HTTP/1.0 " + status + b" ")
    assert answer.endswith(b"}\n")


def test_a_request_still_queued_when_the_server_stops_has_its_connection_closed(serve: Any) -> None:
    """A full run on 5 workers failed once with 'ResourceWarning: unclosed <socket ...>' at server_close: the
    executor's shutdown cancelled a queued request and dropped its connection to the garbage collector. One
    handler thread held by a slow reply, a second request queued behind it, then the stop."""
    import gc
    import warnings

    release = threading.Event()
    server = serve(handler_threads=1, max_queued=2)
    httpd = server._httpd
    answer = httpd._answer
    httpd._answer = lambda request, address: (release.wait(10), answer(request, address))[1]  # hang guard
    first = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    second = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        first.sendall(b"GET /admin/workers HTTP/1.1\r\n\r\n")
        _wait_for(lambda: httpd._queued["handlers"] == 1, "the first request taken by the handler thread")
        second.sendall(b"GET /admin/workers HTTP/1.1\r\n\r\n")
        _wait_for(lambda: httpd._queued["handlers"] == 2, "the second request queued behind it")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            server.stop()
            gc.collect()
        assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]
        assert second.recv(100) == b""  # closed by the server, not reset later by the collector
    finally:
        release.set()
        first.close()
        second.close()
