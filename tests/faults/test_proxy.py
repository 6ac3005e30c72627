"""The fault proxy itself, against a local echo server: it forwards, cuts, black-holes and refuses."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.conftest import wait_until
from tests.faults.proxy import FaultProxy


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A TCP echo server on a free loopback port (one thread per connection), closed at teardown."""
    server = socket.create_server(("127.0.0.1", 0))
    stopped = threading.Event()

    def echo(connection: socket.socket) -> None:
        with connection:
            while data := connection.recv(65536):
                connection.sendall(data)

    def serve() -> None:
        server.settimeout(0.05)
        while not stopped.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=echo, args=(connection,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stopped.set()
    thread.join(5)
    server.close()


def round_trip(connection: socket.socket, payload: bytes) -> bytes:
    connection.sendall(payload)
    received = b""
    while len(received) < len(payload):
        chunk = connection.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


def test_it_forwards_both_ways_and_counts(echo_port):
    with FaultProxy(echo_port) as proxy, socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
        assert round_trip(client, b"x" * 100_000) == b"x" * 100_000
        assert proxy.accepted == 1
        wait_until(lambda: proxy.forwarded_bytes == 200_000, 5, "both directions counted")


def test_cut_closes_every_open_connection_and_new_ones_still_work(echo_port):
    with FaultProxy(echo_port) as proxy:
        clients = [socket.create_connection(("127.0.0.1", proxy.port), timeout=5) for _ in range(3)]
        for client in clients:
            assert round_trip(client, b"ping") == b"ping"
        assert proxy.cut() == 3
        for client in clients:
            assert client.recv(10) == b"", "the connection was not closed"
            client.close()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            assert round_trip(client, b"again") == b"again"
        assert proxy.cut_connections == 3


def test_black_hole_holds_every_byte_and_heal_delivers_them_intact(echo_port):
    with FaultProxy(echo_port) as proxy, socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
        assert round_trip(client, b"before") == b"before"
        proxy.black_hole()
        client.sendall(b"during")
        client.settimeout(0.5)
        with pytest.raises(TimeoutError):
            client.recv(10)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as late:  # accepted, silent
            late.sendall(b"late")
            late.settimeout(0.3)
            with pytest.raises(TimeoutError):
                late.recv(10)
            proxy.heal()
            late.settimeout(5)
            assert late.recv(10) == b"late"
        client.settimeout(5)
        assert client.recv(10) == b"during", "what waited in the black hole arrives after the heal"


def test_refuse_cuts_and_refuses_until_healed_on_the_same_port(echo_port):
    with FaultProxy(echo_port) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        wait_until(lambda: proxy.open_connections == 1, 5, "the proxy to accept the connection")
        assert proxy.refuse() == 1
        assert client.recv(10) == b""
        client.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        proxy.heal()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            assert round_trip(client, b"back") == b"back"
        wait_until(lambda: proxy.open_connections == 0, 5, "the closed connection to be forgotten")
